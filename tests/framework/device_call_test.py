"""Tests for device_call.OnDevice: same values and gradients, backward on
the forward's device."""
import numpy as np
import tensorflow as tf

from cadence.framework import device_call
from cadence.framework.nested_map import NestedMap
from cadence.framework.pipeline import memory_profile

_CPU0, _CPU1 = '/device:CPU:0', '/device:CPU:1'


def _Loss(w, x, batch):
  logits = tf.matmul(x, w)                                      # [b, v]
  xent = tf.nn.sparse_softmax_cross_entropy_with_logits(
      labels=batch.labels, logits=logits)
  return NestedMap(loss=tf.reduce_sum(xent * batch.weights),
                   count=tf.size(batch.labels))


class OnDeviceTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    rng = np.random.default_rng(1)
    with tf.device(_CPU1):
      self.w = tf.Variable(rng.normal(size=[8, 5]).astype(np.float32))
    self.x = tf.constant(rng.normal(size=[4, 8]).astype(np.float32))
    self.batch = NestedMap(labels=tf.constant([0, 3, 4, 1]),
                           weights=tf.constant([1.0, 0.5, 0.0, 2.0]))

  def _Step(self, on_device):
    def _Run(x):
      with tf.GradientTape() as tape:
        tape.watch(x)
        if on_device:
          out = device_call.OnDevice(_CPU1, _Loss, self.w, x, self.batch)
        else:
          with tf.device(_CPU1):
            out = _Loss(self.w, x, self.batch)
      return out, tape.gradient(out.loss, [self.w, x])
    return tf.function(_Run, autograph=False)

  def _Captured(self, x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      out = device_call.OnDevice(
          _CPU1, lambda x, batch: _Loss(self.w, x, batch), x, self.batch)
    return tape.gradient(out.loss, [self.w, x])

  def testSameValuesAndGradients(self):
    expected = self._Step(False)(self.x)
    out, grads = self._Step(True)(self.x)
    self.assertAllClose(expected[0].loss, out.loss, atol=1e-6)
    self.assertEqual(4, int(out.count))
    self.assertAllClose(expected[1], grads, atol=1e-6)
    # A variable fn reads without being passed it gets its gradient too.
    captured = tf.function(lambda x: self._Captured(x), autograph=False)
    self.assertAllClose(expected[1], captured(self.x), atol=1e-6)
    # Eagerly: fn under the device scope.
    with tf.GradientTape() as tape:
      tape.watch(self.x)
      out = device_call.OnDevice(_CPU1, _Loss, self.w, self.x, self.batch)
    self.assertAllClose(expected[1], tape.gradient(out.loss, [self.w, self.x]),
                        atol=1e-6)

  def testSiblingOutputsOfASourceAreNotDifferentiatedAgain(self):
    """An argument that is one output of an op with others (a batch from an
    iterator is one op) does not put what its siblings feed between the
    sources and the outputs: the backward of that (here a custom gradient
    fed by the other half of a split) runs once, for the outer tape, and
    not again inside OnDevice's gradient."""
    calls = []

    @tf.custom_gradient
    def _Upstream(x):
      def _Grad(dy):
        calls.append(dy)
        return 2.0 * dy
      return 2.0 * x, _Grad

    def _Run(v):
      with tf.GradientTape() as tape:
        tape.watch(v)
        a, b = tf.split(v, 2)        # One op, two outputs.
        out = device_call.OnDevice(_CPU1, lambda y, b: tf.reduce_sum(y * b),
                                   _Upstream(a), b)
      return tape.gradient(out, v)

    grad = tf.function(_Run, autograph=False)(tf.constant([1., 2., 3., 4.]))
    # out = sum(2 a b): d/da = 2 b, d/db = 2 a.
    self.assertAllClose([6.0, 8.0, 2.0, 4.0], grad)
    self.assertLen(calls, 1)

  def testBackwardOnTheForwardsDevice(self):
    for on_device, device in ((True, 'CPU:1'), (False, 'CPU:0')):
      step = self._Step(on_device)
      placement = memory_profile.Placement(lambda: step(self.x))  # pylint: disable=cell-var-from-loop
      # The gradient products of tf.matmul(x, w): d_x and d_w.
      grads = {n: d for n, d in placement.items()
               if 'gradient' in n and n.endswith(('MatMul', 'MatMul_1'))}
      self.assertLen(grads, 2, msg=sorted(placement))
      for name, d in grads.items():
        self.assertEqual(device, d.rsplit('device:', 1)[-1],
                         msg=f'on_device={on_device}: {name}')


if __name__ == '__main__':
  tf.test.main()
