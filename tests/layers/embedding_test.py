"""Tests for cadence.layers.embedding."""

import numpy as np
import tensorflow as tf

from cadence.framework import shapes
from cadence.layers import embedding
from cadence.tests import test_utils


def _NpSinusoid(pos, dim, min_ts, max_ts):
  half = dim // 2
  inv = np.array([1.0 / (min_ts * (max_ts / min_ts) ** (i / max(half - 1, 1)))
                  for i in range(half)])
  scaled = np.asarray(pos, np.float64)[..., None] * inv
  return np.concatenate([np.sin(scaled), np.cos(scaled)], axis=-1)


def _TracedShape(fn, shape, dtype=tf.int32):
  traced = tf.function(fn, input_signature=[tf.TensorSpec(shape, dtype)])
  return shapes.Shape(traced.get_concrete_function().structured_outputs.shape)


class EmbeddingLayerTest(tf.test.TestCase):

  def _Build(self, **kwargs):
    p = embedding.EmbeddingLayer.Params().Set(
        name='emb', vocab_size=7, embedding_dim=4, **kwargs)
    layer = p.Instantiate()
    table = test_utils.Rand([7, 4], 0)
    layer.vars.emb.assign(table)
    return p, layer, table

  def testNumpyReference(self):
    _, layer, table = self._Build()
    ids = np.array([[0, 3, 6], [2, 2, 1]])
    self.assertAllClose(layer(tf.constant(ids)), table[ids], atol=0)
    _, scaled, table = self._Build(scale_sqrt_depth=True)
    self.assertAllClose(scaled(tf.constant(ids)), table[ids] * 2.0, atol=1e-6)

  def testEagerEqualsFunctionAndGradient(self):
    _, layer, _ = self._Build()
    ids = tf.constant([[1, 1, 5]])
    self.assertAllEqual(layer(ids), tf.function(layer.FProp)(layer.theta, ids))
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(layer(ids))
    g = tf.convert_to_tensor(tape.gradient(loss, layer.vars.emb))
    # Each occurrence of an id adds 1 to every element of its row.
    want = np.zeros([7, 4])
    want[1] = 2.0
    want[5] = 1.0
    self.assertAllClose(g, want, atol=0)

  def testBfloat16(self):
    _, layer, table = self._Build(fprop_dtype=tf.bfloat16)
    y = layer(tf.constant([3, 4]))
    self.assertEqual(y.dtype, tf.bfloat16)
    # |table| <= 1, bfloat16 rounding is 2^-8 relative.
    self.assertAllClose(tf.cast(y, tf.float32), table[[3, 4]], atol=4e-3)

  def testBadParams(self):
    with self.assertRaisesRegex(
        ValueError, r"EmbeddingLayer 'emb': vocab_size=0 must be an int "
        '>= 1'):
      embedding.EmbeddingLayer.Params().Set(
          name='emb', embedding_dim=3).Instantiate()
    with self.assertRaisesRegex(
        ValueError, r"EmbeddingLayer 'emb': embedding_dim=2.5 must be an "
        'int >= 1'):
      embedding.EmbeddingLayer.Params().Set(
          name='emb', vocab_size=3, embedding_dim=2.5).Instantiate()

  def testFPropMeta(self):
    p, layer, _ = self._Build()
    for shape in ([3], [2, 5], [2, 1, 3]):
      meta = embedding.EmbeddingLayer.FPropMeta(p, shape)
      y = layer(tf.zeros(shape, tf.int32))
      self.assertEqual(meta.out_shapes, (shapes.Shape(y.shape),))
      self.assertEqual(meta.flops, 0)
    scaled = p.Copy().Set(scale_sqrt_depth=True)
    self.assertEqual(embedding.EmbeddingLayer.FPropMeta(scaled, [2, 5]).flops,
                     2 * 5 * 4)
    meta = embedding.EmbeddingLayer.FPropMeta(scaled, [None, 5])
    self.assertEqual(meta.out_shapes, (_TracedShape(layer, [None, 5]),))
    self.assertIsNone(meta.flops)


