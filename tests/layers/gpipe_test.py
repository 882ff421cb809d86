"""Tests for cadence.layers.gpipe: partitioning, cells, the pipeline."""
import itertools
import textwrap
from unittest import mock

import numpy as np
import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import cluster as cluster_lib
from cadence.framework.pipeline import cell_program
from cadence.framework.pipeline import schedules
from cadence.framework import shapes
from cadence.framework import step_seed
from cadence.layers import conv
from cadence.layers import gpipe
from cadence.layers import linear
from cadence.layers import transformer
from cadence.tests import test_utils

NestedMap = base_layer.NestedMap
Shape = shapes.Shape
_BATCH = 8


def _Cluster(k):
  return cluster_lib.Cluster.Params().Set(
      num_devices=k, worker_split_size=k).Instantiate()


def _AsTuple(x):
  return x if isinstance(x, tuple) else (x,)


def _Swap(x, batch_dim):
  """Swaps axes 0 and batch_dim (a tensor or a Shape)."""
  if not batch_dim:
    return x
  if isinstance(x, Shape):
    dims = list(x)
    dims[0], dims[batch_dim] = dims[batch_dim], dims[0]
    return Shape(dims)
  perm = list(range(x.shape.rank))
  perm[0], perm[batch_dim] = batch_dim, 0
  return tf.transpose(x, perm)


