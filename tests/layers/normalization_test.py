"""Tests for cadence.layers.normalization."""
import numpy as np
import tensorflow as tf

from cadence.framework.nested_map import NestedMap
from cadence.framework import shapes
from cadence.layers import normalization
from cadence.tests import test_utils


def _NpLayerNorm(x, scale, bias, eps):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * scale + bias


def _NpRmsNorm(x, scale, eps):
  return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps) * scale


def _Build(cls, **kwargs):
  p = cls.Params().Set(name='norm', input_dim=6, **kwargs)
  layer = p.Instantiate()
  scale = test_utils.Rand([6], 1) + 1.0
  layer.vars.scale.assign(scale.astype(layer.vars.scale.dtype.as_numpy_dtype))
  bias = None
  if 'bias' in layer.vars:
    bias = test_utils.Rand([6], 2)
    layer.vars.bias.assign(bias.astype(layer.vars.bias.dtype.as_numpy_dtype))
  return p, layer, scale, bias


def _TracedShape(fn, shape):
  traced = tf.function(fn, input_signature=[tf.TensorSpec(shape, tf.float32)])
  return shapes.Shape(traced.get_concrete_function().structured_outputs.shape)


def _NpLayerNormGrads(x, scale, dy, eps):
  """Numpy reference gradients (dx, dscale, dbias) of _NpLayerNorm, from
  the chain rule written out term by term (not the layer's formula)."""
  d = x.shape[-1]
  mean = x.mean(-1, keepdims=True)
  c = x - mean
  var = (c ** 2).mean(-1, keepdims=True)
  r = 1.0 / np.sqrt(var + eps)
  g = dy * scale
  d_c = g * r                                     # through c * r
  d_var = (g * c).sum(-1, keepdims=True) * -0.5 * r ** 3
  d_c += d_var * 2.0 * c / d                      # through var's square
  dx = d_c - d_c.mean(-1, keepdims=True)          # through c = x - mean
  rows = (-1, d)
  return (dx, (dy * c * r).reshape(rows).sum(0), dy.reshape(rows).sum(0))


def _NpRmsNormGrads(x, scale, dy, eps):
  """Numpy reference gradients (dx, dscale) of _NpRmsNorm (chain rule)."""
  d = x.shape[-1]
  r = 1.0 / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps)
  g = dy * scale
  dx = g * r + (g * x).sum(-1, keepdims=True) * -r ** 3 * x / d
  return dx, (dy * x * r).reshape(-1, d).sum(0)


def _TheoryGrads(layer, theta, x, dy):
  """The layer's (dx, d theta...) for output gradient dy, in a function."""

  @tf.function
  def _Grads(theta, x):
    with tf.GradientTape() as tape:
      tape.watch([x, theta])
      y = layer.FProp(theta, x)
    return tape.gradient(y, [x] + theta.Flatten(), output_gradients=dy)

  return _Grads(theta, x)


