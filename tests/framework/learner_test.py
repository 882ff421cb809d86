"""Tests for cadence.framework.learner."""

import numpy as np
import tensorflow as tf

from cadence.framework import learner
from cadence.framework import lr_schedule
from cadence.framework.nested_map import NestedMap
from cadence.framework import optimizer


def _VarMap(rng):
  return NestedMap(
      enc=NestedMap(w=tf.Variable(rng.randn(3, 2).astype(np.float32)),
                    b=tf.Variable(rng.randn(2).astype(np.float32))),
      dec=[NestedMap(w=tf.Variable(rng.randn(2, 2).astype(np.float32)))],
      frozen=tf.Variable(np.ones([2], np.float32), trainable=False))


def _Loss(vm, x):
  h = tf.matmul(x, vm.enc.w) + vm.enc.b
  return tf.reduce_sum(tf.square(tf.matmul(h, vm.dec[0].w))) * vm.frozen[0]


def _SGDParams(**kwargs):
  p = learner.Learner.Params().Set(**{'learning_rate': 0.1, **kwargs})
  p.optimizer = optimizer.SGD.Params()
  return p


def _NumpyGrads(vm, x):
  """Hand-derived gradients of _Loss (frozen[0] == 1)."""
  w1, b, w2 = vm.enc.w.numpy(), vm.enc.b.numpy(), vm.dec[0].w.numpy()
  h = x @ w1 + b
  dy = 2 * (h @ w2)
  dh = dy @ w2.T
  return {'dec[0].w': h.T @ dy, 'enc.b': dh.sum(0), 'enc.w': x.T @ dh}


class LearnerTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    self.rng = np.random.RandomState(0)
    self.x = self.rng.randn(4, 3).astype(np.float32)

  def _Step(self, lrn, vm, traced=True):
    def Step(step, x):
      with tf.GradientTape() as tape:
        loss = _Loss(vm, x)
      return lrn.Apply(step, tape, loss)
    return tf.function(Step) if traced else Step

  def testTrainableAndFilters(self):
    vm = _VarMap(self.rng)
    lrn = _SGDParams().Instantiate(var_map=vm)
    self.assertEqual([k for k, _ in lrn.trainable],
                     ['dec[0].w', 'enc.b', 'enc.w'])
    lrn = _SGDParams(bprop_variable_filter=r'^enc\.').Instantiate(var_map=vm)
    self.assertEqual([k for k, _ in lrn.trainable], ['enc.b', 'enc.w'])
    lrn = _SGDParams(bprop_variable_filter=r'\.w$',
                     bprop_variable_exclusion='dec').Instantiate(var_map=vm)
    self.assertEqual([k for k, _ in lrn.trainable], ['enc.w'])
    self.assertEqual(list(lrn.trainable_vars.keys()), ['enc'])

  def testFilteredVariablesDoNotChange(self):
    vm = _VarMap(self.rng)
    lrn = _SGDParams(bprop_variable_exclusion='enc').Instantiate(var_map=vm)
    lrn.Build()
    enc_before = [v.numpy() for v in vm.enc.Flatten()]
    dec_before = vm.dec[0].w.numpy()
    self._Step(lrn, vm)(0, self.x)
    for b, v in zip(enc_before, vm.enc.Flatten()):
      self.assertAllEqual(b, v.numpy())
    self.assertGreater(np.abs(vm.dec[0].w.numpy() - dec_before).max(), 0)

  def testSGDStepMatchesNumpy(self):
    vm = _VarMap(self.rng)
    p = _SGDParams()
    p.lr_schedule = lr_schedule.PiecewiseConstantSchedule.Params().Set(
        boundaries=[1], values=[1.0, 0.5])
    lrn = p.Instantiate(var_map=vm)
    lrn.Build()
    step = self._Step(lrn, vm)
    for s, lr in ((0, 0.1), (1, 0.05)):
      grads = _NumpyGrads(vm, self.x)
      before = {k: v.numpy() for k, v in lrn.trainable}
      stats = step(tf.constant(s, tf.int64), self.x)
      norm = np.sqrt(sum(np.sum(g**2) for g in grads.values()))
      self.assertAllClose(stats.grad_norm, norm, rtol=1e-5)
      self.assertFalse(stats.skipped)
      self.assertAllClose(stats.learning_rate, lr, rtol=1e-6)
      for k, v in lrn.trainable:
        self.assertAllClose(v.numpy(), before[k] - lr * grads[k], atol=1e-5)
    self.assertEqual(step.experimental_get_tracing_count(), 1)

  def testComputeGradientsStructure(self):
    vm = _VarMap(self.rng)
    lrn = _SGDParams().Instantiate(var_map=vm)
    with tf.GradientTape() as tape:
      loss = _Loss(vm, self.x)
    grads = lrn.ComputeGradients(tape, loss)
    self.assertTrue(grads.IsCompatible(lrn.trainable_vars))
    want = _NumpyGrads(vm, self.x)
    for k, g in grads.FlattenItems():
      self.assertAllClose(g, want[k], rtol=1e-5, atol=1e-5)

  def testClipping(self):
    vm = _VarMap(self.rng)
    clip = 0.5
    lrn = _SGDParams(clip_gradient_norm_to_value=clip).Instantiate(
        var_map=vm)
    lrn.Build()
    grads = _NumpyGrads(vm, self.x)
    norm = np.sqrt(sum(np.sum(g**2) for g in grads.values()))
    self.assertGreater(norm, clip)
    before = {k: v.numpy() for k, v in lrn.trainable}
    stats = self._Step(lrn, vm)(0, self.x)
    self.assertAllClose(stats.grad_norm, norm, rtol=1e-5)  # Before clipping.
    applied = {k: (before[k] - v.numpy()) / 0.1 for k, v in lrn.trainable}
    self.assertAllClose(
        np.sqrt(sum(np.sum(g**2) for g in applied.values())), clip,
        rtol=1e-4)
    for k in grads:
      self.assertAllClose(applied[k], grads[k] * clip / norm, atol=1e-5)

  def _CheckSkipped(self, p, x, vm=None, **kwargs):
    vm = vm or _VarMap(self.rng)
    lrn = p.Instantiate(var_map=vm)
    lrn.Build()
    step = self._Step(lrn, vm, **kwargs)
    step(tf.constant(0), self.x)  # A good step first: non-zero slots.
    before = [v.numpy().tobytes() for v in vm.Flatten()]
    slots_before = [s.numpy().tobytes() for _, v in lrn.trainable
                    for s in lrn.optimizer.Slots(v).values()]
    stats = step(tf.constant(1), x)
    self.assertTrue(stats.skipped)
    self.assertEqual(before, [v.numpy().tobytes() for v in vm.Flatten()])
    self.assertEqual(slots_before,
                     [s.numpy().tobytes() for _, v in lrn.trainable
                      for s in lrn.optimizer.Slots(v).values()])
    self.assertEqual(int(lrn.optimizer.num_updates.numpy()), 1)
    # And training goes on afterwards.
    self.assertFalse(step(tf.constant(2), self.x).skipped)
    self.assertNotEqual(before, [v.numpy().tobytes() for v in vm.Flatten()])
    return stats

  def testSkipOnNaNAndInf(self):
    p = learner.Learner.Params().Set(clip_gradient_norm_to_value=1.0)
    p.optimizer = optimizer.Adam.Params()
    for bad in (np.nan, np.inf):
      x = self.x.copy()
      x[0, 0] = bad
      for traced in (True, False):
        self._CheckSkipped(p, x, traced=traced)

  def testSkipOnLargeNorm(self):
    vm = _VarMap(self.rng)
    norm = np.sqrt(sum(np.sum(g**2) for g in _NumpyGrads(vm, self.x).values()))
    p = _SGDParams(grad_norm_to_clip_to_zero=2 * norm, learning_rate=1e-3)
    p.optimizer = optimizer.Momentum.Params()
    stats = self._CheckSkipped(p, self.x * 10, vm=vm)
    self.assertGreater(float(stats.grad_norm), 2 * norm)

  def testSkipOnNonFiniteLossOnly(self):
    vm = _VarMap(self.rng)
    lrn = _SGDParams().Instantiate(var_map=vm)
    lrn.Build()
    before = [v.numpy().tobytes() for v in vm.Flatten()]
    grads = lrn.trainable_vars.Transform(tf.ones_like)
    stats = lrn.ApplyGradients(0, grads, loss=tf.constant(np.nan))
    self.assertTrue(stats.skipped)
    self.assertEqual(before, [v.numpy().tobytes() for v in vm.Flatten()])

  def testL2Regularization(self):
    vm = _VarMap(self.rng)
    w = 0.3
    lrn = _SGDParams(l2_regularizer_weight=w).Instantiate(var_map=vm)
    want_l2 = w * sum(np.sum(v.numpy()**2) / 2 for _, v in lrn.trainable)
    self.assertAllClose(lrn.L2Loss(), want_l2, rtol=1e-6)
    with tf.GradientTape() as tape:
      loss = _Loss(vm, self.x)
    grads = lrn.ComputeGradients(tape, loss)
    want = _NumpyGrads(vm, self.x)
    for k, v in lrn.trainable:
      self.assertAllClose(dict(grads.FlattenItems())[k],
                          want[k] + w * v.numpy(), rtol=1e-5, atol=1e-5)
    # The frozen variable is not regularised.
    self.assertNotIn('frozen', dict(grads.FlattenItems()))

  def testL2GradientEqualsTapeOfL2Loss(self):
    vm = _VarMap(self.rng)
    lrn = _SGDParams(l2_regularizer_weight=0.7).Instantiate(var_map=vm)
    with tf.GradientTape() as tape:
      l2 = lrn.L2Loss()
    want = tape.gradient(l2, [v for _, v in lrn.trainable])
    with tf.GradientTape() as tape:
      loss = tf.constant(0.0) * _Loss(vm, self.x)
    got = lrn.ComputeGradients(tape, loss).Flatten()
    for g, e in zip(got, want):
      self.assertAllClose(g, e, atol=1e-6)

  def testBadParams(self):
    vm = _VarMap(self.rng)
    with self.assertRaisesRegex(
        ValueError, r"Learner 'learner': learning_rate=-0.1 must be a "
        'number >= 0.'):
      _SGDParams().Set(learning_rate=-0.1).Instantiate(var_map=vm)
    with self.assertRaisesRegex(
        ValueError, r"Learner 'lm': clip_gradient_norm_to_value=-1.0 must "
        'be a number >= 0'):
      _SGDParams(name='lm', clip_gradient_norm_to_value=-1.0).Instantiate(
          var_map=vm)
    with self.assertRaisesRegex(
        ValueError, r"Learner 'learner': bprop_variable_filter='\(' is not a "
        'valid regex'):
      _SGDParams(bprop_variable_filter='(').Instantiate(var_map=vm)
    with self.assertRaisesRegex(AttributeError, r"did you mean "
                                r"'learning_rate'"):
      learner.Learner.Params().Set(learning_rat=0.1)
    p = _SGDParams(shard_optimizer_state=True)
    p.optimizer = optimizer.Adafactor.Params()
    with self.assertRaisesRegex(
        ValueError, r"Learner 'learner': shard_optimizer_state=True needs an "
        r'optimizer that updates each element on its own \(SGD, Momentum or '
        r'Adam\); Adafactor reads whole rows, columns or variables'):
      p.Instantiate(var_map=vm)
    with self.assertRaisesRegex(
        ValueError, r"Learner 'learner': shard_optimizer_state='yes' must be "
        'True or False'):
      _SGDParams(shard_optimizer_state='yes').Instantiate(var_map=vm)

  def testOptimizerAndScheduleMustBeOfTheirKind(self):
    vm = _VarMap(self.rng)
    p = _SGDParams()
    p.optimizer.cls = lr_schedule.ConstantSchedule
    with self.assertRaisesWithLiteralMatch(
        ValueError, "Learner 'learner': optimizer.cls=<class 'cadence."
        "framework.lr_schedule.ConstantSchedule'> must be one of SGD, "
        'Momentum, Adam, Adafactor (cadence.framework.optimizer).'):
      p.Instantiate(var_map=vm)
    p = _SGDParams()
    p.optimizer.cls = 'adam'   # A name where a class is expected.
    with self.assertRaisesWithLiteralMatch(
        ValueError, "Learner 'learner': optimizer.cls='adam' must be one of "
        'SGD, Momentum, Adam, Adafactor (cadence.framework.optimizer). Did '
        "you mean type('cadence.framework.optimizer.Adam') (a class, not a "
        'str)?'):
      p.Instantiate(var_map=vm)
    p = _SGDParams()
    p.lr_schedule.cls = optimizer.Adam
    with self.assertRaisesWithLiteralMatch(
        ValueError, "Learner 'learner': lr_schedule.cls=<class 'cadence."
        "framework.optimizer.Adam'> must be one of ConstantSchedule, "
        'PiecewiseConstantSchedule, LinearRampupSchedule, '
        'TransformerSchedule, CosineSchedule (cadence.framework.'
        'lr_schedule).'):
      p.Instantiate(var_map=vm)
    with self.assertRaisesWithLiteralMatch(
        ValueError, "Learner 'learner': lr_schedule=None must be the Params() "
        'of one of ConstantSchedule, PiecewiseConstantSchedule, '
        'LinearRampupSchedule, TransformerSchedule, CosineSchedule '
        '(cadence.framework.lr_schedule).'):
      _SGDParams(lr_schedule=None).Instantiate(var_map=vm)

  def testMismatchedGradients(self):
    vm = _VarMap(self.rng)
    lrn = _SGDParams().Instantiate(var_map=vm)
    with self.assertRaisesRegex(
        ValueError, r"Learner 'learner': gradient keys \['enc.w'\] do not "
        r"match the trained variables \['dec\[0\].w', 'enc.b', 'enc.w'\]"):
      lrn.ApplyGradients(0, NestedMap(enc=NestedMap(w=tf.zeros([3, 2]))))


if __name__ == '__main__':
  tf.test.main()
