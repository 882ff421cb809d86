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

  def testAttentionHoldsItsParts(self):
    # 6 = examples x heads of queries [16, 4] over keys and values [8, 4].
    op = op_cost.Attention(6, 16, 8, 4, size=2)
    scores, soft, context = op.dims.parts
    self.assertEqual((op_cost.MATMUL, op_cost.SOFTMAX, op_cost.MATMUL),
                     (scores.kind, soft.kind, context.kind))
    self.assertEqual((6, 16, 4, 8, False, 2), scores.dims)   # q k^T.
    self.assertEqual((6, 16, 8, 4, False, 2), context.dims)  # probs v.
    self.assertEqual(2 * 2 * 6 * 16 * 8 * 4 + 5 * 6 * 16 * 8, op.flops)
    self.assertEqual(op_cost.Sum(op.dims.parts, 'bytes'), op.bytes)
    self.assertEqual([scores, soft, context], op_cost.Unfused([op]))
    self.assertFalse(op.dims.fused)
    # Its gradient: one attention op of its parts' gradients, in order.
    (back,) = op_cost.Backward(op)
    self.assertEqual(op_cost.ATTENTION, back.kind)
    self.assertTrue(back.dims.backward)
    self.assertEqual(op_cost.Gradient(op.dims.parts), list(back.dims.parts))
    self.assertEqual(2 * op.flops, back.flops)
    self.assertEqual(op_cost.Gradient([scores, op]),
                     list(op_cost.Backward(scores)) + [back])

  def testFusedAttentionReadsQKVAndTheOutputOnly(self):
    op = op_cost.Attention(6, 16, 8, 4, size=2, fused=True)
    self.assertTrue(op.dims.fused)
    flops, num_bytes, dims = op_cost.FusedAttention(op)
    # Forward: q k^T and probs v, 2 x 2 b tq tk dh; q and the output
    # [16, 4], k and v [8, 4] once each, no [16, 8] scores.
    self.assertEqual(4 * 6 * 16 * 8 * 4, flops)
    self.assertEqual(2 * 6 * (2 * 16 * 4 + 2 * 8 * 4), num_bytes)
    self.assertEqual((6, 16, 4, 8, False, 2), dims)
    # Backward: the scores again and four gradient products (2.5 x); reads
    # q, k, v, the output and its gradient, writes dq, dk, dv.
    flops, num_bytes, _ = op_cost.FusedAttention(op_cost.Backward(op)[0])
    self.assertEqual(2.5 * 4 * 6 * 16 * 8 * 4, flops)
    self.assertEqual(2 * 6 * (4 * 16 * 4 + 4 * 8 * 4), num_bytes)


if __name__ == '__main__':
  unittest.main()
