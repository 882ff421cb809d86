"""Tests for layers/gpipe_resnet.py: the pipelined ResNet is transparent.

The reference is the same ResNet unpipelined (pipeline_tpl None: same
variable paths, so the same initial weights) run on each micro-batch in
turn, updating the BN moving averages after each: what the pipeline
promises, values, gradients and moving statistics alike.
"""
import itertools

import numpy as np
import tensorflow as tf

from cadence.framework import cluster as cluster_lib
from cadence.framework import hyperparams
from cadence.framework import shapes
from cadence.layers import gpipe
from cadence.layers import gpipe_resnet
from cadence.tests import test_utils

NestedMap = gpipe.NestedMap

_BATCH = 8


def _Params(**kw):
  p = gpipe_resnet.ResNet.Params().Set(
      name='net', image_size=[6, 6], input_dim=2, stage_dims=[4, 6],
      stage_blocks=[1, 1], num_classes=3)
  p.stem_tpl.Set(dim=4, kernel=3, stride=1, max_pool=False)
  p.bn_tpl.Set(decay=0.7)
  return p.Set(**kw)


def _Build(p, k):
  with cluster_lib.Cluster.Params().Set(num_devices=k,
                                        worker_split_size=k).Instantiate():
    return p.Instantiate()


def _Loss(logits):
  w = tf.random.stateless_normal(tf.shape(logits), [3, 7])
  return tf.reduce_mean(logits * w)


def _Moving(net):
  return [v.numpy() for k, v in net.vars.FlattenItems() if 'moving' in k]


class PipelinedResNetTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    self.x = tf.constant(np.random.default_rng(0).normal(
        size=[_BATCH, 6, 6, 2]).astype(np.float32))

  def _Reference(self, m):
    """(logits, grads, moving stats) of the plain net per micro-batch."""
    ref = _Params(pipeline_tpl=None).Instantiate()
    parts = tf.split(self.x, m) if m > 1 else [self.x]

    def _Fn():
      outs = []
      for part in parts:
        logits, stats = ref.FPropStats(ref.theta, part)
        ref.UpdateMovingStats(stats)
        outs.append(logits)
      logits = tf.concat(outs, 0)
      return _Loss(logits), logits

    (_, logits), grads = test_utils.LossAndGrads(_Fn, ref.vars.Flatten())
    return ref, logits, grads, _Moving(ref)

  def testTransparentOverStagesAndMicroBatches(self):
    for k, m in itertools.product((1, 2), (1, 4)):
      ref, ref_logits, ref_grads, ref_moving = self._Reference(m)
      p = _Params(splits=k)
      p.pipeline_tpl.num_micro_batches = m
      net = _Build(p, k)
      self.assertEqual(k, net.num_cells)
      for a, b in zip(ref.vars.Flatten(), net.vars.Flatten()):
        if a.trainable:             # same paths, same initial weights
          self.assertAllEqual(a, b)

      def _Fn(net=net):
        logits, stats = net.FPropStats(net.theta, self.x)
        net.UpdateMovingStats(stats)
        return _Loss(logits), logits, stats

      (_, logits, stats), grads = test_utils.LossAndGrads(
          _Fn, net.vars.Flatten())
      what = f'K={k} M={m}'
      self.assertEqual([m, 2, 4], stats.stem.bn.shape.as_list(), what)
      self.assertAllClose(ref_logits, logits, atol=1e-5, msg=what)
      for name, g, rg in zip([n for n, _ in net.vars.FlattenItems()], grads,
                             ref_grads):
        if rg is None:                       # moving stats: no gradient
          self.assertIn('moving', name)
          continue
        self.assertAllClose(rg, g, atol=1e-5, msg=f'{what} {name}')
      for a, b in zip(ref_moving, _Moving(net)):
        self.assertAllClose(a, b, atol=1e-5, msg=what)

  def testEverySchedulesLossInsideOrOutEqualsTheReference(self):
    # The transparency grid of the schedules for the ResNet's stages: the
    # loss of each micro-batch inside the pipeline (1F1B, zero-bubble,
    # interleaved) or after it (GPipe), its BN statistics out through the
    # loss; compiled, so a backward with a deferred W (B, W) runs as in
    # training.
    m = 4
    ref, ref_logits, ref_grads, ref_moving = self._Reference(m)
    del ref, ref_logits
    w = tf.random.stateless_normal([_BATCH, 3], [3, 7])
    loss = gpipe.PipelineCell(
        fprop=lambda th, logits, side: NestedMap(loss=tf.reduce_sum(
            logits * side.w) / float(_BATCH * 3)), theta=NestedMap(),
        meta=None)
    cases = [('gpipe', 1, 'except_last'), ('1f1b', 1, 'never'),
             ('interleaved_1f1b', 2, 'always'), ('zb_h1', 1, 'except_last'),
             ('zb_h1', 1, 'selective'), ('zb_v', 2, 'never')]
    for schedule, v, remat in cases:
      what = f'{schedule} v={v} {remat}'
      p = _Params(splits=2)
      p.pipeline_tpl.Set(num_micro_batches=m, schedule=schedule,
                         stages_per_device=v, remat=remat)
      net = _Build(p, 2)

      @tf.function(autograph=False)
      def _Step(net=net):
        with tf.GradientTape() as tape:
          out, stats = net.FPropLossStats(
              net.theta, self.x, loss=loss, side_inputs=NestedMap(w=w))
        return out.loss, tape.gradient(out.loss, net.vars.Flatten()), stats

      _, grads, stats = _Step()
      net.UpdateMovingStats(stats)
      self.assertEqual([m, 2, 4], stats.stem.bn.shape.as_list(), what)
      for name, g, rg in zip([n for n, _ in net.vars.FlattenItems()], grads,
                             ref_grads):
        if rg is not None:
          self.assertAllClose(rg, g, atol=1e-5, msg=f'{what} {name}')
      for a, b in zip(ref_moving, _Moving(net)):
        self.assertAllClose(a, b, atol=1e-5, msg=what)

  def testMicroBatchesNormaliseWithTheirOwnStatistics(self):
    p = _Params(splits=2)
    p.pipeline_tpl.num_micro_batches = 4
    net = _Build(p, 2)
    whole = _Params(pipeline_tpl=None).Instantiate()
    self.assertNotAllClose(whole(self.x), net(self.x), atol=1e-3)

  def testInferenceUsesMovingStatistics(self):
    p = _Params(splits=2, is_inference=True)
    p.pipeline_tpl.num_micro_batches = 2
    net = _Build(p, 2)
    ref = _Params(pipeline_tpl=None, is_inference=True).Instantiate()
    rng = np.random.default_rng(1)
    for a, b in zip(ref.vars.Flatten(), net.vars.Flatten()):
      value = rng.uniform(0.5, 1.5, size=a.shape).astype(np.float32)
      a.assign(value)
      b.assign(value)
    logits, stats = net.FPropStats(net.theta, self.x)
    self.assertIsNone(stats)
    self.assertAllClose(ref(self.x), logits, atol=1e-5)
    # Per example: the same on its own (no batch statistics involved).
    self.assertAllClose(ref(self.x[:1]), logits[:1], atol=1e-5)

  def testVariablePathsDoNotDependOnTheSplits(self):
    paths = [[k for k, _ in _Build(_Params(splits=k), k).vars.FlattenItems()]
             for k in (1, 3)]
    self.assertEqual(paths[0], paths[1])
    self.assertIn('blocks[1].proj_bn.moving_mean', paths[0])

  def testFPropMetaAndPartition(self):
    p = _Params(splits=2)
    net = _Build(p, 2)
    meta = gpipe_resnet.ResNet.FPropMeta(p, [_BATCH, 6, 6, 2])
    self.assertEqual((shapes.Shape([_BATCH, 3]),), meta.out_shapes)
    units, _, _ = gpipe_resnet.ResNet.UnitCosts(
        p, (shapes.Shape([_BATCH, 6, 6, 2]),))
    self.assertEqual(sum(u.cost.flops for u in units), meta.flops)
    cells = meta.plan.StageFlops()
    self.assertEqual(meta.flops, sum(cells))
    self.assertEqual([0, net.boundaries[1], 4], net.boundaries)
    self.assertEqual(net(self.x).shape.as_list(), [_BATCH, 3])

  def testBadParams(self):
    with self.assertRaisesRegex(ValueError, r"ResNet 'net': splits=5 must be "
                                r'in \[1, 4\] \(the stem, the blocks and the '
                                r'head\)'):
      _Params(splits=5).Instantiate()
    with self.assertRaisesRegex(ValueError, r"pipeline_tpl.cell_tpl=\[.*must "
                                'stay empty'):
      p = _Params()
      p.pipeline_tpl.cell_tpl = [gpipe.FeatureExtractionLayer.Params()]
      p.Instantiate()
    p = _Params()
    p.pipeline_tpl.num_micro_batches = 3
    with self.assertRaisesRegex(ValueError, 'num_micro_batches=3'):
      gpipe_resnet.ResNet.FPropMeta(p, [_BATCH, 6, 6, 2])
    with self.assertRaisesRegex(ValueError, r'images shape \[8, 5, 6, 2\] '
                                r'must be \[None, 6, 6, 2\]'):
      gpipe_resnet.ResNet.FPropMeta(_Params(), [_BATCH, 5, 6, 2])

  def testFPropMetaNamesABadValueWhereItWasSet(self):
    # FPropMeta (what a task runs when built) checks the params first: the
    # ResNet's, bn_tpl's (which replaces the stem's) and the pipeline's,
    # each named by its params path, not by a unit that inherits it.
    for field, value, want in (
        ('fprop_dtype', 'bfloat16', "ResNet 'net' (params 'net'): "
         "fprop_dtype='bfloat16' must be one of None, tf.float32, "
         'tf.bfloat16 (tf.float16 is not supported: its range underflows '
         'small gradients without loss scaling; use tf.bfloat16). Did you '
         'mean tf.bfloat16 (a dtype, not a string)?'),
        ('bn_tpl.dtype', 'float32', "BatchNormLayer (params 'net.bn_tpl'): "
         "dtype='float32' must be one of tf.float32, tf.float64. Did you "
         'mean tf.float32 (a dtype, not a string)?'),
        ('pipeline_tpl.schedule', 'GPipe', "PipeliningLayer (params "
         "'net.pipeline_tpl'): schedule='GPipe' must be one of 'gpipe', "
         "'1f1b', 'interleaved_1f1b', 'zb_h1', 'zb_v', 'table'. Did you mean "
         "'gpipe'?"),
        ('pipeline_tpl.state_dtype', 'zz', "PipeliningLayer (params "
         "'net.pipeline_tpl'): state_dtype='zz' must be one of None, "
         'tf.float32, tf.bfloat16, tf.float64 (tf.float16 is not supported: '
         'its range underflows small gradients without loss scaling; use '
         'tf.bfloat16).')):
      with self.subTest(field=field):
        root = hyperparams.Params()
        root.Define('net', _Params(splits=2).Set(**{field: value}), 'Net.')
        with self.assertRaisesWithLiteralMatch(ValueError, want):
          gpipe_resnet.ResNet.FPropMeta(root.net, [_BATCH, 6, 6, 2])


if __name__ == '__main__':
  tf.test.main()
