"""Tests for layers/batch_norm.py against numpy references."""
import numpy as np
import tensorflow as tf

from cadence.framework import shapes
from cadence.layers import batch_norm


def _Params(**kw):
  return batch_norm.BatchNormLayer.Params().Set(name='bn', dim=3).Set(**kw)


def _NpNorm(x, mean, var, gamma, beta, eps):
  return (x - mean) / np.sqrt(var + eps) * gamma + beta


class BatchNormLayerTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    self.rng = np.random.default_rng(0)
    self.x = (self.rng.normal(size=[4, 5, 2, 3]) * 3 + 1).astype(np.float32)

  def _Layer(self, **kw):
    layer = _Params(**kw).Instantiate()
    layer.vars.gamma.assign(self.rng.normal(size=[3]).astype(np.float32))
    layer.vars.beta.assign(self.rng.normal(size=[3]).astype(np.float32))
    return layer

  def testTrainingMatchesNumpy(self):
    layer = self._Layer()
    out, stats = layer.FPropStats(layer.theta, tf.constant(self.x))
    mean = self.x.reshape([-1, 3]).mean(0)
    var = self.x.reshape([-1, 3]).var(0)            # biased
    ref = _NpNorm(self.x, mean, var, layer.vars.gamma.numpy(),
                  layer.vars.beta.numpy(), 1e-5)
    self.assertAllClose(ref, out, atol=1e-5)
    self.assertAllClose(np.stack([mean, var]), stats, atol=1e-5)
    self.assertAllClose(out, layer(tf.constant(self.x)), atol=0)
    meta = batch_norm.BatchNormLayer.FPropMeta(layer.params, self.x.shape)
    self.assertEqual(meta.out_shapes, (shapes.AsShape(out),))
    self.assertEqual(40 * 3 * 7 + 3 * 3, meta.flops)

  def testInferenceUsesMovingStatistics(self):
    layer = self._Layer(is_inference=True)
    mean = self.rng.normal(size=[3]).astype(np.float32)
    var = self.rng.uniform(0.5, 2, size=[3]).astype(np.float32)
    layer.vars.moving_mean.assign(mean)
    layer.vars.moving_variance.assign(var)
    out, stats = layer.FPropStats(layer.theta, tf.constant(self.x))
    self.assertIsNone(stats)
    self.assertAllClose(_NpNorm(self.x, mean, var, layer.vars.gamma.numpy(),
                                layer.vars.beta.numpy(), 1e-5), out,
                        atol=1e-5)
    fn = tf.function(layer.FPropDefaultTheta)
    self.assertAllClose(out, fn(tf.constant(self.x)), atol=1e-6)

  def testMovingAveragesOnePerMicroBatchInOrder(self):
    layer = self._Layer(decay=0.8)
    stats = self.rng.normal(size=[4, 2, 3]).astype(np.float32)
    mean, var = np.zeros(3), np.ones(3)
    for s in stats:                 # the reference: M updates in order
      mean = 0.8 * mean + 0.2 * s[0]
      var = 0.8 * var + 0.2 * s[1]
    tf.function(layer.UpdateMovingStats)(tf.constant(stats))
    self.assertAllClose(mean, layer.vars.moving_mean, atol=1e-6)
    self.assertAllClose(var, layer.vars.moving_variance, atol=1e-6)
    with self.assertRaisesRegex(ValueError, r"BatchNormLayer 'bn': stats "
                                r'shape \[2, 3\] must be \[micro_batches, 2, '
                                r'3\]'):
      layer.UpdateMovingStats(tf.constant(stats[0]))

  def testMovingStatisticsAreStateTheReplicasAverage(self):
    layer = _Params().Instantiate()
    for name in ('moving_mean', 'moving_variance'):
      var = layer.vars[name]
      self.assertFalse(var.trainable)
      self.assertEqual(tf.VariableAggregation.MEAN, var.aggregation)
    self.assertTrue(layer.vars.gamma.trainable)

  def testGradientsMatchFiniteDifferences(self):
    x = tf.constant(self.x[:2].astype(np.float64))
    layer64 = _Params(dtype=tf.float64).Instantiate()
    with tf.GradientTape() as tape:
      tape.watch(x)
      loss = tf.reduce_sum(layer64(x) ** 3)
    grad = tape.gradient(loss, x).numpy()
    eps, idx = 1e-6, (1, 2, 0, 1)
    xp, xm = self.x[:2].astype(np.float64), self.x[:2].astype(np.float64)
    xp[idx] += eps
    xm[idx] -= eps
    num = (np.sum(layer64(tf.constant(xp)).numpy() ** 3) -
           np.sum(layer64(tf.constant(xm)).numpy() ** 3)) / (2 * eps)
    self.assertAllClose(num, grad[idx], rtol=1e-5)

  def testBadParams(self):
    with self.assertRaisesRegex(
        ValueError, r"BatchNormLayer 'bn': decay=1.0 must be"):
      _Params(decay=1.0).Instantiate()
    with self.assertRaisesRegex(ValueError, r"BatchNormLayer 'bn': dim=0 "
                                'must be an int >= 1'):
      _Params(dim=0).Instantiate()
    with self.assertRaisesRegex(ValueError, r"BatchNormLayer 'bn': inputs "
                                r'shape \[4, 5\] must be \[..., 3\]'):
      batch_norm.BatchNormLayer.FPropMeta(_Params(), [4, 5])


if __name__ == '__main__':
  tf.test.main()