class LayerNormTest(tf.test.TestCase):

  def testInitialValues(self):
    layer = normalization.LayerNorm.Params().Set(
        name='ln', input_dim=4).Instantiate()
    self.assertAllEqual(layer.vars.scale, np.ones([4]))
    self.assertAllEqual(layer.vars.bias, np.zeros([4]))

  def testNumpyReference(self):
    _, layer, scale, bias = _Build(normalization.LayerNorm, epsilon=1e-3)
    # An offset of 3 checks that the mean is removed before the variance.
    x = test_utils.Rand([2, 3, 6], 3) + 3.0
    self.assertAllClose(layer(tf.constant(x)),
                        _NpLayerNorm(x, scale, bias, 1e-3), atol=1e-5)

  def testEagerEqualsFunction(self):
    _, layer, _, _ = _Build(normalization.LayerNorm)
    x = tf.constant(test_utils.Rand([4, 6], 4))
    self.assertAllClose(layer(x), tf.function(layer.FProp)(layer.theta, x),
                        atol=1e-6)

  def testGradients(self):
    _, layer, _, _ = _Build(normalization.LayerNorm)
    x = tf.constant(test_utils.Rand([3, 6], 5))
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(layer(x) * tf.range(6, dtype=tf.float32))
    grads = tape.gradient(loss, layer.vars)
    self.assertCountEqual(grads.keys(), ['scale', 'bias'])
    for name, g in grads.FlattenItems():
      self.assertIsNotNone(g, msg=name)
      self.assertTrue(np.all(np.isfinite(g)), msg=name)

  def testNumericGradient(self):
    p = normalization.LayerNorm.Params().Set(
        name='ln', input_dim=5, epsilon=1e-3, dtype=tf.float64)
    layer = p.Instantiate()
    layer.vars.scale.assign(test_utils.Rand([5], 6, np.float64) + 1.0)
    layer.vars.bias.assign(test_utils.Rand([5], 7, np.float64))
    x = tf.constant(test_utils.Rand([3, 5], 8, np.float64))

    def _Fn(scale, bias, inputs):
      return layer.FProp(NestedMap(scale=scale, bias=bias), inputs)

    theoretical, numerical = tf.test.compute_gradient(
        _Fn, [tf.convert_to_tensor(layer.vars.scale),
              tf.convert_to_tensor(layer.vars.bias), x], delta=1e-5)
    for t, n in zip(theoretical, numerical):
      self.assertAllClose(t, n, atol=1e-6)

  def testHandWrittenGradientMatchesNumpy(self):
    # The layer's own backward (a custom gradient) against the chain rule
    # in numpy, float64, on [2, 3, 6] with an offset and a scale != 1.
    p = normalization.LayerNorm.Params().Set(
        name='ln', input_dim=6, epsilon=1e-3, dtype=tf.float64)
    layer = p.Instantiate()
    scale = test_utils.Rand([6], 10, np.float64) + 1.0
    theta = NestedMap(scale=tf.constant(scale),
                      bias=tf.constant(test_utils.Rand([6], 11, np.float64)))
    x = test_utils.Rand([2, 3, 6], 12, np.float64) + 3.0
    dy = test_utils.Rand([2, 3, 6], 13, np.float64)
    got = _TheoryGrads(layer, theta, tf.constant(x), tf.constant(dy))
    want = _NpLayerNormGrads(x, scale, dy, 1e-3)
    # Flatten order: bias, scale.
    for g, w in zip(got, (want[0], want[2], want[1])):
      self.assertAllClose(w, g, atol=1e-10)

  def testBfloat16StatisticsInFloat32(self):
    _, ref, _, _ = _Build(normalization.LayerNorm)
    _, bf, _, _ = _Build(normalization.LayerNorm, fprop_dtype=tf.bfloat16)
    # A large offset with a small spread: a bfloat16 mean would be off by
    # more than the spread itself.
    x = (test_utils.Rand([4, 6], 9, scale=0.5) + 100.0)
    xb = tf.cast(tf.constant(x), tf.bfloat16)
    y = bf(xb)
    self.assertEqual(y.dtype, tf.bfloat16)
    want = ref(tf.cast(xb, tf.float32))
    # Output |y| <= ~5; bfloat16 output rounding is 2^-8 relative.
    self.assertAllClose(tf.cast(y, tf.float32), want, atol=5e-2)

  def testBadParams(self):
    with self.assertRaisesRegex(
        ValueError, r"LayerNorm 'ln': input_dim=0 must be an int >= 1"):
      normalization.LayerNorm.Params().Set(name='ln').Instantiate()
    with self.assertRaisesRegex(
        ValueError, r"LayerNorm 'ln': epsilon=-1.0 must be a number > 0"):
      normalization.LayerNorm.Params().Set(
          name='ln', input_dim=3, epsilon=-1.0).Instantiate()
    with self.assertRaisesRegex(
        ValueError, r"LayerNorm 'ln': inputs shape \[2, 4\] must end in "
        'input_dim=3'):
      normalization.LayerNorm.FPropMeta(
          normalization.LayerNorm.Params().Set(name='ln', input_dim=3), [2, 4])

  def testFPropMeta(self):
    p, layer, _, _ = _Build(normalization.LayerNorm)
    for shape in ([6], [4, 6], [2, 3, 6]):
      meta = normalization.LayerNorm.FPropMeta(p, shape)
      self.assertEqual(meta.out_shapes,
                       (shapes.Shape(layer(tf.ones(shape)).shape),))
    # 12 rows of 6: 12 * (7 * 6 + 3).
    self.assertEqual(normalization.LayerNorm.FPropMeta(p, [3, 4, 6]).flops,
                     12 * 45)
    meta = normalization.LayerNorm.FPropMeta(p, shapes.Shape([None, 6]))
    self.assertEqual(meta.out_shapes, (_TracedShape(layer, [None, 6]),))
    self.assertIsNone(meta.flops)


