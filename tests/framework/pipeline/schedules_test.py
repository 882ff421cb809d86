"""Tests for cadence.framework.pipeline.schedules."""
import itertools

import tensorflow as tf

from cadence.framework.pipeline import schedules as ps

F, B = ps.FORWARD, ps.BACKWARD


def _Hand1F1B():
  """1F1B for K=2, M=4 by hand: cell 0 runs one forward ahead, then both
  cells alternate a backward and a forward."""
  a = ps.Action
  return [[a(F, 0, 0)], [a(F, 0, 1), a(F, 1, 0)], [a(B, 1, 0)],
          [a(B, 0, 0), a(F, 1, 1)], [a(F, 0, 2), a(B, 1, 1)],
          [a(B, 0, 1), a(F, 1, 2)], [a(F, 0, 3), a(B, 1, 2)],
          [a(B, 0, 2), a(F, 1, 3)], [a(B, 1, 3)], [a(B, 0, 3)]]


class GPipeScheduleTest(tf.test.TestCase):

  def testExhaustiveSmall(self):
    for k, m in itertools.product(range(1, 5), range(1, 9)):
      with self.subTest(k=k, m=m):
        ticks = ps.GPipeSchedule(k, m)
        ps.CheckSchedule(ticks, k, m)   # Every rule of the module docstring.
        n = m + k - 1
        self.assertLen(ticks, 2 * n)
        wave = ps.WavefrontSchedule(k, m)
        self.assertEqual(wave, [[(i, j) for kind, i, j in tick
                                 if kind == F] for tick in ticks[:n]])
        self.assertEqual(wave[::-1], [[(i, j) for kind, i, j in tick
                                       if kind == B] for tick in ticks[n:]])
        for i in range(k):   # Each cell: steps up, then back down.
          mine = [a for tick in ticks for a in tick if a.cell == i]
          self.assertEqual([(F, i, j) for j in range(m)] +
                           [(B, i, j) for j in reversed(range(m))], mine)
        self.assertEqual([m] * k, ps.InFlight(ticks, k))
        forward, backward = ps.SplitPhases(ticks)
        self.assertEqual([a for tick in ticks[:n] for a in tick], forward)
        self.assertEqual([a for tick in ticks[n:] for a in tick], backward)

  def testNoTickCanMove(self):
    # Every tick needs the one before it, so swapping any two breaks a rule.
    for k, m in itertools.product(range(1, 4), range(1, 4)):
      ticks = ps.GPipeSchedule(k, m)
      for t, u in itertools.combinations(range(len(ticks)), 2):
        swapped = list(ticks)
        swapped[t], swapped[u] = ticks[u], ticks[t]
        with self.subTest(k=k, m=m, t=t, u=u):
          with self.assertRaisesRegex(ValueError, 'needs'):
            ps.CheckSchedule(swapped, k, m)

  def testExplicitTable(self):
    self.assertEqual(
        '[[F(0, 0)], [F(0, 1), F(1, 0)], [F(1, 1)], '
        '[B(1, 1)], [B(0, 1), B(1, 0)], [B(0, 0)]]',
        str(ps.GPipeSchedule(2, 2)))

  def testBadSizes(self):
    with self.assertRaisesRegex(ValueError,
                                'GPipeSchedule: num_cells=2 and num_steps=0'):
      ps.GPipeSchedule(2, 0)


class OneFOneBScheduleTest(tf.test.TestCase):

  def testExhaustiveSmall(self):
    for k, m in itertools.product(range(1, 6), range(1, 9)):
      with self.subTest(k=k, m=m):
        ticks = ps.OneFOneBSchedule(k, m)
        ps.CheckSchedule(ticks, k, m, recurrent=False)
        # As long as GPipe's in unit-time ticks, with K - i steps in flight
        # instead of M.
        self.assertLen(ticks, 2 * (m + k - 1))
        self.assertEqual([min(k - i, m) for i in range(k)],
                         ps.InFlight(ticks, k))
        for i, order in enumerate(ps.CellOrders(ticks, k)):
          warm = min(k - i - 1, m)
          self.assertEqual([F] * warm, [a.kind for a in order[:warm]])
          steady = order[warm:warm + 2 * (m - warm)]
          self.assertEqual([F, B] * (m - warm), [a.kind for a in steady])
          self.assertEqual([a.step for a in order if a.kind == F],
                           list(range(m)))
          self.assertEqual([a.step for a in order if a.kind == B],
                           list(range(m)))

  def testHandWrittenTable(self):
    self.assertEqual(_Hand1F1B(), ps.OneFOneBSchedule(2, 4))
    self.assertEqual('[[F(0, 0)], [F(0, 1), F(1, 0)], [B(1, 0)], '
                     '[B(0, 0), F(1, 1)], [B(1, 1)], [B(0, 1)]]',
                     str(ps.OneFOneBSchedule(2, 2)))

  def testListScheduleOfGPipeOrdersIsGPipe(self):
    for k, m in itertools.product(range(1, 4), range(1, 5)):
      gpipe = ps.GPipeSchedule(k, m)
      self.assertEqual(gpipe, ps.ListSchedule(ps.CellOrders(gpipe, k), m,
                                              recurrent=True))

  def testDeadlockAndBadSizes(self):
    a = ps.Action
    with self.assertRaisesRegex(
        ValueError, r"ListSchedule: deadlock after 1 ticks; the next "
        r"actions \['B\(0, 0\)', 'F\(1, 1\)'\] all wait"):
      ps.ListSchedule([[a(F, 0, 0), a(B, 0, 0), a(F, 0, 1), a(B, 0, 1)],
                       [a(F, 1, 1), a(F, 1, 0), a(B, 1, 0), a(B, 1, 1)]], 2)
    with self.assertRaisesRegex(ValueError, 'OneFOneBSchedule: num_cells=0'):
      ps.OneFOneBSchedule(0, 2)