class PositionalEmbeddingTest(tf.test.TestCase):

  def _Params(self, **kwargs):
    return embedding.PositionalEmbedding.Params().Set(
        name='pos', embedding_dim=6, **kwargs)

  def testNumpyReference(self):
    layer = self._Params(min_timescale=1.0, max_timescale=100.0).Instantiate()
    self.assertEmpty(layer.vars)
    y = layer(seq_length=5)
    self.assertAllClose(y, _NpSinusoid(np.arange(5), 6, 1.0, 100.0),
                        atol=1e-5)
    # Position 0: sin = 0, cos = 1.
    self.assertAllClose(y[0], [0, 0, 0, 1, 1, 1], atol=0)
    pos = np.array([[0, 1, 2], [10, 11, 12]])
    z = layer(positions=tf.constant(pos))
    self.assertAllClose(z, _NpSinusoid(pos, 6, 1.0, 100.0), atol=1e-5)

  def testEagerEqualsFunction(self):
    layer = self._Params().Instantiate()
    pos = tf.constant([[3, 4], [5, 6]])
    fn = tf.function(lambda x: layer.FProp(layer.theta, positions=x))
    self.assertAllClose(layer(positions=pos), fn(pos), atol=1e-6)
    fn_len = tf.function(lambda t: layer.FProp(layer.theta, seq_length=t))
    self.assertAllClose(layer(seq_length=4), fn_len(tf.constant(4)),
                        atol=1e-6)

  def testBfloat16(self):
    layer = self._Params(fprop_dtype=tf.bfloat16).Instantiate()
    y = layer(seq_length=3)
    self.assertEqual(y.dtype, tf.bfloat16)
    self.assertAllClose(tf.cast(y, tf.float32),
                        _NpSinusoid(np.arange(3), 6, 1.0, 1e4), atol=4e-3)

  def testBadParams(self):
    with self.assertRaisesRegex(
        ValueError, r"PositionalEmbedding 'pos': embedding_dim=5 must be "
        'even'):
      embedding.PositionalEmbedding.Params().Set(
          name='pos', embedding_dim=5).Instantiate()
    with self.assertRaisesRegex(
        ValueError, r"PositionalEmbedding 'pos': min_timescale=10.0, "
        'max_timescale=1.0 must satisfy'):
      self._Params(min_timescale=10.0, max_timescale=1.0).Instantiate()
    layer = self._Params().Instantiate()
    with self.assertRaisesRegex(
        ValueError, r"PositionalEmbedding 'pos': pass exactly one of "
        'seq_length'):
      layer(seq_length=3, positions=tf.constant([1]))
    with self.assertRaisesRegex(ValueError, 'pass exactly one of'):
      layer()

  def testFPropMeta(self):
    p = self._Params()
    layer = p.Instantiate()
    meta = embedding.PositionalEmbedding.FPropMeta(p, 5)
    self.assertEqual(meta.out_shapes, (shapes.Shape(layer(seq_length=5).shape),))
    self.assertEqual(meta.flops, 2 * 5 * 6)
    for shape in ([4], [2, 3]):
      meta = embedding.PositionalEmbedding.FPropMeta(p, shapes.Shape(shape))
      y = layer(positions=tf.zeros(shape, tf.int32))
      self.assertEqual(meta.out_shapes, (shapes.Shape(y.shape),))
    meta = embedding.PositionalEmbedding.FPropMeta(p, shapes.Shape([None, 3]))
    self.assertEqual(meta.out_shapes, (_TracedShape(
        lambda x: layer.FProp(layer.theta, positions=x), [None, 3]),))
    self.assertIsNone(meta.flops)


class LearnedPositionalEmbeddingTest(tf.test.TestCase):

  def _Build(self):
    p = embedding.LearnedPositionalEmbedding.Params().Set(
        name='pos', max_seq_len=5, embedding_dim=3)
    layer = p.Instantiate()
    table = test_utils.Rand([5, 3], 1)
    layer.vars.emb.assign(table)
    return p, layer, table

  def testNumpyReference(self):
    _, layer, table = self._Build()
    self.assertAllClose(layer(seq_length=4), table[:4], atol=0)
    pos = np.array([[4, 0], [1, 1]])
    self.assertAllClose(layer(positions=tf.constant(pos)), table[pos], atol=0)

  def testEagerEqualsFunctionAndGradient(self):
    _, layer, _ = self._Build()
    fn = tf.function(lambda t: layer.FProp(layer.theta, seq_length=t))
    self.assertAllEqual(layer(seq_length=3), fn(tf.constant(3)))
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(layer(seq_length=2))
    g = tf.convert_to_tensor(tape.gradient(loss, layer.vars.emb))
    self.assertAllClose(g, [[1] * 3, [1] * 3, [0] * 3, [0] * 3, [0] * 3],
                        atol=0)

  def testBadParams(self):
    with self.assertRaisesRegex(
        ValueError, r"LearnedPositionalEmbedding 'pos': max_seq_len=0 must "
        'be an int >= 1'):
      embedding.LearnedPositionalEmbedding.Params().Set(
          name='pos', embedding_dim=3).Instantiate()
    _, layer, _ = self._Build()
    with self.assertRaisesRegex(
        ValueError, r"LearnedPositionalEmbedding 'pos': seq_length=6 must be "
        r'in \[1, max_seq_len=5\]'):
      layer(seq_length=6)

  def testFPropMeta(self):
    p, layer, _ = self._Build()
    meta = embedding.LearnedPositionalEmbedding.FPropMeta(p, 4)
    self.assertEqual(meta.out_shapes, (shapes.Shape(layer(seq_length=4).shape),))
    self.assertEqual(meta.flops, 0)
    meta = embedding.LearnedPositionalEmbedding.FPropMeta(p, [None, 2])
    self.assertEqual(meta.out_shapes, (_TracedShape(
        lambda x: layer.FProp(layer.theta, positions=x), [None, 2]),))


if __name__ == '__main__':
  tf.test.main()
