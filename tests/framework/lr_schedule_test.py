"""Tests for cadence.framework.lr_schedule against numpy formulas."""
import math

import numpy as np
import tensorflow as tf

from cadence.framework import lr_schedule

_STEPS = [0, 1, 3, 4, 5, 9, 10, 11, 50, 1000]


class ScheduleTest(tf.test.TestCase):

  def _CheckSteps(self, sched, expected_fn, atol=1e-6):
    """Eager int steps, eager tensors, and one traced tf.function agree."""
    fn = tf.function(sched.Value)
    for s in _STEPS:
      want = np.float32(expected_fn(s))
      self.assertAllClose(sched.Value(s), want, atol=atol, rtol=1e-6)
      self.assertAllClose(sched.Value(tf.constant(s, tf.int64)), want,
                          atol=atol, rtol=1e-6)
      got = fn(tf.constant(s, tf.int64))
      self.assertEqual(got.dtype, tf.float32)
      self.assertAllClose(got, want, atol=atol, rtol=1e-6)
    self.assertEqual(fn.experimental_get_tracing_count(), 1)

  def testConstant(self):
    sched = lr_schedule.ConstantSchedule.Params().Set(value=0.5).Instantiate()
    self._CheckSteps(sched, lambda s: 0.5)

  def testPiecewiseConstant(self):
    sched = lr_schedule.PiecewiseConstantSchedule.Params().Set(
        boundaries=[4, 10], values=[1.0, 0.1, 0.01]).Instantiate()
    self._CheckSteps(sched, lambda s: 1.0 if s < 4 else 0.1 if s < 10 else
                     0.01)

  def testPiecewiseConstantNoBoundaries(self):
    sched = lr_schedule.PiecewiseConstantSchedule.Params().Set(
        boundaries=[], values=[0.3]).Instantiate()
    self._CheckSteps(sched, lambda s: 0.3)

  def testPiecewiseConstantLengthMismatch(self):
    p = lr_schedule.PiecewiseConstantSchedule.Params().Set(
        boundaries=[4, 10], values=[1.0, 0.1])
    with self.assertRaisesRegex(
        ValueError, r'PiecewiseConstantSchedule: got 2 values for 2 '
        r'boundaries; need len\(values\) == len\(boundaries\) \+ 1 = 3'):
      p.Instantiate()

  def testPiecewiseConstantNotIncreasing(self):
    p = lr_schedule.PiecewiseConstantSchedule.Params().Set(
        boundaries=[10, 4], values=[1.0, 0.1, 0.01])
    with self.assertRaisesRegex(
        ValueError, r'boundaries=\[10, 4\] must be strictly increasing'):
      p.Instantiate()

  def testLinearRampup(self):
    sched = lr_schedule.LinearRampupSchedule.Params().Set(
        warmup_steps=10, start=0.2, peak=2.0).Instantiate()
    self._CheckSteps(sched, lambda s: 0.2 + 1.8 * min(s / 10.0, 1.0))

  def testLinearRampupZeroWarmup(self):
    sched = lr_schedule.LinearRampupSchedule.Params().Set(
        warmup_steps=0, peak=3.0).Instantiate()
    self._CheckSteps(sched, lambda s: 3.0)

  def testLinearRampupNegativeWarmup(self):
    with self.assertRaisesRegex(
        ValueError,
        r'LinearRampupSchedule: warmup_steps=-1 must be a number >= 0'):
      lr_schedule.LinearRampupSchedule.Params().Set(
          warmup_steps=-1).Instantiate()

  def testTransformer(self):
    sched = lr_schedule.TransformerSchedule.Params().Set(
        model_dim=16, warmup_steps=5, worker_replicas=2).Instantiate()
    w = 10.0
    self._CheckSteps(
        sched, lambda s: 16**-0.5 * min((s + 1) * w**-1.5, (s + 1)**-0.5))
    # The peak is at step w - 1.
    values = [float(sched.Value(s)) for s in range(20)]
    self.assertEqual(int(np.argmax(values)), 9)

  def testTransformerBadParams(self):
    with self.assertRaisesRegex(
        ValueError, r'TransformerSchedule: model_dim=0 must be a number > 0'):
      lr_schedule.TransformerSchedule.Params().Set(model_dim=0).Instantiate()

  def testCosine(self):
    sched = lr_schedule.CosineSchedule.Params().Set(
        initial_value=2.0, final_value=0.5, total_steps=50,
        warmup_steps=10).Instantiate()

    def Expected(s):
      if s < 10:
        return 2.0 * s / 10
      t = min(s - 10, 40) / 40
      return 0.5 + 1.5 * 0.5 * (1 + math.cos(math.pi * t))

    self._CheckSteps(sched, Expected)
    self.assertAllClose(sched.Value(30), 1.25, atol=1e-6)  # Half way.

  def testCosineNoWarmup(self):
    sched = lr_schedule.CosineSchedule.Params().Set(
        total_steps=10).Instantiate()
    self._CheckSteps(
        sched, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, 10) / 10)))

  def testCosineBadTotal(self):
    with self.assertRaisesRegex(
        ValueError,
        r'CosineSchedule: total_steps=5 must be > warmup_steps=5'):
      lr_schedule.CosineSchedule.Params().Set(
          total_steps=5, warmup_steps=5).Instantiate()

  def testUnknownParamDidYouMean(self):
    with self.assertRaisesRegex(AttributeError, r"did you mean 'warmup_steps'"):
      lr_schedule.CosineSchedule.Params().Set(warmup_step=3)


if __name__ == '__main__':
  tf.test.main()