class _Wrap(base_layer.BaseLayer):
  """Test cell layer: `sub` on inputs with the batch at `batch_dim`, taking
  and returning a NestedMap with `keys` (or a tuple when keys is None)."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('sub', None, 'The wrapped layer (batch-major).')
    p.Define('batch_dim', 0, 'Batch dim of the inputs and outputs.')
    p.Define('keys', None, 'NestedMap keys of the inputs/outputs, or None.')
    return p

  def __init__(self, params):
    super().__init__(params)
    self.CreateChild('sub', self.params.sub)

  @staticmethod
  def _Run(p, fn, args):
    xs = [args[0][k] for k in p.keys] if p.keys else list(args)
    out = fn(*[_Swap(x, p.batch_dim) for x in xs])
    out = [_Swap(o, p.batch_dim) for o in _AsTuple(out)]
    if p.keys:
      return NestedMap(zip(p.keys, out))
    return out[0] if len(out) == 1 else tuple(out)

  def FProp(self, theta, *args):
    return self._Run(self.params,
                     lambda *xs: self.children.sub.FProp(theta.sub, *xs), args)

  @classmethod
  def FPropMeta(cls, p, *args):
    sub = base_layer.InheritParams(p, p.sub)
    metas = []

    def _Fn(*xs):
      metas.append(sub.cls.FPropMeta(sub, *xs))
      return tuple(metas[0].out_shapes)

    out = cls._Run(p, _Fn, args)
    single = p.keys or isinstance(out, Shape)
    return NestedMap(flops=metas[0].flops,
                     out_shapes=(out,) if single else out)


def _ConvLayers(batch_dim, nested, acts=('TANH',) * 4):
  return [_Wrap.Params().Set(
      name=f'l{i}', batch_dim=batch_dim, keys=['x'] if nested else None,
      sub=conv.Conv2DLayer.Params().Set(
          name='conv', filter_shape=[3, 3, 2, 2], activation=act))
          for i, act in enumerate(acts)]


def _TransformerLayers(batch_dim, nested, dropout=0.0, num=4):
  return [_Wrap.Params().Set(
      name=f'l{i}', batch_dim=batch_dim,
      keys=['x', 'paddings'] if nested else None,
      sub=transformer.GPipeTransformerLayer.Params().Set(
          name='xformer', input_dim=4, hidden_dim=8, num_heads=2,
          residual_dropout_prob=dropout))
          for i in range(num)]


def _Inputs(kind, batch_dim, nested):
  """Inputs (laid out with the batch at batch_dim) and their shapes."""
  rng = np.random.RandomState(3)
  if kind == 'conv':
    xs = [tf.constant(rng.normal(size=[_BATCH, 4, 4, 2]), tf.float32)]
    keys = ['x']
  else:
    pads = np.zeros([_BATCH, 3], np.float32)
    pads[::3, -1] = 1.0
    xs = [tf.constant(rng.normal(size=[_BATCH, 3, 4]), tf.float32),
          tf.constant(pads)]
    keys = ['x', 'paddings']
  xs = [_Swap(x, batch_dim) for x in xs]
  in_shapes = [Shape(x.shape) for x in xs]
  if nested:
    return (NestedMap(zip(keys, xs)),), (NestedMap(zip(keys, in_shapes)),)
  return tuple(xs), tuple(in_shapes)


def microbatch_parts(x, m, batch_dim):
  return tf.split(x, m, axis=batch_dim) if m > 1 else [x]


def _Loss(outputs):
  """A weighted mean of every float output (fixed pseudo-random weights).

  A mean keeps gradients O(1), so float32 round-off (summation order differs
  between micro-batched and whole-batch gradients) stays below 1e-5.
  """
  loss = 0.0
  for i, o in enumerate(tf.nest.flatten(outputs)):
    w = tf.random.stateless_normal(tf.shape(o), [i, 7])
    loss += tf.reduce_mean(o * w)
  return loss


def _LossAndGrads(layer, fprop, inputs):
  flat_in = tf.nest.flatten(inputs)

  def _LossAndOutputs():
    out = fprop(inputs)
    return [_Loss(out)] + tf.nest.flatten(out)

  out, grads = test_utils.LossAndGrads(_LossAndOutputs,
                                       layer.vars.Flatten() + flat_in)
  return out + grads


def _SequentialReference(pipe, theta, inputs, batch_dim, num_micro_batches,
                         seed=None):
  """The cells run plainly one after another on one device.

  With a seed, micro-batch j runs alone with MicroBatchSeed(seed, j) (what
  the pipeline promises); the outputs are concatenated back.
  """
  def _Run(th, xs):
    for cell, cell_theta in zip(pipe.children.cells, th.cells):
      xs = _AsTuple(cell.FProp(cell_theta, *xs))
    return xs

  if seed is None:
    out = _Run(theta, inputs)
  else:
    parts = [tf.split(x, num_micro_batches, axis=batch_dim)
             for x in tf.nest.flatten(inputs)]
    outs = []
    for j in range(num_micro_batches):
      th = base_layer.WithStepSeed(theta, step_seed.MicroBatchSeed(seed, j))
      outs.append(_Run(th, tf.nest.pack_sequence_as(
          inputs, [p[j] for p in parts])))
    out = tf.nest.map_structure(lambda *x: tf.concat(x, axis=batch_dim),
                                *outs)
  return out[0] if len(out) == 1 else out


class PipeliningLayerTest(tf.test.TestCase):

  def _Build(self, layers, k, m, batch_dim, nested, in_shapes, **kwargs):
    cells = gpipe.PartitionSequentialLayers(layers, k, *in_shapes)
    with _Cluster(k):
      return gpipe.PipeliningLayer.Params().Set(
          name='pipe', cell_tpl=cells, num_micro_batches=m,
          batch_dim=batch_dim, nested_map_fprop=nested, **kwargs).Instantiate()

  def _CheckTransparent(self, kind, k, m, batch_dim, nested, dropout=0.0,
                        use_function=False):
    inputs, in_shapes = _Inputs(kind, batch_dim, nested)
    layers = (_ConvLayers(batch_dim, nested) if kind == 'conv' else
              _TransformerLayers(batch_dim, nested, dropout, num=max(k, 2)))
    pipe = self._Build(layers, k, m, batch_dim, nested, in_shapes)
    seed = step_seed.MakeStepSeed(5) if dropout else None
    theta = pipe.theta if seed is None else base_layer.WithStepSeed(
        pipe.theta, seed)

    def _Pipelined(xs):
      return pipe.FProp(theta, *xs)

    if use_function:
      _Pipelined = tf.function(_Pipelined)  # pylint: disable=invalid-name
    got = _LossAndGrads(pipe, _Pipelined, inputs)
    want = _LossAndGrads(pipe, lambda xs: _SequentialReference(
        pipe, theta, xs, batch_dim, m, seed), inputs)
    self.assertEqual(len(want), len(got))
    for w, g in zip(want, got):
      self.assertAllClose(w, g, atol=1e-5, rtol=1e-5)

  def testConvGridMatchesSequential(self):
    # The full grid: K x M x batch_dim x nested_map_fprop.
    for k, m, bd, nested in itertools.product((1, 2, 4), (1, 2, 4, 8), (0, 1),
                                              (False, True)):
      with self.subTest(k=k, m=m, batch_dim=bd, nested=nested):
        self._CheckTransparent('conv', k, m, bd, nested)

  def testTransformerGridMatchesSequential(self):
    # Each K and each M (the full grid runs with conv cells), batch_dim 1
    # and nested_map_fprop on some.
    configs = [(1, 1, 0, False), (1, 8, 1, False), (2, 2, 0, True),
               (2, 4, 1, False), (4, 1, 1, True), (4, 8, 0, False)]
    for k, m, bd, nested in configs:
      with self.subTest(k=k, m=m, batch_dim=bd, nested=nested):
        self._CheckTransparent('transformer', k, m, bd, nested)

  def testInFunction(self):
    self._CheckTransparent('transformer', 2, 4, 1, True, dropout=0.2,
                           use_function=True)

  def testDropoutEqualsSequentialWithMicroBatchSeeds(self):
    for k, m, bd in ((2, 4, 0), (4, 2, 1)):   # Also the cells' own dropout.
      with self.subTest(k=k, m=m, batch_dim=bd):
        self._CheckTransparent('transformer', k, m, bd, False, dropout=0.3)

  def testDropoutMasksDifferAcrossMicroBatchesAndRepeatPerStep(self):
    inputs, in_shapes = _Inputs('transformer', 0, False)
    x = tf.tile(inputs[0][:1], [_BATCH, 1, 1])     # Identical examples.
    pads = tf.zeros([_BATCH, 3])
    # 8 micro-batches of one example each.
    pipe = self._Build(_TransformerLayers(0, False, 0.5, num=2), 2, 8, 0,
                       False, in_shapes)

    def _Out(step):
      th = base_layer.WithStepSeed(pipe.theta, step_seed.MakeStepSeed(step))
      return pipe.FProp(th, x, pads)[0].numpy()

    out = _Out(1)
    for i, j in itertools.combinations(range(_BATCH), 2):
      self.assertNotAllClose(out[i], out[j])   # Other micro-batch, other mask.
    self.assertAllEqual(out, _Out(1))          # Same step: same masks.
    self.assertNotAllClose(out, _Out(2))

  def testEachCellRunsOncePerMicroBatch(self):
    counters = {}

    class Counting(linear.ProjectionLayer):

      def FProp(self, theta, inputs):
        counters[self.path].assign_add(1)
        return super().FProp(theta, inputs)

    layers = [Counting.Params().Set(name=f'c{i}', input_dim=4, output_dim=4)
              for i in range(3)]
    pipe = self._Build(layers, 3, 4, 0, False, [Shape([_BATCH, 4])])
    for i in range(3):
      counters[f'pipe.cells[{i}].c{i}'] = tf.Variable(0, trainable=False)
    x = tf.random.normal([_BATCH, 4])
    pipe.FProp(pipe.theta, x)
    self.assertEqual([4] * 3, [int(c.numpy()) for c in counters.values()])
    with tf.GradientTape() as tape:
      y = pipe.FProp(pipe.theta, x)
    tape.gradient(y, pipe.vars.Flatten())
    # 4 (first forward) + 4 (second forward) + 3 re-runs in the backward
    # (remat 'except_last': the last micro-batch keeps its activations).
    self.assertEqual([11] * 3, [int(c.numpy()) for c in counters.values()])
    # Inference on one device per split: the cells run once on the batch.
    seq = pipe.params.Copy().Set(is_inference=True).Instantiate()
    for i in range(3):
      counters[f'pipe.cells[{i}].c{i}'].assign(0)
    seq.FProp(pipe.theta, x)
    self.assertEqual([1] * 3, [int(c.numpy()) for c in counters.values()])

  def testCellsAndVariablesOnTheirDevices(self):
    layers = _ConvLayers(0, False)
    _, in_shapes = _Inputs('conv', 0, False)
    cells = gpipe.PartitionSequentialLayers(layers, 4, *in_shapes)
    with _Cluster(2):    # 4 cells round-robin over 2 devices.
      pipe = gpipe.PipeliningLayer.Params().Set(
          name='pipe', cell_tpl=cells).Instantiate()
    for i, cell in enumerate(pipe.children.cells):
      for v in cell.vars.Flatten():
        self.assertEqual(f'CPU:{i % 2}', v.device.split('device:')[-1])
    self.assertEqual(['/device:CPU:0', '/device:CPU:1'], pipe.devices)

  def _Proj(self, name, act='TANH', i=4, o=4):
    return linear.ProjectionLayer.Params().Set(
        name=name, input_dim=i, output_dim=o, activation=act)

  def _AssertSame(self, layer, fprop_a, fprop_b, inputs):
    want = _LossAndGrads(layer, fprop_a, inputs)
    got = _LossAndGrads(layer, fprop_b, inputs)
    self.assertEqual(len(want), len(got))
    for w, g in zip(want, got):
      self.assertAllClose(w, g, atol=1e-5, rtol=1e-5)

  def testBeforeLayersAndForwardedActivations(self):
    # before: a projection on the whole batch (device 0); cell0 fetches its
    # first layer's output as an extra activation, which cell1 forwards.
    cell0 = gpipe.FeatureExtractionLayer.Params().Set(
        name='c0', sub=[self._Proj('a'), self._Proj('b', 'SIGMOID')],
        act_fetch_layers=['a'], num_act_outputs=1)
    cell1 = gpipe.FeatureExtractionLayer.Params().Set(
        name='c1', sub=[self._Proj('c', 'RELU', o=3)], num_act_inputs=1,
        num_act_outputs=1)
    with _Cluster(2):
      pipe = gpipe.PipeliningLayer.Params().Set(
          name='pipe', before_tpl=[self._Proj('pre', i=5)],
          cell_tpl=[cell0, cell1], num_micro_batches=4).Instantiate()
    x = (tf.random.stateless_normal([_BATCH, 5], [1, 1]),)

    def _Sequential(xs):
      c = pipe.children
      h = c.before[0].FProp(pipe.theta.before[0], xs[0])
      a = c.cells[0].children.a.FProp(pipe.theta.cells[0].a, h)
      b = c.cells[0].children.b.FProp(pipe.theta.cells[0].b, a)
      return c.cells[1].children.c.FProp(pipe.theta.cells[1].c, b), a

    out = pipe.FProp(pipe.theta, *x)
    self.assertLen(out, 2)
    self.assertEqual([_BATCH, 3], out[0].shape.as_list())
    self._AssertSame(pipe, _Sequential,
                     lambda xs: pipe.FProp(pipe.theta, *xs), x)

  def testSeqLayerRunsCellsInOrderOnTheirDevices(self):
    with _Cluster(2):
      seq = gpipe.SeqLayer.Params().Set(
          name='seq', cell_tpl=[self._Proj(f'p{i}') for i in range(3)]
      ).Instantiate()
    self.assertEqual(['CPU:0', 'CPU:1', 'CPU:0'],
                     [c.vars.w.device.split('device:')[-1]
                      for c in seq.children.cells])
    x = (tf.random.stateless_normal([_BATCH, 4], [1, 2]),)

    def _Sequential(xs):
      h = xs[0]
      for cell, th in zip(seq.children.cells, seq.theta.cells):
        h = cell.FProp(th, h)
      return h

    self._AssertSame(seq, _Sequential, lambda xs: seq.FProp(seq.theta, *xs),
                     x)

  def testErrorsNameTheNumbers(self):
    layers = _ConvLayers(0, False)
    inputs, in_shapes = _Inputs('conv', 0, False)
    cases = [
        (dict(num_micro_batches=3),
         r"PipeliningLayer 'pipe': num_micro_batches=3 does not divide batch "
         r'8 \(inputs dim batch_dim=0\)'),
        (dict(num_micro_batches=2, micro_batch_size=3),
         r'micro_batch_size=3 \* num_micro_batches=2 = 6 != batch 8'),
        (dict(micro_batch_size=3),
         r'micro_batch_size=3 does not divide batch 8'),
    ]
    for kwargs, regex in cases:
      cells = gpipe.PartitionSequentialLayers(layers, 2, *in_shapes)
      with _Cluster(2):
        pipe = gpipe.PipeliningLayer.Params().Set(
            name='pipe', cell_tpl=cells, **kwargs).Instantiate()
      with self.subTest(kwargs=kwargs):
        with self.assertRaisesRegex(ValueError, regex):
          pipe.FProp(pipe.theta, *inputs)
        # The same check, statically: FPropMeta on the shapes alone (what a
        # task runs when it is built).
        with self.assertRaisesRegex(ValueError, regex):
          gpipe.PipeliningLayer.FPropMeta(pipe.params, *in_shapes)

  def testSettingsCheckedFromParamsAlone(self):
    note = ('(tf.float16 is not supported: its range underflows small '
            'gradients without loss scaling; use tf.bfloat16)')
    p = gpipe.PipeliningLayer.Params().Set(name='pipe',
                                           state_dtype='bfloat16')
    want = ("PipeliningLayer 'pipe': state_dtype='bfloat16' must be one of "
            f'None, tf.float32, tf.bfloat16, tf.float64 {note}. Did you '
            'mean tf.bfloat16 (a dtype, not a string)?')
    with self.assertRaisesWithLiteralMatch(ValueError, want):
      gpipe.PipeliningLayer.CheckParams(p, "PipeliningLayer 'pipe'")
    with self.assertRaisesWithLiteralMatch(
        ValueError, "PipeliningLayer 'pipe': state_dtype=tf.float16 must be "
        f'one of None, tf.float32, tf.bfloat16, tf.float64 {note}.'):
      gpipe.PipeliningLayer.CheckParams(p.Copy().Set(state_dtype=tf.float16),
                                        "PipeliningLayer 'pipe'")
    # The settings every layer has, too (base_layer.CheckBaseParams).
    with self.assertRaisesWithLiteralMatch(
        ValueError, "PipeliningLayer 'pipe': is_inference=1 must be True or "
        'False.'):
      gpipe.PipeliningLayer.CheckParams(
          p.Copy().Set(state_dtype=None, is_inference=1),
          "PipeliningLayer 'pipe'")
    # The plan's entry point checks them before it reads them (an owner's
    # FPropMeta may call it first), not a KeyError.
    with self.assertRaisesWithLiteralMatch(
        ValueError, "PipeliningLayer 'pipe': schedule='GPipe' must be one of "
        "'gpipe', '1f1b', 'interleaved_1f1b', 'zb_h1', 'zb_v', 'table'. Did "
        "you mean 'gpipe'?"):
      gpipe.PipeliningLayer.Plan(
          p.Copy().Set(state_dtype=None, schedule='GPipe'), [0, 1, 2], 4,
          lambda size: ([], [], 0))

  def testCellsAgainstDevices(self):
    cells = [linear.ProjectionLayer.Params().Set(
        name=f'p{i}', input_dim=4, output_dim=4) for i in range(2)]
    with _Cluster(4):
      with self.assertRaisesWithLiteralMatch(
          ValueError, "PipeliningLayer 'pipe': 2 pipeline cell(s) on a model "
          'split of 4 devices would leave 2 device(s) idle. A replica has 4 '
          'devices: use --worker_split_size=2, or cut the model into 4 '
          'stages.'):
        gpipe.PipeliningLayer.Params().Set(name='pipe',
                                           cell_tpl=cells).Instantiate()
    # The line names where the split's size came from (the flag as the
    # user typed it: the trainer's cluster says).
    with cluster_lib.Cluster.Params().Set(
        num_devices=4, worker_split_size=4,
        split_size_from='--worker_split_size=4').Instantiate():
      with self.assertRaisesRegex(
          ValueError, r'idle\. --worker_split_size=4 gives a replica 4 '
          r'devices: use --worker_split_size=2, or cut the model into 4 '
          r'stages\.$'):
        gpipe.PipeliningLayer.Params().Set(name='pipe',
                                           cell_tpl=cells).Instantiate()
    with _Cluster(1):   # More cells than devices: allowed (and logged).
      pipe = gpipe.PipeliningLayer.Params().Set(
          name='pipe', cell_tpl=cells * 2).Instantiate()
    self.assertEqual(['/device:CPU:0'] * 4,
                     [pipe.CellDevice(i) for i in range(4)])

  def testCellsComeFromCellTplOrFromTheOwner(self):
    with self.assertRaisesRegex(ValueError, r"SeqLayer 'seq': cell_tpl=\[\] "
                                'must be a non-empty list'):
      gpipe.SeqLayer.Params().Set(name='seq').Instantiate()
    # A PipeliningLayer without cells holds settings and devices for an
    # owner that passes its cells to FPropCells (GPipeTransformerStack).
    with _Cluster(2):
      pipe = gpipe.PipeliningLayer.Params().Set(
          name='pipe', num_micro_batches=2).Instantiate()
    self.assertEqual(['/device:CPU:0', '/device:CPU:1'], pipe.devices)
    with self.assertRaisesRegex(ValueError, r"PipeliningLayer 'pipe': has no "
                                r'cells \(cell_tpl is empty\)'):
      pipe.FProp(pipe.theta, tf.ones([4, 2]))
    scale = [tf.constant(2.0), tf.constant(-1.0)]
    cells = [gpipe.PipelineCell(
        fprop=lambda th, x: x * th, theta=s,
        meta=lambda x: NestedMap(flops=0, out_shapes=(x,))) for s in scale]
    x = tf.reshape(tf.range(8.0), [4, 2])
    self.assertAllClose(-2.0 * x, pipe.FPropCells(cells, x))

  def testCellWithoutFPropMeta(self):
    class NoMeta(linear.ProjectionLayer):

      @classmethod
      def FPropMeta(cls, p, *shapes_in):
        return base_layer.BaseLayer.FPropMeta.__func__(cls, p, *shapes_in)

    pipe = gpipe.PipeliningLayer.Params().Set(
        name='pipe', num_micro_batches=2, cell_tpl=[
            NoMeta.Params().Set(name='nm', input_dim=4, output_dim=4)
        ]).Instantiate()
    with self.assertRaisesRegex(
        ValueError, r"PipeliningLayer 'pipe': cell 0 \(NoMeta "
        r"'pipe.cells\[0\]'\) has no FPropMeta.*inputs \[\[4, 4\]\]"):
      pipe.FProp(pipe.theta, tf.ones([8, 4]))


def _LossCell(nested, batch_dim, channels):
  """A PipelineCell loss: a weighted squared error against side.y, with a
  weight vector of its own (so the loss's weights get gradients too)."""
  v = tf.Variable(tf.linspace(0.5, 1.5, channels))

  def _Fprop(theta, outputs, side):
    x = outputs.x if nested else tf.nest.flatten(outputs)[0]
    axes = [a for a in range(x.shape.rank) if a != batch_dim]
    err = tf.reduce_sum((x * theta.v - side.y) ** 2, axis=axes,
                        keepdims=True)          # The batch at batch_dim.
    return NestedMap(loss=tf.reduce_sum(err), err=err,
                     count=tf.cast(tf.size(err), tf.float32))

  return gpipe.PipelineCell(fprop=_Fprop, theta=NestedMap(v=v), meta=None)


class FPropLossTest(tf.test.TestCase):
  """PipeliningLayer.FPropLoss (GPipe and 1F1B) against the sequential
  model run on each micro-batch with its seed."""

  def _Check(self, kind, k, m, batch_dim, nested, schedule, remat='never',
             dropout=0.0, use_function=False, v=1, table=''):
    """k devices, k * v cells (v stages per device); `table`: the
    schedule_table of schedules.TABLE."""
    inputs, in_shapes = _Inputs(kind, batch_dim, nested)
    stages = k * v
    layers = (_ConvLayers(batch_dim, nested, ('TANH',) * max(4, stages))
              if kind == 'conv' else
              _TransformerLayers(batch_dim, nested, dropout,
                                 num=max(stages, 2)))
    cells = gpipe.PartitionSequentialLayers(layers, stages, *in_shapes)
    with _Cluster(k):
      pipe = gpipe.PipeliningLayer.Params().Set(
          name='pipe', cell_tpl=cells, num_micro_batches=m,
          batch_dim=batch_dim, nested_map_fprop=nested, schedule=schedule,
          remat=remat, stages_per_device=v,
          schedule_table=table).Instantiate()
    x = inputs[0].x if nested else inputs[0]
    loss = _LossCell(nested, batch_dim, x.shape[-1])
    side = NestedMap(y=tf.random.stateless_normal(x.shape, [k, m]))
    seed = step_seed.MakeStepSeed(5)
    theta = base_layer.WithStepSeed(pipe.theta, seed)

    def _Pipelined():
      out = pipe.FPropLoss(pipe._OwnCells(theta), loss, *inputs,  # pylint: disable=protected-access
                           side_inputs=side, step_seed=seed)
      return 0.5 * out.loss, [out.err, out.count]

    def _Sequential():
      parts = [microbatch_parts(t, m, batch_dim)
               for t in tf.nest.flatten(inputs)]
      sides = microbatch_parts(side.y, m, batch_dim)
      res = []
      for j in range(m):
        th = base_layer.WithStepSeed(theta, step_seed.MicroBatchSeed(seed, j))
        xs = _AsTuple(tf.nest.pack_sequence_as(inputs, [p[j] for p in parts]))
        for cell, cell_theta in zip(pipe.children.cells, th.cells):
          xs = _AsTuple(cell.FProp(cell_theta, *xs))
        res.append(loss.fprop(loss.theta, xs[0] if nested else xs,
                              NestedMap(y=sides[j])))
      return 0.5 * tf.add_n([r.loss for r in res]), [
          tf.concat([r.err for r in res], batch_dim),
          tf.add_n([r.count for r in res])]

    wrt = pipe.vars.Flatten() + [loss.theta.v] + tf.nest.flatten(inputs)
    if use_function:
      _Pipelined = tf.function(_Pipelined)  # pylint: disable=invalid-name
    def _ZeroIfNone(out_grads):   # An unconnected input: None or zeros.
      out, grads = out_grads
      return out, [tf.zeros_like(x) if g is None else g
                   for g, x in zip(grads, wrt)]

    got = _ZeroIfNone(test_utils.LossAndGrads(_Pipelined, wrt))
    want = _ZeroIfNone(test_utils.LossAndGrads(_Sequential, wrt))
    self.assertAllClose(want, got, atol=1e-5, rtol=1e-5)
    return pipe, loss, side, inputs, got

  def testConvGridMatchesSequential(self):
    for k, m, bd in itertools.product((1, 2, 4), (1, 2, 4, 8), (0, 1)):
      with self.subTest(k=k, m=m, batch_dim=bd):
        self._Check('conv', k, m, bd, nested=bd == 1, schedule='1f1b')

  def testNewSchedulesGridMatchesSequential(self):
    # Interleaved, ZB-H1 and ZB-V over K devices x M micro-batches x v
    # stages per device x batch_dim, on conv cells (interleaved with M < K
    # too).
    for k, m, bd in itertools.product((1, 2, 4), (1, 2, 4, 8), (0, 1)):
      for schedule, v in (('interleaved_1f1b', 2), ('zb_h1', 1),
                          ('zb_v', 2)):
        with self.subTest(k=k, m=m, batch_dim=bd, schedule=schedule):
          self._Check('conv', k, m, bd, bd == 1, schedule, v=v)

  def testNewSchedulesTransformerRematAndDropout(self):
    for k, m, bd, nested, schedule, v, remat, fn in [
        (2, 4, 0, False, 'zb_h1', 1, 'always', False),
        (2, 4, 1, True, 'zb_h1', 2, 'except_last', True),
        (2, 4, 0, True, 'zb_v', 2, 'selective', True),
        (1, 2, 1, False, 'zb_v', 2, 'never', False),
        (2, 2, 0, False, 'interleaved_1f1b', 2, 'always', True),
        (2, 4, 1, True, 'interleaved_1f1b', 1, 'except_last', False)]:
      with self.subTest(k=k, m=m, schedule=schedule, v=v, remat=remat):
        self._Check('transformer', k, m, bd, nested, schedule, remat,
                    dropout=0.3, use_function=fn, v=v)

  def testTableEqualsItsRegisteredSchedule(self):
    # A hand-written table of ZB-H1 (here the registered one's text) gives
    # the same loss and gradients.
    table = schedules.Build('zb_h1', 2, 2, 4).Text()
    registered = self._Check('conv', 2, 4, 0, False, 'zb_h1')[-1]
    written = self._Check('conv', 2, 4, 0, False, schedules.TABLE,
                          table=table)[-1]
    self.assertAllClose(registered, written, atol=1e-6)

  def testSchedulesRematAndDropout(self):
    for k, m, bd, nested, schedule, remat in [
        (2, 4, 0, False, '1f1b', 'always'), (4, 8, 1, True, 'gpipe',
                                             'except_last'),
        (4, 4, 0, True, '1f1b', 'except_last')]:
      with self.subTest(k=k, m=m, schedule=schedule, remat=remat):
        self._Check('transformer', k, m, bd, nested, schedule, remat,
                    dropout=0.3)

  def testInFunctionAndInference(self):
    # In a graph, 'never' and 'selective' keep what remat_policy picks
    # (the dropout masks are recomputed with 'selective').
    self._Check('transformer', 2, 4, 1, True, '1f1b', remat='selective',
                dropout=0.3, use_function=True)
    pipe, loss, side, inputs, got = self._Check(
        'transformer', 2, 4, 0, False, '1f1b', use_function=True)
    # Inference (forward only) gives the same loss and metrics.
    for devices in (1, 2):
      with _Cluster(devices):
        inference = pipe.params.Copy().Set(is_inference=True).Instantiate()
      seed = step_seed.MakeStepSeed(5)
      theta = base_layer.WithStepSeed(pipe.theta, seed)
      out = inference.FPropLoss(inference._OwnCells(theta), loss, *inputs,  # pylint: disable=protected-access
                                side_inputs=side, step_seed=seed)
      self.assertAllClose(got[0], [0.5 * out.loss, [out.err, out.count]],
                          atol=1e-5)

  def testInferenceKeepsTheVPlacement(self):
    # zb_v puts 4 cells on 2 devices as a V (0, 1, 1, 0); inference runs
    # the default schedule on the cells where the weights are, and gives
    # the training step's loss and metrics.
    pipe, loss, side, inputs, got = self._Check(
        'transformer', 2, 4, 0, False, 'zb_v', v=2)
    with _Cluster(2):
      inference = pipe.params.Copy().Set(is_inference=True).Instantiate()
    out = inference.FPropLoss(inference._OwnCells(pipe.theta), loss,  # pylint: disable=protected-access
                              *inputs, side_inputs=side)
    self.assertAllClose(got[0], [0.5 * out.loss, [out.err, out.count]],
                        atol=1e-5)

  def testNeverReRunsWhenTheBatchIsOneOp(self):
    """GPipe with remat 'never' in a graph whose inputs and side inputs are
    outputs of one op (as a batch from an iterator is): every backward
    reads its kept activations, none re-runs a cell, and the gradients are
    those of the batch as separate tensors (device_call.OnDevice)."""
    (x,), in_shapes = _Inputs('conv', 0, False)
    cells = gpipe.PartitionSequentialLayers(_ConvLayers(0, False), 2,
                                            *in_shapes)
    with _Cluster(2):
      pipe = gpipe.PipeliningLayer.Params().Set(
          name='pipe', cell_tpl=cells, num_micro_batches=4,
          schedule='gpipe', remat='never').Instantiate()
    loss = _LossCell(False, 0, x.shape[-1])
    y = tf.random.stateless_normal(x.shape, [1, 2])
    wrt = pipe.vars.Flatten() + [loss.theta.v]

    def _Grads(one_op):
      def _Run(x, y):
        if one_op:
          x, y = tf.unstack(tf.stack([x, y]))
        with tf.GradientTape() as tape:
          out = pipe.FPropLoss(pipe._OwnCells(pipe.theta), loss, x,  # pylint: disable=protected-access
                               side_inputs=NestedMap(y=y))
        return tape.gradient(out.loss, wrt)
      return tf.function(_Run, autograph=False)(x, y)

    reruns = []
    backward = cell_program.CellProgram.Backward

    def _Counted(program, *args, **kwargs):
      reruns.append(program)
      return backward(program, *args, **kwargs)

    with mock.patch.object(cell_program.CellProgram, 'Backward', _Counted):
      got = _Grads(True)
    self.assertEqual([], reruns)
    self.assertAllClose(_Grads(False), got, atol=1e-6)

  def testErrors(self):
    layers = _ConvLayers(0, False)
    inputs, in_shapes = _Inputs('conv', 0, False)
    cells = gpipe.PartitionSequentialLayers(layers, 2, *in_shapes)
    with _Cluster(2):
      with self.assertRaisesRegex(
          ValueError, r"PipeliningLayer 'pipe': schedule='1F1B' must be one "
          r"of 'gpipe', '1f1b', 'interleaved_1f1b', 'zb_h1', 'zb_v', 'table'\. "
          r"Did you mean '1f1b'\?"):
        gpipe.PipeliningLayer.Params().Set(
            name='pipe', cell_tpl=cells, schedule='1F1B').Instantiate()
      pipe = gpipe.PipeliningLayer.Params().Set(
          name='pipe', cell_tpl=cells, num_micro_batches=2,
          schedule='1f1b').Instantiate()
    with self.assertRaisesRegex(
        ValueError, r"PipeliningLayer 'pipe': schedule='1f1b' runs each "
        r"micro-batch's backward inside the pipeline, so it needs the loss: "
        r'call FPropLoss'):
      pipe.FProp(pipe.theta, *inputs)
    bad = gpipe.PipelineCell(fprop=lambda th, out, side: out, theta=NestedMap(),
                             meta=None)
    with self.assertRaisesRegex(
        ValueError, r"PipeliningLayer 'pipe': the loss function must return a "
        r"NestedMap with a scalar 'loss'; got"):
      pipe.FPropLoss(pipe._OwnCells(pipe.theta), bad, *inputs,  # pylint: disable=protected-access
                     side_inputs=NestedMap())


_PLACEMENT_SCRIPT = textwrap.dedent("""
    import tensorflow as tf
    tf.debugging.set_log_device_placement(True)
    cpu = tf.config.list_physical_devices('CPU')[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 4)
    from cadence.framework import cluster as cluster_lib
    from cadence.layers import gpipe
    from cadence.layers import linear
    cells = [linear.ProjectionLayer.Params().Set(
        name='p%d' % i, input_dim=4, output_dim=4, activation=act)
             for i, act in enumerate(['TANH', 'SIGMOID', 'RELU'])]
    with cluster_lib.Cluster.Params().Set(
        num_devices=3, worker_split_size=3).Instantiate():
      pipe = gpipe.PipeliningLayer.Params().Set(
          name='pipe', cell_tpl=cells, num_micro_batches=4).Instantiate()

    @tf.function
    def Step(x):
      with tf.GradientTape() as tape:
        loss = tf.reduce_sum(pipe.FProp(pipe.theta, x))
      return tape.gradient(loss, pipe.vars.Flatten())

    Step(tf.ones([8, 4]))
""")


class PlacementTest(tf.test.TestCase):

  def testForwardAndBackwardOfCellIRunOnDeviceI(self):
    # Cell i's activation (Tanh, Sigmoid, Relu) and its gradient op are op
    # types used by cell i only.
    cell_ops = {'Tanh': 0, 'TanhGrad': 0, 'Sigmoid': 1, 'SigmoidGrad': 1,
                'Relu': 2, 'ReluGrad': 2}
    devices = test_utils.OpDevices(_PLACEMENT_SCRIPT, cell_ops)
    self.assertCountEqual(cell_ops, devices)
    for op_type, cell in cell_ops.items():
      self.assertEqual({f'CPU:{cell}'}, devices[op_type], op_type)


if __name__ == '__main__':
  tf.test.main()
