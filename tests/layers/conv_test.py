"""Tests for layers/conv.py against numpy references."""
import itertools

import numpy as np
import tensorflow as tf

from cadence.framework import shapes
from cadence.layers import conv
from cadence.tests import test_utils


def _ConvParams(**kw):
  p = conv.Conv2DLayer.Params().Set(name='conv', filter_shape=[3, 2, 3, 4])
  return p.Set(**kw)


class ConvOutputSizeTest(tf.test.TestCase):

  def testMatchesTensorFlow(self):
    for n, k, s, pad in itertools.product(range(3, 9), (1, 2, 3), (1, 2, 3),
                                          ('SAME', 'VALID')):
      x = tf.zeros([1, n, 1, 1])
      y = tf.nn.conv2d(x, tf.zeros([k, 1, 1, 1]), [1, s, 1, 1], pad)
      self.assertEqual(y.shape[1], conv.ConvOutputSize(n, k, s, pad),
                       (n, k, s, pad))
    self.assertIsNone(conv.ConvOutputSize(None, 3, 1, 'SAME'))
    with self.assertRaisesRegex(ValueError, 'size 2 < window 3'):
      conv.ConvOutputSize(2, 3, 1, 'VALID')


class Conv2DLayerTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    self.rng = np.random.default_rng(0)

  def testMatchesNumpy(self):
    x = self.rng.normal(size=[2, 7, 6, 3]).astype(np.float32)
    for padding, stride in itertools.product(('SAME', 'VALID'),
                                             ([1, 1], [2, 3])):
      layer = _ConvParams(padding=padding, filter_stride=stride,
                          activation='RELU').Instantiate()
      layer.vars.b.assign(self.rng.normal(size=[4]).astype(np.float32))
      ref = np.maximum(test_utils.NpConv2D(x, layer.vars.w.numpy(), layer.vars.b.numpy(),
                               stride, padding), 0.0)
      out = layer(tf.constant(x))
      self.assertAllClose(ref, out, atol=1e-5)
      meta = conv.Conv2DLayer.FPropMeta(layer.params, x.shape)
      self.assertEqual(meta.out_shapes, (shapes.AsShape(out),))

  def testEagerEqualsFunctionAndGradients(self):
    layer = _ConvParams(filter_stride=[2, 2]).Instantiate()
    x = tf.constant(self.rng.normal(size=[2, 5, 5, 3]).astype(np.float32))
    self.assertAllClose(layer(x), tf.function(layer.FPropDefaultTheta)(x),
                        atol=1e-6)
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(layer(x)**2)
    grads = tape.gradient(loss, layer.vars)
    self.assertEqual({'w', 'b'}, set(grads.keys()))
    for g in grads.Flatten():
      self.assertAllEqual(True, np.isfinite(g.numpy()).all())

  def testFPropMeta(self):
    p = _ConvParams(filter_stride=[2, 1], padding='SAME', activation='RELU')
    # Input [2, 7, 6, 3] -> [2, 4, 6, 4]; each output: 2*3*2*3 MACs-as-FLOPs
    # + 1 bias + 1 relu.
    meta = conv.Conv2DLayer.FPropMeta(p, [2, 7, 6, 3])
    self.assertEqual((shapes.Shape([2, 4, 6, 4]),), meta.out_shapes)
    self.assertEqual(2 * 4 * 6 * 4 * (2 * 3 * 2 * 3 + 1 + 1), meta.flops)
    p_valid = _ConvParams(padding='VALID', has_bias=False)
    meta = conv.Conv2DLayer.FPropMeta(p_valid, [1, 7, 6, 3])  # -> [1,5,5,4]
    self.assertEqual(5 * 5 * 4 * (2 * 3 * 2 * 3), meta.flops)
    # Unknown batch: FPropMeta equals the traced static shape.
    layer = p.Instantiate()
    fn = tf.function(layer.FPropDefaultTheta).get_concrete_function(
        tf.TensorSpec([None, 7, 6, 3]))
    meta = conv.Conv2DLayer.FPropMeta(p, [None, 7, 6, 3])
    self.assertIsNone(meta.flops)
    self.assertEqual(meta.out_shapes, (shapes.AsShape(fn.outputs[0].shape),))

  def testBfloat16(self):
    x = tf.constant(self.rng.normal(size=[1, 5, 5, 3]).astype(np.float32))
    out32 = _ConvParams().Instantiate()(x)
    out16 = _ConvParams(fprop_dtype=tf.bfloat16).Instantiate()(x)
    self.assertEqual(tf.bfloat16, out16.dtype)
    self.assertAllClose(out32, tf.cast(out16, tf.float32), atol=0.05)

  def testBadParams(self):
    with self.assertRaisesRegex(
        ValueError, r"Conv2DLayer 'conv': padding='same' must be one of "
        r"'SAME', 'VALID'. Did you mean 'SAME'\?"):
      _ConvParams(padding='same').Instantiate()
    with self.assertRaisesRegex(
        ValueError, r"Conv2DLayer 'conv': filter_shape=\[3, 3, 3\] must be a "
        'list of 4 ints >= 1'):
      _ConvParams(filter_shape=[3, 3, 3]).Instantiate()
    with self.assertRaisesRegex(
        ValueError, r"Conv2DLayer 'conv': filter_stride=\[0, 1\] must be a "
        'list of 2 ints >= 1'):
      _ConvParams(filter_stride=[0, 1]).Instantiate()
    with self.assertRaisesRegex(
        ValueError, r"Conv2DLayer 'conv': activation='RELUU' is invalid: .*"
        "Did you mean 'RELU'"):
      _ConvParams(activation='RELUU').Instantiate()
    with self.assertRaisesRegex(
        ValueError, r"Conv2DLayer 'conv': inputs shape \[1, 5, 5, 2\] must be "
        r'\[batch, height, width, 3\]'):
      conv.Conv2DLayer.FPropMeta(_ConvParams(), [1, 5, 5, 2])
    with self.assertRaisesRegex(
        ValueError, r"Conv2DLayer 'conv': inputs shape \[1, 2, 5, 3\]: VALID "
        'padding needs input size >= window; got size 2 < window 3'):
      conv.Conv2DLayer.FPropMeta(_ConvParams(padding='VALID'), [1, 2, 5, 3])


