"""Tests for cadence.framework.op_cost: ops' FLOPs, bytes and gradients,
worked out by hand."""
import unittest

from cadence.framework import op_cost


class OpCostTest(unittest.TestCase):

  def testMatMulWithAWeight(self):
    # [3, 4, 5] x [5, 6], bfloat16: the weight read once for the batch.
    op = op_cost.MatMul(3, 4, 5, 6, size=2)
    self.assertEqual(op_cost.MATMUL, op.kind)
    self.assertEqual(2 * 3 * 4 * 5 * 6, op.flops)
    self.assertEqual(2 * (3 * 4 * 5 + 5 * 6 + 3 * 4 * 6), op.bytes)
    dx, dw = op_cost.Backward(op)
    # dx [3, 4, 6] x [6, 5]; dw: [5, 12] x [12, 6], summed over the batch.
    self.assertEqual((3, 4, 6, 5, True, 2), dx.dims)
    self.assertEqual((1, 5, 12, 6, False, 2), dw.dims)
    self.assertEqual([op.flops] * 2, [dx.flops, dw.flops])
    self.assertEqual(2 * (5 * 12 + 12 * 6 + 5 * 6), dw.bytes)

  def testMatMulOfActivations(self):
    # Attention's scores: [b h, tq, dh] x [b h, dh, tk], both per batch.
    op = op_cost.MatMul(8, 16, 4, 16, size=4, weight=False)
    self.assertEqual(4 * 8 * (16 * 4 + 4 * 16 + 16 * 16), op.bytes)
    da, db = op_cost.Backward(op)
    self.assertEqual((8, 16, 16, 4, False, 4), da.dims)
    self.assertEqual((8, 4, 16, 16, False, 4), db.dims)
    self.assertEqual([op.flops] * 2, [da.flops, db.flops])

  def testMemoryBoundOps(self):
    add = op_cost.Elementwise(10, size=2, reads=2)
    self.assertEqual((10, 2 * 10 * 3), (add.flops, add.bytes))
    norm = op_cost.Norm(10, size=4)
    self.assertEqual((70, 80), (norm.flops, norm.bytes))
    soft = op_cost.Softmax(10, size=4)
    self.assertEqual((50, 80), (soft.flops, soft.bytes))
    # A gradient reads what the op read and the gradient, writes one.
    (back,) = op_cost.Backward(norm)
    self.assertEqual((op_cost.NORM, 140, 160),
                     (back.kind, back.flops, back.bytes))
    gather = op_cost.Gather(rows=6, dim=8, size=2)
    self.assertEqual((0, 2 * 2 * 6 * 8), (gather.flops, gather.bytes))
    self.assertEqual((gather,), op_cost.Backward(gather))

  def testOtherAndSum(self):
    other = op_cost.Other(100, 40)
    self.assertEqual((op_cost.OTHER, 200, 80),
                     op_cost.Backward(other)[0][:3])
    ops = (other, op_cost.Elementwise(10, 4))
    self.assertEqual(110, op_cost.Sum(ops))
    self.assertEqual(40 + 80, op_cost.Sum(ops, 'bytes'))


if __name__ == '__main__':
  unittest.main()
