"""Tests for cadence.framework.cost: Complete's documented defaults, Chain,
Bytes. Every expected figure is worked out by hand in the test (ints, no
numpy): elements x the dtype's size."""
import tensorflow as tf

from cadence.framework import cost
from cadence.framework import op_cost
from cadence.framework.nested_map import NestedMap
from cadence.framework.shapes import Shape

_FILLED = ('bwd_flops', 'act', 'act_weights', 'residuals', 'transient',
           'act_outputs', 'act_inputs', 'ops')


class CompleteTest(tf.test.TestCase):

  def testALayerThatSaysNothing(self):
    # Input [2, 5] and output [2, 3]: 10 + 6 elements.
    record = cost.Cost(flops=100, out_shapes=(Shape([2, 3]),))
    for dtype, size in ((tf.float32, 4), (tf.bfloat16, 2)):
      with self.subTest(dtype=dtype.name):
        c = cost.Complete(record, (Shape([2, 5]),), dtype)
        self.assertIsInstance(c, cost.Cost)
        self.assertEqual(c.flops, 100)
        self.assertEqual(c.bwd_flops, 2 * 100)
        self.assertEqual(c.act, (10 + 6) * size)
        self.assertEqual(c.act_weights, (10 + 6) * size)
        self.assertEqual(c.residuals, (10 + 6) * size)
        self.assertEqual(c.transient, 6 * size)
        self.assertEqual(c.act_inputs, 10 * size)   # The default act's.
        self.assertIsNone(c.weight_bytes)
        self.assertEqual(c.out_shapes, (Shape([2, 3]),))
        # One `other` op: its FLOPs at the flat rate, its act's bytes.
        self.assertEqual((op_cost.Other(100, (10 + 6) * size),), c.ops)
        self.assertEqual(c.defaulted, _FILLED)
    # The record itself is not changed.
    self.assertIsNone(record.act)
    self.assertEqual(record.defaulted, ())

  def testALayerThatSaysActOnly(self):
    record = cost.Cost(flops=100, out_shapes=(Shape([2, 3]),), act=1000)
    c = cost.Complete(record, (Shape([2, 5]),), tf.float32)
    self.assertEqual(c.act, 1000)
    self.assertEqual(c.act_weights, 1000)    # = act, not the inputs' bytes.
    self.assertEqual(c.residuals, 1000)
    self.assertEqual(c.transient, 6 * 4)
    self.assertEqual(c.bwd_flops, 200)
    self.assertEqual(c.act_outputs, 0)       # Outputs counted beside act.
    self.assertEqual(c.act_inputs, 0)        # Inputs too.
    self.assertEqual(c.ops, (op_cost.Other(100, 1000),))
    self.assertEqual(c.defaulted, ('bwd_flops', 'act_weights', 'residuals',
                                   'transient', 'act_outputs', 'act_inputs',
                                   'ops'))

  def testALayerThatSaysEverything(self):
    record = cost.Cost(flops=0, out_shapes=(Shape([2, 3]),), bwd_flops=7,
                       act=0, act_weights=1, residuals=2, transient=3,
                       weight_bytes=4, act_outputs=5, act_inputs=6, ops=())
    c = cost.Complete(record, (Shape([2, 5]),), tf.float32)
    self.assertEqual(
        [c[f] for f in cost.FIELDS[1:]], [0, 7, 0, 1, 2, 3, 4, 5, 6, ()])
    self.assertEqual(c.defaulted, ())

  def testUnknownBatch(self):
    record = cost.Cost(flops=None, out_shapes=(Shape([None, 3]),))
    c = cost.Complete(record, (Shape([None, 5]),), tf.float32)
    for field in _FILLED:
      if field != 'act_outputs':   # act_inputs: the unknown inputs'.
        self.assertIsNone(c[field], field)
    self.assertEqual(c.act_outputs, 0)      # Known without the batch.
    self.assertEqual(c.defaulted, _FILLED)
    # What the layer says stands; what follows from it too.
    c = cost.Complete(record.Replace(act=64), (Shape([None, 5]),),
                      tf.float32)
    self.assertEqual((c.act, c.act_weights, c.residuals), (64, 64, 64))
    self.assertIsNone(c.transient)
    self.assertIsNone(c.bwd_flops)

  def testDefaultedNamesExactlyTheFilledFields(self):
    record = cost.Cost(flops=10, out_shapes=(Shape([4]),), act=8,
                       transient=2, act_outputs=4, act_inputs=4, ops=())
    c = cost.Complete(record, (Shape([4]),), tf.float32)
    self.assertEqual(c.defaulted, ('bwd_flops', 'act_weights', 'residuals'))
    # Completing again fills nothing and keeps the names.
    again = cost.Complete(c, (Shape([4]),), tf.float32)
    self.assertEqual(again, c)
    self.assertEqual(again.defaulted, c.defaulted)

  def testExtraKeysAndANestedMapRecord(self):
    record = cost.Cost(flops=3, out_shapes=(), breakdown=[('net', 3)])
    c = cost.Complete(record, (Shape([2]),), tf.float32)
    self.assertEqual(c.breakdown, [('net', 3)])
    self.assertEqual(c.act, 2 * 4)           # The input alone; no output.
    self.assertEqual(c.transient, 0)
    # A layer not yet returning a Cost: its NestedMap is taken as one.
    c = cost.Complete(NestedMap(flops=3, out_shapes=(Shape([2]),)),
                      (Shape([2]),), tf.float32)
    self.assertIsInstance(c, cost.Cost)
    self.assertEqual((c.bwd_flops, c.act, c.transient), (6, 16, 8))

  def testReplace(self):
    record = cost.Cost(flops=1, out_shapes=(Shape([2]),), act=4)
    other = record.Replace(act=8, plan='p')
    self.assertIsInstance(other, cost.Cost)
    self.assertEqual((other.act, other.plan, other.flops), (8, 'p', 1))
    self.assertEqual(record.act, 4)
    self.assertNotIn('plan', record)


