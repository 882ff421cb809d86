"""Tests for cadence.layers.gpipe_transformer.GPipeTransformerStack."""
import numpy as np
import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import cluster as cluster_lib
from cadence.framework.nested_map import NestedMap
from cadence.framework import shapes
from cadence.framework import step_seed
from cadence.layers import gpipe
from cadence.layers import gpipe_transformer
from cadence.layers import transformer
from cadence.tests import test_utils

_LAYERS, _BATCH, _TIME, _DIM = 4, 8, 3, 4


def _Tpl(dropout=0.0):
  return transformer.TransformerLayer.Params().Set(
      input_dim=_DIM, hidden_dim=8, num_heads=2, mask_self_atten=True,
      residual_dropout_prob=dropout)


def _Stack(splits, num_micro_batches=1, dropout=0.0, tpl=None,
           schedule='gpipe', **kwargs):
  k = splits if isinstance(splits, int) else len(splits) + 1
  with cluster_lib.Cluster.Params().Set(num_devices=k,
                                        worker_split_size=k).Instantiate():
    p = gpipe_transformer.GPipeTransformerStack.Params().Set(
        name='stack', num_layers=_LAYERS,
        transformer_tpl=tpl or _Tpl(dropout), splits=splits, **kwargs)
    p.pipeline_tpl.Set(num_micro_batches=num_micro_batches,
                       schedule=schedule)
    return p.Instantiate()


def _Plain(dropout=0.0, tpl=None, **kwargs):
  return transformer.TransformerStack.Params().Set(
      name='stack', num_layers=_LAYERS, transformer_tpl=tpl or _Tpl(dropout),
      **kwargs).Instantiate()


def _Inputs():
  rng = np.random.RandomState(1)
  pads = np.zeros([_BATCH, _TIME], np.float32)
  pads[1::2, -1] = 1.0
  return (tf.constant(rng.normal(size=[_BATCH, _TIME, _DIM]), tf.float32),
          tf.constant(pads))


def _LossAndGrads(layer, fprop):
  x, pads = _Inputs()

  def _Loss():
    out = fprop(x, pads)
    w = tf.random.stateless_normal(tf.shape(out), [3, 4])
    return [tf.reduce_mean(out * w), out]

  out, grads = test_utils.LossAndGrads(_Loss, layer.vars.Flatten() + [x])
  return out + grads


def _FPropLossAndGrads(stack):
  """(loss, gradients of the variables and inputs) of a float32 loss on
  the stack's outputs through FPropLoss (any schedule)."""
  x, pads = _Inputs()
  w = tf.random.stateless_normal(x.shape, [3, 4])
  loss = gpipe.PipelineCell(
      fprop=lambda th, out, side: NestedMap(
          loss=tf.reduce_sum(tf.cast(out, tf.float32) * side.w)),
      theta=NestedMap(), meta=None)

  def _Loss():
    return stack.FPropLoss(stack.theta, x, pads, loss, NestedMap(w=w)).loss

  return test_utils.LossAndGrads(_Loss, stack.vars.Flatten() + [x])