class PoolingLayerTest(tf.test.TestCase):

  def testMatchesNumpy(self):
    x = np.random.default_rng(1).normal(size=[2, 7, 6, 3]).astype(np.float32)
    for ptype, padding, window, stride in itertools.product(
        ('MAX', 'AVG'), ('SAME', 'VALID'), ([2, 2], [3, 2]), ([2, 2], [1, 3])):
      p = conv.PoolingLayer.Params().Set(
          name='pool', window_shape=window, window_stride=stride,
          pooling_type=ptype, padding=padding)
      out = p.Instantiate()(tf.constant(x))
      ref = test_utils.NpPool2D(x, window, stride, ptype, padding)
      self.assertAllClose(ref, out, atol=1e-5)
      meta = conv.PoolingLayer.FPropMeta(p, x.shape)
      self.assertEqual(meta.out_shapes, (shapes.AsShape(out),))
      per_output = window[0] * window[1] + (ptype == 'AVG')
      self.assertEqual(out.shape.num_elements() * per_output, meta.flops)

  def testBadParams(self):
    with self.assertRaisesRegex(
        ValueError, r"PoolingLayer 'pool': pooling_type='MEAN' must be one of "
        r"'MAX', 'AVG'"):
      conv.PoolingLayer.Params().Set(name='pool',
                                     pooling_type='MEAN').Instantiate()
    with self.assertRaisesRegex(
        ValueError, r"PoolingLayer 'pool': padding='VALLID' must be one of "
        r"'SAME', 'VALID'. Did you mean 'VALID'\?"):
      conv.PoolingLayer.Params().Set(name='pool',
                                     padding='VALLID').Instantiate()


class FlattenLayerTest(tf.test.TestCase):

  def testFlatten(self):
    p = conv.FlattenLayer.Params().Set(name='flat')
    layer = p.Instantiate()
    x = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape([2, 3, 4, 5])
    out = layer(tf.constant(x))
    self.assertAllEqual(x.reshape([2, 60]), out)
    meta = conv.FlattenLayer.FPropMeta(p, x.shape)
    self.assertEqual(0, meta.flops)
    self.assertEqual((shapes.Shape([2, 60]),), meta.out_shapes)
    for spec in ([None, 3, 4], [None, None, 4]):
      fn = tf.function(layer.FPropDefaultTheta).get_concrete_function(
          tf.TensorSpec(spec))
      self.assertEqual(conv.FlattenLayer.FPropMeta(p, spec).out_shapes,
                       (shapes.AsShape(fn.outputs[0].shape),))
      self.assertAllEqual(np.ones([2, 12]),
                          fn(tf.ones([2, 3, 4])))
    with self.assertRaisesRegex(ValueError, 'must have rank >= 1'):
      conv.FlattenLayer.FPropMeta(p, [])


if __name__ == '__main__':
  tf.test.main()
