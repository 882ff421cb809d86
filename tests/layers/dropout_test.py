"""Tests for cadence.layers.dropout."""
import numpy as np
import tensorflow as tf

from cadence.framework import shapes
from cadence.framework import step_seed
from cadence.layers import dropout
from cadence.tests import test_utils


def _Layer(**kwargs):
  return dropout.DropoutLayer.Params().Set(name='drop', **kwargs).Instantiate()


class DropoutLayerTest(tf.test.TestCase):

  def testIdentityCases(self):
    x = tf.random.stateless_normal([3, 4], seed=[1, 2])
    # keep_prob 1: identity, no seed needed.
    self.assertAllEqual(_Layer(keep_prob=1.0)(x), x)
    # Inference: identity, no seed needed.
    self.assertAllEqual(_Layer(keep_prob=0.5, is_inference=True)(x), x)

  def testMaskValuesAndScale(self):
    layer = _Layer(keep_prob=0.75)
    x = tf.ones([16, 32])
    y = layer.FProp(test_utils.Seeded(layer, 3), x).numpy()
    # Every output is 0 (dropped) or 1/keep_prob (kept and rescaled).
    kept = np.isclose(y, 1.0 / 0.75, atol=1e-6)
    dropped = y == 0.0
    self.assertTrue(np.all(kept | dropped))
    self.assertTrue(kept.any() and dropped.any())

  def testSameSeedSameMaskDifferentMicroBatchesDiffer(self):
    layer = _Layer(keep_prob=0.5)
    x = tf.ones([8, 16])
    seed = step_seed.MakeStepSeed(11)
    y1 = layer.FProp(test_utils.Seeded(layer, seed=seed), x)
    y2 = layer.FProp(test_utils.Seeded(layer, seed=seed), x)
    self.assertAllEqual(y1, y2)
    mb0, mb1 = [layer.FProp(test_utils.Seeded(
        layer, seed=step_seed.MicroBatchSeed(seed, j)), x) for j in (0, 1)]
    self.assertNotAllEqual(mb0, mb1)
    self.assertNotAllEqual(y1, mb0)
    # A different step seed differs too.
    y3 = layer.FProp(test_utils.Seeded(layer, 12), x)
    self.assertNotAllEqual(y1, y3)

  def testEagerEqualsFunction(self):
    layer = _Layer(keep_prob=0.6)
    x = tf.random.stateless_normal([4, 5, 6], seed=[3, 4])
    theta = test_utils.Seeded(layer, seed=step_seed.MakeStepSeed(5))
    eager = layer.FProp(theta, x)
    graph = tf.function(layer.FProp)(theta, x)
    self.assertAllEqual(eager, graph)

  def testMeanPreserved(self):
    # 40000 elements; an element's output has mean 1 and variance
    # (1 - k) / k = 1 for k = 0.5, so the sample mean has stddev 0.005.
    # 0.025 is 5 stddevs.
    layer = _Layer(keep_prob=0.5)
    y = layer.FProp(test_utils.Seeded(layer, seed=step_seed.MakeStepSeed(0)),
                    tf.ones([200, 200]))
    self.assertAllClose(tf.reduce_mean(y), 1.0, atol=0.025)
    kept_frac = tf.reduce_mean(tf.cast(y > 0, tf.float32))
    self.assertAllClose(kept_frac, 0.5, atol=0.0125)

  def testNoiseShapeBroadcastDims(self):
    layer = _Layer(keep_prob=0.5, noise_shape_broadcast_dims=[-1])
    y = layer.FProp(test_utils.Seeded(layer, seed=step_seed.MakeStepSeed(2)),
                    tf.ones([6, 7, 9])).numpy()
    # The mask is shared along the last dim: each row is all 0 or all 2.
    self.assertAllEqual(y.min(axis=-1), y.max(axis=-1))
    self.assertEqual(set(np.unique(y)), {0.0, 2.0})

  def testGradientUsesSameMask(self):
    layer = _Layer(keep_prob=0.7)
    x = tf.random.stateless_normal([5, 8], seed=[1, 1])
    theta = test_utils.Seeded(layer, seed=step_seed.MakeStepSeed(9))
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = layer.FProp(theta, x)
    grad = tape.gradient(y, x)
    mask = layer.FProp(theta, tf.ones_like(x))
    self.assertAllClose(grad, mask, atol=1e-6)

  def testMissingStepSeed(self):
    layer = _Layer(keep_prob=0.9)
    with self.assertRaisesRegex(
        ValueError, r"DropoutLayer 'drop': FProp draws random numbers in "
        r'training mode but theta carries no step seed.*WithStepSeed'):
      layer(tf.ones([2, 2]))

  def testBadParams(self):
    for kp in (0.0, 1.5, -0.1, True):
      with self.assertRaisesRegex(
          ValueError, rf"DropoutLayer 'drop': keep_prob={kp!r} must be a "
          r'number in \(0, 1\]'):
        _Layer(keep_prob=kp)
    with self.assertRaisesRegex(
        ValueError, r"DropoutLayer 'drop': noise_shape_broadcast_dims=3 must "
        'be None or a list of ints'):
      _Layer(keep_prob=0.5, noise_shape_broadcast_dims=3)

  def testFPropMeta(self):
    p = dropout.DropoutLayer.Params().Set(name='drop', keep_prob=0.5)
    layer = p.Instantiate()
    theta = test_utils.Seeded(layer, seed=step_seed.MakeStepSeed(1))
    for shape in ([3, 4], [2, 3, 5], [7]):
      meta = dropout.DropoutLayer.FPropMeta(p, shape)
      y = layer.FProp(theta, tf.ones(shape))
      self.assertEqual(meta.out_shapes, (shapes.Shape(y.shape),))
      self.assertEqual(meta.flops, 3 * np.prod(shape))
    fn = tf.function(
        lambda x: layer.FProp(theta, x),
        input_signature=[tf.TensorSpec([None, 4], tf.float32)])
    out = fn.get_concrete_function().structured_outputs
    meta = dropout.DropoutLayer.FPropMeta(p, shapes.Shape([None, 4]))
    self.assertEqual(meta.out_shapes, (shapes.Shape(out.shape),))
    self.assertIsNone(meta.flops)
    ident = p.Copy().Set(keep_prob=1.0)
    self.assertEqual(dropout.DropoutLayer.FPropMeta(ident, [None, 4]).flops, 0)


if __name__ == '__main__':
  tf.test.main()
