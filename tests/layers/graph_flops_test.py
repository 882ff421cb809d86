"""Tests for cadence.layers.graph_flops: FLOPs of a graph's products."""
import tensorflow as tf

from cadence.layers import graph_flops


def _Flops(fn, *shapes):
  """ProductFlops of the ops `fn` adds to a graph on placeholders."""
  graph = tf.Graph()
  with graph.as_default():
    xs = [tf.compat.v1.placeholder(tf.float32, s) for s in shapes]
    first = len(graph.get_operations())
    fn(*xs)
    return graph_flops.ProductFlops(graph.get_operations()[first:])


class ProductFlopsTest(tf.test.TestCase):

  def testEachProductHandCounted(self):
    m, k, n = 3, 5, 7
    self.assertEqual(2 * m * k * n, _Flops(tf.matmul, [m, k], [k, n]))
    self.assertEqual(2 * m * k * n, _Flops(
        lambda a, b: tf.matmul(a, b, transpose_a=True, transpose_b=True),
        [k, m], [n, k]))
    # Batched, the weight broadcast over the batch: [2, 3, k] x [k, n].
    self.assertEqual(2 * 2 * m * k * n, _Flops(
        lambda a, b: tf.linalg.matmul(a, b), [2, m, k], [k, n]))
    # Attention scores: b n t h, b n s h -> b n t s.
    self.assertEqual(2 * 2 * 4 * 5 * 6 * 8, _Flops(
        lambda q, kk: tf.einsum('bnth,bnsh->bnts', q, kk),
        [2, 4, 5, 8], [2, 4, 6, 8]))
    # Conv2D 3x3 VALID, 2 -> 4 channels on 9x9: 7x7 outputs.
    self.assertEqual(2 * 3 * 7 * 7 * 4 * 3 * 3 * 2, _Flops(
        lambda x, w: tf.nn.conv2d(x, w, 1, 'VALID'), [3, 9, 9, 2],
        [3, 3, 2, 4]))

  def testOtherOpsCountNothingAndUnknownDimsGiveNone(self):
    self.assertEqual(0, _Flops(lambda a, b: tf.nn.relu(a + b), [4, 4],
                               [4, 4]))
    self.assertEqual(0, _Flops(lambda t: tf.gather(t, [1, 2]), [10, 4]))
    self.assertIsNone(_Flops(tf.matmul, [None, 5], [5, 7]))


if __name__ == '__main__':
  tf.test.main()