class ActionScopeTest(tf.test.TestCase):

  def testScopeRoundTrip(self):
    a = ps.Action(B, 1, 12)
    self.assertEqual('pipeline_action_B_1_12', a.scope)
    self.assertEqual(a, ps.ActionOfOp(f'train/{a.scope}/PartitionedCall/Mul'))
    # TF uniquifies a repeated scope with a suffix; the outermost counts
    # (gradient ops carry their forward op's name).
    self.assertEqual(a, ps.ActionOfOp(
        'pipeline_action_B_1_12_1/gradient_tape/pipeline_action_F_1_12/Mul'))
    self.assertEqual(ps.Action(B, 0, 3), ps.ActionOfOp(
        'gradient_tape/pipeline_action_F_0_3/MatMul_1/MatMul'))
    self.assertIsNone(ps.ActionOfOp('pipeline_action_F_0_3'))
    self.assertIsNone(ps.ActionOfOp('dense/MatMul'))


class CheckScheduleTest(tf.test.TestCase):

  def testWavefrontIsAForwardSchedule(self):
    for k, m in itertools.product(range(1, 5), range(1, 9)):
      with self.subTest(k=k, m=m):
        wave = ps.WavefrontSchedule(k, m)
        ps.CheckSchedule([[(F, i, j) for i, j in tick] for tick in wave],
                         k, m, backward=False)

  def testEachBrokenRule(self):
    a = ps.Action
    good = ps.GPipeSchedule(2, 2)
    cases = [
        ([good[1], good[0]] + good[2:],
         r'F\(0, 1\) at tick 0 needs F\(0, 0\), which runs at tick 1'),
        ([good[0] + good[1]] + good[2:],
         r'tick 0 has two actions of cell 0: \[F\(0, 0\), F\(0, 1\), '),
        (good + [[a(F, 0, 0)]], r'F\(0, 0\) runs twice, at ticks 0 and 6'),
        (good[:-1], r'B\(0, 0\) never runs'),
        (good + [[a(F, 2, 0)]], r"tick 6 has F\(2, 0\); expected kinds "
                                r"\('F', 'B'\) with cell < 2 and step < 2"),
        (good[:2] + [[a(F, 1, 1)], [a('X', 0, 0)]] + good[3:],
         r'tick 3 has X\(0, 0\)'),
    ]
    for ticks, error in cases:
      with self.subTest(error=error):
        with self.assertRaisesRegex(ValueError, 'CheckSchedule: ' + error):
          ps.CheckSchedule(ticks, 2, 2)
    with self.assertRaisesRegex(ValueError, r"tick 3 has B\(1, 1\); expected "
                                r"kinds \('F',\)"):
      ps.CheckSchedule(good, 2, 2, backward=False)

  def testOneFOneBNeedsStatelessCells(self):
    # The table a 1F1B schedule would give: valid when cells ignore their
    # previous state, K - i steps in flight per cell, and not splittable
    # into a forward phase and a backward phase.
    ticks = _Hand1F1B()
    ps.CheckSchedule(ticks, 2, 4, recurrent=False)
    self.assertEqual([2, 1], ps.InFlight(ticks, 2))
    with self.assertRaisesRegex(
        ValueError, r'B\(1, 0\) at tick 2 needs B\(1, 1\), which runs at '
        r'tick 4'):
      ps.CheckSchedule(ticks, 2, 4)
    with self.assertRaisesRegex(
        ValueError, r'SplitPhases: F\(1, 1\) at tick 3 comes after B\(1, 0\) '
        r'at tick 2; a schedule that interleaves forwards and backwards'):
      ps.SplitPhases(ticks)


if __name__ == '__main__':
  tf.test.main()
