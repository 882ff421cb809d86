"""Tests for layers/resnet.py and conv.GlobalPoolingLayer against numpy."""
import numpy as np
import tensorflow as tf

from cadence.framework import shapes
from cadence.layers import conv
from cadence.layers import resnet
from cadence.tests import test_utils


def _NpBn(x, gamma, beta, eps=1e-5):
  """Batch norm with the batch's statistics; returns (y, [2, c] stats)."""
  flat = x.reshape([-1, x.shape[-1]])
  mean, var = flat.mean(0), flat.var(0)
  return (x - mean) / np.sqrt(var + eps) * gamma + beta, np.stack([mean, var])


def _Randomise(layer, rng):
  """Random gammas and betas, so that a wrong pairing shows."""
  for path, var in layer.vars.FlattenItems():
    if path.endswith(('gamma', 'beta')):
      var.assign(rng.normal(size=var.shape).astype(np.float32))


def _NpBlock(layer, x, stride):
  """ResidualBlock in numpy; returns (y, stats NestedMap-like dict)."""
  v = layer.vars
  stats = {}
  h = test_utils.NpConv2D(x, v.conv1.w.numpy(), 0.0, [stride] * 2, 'SAME')
  h, stats['bn1'] = _NpBn(h, v.bn1.gamma.numpy(), v.bn1.beta.numpy())
  h = np.maximum(h, 0)
  h = test_utils.NpConv2D(h, v.conv2.w.numpy(), 0.0, [1, 1], 'SAME')
  h, stats['bn2'] = _NpBn(h, v.bn2.gamma.numpy(), v.bn2.beta.numpy())
  short = x
  if 'proj' in v:
    short = test_utils.NpConv2D(x, v.proj.w.numpy(), 0.0, [stride] * 2, 'SAME')
    short, stats['proj_bn'] = _NpBn(short, v.proj_bn.gamma.numpy(),
                                    v.proj_bn.beta.numpy())
  return np.maximum(h + short, 0), stats


class ResidualBlockTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    self.rng = np.random.default_rng(0)

  def _Check(self, input_dim, output_dim, stride):
    p = resnet.ResidualBlock.Params().Set(
        name='block', input_dim=input_dim, output_dim=output_dim,
        stride=stride)
    layer = p.Instantiate()
    _Randomise(layer, self.rng)
    x = self.rng.normal(size=[3, 6, 5, input_dim]).astype(np.float32)
    out, stats = layer.FPropStats(layer.theta, tf.constant(x))
    ref, ref_stats = _NpBlock(layer, x.astype(np.float64), stride)
    self.assertAllClose(ref, out, atol=1e-4)
    self.assertEqual(sorted(ref_stats), sorted(stats.keys()))
    for k, s in ref_stats.items():
      self.assertAllClose(s, stats[k], atol=1e-4)
    meta = resnet.ResidualBlock.FPropMeta(p, x.shape)
    self.assertEqual(meta.out_shapes, (shapes.AsShape(out),))
    fn = tf.function(layer.FPropDefaultTheta)
    self.assertAllClose(out, fn(tf.constant(x)), atol=1e-5)
    return p, meta

  def testIdentityShortcut(self):
    p, meta = self._Check(4, 4, 1)
    self.assertFalse(resnet.ResidualBlock.HasProjection(p))
    n = 3 * 6 * 5 * 4          # outputs
    # 2 convs (2*9*4 FLOPs an output), 2 BNs (7 an element + 3 a channel),
    # relu, add, relu.
    self.assertEqual(2 * n * 2 * 9 * 4 + 2 * (7 * n + 3 * 4) + 3 * n,
                     meta.flops)

  def testProjectionShortcut(self):
    p, _ = self._Check(3, 4, 2)
    self.assertTrue(resnet.ResidualBlock.HasProjection(p))

  def testMovingStatsAndInference(self):
    p = resnet.ResidualBlock.Params().Set(name='block', input_dim=2,
                                          output_dim=4, stride=2)
    layer = p.Instantiate()
    x = tf.constant(self.rng.normal(size=[2, 4, 4, 2]).astype(np.float32))
    _, stats = layer.FPropStats(layer.theta, x)
    layer.UpdateMovingStats(stats.Transform(lambda s: s[tf.newaxis]))
    self.assertAllClose(0.1 * stats.proj_bn[0],
                        layer.vars.proj_bn.moving_mean, atol=1e-6)
    infer = p.Copy().Set(is_inference=True).Instantiate()
    for src, dst in zip(layer.vars.Flatten(), infer.vars.Flatten()):
      dst.assign(src)
    out, none = infer.FPropStats(infer.theta, x)
    self.assertIsNone(none)
    self.assertEqual([2, 2, 2, 4], out.shape.as_list())

  def testBadParams(self):
    with self.assertRaisesRegex(ValueError, r"ResidualBlock 'block': "
                                'output_dim=0 must be an int >= 1'):
      resnet.ResidualBlock.Params().Set(name='block', input_dim=2,
                                        output_dim=0).Instantiate()
    p = resnet.ResidualBlock.Params().Set(name='block', input_dim=2,
                                          output_dim=4)
    with self.assertRaisesRegex(ValueError, r'inputs shape \[1, 4, 4, 3\] '
                                r'must be \[batch, height, width, 2\]'):
      resnet.ResidualBlock.FPropMeta(p, [1, 4, 4, 3])