class GPipeTransformerStackTest(tf.test.TestCase):

  def testWeightLayoutIsIndependentOfSplits(self):
    plain = _Plain()
    want = plain.vars.FlattenItems()
    self.assertIn('x_layers[3].ffn.fc[1].w', [k for k, _ in want])
    for splits in (1, 2, 4, [3]):
      with self.subTest(splits=splits):
        got = _Stack(splits).vars.FlattenItems()
        self.assertEqual([k for k, _ in want], [k for k, _ in got])
        for (_, w), (_, g) in zip(want, got):
          self.assertAllEqual(w, g)          # Seeded by path: same values.
          self.assertEqual(w.name, g.name)

  def testMatchesTransformerStack(self):
    plain = _Plain()

    def _PlainFProp(x, pads):
      return plain.FProp(plain.theta, x, pads)

    want = _LossAndGrads(plain, _PlainFProp)
    for splits, m in ((1, 1), (2, 4), (4, 2), ([1], 8)):
      stack = _Stack(splits, m)

      def _Pipelined(x, pads, stack=stack):
        return stack.FProp(stack.theta, x, pads)

      with self.subTest(splits=splits, m=m):
        got = _LossAndGrads(stack, _Pipelined)
        for w, g in zip(want, got):
          self.assertAllClose(w, g, atol=1e-5, rtol=1e-5)

  def testDropoutMatchesPlainPerMicroBatch(self):
    plain, stack = _Plain(0.3), _Stack(2, 4, dropout=0.3)
    seed = step_seed.MakeStepSeed(9)

    def _Reference(x, pads):
      outs = []
      for j, (xj, pj) in enumerate(zip(tf.split(x, 4), tf.split(pads, 4))):
        th = base_layer.WithStepSeed(plain.theta,
                                     step_seed.MicroBatchSeed(seed, j))
        outs.append(plain.FProp(th, xj, pj))
      return tf.concat(outs, 0)

    def _Pipelined(x, pads):
      th = base_layer.WithStepSeed(stack.theta, seed)
      return tf.function(stack.FProp)(th, x, pads)

    want = _LossAndGrads(plain, _Reference)
    got = _LossAndGrads(stack, _Pipelined)
    for w, g in zip(want, got):
      self.assertAllClose(w, g, atol=1e-5, rtol=1e-5)

  def testBfloat16PipelineEqualsPlainBfloat16(self):
    # One knob, the stack's fprop_dtype: its layers compute in bfloat16
    # from float32 variables, the pipeline passes bfloat16 between its
    # stages (half the bytes), the weight gradients come back float32 and
    # each stage sums its micro-batches' in float32. GELU, not ReLU: see
    # transformer_test (a ReLU's kink).
    tpl = _Tpl().Set(activation='GELU')
    loss32, _ = _FPropLossAndGrads(_Plain(tpl=tpl))
    loss16, want = _FPropLossAndGrads(_Plain(tpl=tpl,
                                             fprop_dtype=tf.bfloat16))
    self.assertEqual(loss16.dtype, tf.float32)
    scale = max(np.abs(g).max() for g in want)
    for schedule in ('gpipe', '1f1b'):
      for k, m in ((1, 1), (1, 4), (2, 1), (2, 4)):
        stack = _Stack(k, m, tpl=tpl, schedule=schedule,
                       fprop_dtype=tf.bfloat16)
        self.assertEqual(gpipe.PipeliningLayer.StateDtype(
            stack.pipeline.params), tf.bfloat16)
        self.assertEqual({v.dtype for v in stack.vars.Flatten()},
                         {tf.float32})
        loss, grads = _FPropLossAndGrads(stack)
        with self.subTest(schedule=schedule, k=k, m=m):
          # The same bfloat16 forward (measured: equal to 5e-7), far from
          # float32's (loss32 differs by 0.14).
          self.assertAllClose(loss16, loss, rtol=1e-5)
          self.assertGreater(abs(loss32 - loss16), 100 * abs(loss - loss16))
          for g, w in zip(grads, want):
            self.assertEqual(g.dtype, tf.float32)
            # Each micro-batch's weight gradient is a bfloat16 product,
            # rounded (2^-9 relative at most) before the float32 sum; the
            # whole batch's is rounded once. Those roundings, of parts
            # that may cancel, differ by about a bfloat16 spacing (2^-7)
            # of the largest gradient (measured: up to 0.6%; bfloat16
            # from float32: 5.6%).
            self.assertAllClose(w, g, atol=2**-6 * scale, rtol=0)
        if schedule == 'gpipe':   # Its outputs: the last stage's state.
          out = stack.FProp(stack.theta, *_Inputs())
          self.assertEqual(out.dtype, tf.bfloat16)

  def testStateDtype(self):
    pipe = gpipe.PipeliningLayer.Params()
    self.assertEqual(gpipe.PipeliningLayer.StateDtype(pipe, tf.float32),
                     tf.float32)
    pipe.fprop_dtype = tf.bfloat16   # Inherited from the stack, e.g.
    self.assertEqual(gpipe.PipeliningLayer.StateDtype(pipe, tf.float32),
                     tf.bfloat16)
    pipe.state_dtype = tf.float32    # Set: wins.
    self.assertEqual(gpipe.PipeliningLayer.StateDtype(pipe, tf.bfloat16),
                     tf.float32)
    # A float32 stack passing bfloat16 between its stages: the cells'
    # outputs are cast to it; the stage boundary rounds (2^-9 relative).
    plain = _Plain()
    stack = _Stack(2, 4, pipeline_tpl=gpipe.PipeliningLayer.Params().Set(
        state_dtype=tf.bfloat16))
    x, pads = _Inputs()
    out = stack.FProp(stack.theta, x, pads)
    self.assertEqual(out.dtype, tf.bfloat16)
    self.assertAllClose(plain.FProp(plain.theta, x, pads),
                        tf.cast(out, tf.float32), atol=0.05)
    # Its memory estimate counts 2-byte outputs (activations and paddings).
    p = stack.params.Copy()
    b, t = _BATCH // 4, _TIME
    for want, state_dtype in ((2, tf.bfloat16), (4, None)):
      p.pipeline_tpl.state_dtype = state_dtype
      cells = p.cls.Plan(p, shapes.Shape([_BATCH, t, _DIM]),
                         shapes.Shape([_BATCH, t])).cells   # 4 x b rows.
      self.assertEqual([c.out for c in cells], [want * b * t * (_DIM + 1)] * 2)

  def testInferenceOnOneDeviceRunsSequentially(self):
    plain = _Plain()
    # 2 cells; no cluster scope: the default cluster, 1 device per split.
    p = gpipe_transformer.GPipeTransformerStack.Params().Set(
        name='stack', num_layers=_LAYERS, transformer_tpl=_Tpl(), splits=2,
        is_inference=True)
    p.pipeline_tpl.num_micro_batches = 4
    stack = p.Instantiate()
    self.assertEqual(['/device:CPU:0'], stack.pipeline.devices)
    x, pads = _Inputs()
    out = stack.FProp(stack.theta, x, pads)
    self.assertAllClose(plain.FProp(plain.theta, x, pads), out, atol=1e-6)

  def testBoundariesAndDevices(self):
    self.assertEqual([0, 2, 4], _Stack(2).boundaries)
    self.assertEqual([0, 3, 4], _Stack([3]).boundaries)
    stack = _Stack([1, 2])
    self.assertEqual([0, 1, 2, 4], stack.boundaries)
    for i, cell in enumerate([0, 1, 2, 2]):
      for v in stack.vars.x_layers[i].Flatten():
        self.assertEqual(f'CPU:{cell}', v.device.split('device:')[-1])
    self.assertEqual('CPU:2', stack.vars.final_ln.scale.device.split(
        'device:')[-1])

  def testFPropMeta(self):
    p = _Stack(2).params.Copy()
    x, pads = shapes.Shape([8, 3, 4]), shapes.Shape([8, 3])
    meta = gpipe_transformer.GPipeTransformerStack.FPropMeta(p, x, pads)
    plain_p = transformer.TransformerStack.Params().Set(
        name='stack', num_layers=_LAYERS, transformer_tpl=_Tpl())
    self.assertEqual(
        transformer.TransformerStack.FPropMeta(plain_p, x, pads).flops,
        meta.flops)
    self.assertEqual((x,), meta.out_shapes)
    self.assertEqual(meta.flops, sum(meta.plan.StageFlops()))
    p.pipeline_tpl.num_micro_batches = 3
    with self.assertRaisesRegex(
        ValueError, r"PipeliningLayer \(params 'pipeline_tpl'\): "
        r'num_micro_batches=3 does not divide batch 8'):
      gpipe_transformer.GPipeTransformerStack.FPropMeta(p, x, pads)

  def testBadSplits(self):
    for splits, regex in ((5, r'splits=5 must be in \[1, num_layers=4\]'),
                          ([2, 2], r'splits=\[2, 2\] must be an int K in '
                           r'\[1, 4\] or a list of increasing layer indices '
                           r'in \(0, 4\)'),
                          ([4], r'splits=\[4\]')):
      with self.subTest(splits=splits):
        with self.assertRaisesRegex(ValueError, regex):
          gpipe_transformer.GPipeTransformerStack.Params().Set(
              name='stack', num_layers=_LAYERS, transformer_tpl=_Tpl(),
              splits=splits).Instantiate()
    p = gpipe_transformer.GPipeTransformerStack.Params().Set(
        name='stack', num_layers=_LAYERS, transformer_tpl=_Tpl())
    p.pipeline_tpl.cell_tpl = [_Tpl()]
    with self.assertRaisesRegex(
        ValueError, r"GPipeTransformerStack 'stack': pipeline_tpl.cell_tpl="
        r'.* must stay empty: the stack builds the cells'):
      p.Instantiate()
    p.pipeline_tpl.Set(cell_tpl=[], remat='sometimes')
    with self.assertRaisesRegex(
        ValueError, r"PipeliningLayer \(params 'pipeline_tpl'\): "
        r"remat='sometimes' must be one of 'except_last'"):
      p.Instantiate()


if __name__ == '__main__':
  tf.test.main()
