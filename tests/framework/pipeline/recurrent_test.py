"""Tests for cadence.framework.pipeline.recurrent (Recurrent) and
cell_program."""
import numpy as np
import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework.nested_map import NestedMap
from cadence.framework.pipeline import recurrent
from cadence.framework import step_seed
from cadence.tests import test_utils

_T, _B, _D = 5, 2, 3


def _RnnCell(theta, state, inputs):
  h = tf.tanh(tf.matmul(state.h, theta.w) + inputs.x * theta.b)
  return NestedMap(h=h, t=state.t + 1)          # t: an int32 step counter.


def _DropoutCell(theta, state, inputs):
  keep = tf.random.stateless_uniform(tf.shape(inputs.x),
                                     seed=theta.step_seed) > 0.4
  x = tf.where(keep, inputs.x / 0.6, tf.zeros_like(inputs.x))
  return NestedMap(h=tf.tanh(tf.matmul(state.h, theta.w) + x), t=state.t + 1)


def _Unrolled(theta, state0, inputs, cell_fn, seed=None):
  """The reference: a python loop over the steps."""
  state, accs = state0, []
  for t in range(inputs.x.shape[0]):
    th = theta
    if seed is not None:
      th = base_layer.WithStepSeed(theta, step_seed.MicroBatchSeed(seed, t))
    state = cell_fn(th, state, NestedMap(x=inputs.x[t]))
    accs.append(state)
  acc = tf.nest.map_structure(lambda *xs: tf.stack(xs), *accs)
  return acc, state


class RecurrentTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    rng = np.random.RandomState(0)
    self.w = tf.Variable(rng.normal(size=[_D, _D]).astype(np.float32))
    self.b = tf.Variable(rng.normal(size=[_D]).astype(np.float32))
    self.xs = tf.constant(rng.normal(size=[_T, _B, _D]).astype(np.float32))
    self.h0 = tf.constant(rng.normal(size=[_B, _D]).astype(np.float32))

  def _LossAndGrads(self, run):
    """Runs `run(theta, state0, inputs)`; returns loss and its gradients."""

    def _Loss():
      theta = NestedMap(w=self.w, b=self.b)
      state0 = NestedMap(h=self.h0, t=tf.constant(0))
      acc, final = run(theta, state0, NestedMap(x=self.xs))
      # Weights per step make every acc entry matter differently.
      weights = tf.reshape(tf.range(1, _T + 1, dtype=tf.float32), [-1, 1, 1])
      loss = (tf.reduce_sum(acc.h ** 2 * weights) +
              3.0 * tf.reduce_sum(final.h))
      return [loss, acc.h, final.h, acc.t, final.t]

    out, grads = test_utils.LossAndGrads(
        _Loss, [self.w, self.b, self.xs, self.h0])
    return out + grads

  def _AssertMatchesUnrolled(self, cell_fn, seed=None, use_function=False):
    def _Rec(theta, state0, inputs):
      return recurrent.Recurrent(theta, state0, inputs, cell_fn,
                                 step_seed=seed)

    def _Ref(theta, state0, inputs):
      return _Unrolled(theta, state0, inputs, cell_fn, seed)

    rec = self._LossAndGrads
    if use_function:
      rec = tf.function(self._LossAndGrads)
    got = rec(_Rec)
    want = self._LossAndGrads(_Ref)
    for g, w in zip(got, want):
      if w is None:     # A weight the cell does not read.
        self.assertIsNone(g)
      else:
        self.assertAllClose(w, g, atol=1e-5, rtol=1e-5)
    self.assertAllEqual(got[3], np.arange(1, _T + 1))   # int state stacked.

  def testRnnMatchesUnrolledEager(self):
    self._AssertMatchesUnrolled(_RnnCell)

  def testRnnMatchesUnrolledInFunction(self):
    self._AssertMatchesUnrolled(_RnnCell, use_function=True)

  def testDropoutMatchesUnrolledWithPerStepSeeds(self):
    seed = step_seed.MakeStepSeed(7)
    self._AssertMatchesUnrolled(_DropoutCell, seed=seed)
    self._AssertMatchesUnrolled(_DropoutCell, seed=seed, use_function=True)

  def testDropoutMasksDifferAcrossStepsAndRepeatPerSeed(self):
    seed = step_seed.MakeStepSeed(7)

    def _Masks(seed):
      def _Cell(theta, state, inputs):
        del inputs
        keep = tf.random.stateless_uniform([64], seed=theta.step_seed) > 0.5
        return NestedMap(m=tf.cast(keep, tf.float32) + 0.0 * state.m)
      acc, _ = recurrent.Recurrent(NestedMap(), NestedMap(m=tf.zeros([64])),
                                   NestedMap(x=tf.zeros([3, 1])), _Cell,
                                   step_seed=seed)
      return acc.m.numpy()

    masks = _Masks(seed)
    self.assertNotAllEqual(masks[0], masks[1])
    self.assertNotAllEqual(masks[1], masks[2])
    self.assertAllEqual(masks, _Masks(seed))
    self.assertNotAllEqual(masks, _Masks(step_seed.MakeStepSeed(8)))

  def testDynamicNumberOfSteps(self):
    theta = NestedMap(w=self.w, b=self.b)

    @tf.function(input_signature=[tf.TensorSpec([None, _B, _D])])
    def _Run(xs):
      with tf.GradientTape() as tape:
        tape.watch(xs)
        acc, _ = recurrent.Recurrent(
            theta, NestedMap(h=self.h0, t=tf.constant(0)), NestedMap(x=xs),
            _RnnCell)
        loss = tf.reduce_sum(acc.h)
      return acc.h, tape.gradient(loss, xs)

    for steps in (1, 3):
      xs = self.xs[:steps]
      got_h, got_dx = _Run(xs)
      with tf.GradientTape() as tape:
        tape.watch(xs)
        acc, _ = _Unrolled(theta, NestedMap(h=self.h0, t=tf.constant(0)),
                           NestedMap(x=xs), _RnnCell)
        loss = tf.reduce_sum(acc.h)
      self.assertAllClose(acc.h, got_h, atol=1e-5)
      self.assertAllClose(tape.gradient(loss, xs), got_dx, atol=1e-5)

  def testCellIgnoringPreviousStateGetsZeroStateGradient(self):
    def _Cell(theta, state, inputs):
      del state
      return NestedMap(h=inputs.x * theta.b)

    h0 = tf.ones([_B, _D])
    with tf.GradientTape() as tape:
      tape.watch(h0)
      acc, _ = recurrent.Recurrent(NestedMap(b=self.b), NestedMap(h=h0),
                                   NestedMap(x=self.xs), _Cell)
      loss = tf.reduce_sum(acc.h)
    self.assertAllClose(np.zeros([_B, _D]), tape.gradient(loss, h0))
    self.assertAllClose(self.xs * self.b, acc.h)

  def testStatefulRandomOpIsRejected(self):
    def _Cell(theta, state, inputs):
      del theta
      return NestedMap(h=state.h + tf.random.uniform(tf.shape(inputs.x)))

    with self.assertRaisesRegex(ValueError,
                                r"Recurrent 'Recurrent'.*stateful random ops"
                                r'.*RandomUniform.*stateless'):
      recurrent.Recurrent(NestedMap(), NestedMap(h=self.h0),
                          NestedMap(x=self.xs), _Cell)

  def testStatefulRandomOpInNestedFunctionIsRejected(self):
    @tf.function
    def _Noise(x):
      return tf.nn.dropout(x, rate=0.5)

    def _Cell(theta, state, inputs):
      del theta
      return NestedMap(h=state.h + _Noise(inputs.x))

    with self.assertRaisesRegex(ValueError, 'stateful random ops'):
      recurrent.Recurrent(NestedMap(), NestedMap(h=self.h0),
                          NestedMap(x=self.xs), _Cell)

  def testTrainableVariableOutsideThetaIsRejected(self):
    hidden = tf.Variable(tf.ones([_D]), name='hidden_scale')

    def _Cell(theta, state, inputs):
      del theta
      return NestedMap(h=state.h + inputs.x * hidden)

    with self.assertRaisesRegex(
        ValueError, r"reads trainable variables \['hidden_scale:0'\] that "
        r'are not passed through theta'):
      recurrent.Recurrent(NestedMap(), NestedMap(h=self.h0),
                          NestedMap(x=self.xs), _Cell)

  def testNonTrainableCounterCountsForwardAndRecomputation(self):
    counter = tf.Variable(0, trainable=False)

    def _Cell(theta, state, inputs):
      counter.assign_add(1)
      return NestedMap(h=tf.tanh(state.h * theta.b + inputs.x))

    with tf.GradientTape() as tape:
      acc, _ = recurrent.Recurrent(NestedMap(b=self.b), NestedMap(h=self.h0),
                                   NestedMap(x=self.xs), _Cell)
      loss = tf.reduce_sum(acc.h)
    self.assertEqual(_T, int(counter.numpy()))         # forward: once/step.
    self.assertIsNotNone(tape.gradient(loss, self.b))
    self.assertEqual(2 * _T, int(counter.numpy()))     # + one re-run/step.

  def testStateChangingShapeIsRejected(self):
    def _Cell(theta, state, inputs):
      del theta, state
      return NestedMap(h=tf.concat([inputs.x, inputs.x], axis=1))

    with self.assertRaisesRegex(
        ValueError, r"state leaf 'h' as float32\[2, 6\], but the state is "
        r'float32\[2, 3\]'):
      recurrent.Recurrent(NestedMap(), NestedMap(h=self.h0),
                          NestedMap(x=self.xs), _Cell)

  def testStateChangingStructureIsRejected(self):
    def _Cell(theta, state, inputs):
      del theta
      return NestedMap(h=state.h, extra=inputs.x)

    with self.assertRaisesRegex(ValueError, 'structure of its state0'):
      recurrent.Recurrent(NestedMap(), NestedMap(h=self.h0),
                          NestedMap(x=self.xs), _Cell)

  def testInputsDisagreeingOnStepsAreRejected(self):
    with self.assertRaisesRegex(ValueError, r'leading dims \[4, 5\]'):
      recurrent.Recurrent(NestedMap(), NestedMap(h=self.h0),
                          NestedMap(x=self.xs, y=tf.zeros([4, 1])),
                          lambda th, s, x: s)


if __name__ == '__main__':
  tf.test.main()
