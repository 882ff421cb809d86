"""Tests for cadence.framework.weight_init."""
import math

import numpy as np
import tensorflow as tf

from cadence.framework import weight_init
from cadence.framework.weight_init import WeightInit


def _Draw(init, shape, dtype=tf.float32, seed=(1, 2)):
  return weight_init.InitialValue(init, shape, dtype, seed).numpy()


class WeightInitTest(tf.test.TestCase):

  def testFans(self):
    self.assertEqual(weight_init.Fans([]), (1, 1))
    self.assertEqual(weight_init.Fans([7]), (7, 7))
    self.assertEqual(weight_init.Fans([3, 5]), (3, 5))
    self.assertEqual(weight_init.Fans([3, 3, 8, 16]), (72, 16))

  def testConstant(self):
    self.assertAllEqual(_Draw(WeightInit.Constant(0.25), [2, 3]),
                        np.full([2, 3], 0.25))
    self.assertAllEqual(_Draw(WeightInit.Constant(2), [2], tf.int32), [2, 2])

  def testStatistics(self):
    n = 200000
    cases = [
        (WeightInit.Gaussian(0.5), [n], 0.5),
        (WeightInit.GaussianSqrtDim(2.0), [400, 500], 2.0 / math.sqrt(400)),
        (WeightInit.GaussianSqrtFanOut(2.0), [400, 500], 2.0 / math.sqrt(500)),
        (WeightInit.Uniform(0.3), [n], 0.3 / math.sqrt(3)),
        (WeightInit.UniformSqrtDim(1.0), [400, 500], 1 / math.sqrt(400) / math.sqrt(3)),
        (WeightInit.Xavier(1.0), [400, 500], math.sqrt(6 / 900) / math.sqrt(3)),
    ]
    for init, shape, std in cases:
      v = _Draw(init, shape)
      # 200k samples: the stddev estimate is within ~0.5%; allow 3%.
      self.assertAllClose(v.std(), std, rtol=0.03, msg=init.method)
      self.assertAllClose(v.mean(), 0.0, atol=0.03 * std, msg=init.method)
    limit = math.sqrt(6 / 900)
    v = _Draw(WeightInit.Xavier(1.0), [400, 500])
    self.assertLessEqual(np.abs(v).max(), limit)
    t = _Draw(WeightInit.TruncatedGaussian(1.0), [n])
    self.assertLessEqual(np.abs(t).max(), 2.0 + 1e-6)

  def testDeterministicAndSeedSensitive(self):
    init = WeightInit.Gaussian(1.0)
    self.assertAllEqual(_Draw(init, [8], seed=(1, 2)), _Draw(init, [8], seed=(1, 2)))
    self.assertNotAllClose(_Draw(init, [8], seed=(1, 2)), _Draw(init, [8], seed=(1, 3)))
    # bfloat16 variables get the float32 draw rounded.
    self.assertAllClose(
        _Draw(init, [8], tf.bfloat16).astype(np.float32), _Draw(init, [8]),
        rtol=1e-2)

  def testErrors(self):
    bad = WeightInit.Gaussian(1.0).Set(method='gausian')
    with self.assertRaisesRegex(ValueError, "method 'gausian' is unknown"):
      _Draw(bad, [2])
    with self.assertRaisesRegex(ValueError, "needs a floating dtype; got int32"):
      _Draw(WeightInit.Gaussian(1.0), [2], tf.int32)

  def testCheckInit(self):
    owner = "ProjectionLayer 'fc'"
    init = WeightInit.Xavier(1.0)
    self.assertIs(weight_init.CheckInit(owner, 'params_init', init), init)
    with self.assertRaisesWithLiteralMatch(
        ValueError, "ProjectionLayer 'fc': params_init.method='Xavier' must "
        "be one of 'constant', 'gaussian', 'uniform', 'truncated_gaussian', "
        "'xavier', 'gaussian_sqrt_dim', 'uniform_sqrt_dim', "
        "'gaussian_sqrt_fanout'. Did you mean 'xavier'?"):
      weight_init.CheckInit(owner, 'params_init', WeightInit.Xavier().Set(
          method='Xavier'))
    with self.assertRaisesWithLiteralMatch(
        ValueError, "ProjectionLayer 'fc': params_init.scale='1' must be a "
        'number.'):
      weight_init.CheckInit(owner, 'params_init', WeightInit.Xavier().Set(
          scale='1'))
    with self.assertRaisesWithLiteralMatch(
        ValueError, "ProjectionLayer 'fc': params_init='xavier' must be "
        'WeightInit params (method and scale), e.g. WeightInit.Xavier(1.0).'):
      weight_init.CheckInit(owner, 'params_init', 'xavier')

  def testParamsRoundTripAsText(self):
    wp = weight_init.WeightParams([4, 5], WeightInit.Xavier(2.0))
    again = weight_init.WeightParams([1], WeightInit.Constant()).FromText(
        wp.ToText())
    self.assertEqual(again, wp)


if __name__ == '__main__':
  tf.test.main()
