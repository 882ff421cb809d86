"""Tests for cadence.framework.jobs.graph_optimizer.Scope."""
import numpy as np
import tensorflow as tf

from cadence.framework.jobs import graph_optimizer
from cadence.framework.nested_map import NestedMap
from cadence.framework.pipeline import recurrent
from cadence.tests import test_utils

_KEY = 'disable_meta_optimizer'


def _Disabled():
  return tf.config.optimizer.get_experimental_options().get(_KEY, False)


def _Cell(theta, state, inputs):
  """Ops grappler rewrites: MatMul + BiasAdd + Relu (fused), a mean."""
  del state
  h = tf.nn.relu(tf.nn.bias_add(tf.matmul(inputs.h, theta.w), theta.b))
  h -= tf.reduce_mean(h, axis=-1, keepdims=True)
  return NestedMap(h=h)


class ScopeTest(tf.test.TestCase):

  def testSetsAndRestoresTheSetting(self):
    before = _Disabled()
    try:
      for outer in (False, True):
        tf.config.optimizer.set_experimental_options({_KEY: outer})
        for enabled in (False, True):
          with graph_optimizer.Scope(enabled):
            self.assertEqual(_Disabled(), not enabled)
          self.assertEqual(_Disabled(), outer)
        with self.assertRaisesRegex(ValueError, '^boom$'):
          with graph_optimizer.Scope(outer):
            raise ValueError('boom')
        self.assertEqual(_Disabled(), outer)     # Restored on errors too.
    finally:
      tf.config.optimizer.set_experimental_options({_KEY: before})

  def testPipelinedStepIsTheSameWithoutGrappler(self):
    # One compiled pipelined step (2 cells on 2 devices x 3 micro-batches,
    # forward and backward) traced afresh in each scope, so that each
    # function is optimised (or not) at its first run.
    rng = np.random.RandomState(2)
    thetas = test_utils.DenseThetas(2, 8, rng)
    inits = [NestedMap(h=tf.zeros([4, 8])) for _ in thetas]
    xs = NestedMap(h=tf.constant(rng.normal(size=[3, 4, 8]), tf.float32))
    wrt = [v for theta in thetas for v in theta.Flatten()] + [xs.h]

    def _Step():
      def _Loss():
        out, _ = recurrent.StackedRecurrent(
            ['/device:CPU:0', '/device:CPU:1'], [_Cell] * 2, thetas, inits,
            xs, remat='never')
        return tf.reduce_sum(out.h * tf.sin(out.h))
      return test_utils.LossAndGrads(_Loss, wrt)

    results = {}
    for enabled in (True, False):
      with graph_optimizer.Scope(enabled):
        loss, grads = tf.function(_Step)()
        results[enabled] = [loss] + grads
    self.assertLen(results[True], len(wrt) + 1)
    for on, off in zip(results[True], results[False]):
      self.assertAllClose(on, off, rtol=1e-6, atol=1e-6)


if __name__ == '__main__':
  tf.test.main()