class ResNetStemTest(tf.test.TestCase):

  def testMatchesNumpyAndMeta(self):
    rng = np.random.default_rng(1)
    p = resnet.ResNetStem.Params().Set(name='stem', input_dim=3, dim=4,
                                       kernel=3, stride=2, max_pool=True)
    layer = p.Instantiate()
    _Randomise(layer, rng)
    x = rng.normal(size=[2, 9, 9, 3]).astype(np.float32)
    out, stats = layer.FPropStats(layer.theta, tf.constant(x))
    h = test_utils.NpConv2D(x.astype(np.float64), layer.vars.conv.w.numpy(),
                          0.0, [2, 2], 'SAME')
    h, ref_stats = _NpBn(h, layer.vars.bn.gamma.numpy(),
                         layer.vars.bn.beta.numpy())
    ref = test_utils.NpPool2D(np.maximum(h, 0), [3, 3], [2, 2], 'MAX', 'SAME')
    self.assertAllClose(ref, out, atol=1e-4)
    self.assertAllClose(ref_stats, stats.bn, atol=1e-4)
    meta = resnet.ResNetStem.FPropMeta(p, x.shape)
    self.assertEqual(meta.out_shapes, (shapes.AsShape(out),))


class GlobalPoolingLayerTest(tf.test.TestCase):

  def testMatchesNumpy(self):
    x = np.random.default_rng(2).normal(size=[2, 3, 4, 5]).astype(np.float32)
    for kind, ref in (('AVG', x.mean((1, 2))), ('MAX', x.max((1, 2)))):
      p = conv.GlobalPoolingLayer.Params().Set(name='gap', pooling_type=kind)
      out = p.Instantiate()(tf.constant(x))
      self.assertAllClose(ref, out, atol=1e-6)
      meta = conv.GlobalPoolingLayer.FPropMeta(p, x.shape)
      self.assertEqual(meta.out_shapes, (shapes.AsShape(out),))
      self.assertEqual(2 * 3 * 4 * 5 + (10 if kind == 'AVG' else 0),
                       meta.flops)
    with self.assertRaisesRegex(ValueError, r"GlobalPoolingLayer 'gap': "
                                r"pooling_type='avg' must be one of"):
      conv.GlobalPoolingLayer.Params().Set(name='gap',
                                           pooling_type='avg').Instantiate()


if __name__ == '__main__':
  tf.test.main()