class RMSNormTest(tf.test.TestCase):

  def testNumpyReference(self):
    _, layer, scale, _ = _Build(normalization.RMSNorm, epsilon=1e-4)
    self.assertEqual(list(layer.vars.keys()), ['scale'])
    x = test_utils.Rand([2, 3, 6], 3) + 0.5
    self.assertAllClose(layer(tf.constant(x)), _NpRmsNorm(x, scale, 1e-4),
                        atol=1e-5)

  def testEagerEqualsFunctionAndGradients(self):
    _, layer, _, _ = _Build(normalization.RMSNorm)
    x = tf.constant(test_utils.Rand([4, 6], 4))
    self.assertAllClose(layer(x), tf.function(layer.FProp)(layer.theta, x),
                        atol=1e-6)
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(layer(x) ** 3)
    g = tape.gradient(loss, layer.vars.scale)
    self.assertIsNotNone(g)
    self.assertTrue(np.all(np.isfinite(g)))

  def testHandWrittenGradientMatchesNumpy(self):
    p = normalization.RMSNorm.Params().Set(
        name='rms', input_dim=6, epsilon=1e-3, dtype=tf.float64)
    layer = p.Instantiate()
    scale = test_utils.Rand([6], 14, np.float64) + 1.0
    x = test_utils.Rand([2, 3, 6], 15, np.float64) + 0.5
    dy = test_utils.Rand([2, 3, 6], 16, np.float64)
    got = _TheoryGrads(layer, NestedMap(scale=tf.constant(scale)),
                       tf.constant(x), tf.constant(dy))
    for g, w in zip(got, _NpRmsNormGrads(x, scale, dy, 1e-3)):
      self.assertAllClose(w, g, atol=1e-10)

  def testBfloat16(self):
    _, ref, _, _ = _Build(normalization.RMSNorm)
    _, bf, _, _ = _Build(normalization.RMSNorm, fprop_dtype=tf.bfloat16)
    xb = tf.cast(tf.constant(test_utils.Rand([4, 6], 5)), tf.bfloat16)
    y = bf(xb)
    self.assertEqual(y.dtype, tf.bfloat16)
    # |y| <= ~5; bfloat16 output rounding is 2^-8 relative.
    self.assertAllClose(tf.cast(y, tf.float32), ref(tf.cast(xb, tf.float32)),
                        atol=5e-2)

  def testBadParams(self):
    with self.assertRaisesRegex(
        ValueError, r"RMSNorm 'rms': input_dim=-2 must be an int >= 1"):
      normalization.RMSNorm.Params().Set(name='rms', input_dim=-2).Instantiate()

  def testFPropMeta(self):
    p, layer, _, _ = _Build(normalization.RMSNorm)
    for shape in ([4, 6], [2, 3, 6]):
      meta = normalization.RMSNorm.FPropMeta(p, shape)
      self.assertEqual(meta.out_shapes,
                       (shapes.Shape(layer(tf.ones(shape)).shape),))
    self.assertEqual(normalization.RMSNorm.FPropMeta(p, [4, 6]).flops,
                     4 * (4 * 6 + 2))
    meta = normalization.RMSNorm.FPropMeta(p, shapes.Shape([None, 3, 6]))
    self.assertEqual(meta.out_shapes, (_TracedShape(layer, [None, 3, 6]),))
    self.assertIsNone(meta.flops)


if __name__ == '__main__':
  tf.test.main()