def _Full(flops, act, transient, out, defaulted=(), **kw):
  """A complete record: act_weights act/2, residuals act/4, act_outputs
  act/8."""
  values = dict(flops=flops, bwd_flops=2 * flops, act=act,
                act_weights=act // 2, residuals=act // 4, transient=transient,
                weight_bytes=100, act_outputs=act // 8,
                ops=(op_cost.Other(flops),))
  values.update(kw)
  return cost.Cost(out_shapes=(Shape(out),), defaulted=defaulted, **values)


class ChainTest(tf.test.TestCase):

  def testSumsAndMax(self):
    a = _Full(10, 40, 7, [2, 3], defaulted=('bwd_flops', 'transient'))
    b = _Full(20, 80, 5, [2, 4], defaulted=('act_weights', 'bwd_flops'))
    c = cost.Chain([a, b])
    self.assertIsInstance(c, cost.Cost)
    self.assertEqual(c.flops, 30)
    self.assertEqual(c.bwd_flops, 60)
    self.assertEqual(c.act, 120)
    self.assertEqual(c.act_weights, 20 + 40)
    self.assertEqual(c.residuals, 10 + 20)
    self.assertEqual(c.weight_bytes, 200)
    # Not the sum: a's backward runs after b's has freed b's act (80),
    # which exceeds a's transient (7): b's own, 5.
    self.assertEqual(c.transient, 5)
    # A first record whose transient outlasts what the others free.
    big = cost.Chain([_Full(10, 40, 200, [2, 3]), b])
    self.assertEqual(big.transient, 200 - 80)
    self.assertEqual(c.out_shapes, (Shape([2, 4]),))   # The last one's.
    self.assertEqual(c.act_outputs, 80 // 8)           # The last one's.
    self.assertEqual(c.ops, a.ops + b.ops)             # In order.
    self.assertEqual(c.defaulted, ('bwd_flops', 'transient', 'act_weights'))

  def testATensorPassedOnCountsOnce(self):
    # a's output (act_outputs 40 // 8 = 5) is what b keeps of its input
    # (act_inputs 4 of them): counted once in act and act_weights.
    a = _Full(10, 40, 90, [2, 3], act_inputs=3)
    b = _Full(20, 80, 5, [2, 4], act_inputs=4)
    c = cost.Chain([a, b])
    self.assertEqual(c.act, 40 + 80 - 4)
    self.assertEqual(c.act_weights, 20 + 40 - 4)
    self.assertEqual(c.residuals, 10 + 20)           # W reads no input.
    # At a's backward b's act is free but for the 4 bytes a's act holds.
    self.assertEqual(c.transient, 90 - (80 - 4))
    self.assertEqual((c.act_inputs, c.act_outputs), (3, 80 // 8))
    # A record that does not say what it keeps of its input shares nothing.
    self.assertEqual(cost.Chain([a, b.Replace(act_inputs=None)]).act, 120)

  def testNonePropagates(self):
    a = _Full(10, 40, 7, [2, 3])
    for field in ('flops', 'act', 'residuals', 'weight_bytes', 'transient'):
      with self.subTest(field=field):
        c = cost.Chain([a, _Full(20, 80, 5, [2]).Replace(**{field: None})])
        self.assertIsNone(c[field])
        others = [f for f in ('bwd_flops', 'act_weights') if f != field]
        for f in others:
          self.assertIsNotNone(c[f])

  def testOneAndNone(self):
    a = _Full(10, 40, 7, [2, 3])
    self.assertEqual(cost.Chain([a]), a)
    empty = cost.Chain([])
    self.assertEqual([empty[f] for f in cost.FIELDS],
                     [(), 0, 0, 0, 0, 0, 0, 0, 0, 0, ()])

  def testCompletedChainOfLayers(self):
    # Two layers [2, 5] -> [2, 3] -> [2, 1] that say nothing, completed
    # then chained: each one's inputs and outputs.
    one = cost.Complete(cost.Cost(flops=60, out_shapes=(Shape([2, 3]),)),
                        (Shape([2, 5]),), tf.float32)
    two = cost.Complete(cost.Cost(flops=12, out_shapes=(Shape([2, 1]),)),
                        (Shape([2, 3]),), tf.float32)
    c = cost.Chain([one, two])
    self.assertEqual(c.act, (10 + 6) * 4 + (6 + 2) * 4)
    # one's transient (its output, 24) is less than two's act (32), freed
    # by then: two's own (its output, 8).
    self.assertEqual(c.transient, 2 * 4)
    self.assertEqual(c.bwd_flops, 2 * 72)
    self.assertIsNone(c.weight_bytes)       # Neither says.
    self.assertEqual(c.defaulted, _FILLED)


class BytesTest(tf.test.TestCase):

  def testShapes(self):
    f32 = tf.float32
    self.assertEqual(cost.Bytes(Shape([2, 3]), f32), 24)
    self.assertEqual(cost.Bytes([2, 3], f32), 24)         # A list of dims.
    self.assertEqual(cost.Bytes((2, 3), tf.bfloat16), 12)
    self.assertEqual(cost.Bytes(Shape([]), f32), 4)       # A scalar.
    self.assertEqual(cost.Bytes((), f32), 0)              # No tensors.
    self.assertEqual(cost.Bytes((Shape([2, 3]), Shape([4])), f32),
                     (6 + 4) * 4)
    self.assertIsNone(cost.Bytes((Shape([2, 3]), Shape([None, 4])), f32))

  def testNested(self):
    nest = NestedMap(x=Shape([2, 3]), y=(Shape([4]), [5, 1]),
                     z=NestedMap(w=Shape([1, 2, 2])))
    self.assertEqual(cost.Bytes(nest, tf.float32), (6 + 4 + 5 + 4) * 4)
    self.assertEqual(cost.Bytes((nest, Shape([3])), tf.float64),
                     (6 + 4 + 5 + 4 + 3) * 8)
    nest.z.w = Shape([None, 2])
    self.assertIsNone(cost.Bytes(nest, tf.float32))


if __name__ == '__main__':
  tf.test.main()
