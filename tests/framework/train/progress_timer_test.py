"""Tests for cadence.framework.train.progress_timer."""
import tensorflow as tf

from cadence.framework.train import progress_timer


def _Simulate(step_secs, interval, boundary, total):
  """The steps at which a loop logs, run as TrainProgram.Run runs it: a
  first step, then chunks to the next multiple of `boundary` or cut by the
  timer, the clock advancing `step_secs(step)` a step. Returns (steps
  logged, their times, the chunks' lengths)."""
  timer = progress_timer.ProgressTimer(interval)
  now = step_secs(0)
  timer.Logged(now)
  timer.Ran(1, now)
  step, logged, times, chunks = 1, [1], [now], []
  while step < total:
    limit = min((step // boundary + 1) * boundary, total) - step
    n = timer.Steps(now, limit)
    chunks.append(n)
    begin = now
    for _ in range(n):
      now += step_secs(step)
      step += 1
    timer.Ran(n, now - begin)
    if step % boundary == 0 or step == total or timer.Due(now):
      logged.append(step)
      times.append(now)
      timer.Logged(now)
  return logged, times, chunks


class ProgressTimerTest(tf.test.TestCase):

  def testFastStepsAreNotCut(self):
    # 10 ms a step: 50 steps take 0.5 s, far inside 30 s.
    logged, _, chunks = _Simulate(lambda s: 0.01, 30.0, 50, 500)
    self.assertEqual(logged, [1] + list(range(50, 501, 50)))
    self.assertEqual(chunks, [49] + [50] * 9)

  def testSlowStepsLogWithinTheInterval(self):
    # 1.7 s a step (0.6 steps/s): 50 steps would be 85 s without a line.
    logged, times, _ = _Simulate(lambda s: 1.7, 30.0, 50, 200)
    gaps = [b - a for a, b in zip(times, times[1:])]
    self.assertLessEqual(max(gaps), 30.0)
    self.assertGreaterEqual(min(gaps[:2]), 0.8 * 30.0 - 1.7)
    for boundary in (50, 100, 150, 200):   # The step lines stay.
      self.assertIn(boundary, logged)
    # At 1.7 s a step, 14 steps end within 24 s.
    self.assertEqual(logged[:4], [1, 15, 29, 43])

  def testAStepSlowerThanTheLastChunksStillLogsInTime(self):
    # The steps slow down by 25% after step 20: the aim's margin holds.
    logged, times, _ = _Simulate(lambda s: 1.0 if s < 20 else 1.25, 30.0,
                                 1000, 200)
    gaps = [b - a for a, b in zip(times, times[1:])]
    self.assertLessEqual(max(gaps), 30.0)
    self.assertEqual(logged[-1], 200)

  def testAStepLongerThanTheIntervalLogsEveryStep(self):
    logged, _, chunks = _Simulate(lambda s: 45.0, 30.0, 50, 5)
    self.assertEqual(logged, [1, 2, 3, 4, 5])
    self.assertEqual(chunks, [1, 1, 1, 1])

  def testZeroIntervalLogsByStepsOnly(self):
    logged, _, chunks = _Simulate(lambda s: 5.0, 0.0, 10, 30)
    self.assertEqual(logged, [1, 10, 20, 30])
    self.assertEqual(chunks, [9, 10, 10])

  def testNoRateYetRunsToTheBoundary(self):
    timer = progress_timer.ProgressTimer(30.0)
    self.assertEqual(timer.Steps(0.0, 50), 50)
    self.assertFalse(timer.Due(100.0))
    timer.Logged(0.0)
    self.assertEqual(timer.Steps(0.0, 50), 50)   # Still no rate.
    timer.Ran(2, 20.0)
    self.assertEqual(timer.Steps(0.0, 50), 2)    # 24 s at 10 s a step.
    self.assertFalse(timer.Due(10.0))
    self.assertTrue(timer.Due(15.0))

  def testBadInterval(self):
    with self.assertRaisesRegex(ValueError, 'interval=-1 must be >= 0'):
      progress_timer.ProgressTimer(-1)


if __name__ == '__main__':
  tf.test.main()
