"""Tests for layers/gpipe_stack.py (and the units contract it is made of).

The reference is the same stack unpipelined (pipeline_tpl None: the same
variable paths, so the same initial weights) on the whole batch: a
pipeline of one's own layers must equal it, loss and gradients, with every
schedule, loss inside or outside the pipeline.
"""
import numpy as np
import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import cluster as cluster_lib
from cadence.framework import shapes
from cadence.framework import testing
from cadence.layers import gpipe
from cadence.layers import gpipe_stack
from cadence.layers import gpipe_units
from cadence.layers import linear
from cadence.tests import bad_units
from cadence.tests import test_utils

NestedMap = base_layer.NestedMap
_BATCH, _DIM = 8, 6


def _Params(num_units=4, units=None, **kw):
  units = units or [linear.FeedForwardNet.Params().Set(
      input_dim=_DIM, hidden_layer_dims=[2 * _DIM, _DIM],
      activation=['RELU', 'NONE']) for _ in range(num_units)]
  kw.setdefault('example_shape', [_DIM])
  return gpipe_stack.GPipeStack.Params().Set(name='stack', units=units, **kw)


def _Build(p, k):
  with cluster_lib.Cluster.Params().Set(num_devices=k,
                                        worker_split_size=k).Instantiate():
    return p.Instantiate()


def _LossCell(w):
  return gpipe.PipelineCell(
      fprop=lambda th, out, side: NestedMap(
          loss=tf.reduce_sum(out * side.w), rows=tf.reduce_sum(out, 1)),
      theta=NestedMap(), meta=None)


class GPipeStackTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    rng = np.random.default_rng(0)
    self.x = tf.constant(rng.normal(size=[_BATCH, _DIM]).astype(np.float32))
    self.w = tf.constant(rng.normal(size=[_BATCH, _DIM]).astype(np.float32))

  def _Loss(self, stack):
    """(the loss NestedMap, the gradients of its loss)."""
    def _Fn():
      out = stack.FPropLoss(stack.theta, self.x, loss=_LossCell(self.w),
                            side_inputs=NestedMap(w=self.w))
      return out.loss, out
    (_, out), grads = test_utils.LossAndGrads(_Fn, stack.vars.Flatten())
    return out, grads

  def testEveryScheduleEqualsTheUnpipelinedStack(self):
    ref = _Params(pipeline_tpl=None).Instantiate()
    want, want_grads = self._Loss(ref)
    self.assertAllClose(want.loss, tf.reduce_sum(ref(self.x) * self.w))
    # The test kit's grid and comparison (cadence.framework.testing).
    for layout in testing.Layouts(
        ('gpipe', '1f1b', ('interleaved_1f1b', 2), 'zb_h1', ('zb_v', 2)),
        (1, 2), (1, 4)):
      k, v = layout.splits, layout.stages_per_device
      p = _Params(splits=k)
      p.pipeline_tpl.Set(schedule=layout.schedule, stages_per_device=v,
                         num_micro_batches=layout.micro_batches)
      stack = _Build(p, k)
      self.assertEqual(k * v, stack.num_cells, layout.Name())
      got, grads = self._Loss(stack)
      same = testing.CompareLossAndGrads(
          layout.Name(), (want.loss, dict(enumerate(want_grads))),
          (got.loss, dict(enumerate(grads))), atol=1e-5, rtol=1e-6)
      self.assertTrue(same.ok, same.Line())
      self.assertAllClose(want.rows, got.rows, atol=1e-5, msg=layout.Name())

  def testTablesInAnyBackwardOrderEqualTheUnpipelinedStack(self):
    # With the loss after the pipeline a stage's backwards of different
    # micro-batches do not wait for each other (its cells carry no state
    # from one to the next): a table in GPipe's order (B(s, 0) first) runs
    # as the reversed one does, and both equal the unpipelined stack.
    ref = _Params(pipeline_tpl=None).Instantiate()
    want, want_grads = self._Loss(ref)
    forwards = lambda s: ' '.join(f'F{s}:{j}' for j in range(4))
    for order in (range(4), reversed(range(4))):
      backwards = lambda s, order=list(order): ' '.join(
          f'B{s}:{j}' for j in order)
      table = (f'{forwards(0)} {backwards(0)} | '
               f'{forwards(1)} {backwards(1)}')
      p = _Params(splits=2)
      p.pipeline_tpl.Set(schedule='table', schedule_table=table,
                         num_micro_batches=4)
      got, grads = self._Loss(_Build(p, 2))
      self.assertAllClose(want.loss, got.loss, atol=1e-5, msg=table)
      for g, wg in zip(grads, want_grads):
        self.assertAllClose(wg, g, atol=1e-5, msg=table)

  def testLayersBeforeTheUnitsRunOnceOnTheWholeBatch(self):
    # An input layer of one's own (before_tpl: 4 features -> _DIM) before
    # the units, not cut: every schedule equals the same stack unpipelined,
    # and the plan counts, sizes and builds it as its `before`.
    embed = linear.ProjectionLayer.Params().Set(input_dim=4,
                                                output_dim=_DIM)
    x = tf.constant(np.random.default_rng(1).normal(
        size=[_BATCH, 4]).astype(np.float32))
    ref = _Params(pipeline_tpl=None, before_tpl=[embed],
                  example_shape=[4]).Instantiate()
    self.x, x_dim = x, self.x
    try:
      want, want_grads = self._Loss(ref)
      h = ref.children.before[0](x)   # The units on the embedded input.
      for unit in ref.children.units:
        h = unit(h)
      self.assertAllClose(want.loss, tf.reduce_sum(h * self.w), atol=1e-5)
      for schedule in ('gpipe', '1f1b', 'zb_h1'):
        p = _Params(splits=2, before_tpl=[embed],
                    example_shape=[4])
        p.pipeline_tpl.Set(schedule=schedule, num_micro_batches=4)
        stack = _Build(p, 2)
        self.assertTrue(stack.children.before[0].vars.w.device.endswith(
            stack.UnitDevice(0)[len('/device'):]), schedule)
        got, grads = self._Loss(stack)
        self.assertAllClose(want.loss, got.loss, atol=1e-5, msg=schedule)
        for g, wg in zip(grads, want_grads):
          self.assertAllClose(wg, g, atol=1e-5, msg=schedule)
      plan = p.cls.FPropMeta(p, shapes.Shape([_BATCH, 4])).plan
      [before] = plan.before
      self.assertEqual(  # The product and the bias.
          2 * _BATCH * 4 * _DIM + _BATCH * _DIM, before.cost.flops)
      self.assertCountEqual([([4, _DIM], tf.float32, True),
                             ([_DIM], tf.float32, True)],
                            [(list(s), d, t)
                             for s, d, t in before.Variables()])
      layers, fn, specs, _ = before.build()
      out = fn([layer.theta for layer in layers],
               tf.zeros([_BATCH, 4]))
      self.assertEqual([_BATCH, _DIM], out.shape.as_list())
      self.assertEqual([[_BATCH, 4]], [s.shape.as_list() for s in specs])
    finally:
      self.x = x_dim

  def testVariablesAreTheUnitsWhateverTheCut(self):
    paths = [[k for k, _ in _Build(_Params(splits=k), k).vars.FlattenItems()]
             for k in (1, 2)]
    self.assertEqual(paths[0], paths[1])
    self.assertIn('units[3].fc[1].w', paths[0])
    stack = _Build(_Params(splits=2), 2)
    for u in range(4):
      for v in stack.vars.units[u].Flatten():
        self.assertEqual(f'CPU:{u // 2}', v.device.split('device:')[-1])
    # Each variable of a unit is that unit's (UnitOfVariables).
    unit_of = gpipe_units.UnitOfVariables(stack)
    self.assertEqual({f'stack.units[{u}].fc[{i}].{n}': u for u in range(4)
                      for i in range(2) for n in ('b', 'w')}, unit_of)

  def testPlanIsTheUnitsCostsAndTheSchedule(self):
    p = _Params(splits=2)
    p.pipeline_tpl.Set(num_micro_batches=4, schedule='1f1b')
    meta = p.cls.FPropMeta(p, shapes.Shape([_BATCH, _DIM]))
    plan = meta.plan
    ffn = linear.FeedForwardNet.FPropMeta(
        base_layer.InheritParams(p, p.units[0]).Set(name='ffn'),
        shapes.Shape([_BATCH, _DIM]))
    self.assertEqual(4 * ffn.flops, meta.flops)
    self.assertEqual([0, 2, 4], plan.bounds)
    self.assertEqual(('1f1b', 4, 2), (plan.schedule.name,
                                      plan.num_micro_batches,
                                      plan.micro_batch_size))
    self.assertEqual(meta.flops, sum(plan.StageFlops()))
    # A stage passes on its last unit's outputs: [2, 6] float32 rows.
    self.assertEqual([2 * _DIM * 4] * 2, [c.out for c in plan.cells])
    unit = base_layer.FPropCost(
        base_layer.InheritParams(p, p.units[0]), shapes.Shape([2, _DIM]))
    self.assertEqual(2 * unit.act, plan.cells[0].act)
    # Variables per unit, built without weights: the real ones' shapes.
    stack = _Build(p, 2)
    self.assertEqual(
        [(v.shape, v.dtype) for v in stack.vars.units[0].Flatten()],
        [(s, d) for s, d, _ in plan.units[0].Variables()])

  def testUnitsAreCostedOncePerMicroBatchSize(self):
    # The planner re-plans thousands of layouts: a size's costs are worked
    # out once (the same records), and equal the unit's own FPropCost.
    p = _Params(splits=2)
    plan = p.cls.FPropMeta(p, shapes.Shape([_BATCH, _DIM])).plan
    for size in (1, 4):
      first, again = plan.UnitsAt(size), plan.Replan(
          micro_batch_size=size).UnitsAt(size)
      self.assertEqual([id(u.cost) for u in first],
                       [id(u.cost) for u in again])
      unit = base_layer.FPropCost(base_layer.InheritParams(p, p.units[0]),
                                  shapes.Shape([size, _DIM]))
      self.assertEqual(unit.flops, first[0].cost.flops)
      self.assertEqual(unit.act, first[0].cost.act)

  def testCutByFlopsOfTheExampleOrEqualUnits(self):
    units = _Params().units
    wide = linear.FeedForwardNet.Params().Set(
        input_dim=_DIM, hidden_layer_dims=[16 * _DIM, _DIM],
        activation=['RELU', 'NONE'])
    p = gpipe_stack.GPipeStack.Params().Set(
        name='stack', units=[wide] + units, splits=2, example_shape=[_DIM])
    self.assertEqual([0, 1, 5], gpipe_units.Bounds(p.cls, p))
    p.example_shape = None   # Equal units: 5 split 2 + 3.
    self.assertEqual([0, 2, 5], gpipe_units.Bounds(p.cls, p))

  def testUnitShapesAreCheckedAtTheFirstTrace(self):
    # A unit whose FPropMeta states twice the batch, which nothing after
    # it checks statically: the first trace names it and both shapes,
    # unpipelined (as it runs) and pipelined (before the pipeline sizes
    # its stages by the stated shapes).
    units = _Params().units[:1] + [
        bad_units.WrongBatch.Params().Set(dim=_DIM)] + _Params().units[1:3]
    for splits, pipe in ((1, None), (2, gpipe.PipeliningLayer.Params().Set(
        num_micro_batches=4, schedule='1f1b'))):
      p = _Params(units=units, splits=splits, pipeline_tpl=pipe)
      stack = _Build(p, splits)
      size = _BATCH if pipe is None else _BATCH // 4
      with self.subTest(pipelined=pipe is not None):
        with self.assertRaisesRegex(
            ValueError, rf"^WrongBatch 'stack\.units\[1\]' \(params "
            rf"'units\[1\]'\): FPropMeta "
            rf'states output shape\(s\) \[{2 * size}, 6\] but FProp gives '
            rf'\[{size}, 6\] on input\(s\) \[{size}, 6\]; FPropMeta\'s '
            "out_shapes must be FProp's"):
          self._Loss(stack)

  def testAWrongStatedShapeIsBlamedOnItsUnit(self):
    # The next unit refuses [b, 12]; the unit that stated it is named.
    units = _Params().units
    units[1] = bad_units.WrongShape.Params().Set(dim=_DIM)
    with self.assertRaisesRegex(
        ValueError, r"^WrongShape \(params 'units\[1\]'\): FPropMeta "
        r'states output shape\(s\) '
        r'\[8, 12\] but FProp gives \[8, 6\] on input\(s\) \[8, 6\]'):
      p = _Params(units=units, pipeline_tpl=None)
      p.cls.FPropMeta(p, shapes.Shape([_BATCH, _DIM]))

  def testBadParams(self):
    with self.assertRaisesRegex(ValueError, r"GPipeStack 'stack': units=\[\] "
                                'must be a non-empty list of layer params'):
      gpipe_stack.GPipeStack.Params().Set(name='stack').Instantiate()
    with self.assertRaisesRegex(ValueError, r"GPipeStack 'stack': splits=5 "
                                r'must be in \[1, 4\]; each stage needs a '
                                r'unit\.'):
      _Params(splits=5).Instantiate()
    p = _Params()
    p.pipeline_tpl.num_micro_batches = 3
    with self.assertRaisesRegex(ValueError, 'num_micro_batches=3 does not '
                                'divide batch 8'):
      p.cls.FPropMeta(p, shapes.Shape([_BATCH, _DIM]))
    p = _Params()
    p.units[2] = linear.FeedForwardNet
    with self.assertRaisesRegex(ValueError, r"^GPipeStack 'stack': units\[2\]"
                                r"=<class '.*FeedForwardNet'> is a layer "
                                r'class, not its params: pass '
                                r'FeedForwardNet\.Params\(\)'):
      p.Instantiate()
    p.units[2] = 'ffn'
    with self.assertRaisesRegex(ValueError, r"units\[2\]='ffn' is not a "
                                r"layer's params"):
      p.Instantiate()
    p = _Params(example_shape=[_DIM, 1])
    with self.assertRaisesRegex(ValueError, r"^GPipeStack 'stack': "
                                r'example_shape=\[6, 1\] must be one example '
                                r'of the inputs \[batch, \.\.\.\]: \[6\] '
                                r'\(the inputs are \[8, 6\]\)\.$'):
      p.cls.FPropMeta(p, shapes.Shape([_BATCH, _DIM]))


if __name__ == '__main__':
  tf.test.main()
