"""Tests for cadence.framework.pipeline.schedules: schedules as data."""
import itertools

import tensorflow as tf

from cadence.framework.pipeline import schedule_builders
from cadence.framework.pipeline import schedules as ps

F, B, W = ps.FORWARD, ps.BACKWARD, ps.WEIGHT
a = ps.Action


def _Hand1F1B():
  """1F1B for K=2, M=4 by hand, as ticks: stage 0 runs one forward ahead,
  then both stages alternate a backward and a forward."""
  return [[a(F, 0, 0)], [a(F, 0, 1), a(F, 1, 0)], [a(B, 1, 0)],
          [a(B, 0, 0), a(F, 1, 1)], [a(F, 0, 2), a(B, 1, 1)],
          [a(B, 0, 1), a(F, 1, 2)], [a(F, 0, 3), a(B, 1, 2)],
          [a(B, 0, 2), a(F, 1, 3)], [a(B, 1, 3)], [a(B, 0, 3)]]


def _Schedule(lists, stage_devices=(0, 1), m=2, loss_inside=True):
  return ps.Schedule('hand', len(stage_devices), m, stage_devices, lists,
                     loss_inside)


class WavefrontScheduleTest(tf.test.TestCase):

  def testExhaustiveSmall(self):
    for k, m in itertools.product(range(1, 6), range(1, 7)):
      ticks = ps.WavefrontSchedule(k, m)
      self.assertLen(ticks, m + k - 1)
      seen = {}
      for t, tick in enumerate(ticks):
        self.assertEqual(sorted(tick), tick)
        self.assertLessEqual(len(tick), min(k, m))
        for i, j in tick:
          self.assertEqual(t, i + j)             # stage i works on mb t-i.
          seen[(i, j)] = t
      self.assertCountEqual(itertools.product(range(k), range(m)), seen)
      for (i, j), t in seen.items():       # Dependencies ran earlier.
        if i > 0:
          self.assertLess(seen[(i - 1, j)], t)
        if j > 0:
          self.assertLess(seen[(i, j - 1)], t)

  def testExplicitTable(self):
    self.assertEqual([[(0, 0)], [(0, 1), (1, 0)], [(0, 2), (1, 1)], [(1, 2)]],
                     ps.WavefrontSchedule(2, 3))

  def testBadSizes(self):
    with self.assertRaisesRegex(ValueError,
                                'num_stages=0 and num_micro_batches=3'):
      ps.WavefrontSchedule(0, 3)


class GPipeTest(tf.test.TestCase):

  def testExhaustiveSmall(self):
    for k, m in itertools.product(range(1, 5), range(1, 9)):
      with self.subTest(k=k, m=m):
        schedule = ps.Build('gpipe', k, k, m, recurrent=True)
        self.assertFalse(schedule.loss_inside)
        ticks = schedule.Ticks()
        n = m + k - 1
        self.assertLen(ticks, 2 * n)
        wave = ps.WavefrontSchedule(k, m)
        self.assertEqual(wave, [[(i, j) for kind, i, j in tick
                                 if kind == F] for tick in ticks[:n]])
        self.assertEqual(wave[::-1], [[(i, j) for kind, i, j in tick
                                       if kind == B] for tick in ticks[n:]])
        for i in range(k):   # Each stage: micro-batches up, then back down.
          self.assertEqual([(F, i, j) for j in range(m)] +
                           [(B, i, j) for j in reversed(range(m))],
                           list(schedule.actions[i]))
        self.assertEqual([m] * k, schedule.InFlight())
        self.assertAllClose((k - 1) / (m + k - 1), schedule.Bubble())

  def testNoTwoActionsOfADeviceCanSwap(self):
    # With state between micro-batches every action of a device needs the
    # one before it, so swapping any two breaks a rule.
    for k, m in itertools.product(range(1, 4), range(1, 4)):
      good = ps.Build('gpipe', k, k, m)
      for d in range(k):
        for t, u in itertools.combinations(range(len(good.actions[d])), 2):
          lists = [list(x) for x in good.actions]
          lists[d][t], lists[d][u] = lists[d][u], lists[d][t]
          with self.subTest(k=k, m=m, d=d, t=t, u=u):
            with self.assertRaisesRegex(ValueError, 'deadlocks|comes after'):
              ps.Check(ps.Schedule('gpipe', k, m, range(k), lists, False),
                       recurrent=True)

  def testExplicitTable(self):
    self.assertEqual(
        '[[F(0, 0)], [F(0, 1), F(1, 0)], [F(1, 1)], '
        '[B(1, 1)], [B(0, 1), B(1, 0)], [B(0, 0)]]',
        str(ps.Build('gpipe', 2, 2, 2).Ticks()))
    self.assertEqual('F0:0 F0:1 B0:1 B0:0\nF1:0 F1:1 B1:1 B1:0',
                     ps.Build('gpipe', 2, 2, 2).Text())

  def testLoopedStagesShareDevices(self):
    # 4 stages on 2 devices: stage s on device s % 2, each device's list in
    # the order of the stage-level ticks.
    schedule = ps.Build('gpipe', 4, 2, 2)
    self.assertEqual((0, 1, 0, 1), schedule.stage_devices)
    self.assertEqual([0, 2], schedule.Stages(0))
    self.assertEqual(
        'F0:0 F0:1 F2:0 F2:1 B2:1 B2:0 B0:1 B0:0\n'
        'F1:0 F1:1 F3:0 F3:1 B3:1 B3:0 B1:1 B1:0', schedule.Text())

  def testBadSizes(self):
    with self.assertRaisesRegex(
        ValueError, r"Schedule 'gpipe': num_micro_batches=0 must be an int "
        '>= 1'):
      ps.Build('gpipe', 2, 2, 0)
    with self.assertRaisesRegex(
        ValueError, r"Schedule 'gpipe': 2 stage\(s\) on 3 devices leave "
        r'device\(s\) \[2\] idle'):
      ps.Build('gpipe', 2, 3, 4)


class OneFOneBTest(tf.test.TestCase):

  def testExhaustiveSmall(self):
    for k, m in itertools.product(range(1, 6), range(1, 9)):
      with self.subTest(k=k, m=m):
        schedule = ps.Build('1f1b', k, k, m)
        self.assertTrue(schedule.loss_inside)
        # As long as GPipe's in unit-time ticks, with K - i micro-batches
        # in flight instead of M.
        self.assertLen(schedule.Ticks(), 2 * (m + k - 1))
        self.assertEqual([min(k - i, m) for i in range(k)],
                         schedule.InFlight())
        for i, order in enumerate(schedule.actions):
          warm = min(k - i - 1, m)
          self.assertEqual([F] * warm, [x.kind for x in order[:warm]])
          steady = order[warm:warm + 2 * (m - warm)]
          self.assertEqual([F, B] * (m - warm), [x.kind for x in steady])
          self.assertEqual([x.micro_batch for x in order if x.kind == F],
                           list(range(m)))
          self.assertEqual([x.micro_batch for x in order if x.kind == B],
                           list(range(m)))

  def testHandWrittenTable(self):
    self.assertEqual(_Hand1F1B(), ps.Build('1f1b', 2, 2, 4).Ticks())
    self.assertEqual('[[F(0, 0)], [F(0, 1), F(1, 0)], [B(1, 0)], '
                     '[B(0, 0), F(1, 1)], [B(1, 1)], [B(0, 1)]]',
                     str(ps.Build('1f1b', 2, 2, 2).Ticks()))

  def testStagesShareDevicesInTickOrder(self):
    # 4 stages on 2 devices: each device runs its two stages' 1F1B orders
    # merged by the ticks of the stage-level table; valid and complete.
    schedule = ps.Build('1f1b', 4, 2, 4)
    for d in range(2):
      self.assertCountEqual(
          [x for s in schedule.Stages(d)
           for x in ps.OneFOneBOrder(s, 4, 4)], schedule.actions[d])
    self.assertEqual([4, 3, 2, 1], schedule.InFlight())

  def testNeedsStatelessCells(self):
    # B(1, 0) runs before B(1, 1): wrong for cells with state between
    # micro-batches.
    with self.assertRaisesRegex(
        ValueError, r"Schedule '1f1b' deadlocks: .*device 1 at tick 1: "
        r'B\(1, 0\) waits for B\(1, 1\)'):
      ps.Build('1f1b', 2, 2, 4, recurrent=True)


def _PeakHeld(schedule):
  """Per device, the most stage-micro-batches forwarded and not yet done
  with (their W run, or their B when W is not deferred)."""
  done_kind = W if schedule.defers_w else B
  live, peak = [0] * schedule.num_devices, [0] * schedule.num_devices
  for tick in schedule.Ticks():
    for x in tick:
      d = schedule.stage_devices[x.stage]
      live[d] += {F: 1, done_kind: -1}.get(x.kind, 0)
      peak[d] = max(peak[d], live[d])
  return peak


class InterleavedTest(tf.test.TestCase):

  def testExhaustiveSmall(self):
    for d, v, groups in itertools.product((1, 2, 3, 4), (1, 2, 3), (1, 2, 3)):
      m = d * groups
      with self.subTest(d=d, v=v, m=m):
        schedule = ps.Build('interleaved_1f1b', d * v, d, m)
        self.assertTrue(schedule.loss_inside)
        self.assertEqual(tuple(s % d for s in range(d * v)),
                         schedule.stage_devices)
        for device in schedule.actions:   # v stages x M, forward and back.
          self.assertLen(device, 2 * v * m)
        # Megatron's bubble: each stage takes 1/v of a device's step.
        self.assertAllClose((d - 1) / (v * m + d - 1),
                            schedule.Bubble(lambda x: 1.0 / v))

  def testOneStagePerDeviceIs1F1B(self):
    for d, m in itertools.product((1, 2, 4), (1, 3, 8)):
      self.assertEqual(ps.Build('1f1b', d, d, m).actions,
                       ps.Build('interleaved_1f1b', d, d, m).actions)

  def testMegatronListsWhenDevicesDivideMicroBatches(self):
    # Megatron's rule, written out: device d's k-th forward is of chunk
    # (k // K) % v on micro-batch (k // (K v)) K + k % K, its k-th backward
    # the same with the chunks reversed; (D - d - 1) 2 + (v - 1) D forwards
    # to warm up, then F and B in turn.
    for d, v, groups in itertools.product((1, 2, 3, 4), (2, 3), (1, 2, 3)):
      m = d * groups
      want = []
      for dev in range(d):
        def _Nth(kind, k, dev=dev):
          group, chunk = divmod(k // d, v)
          chunk = v - 1 - chunk if kind == B else chunk
          return a(kind, chunk * d + dev, group * d + k % d)
        warm = min((d - dev - 1) * 2 + (v - 1) * d, v * m)
        order = [_Nth(F, k) for k in range(warm)]
        for k in range(v * m - warm):
          order += [_Nth(F, warm + k), _Nth(B, k)]
        want.append(tuple(order + [_Nth(B, k)
                                   for k in range(v * m - warm, v * m)]))
      with self.subTest(d=d, v=v, m=m):
        self.assertEqual(tuple(want),
                         ps.Build('interleaved_1f1b', d * v, d, m).actions)

  def testRounds(self):
    for d, m in itertools.product(range(1, 6), range(1, 21)):
      with self.subTest(d=d, m=m):
        rounds = schedule_builders.InterleavedRounds(d, m)
        self.assertEqual(m, sum(rounds))
        self.assertLen(rounds, max(1, m // d))
        self.assertEqual(sorted(rounds, reverse=True), rounds)
        self.assertLessEqual(rounds[0] - rounds[-1], 1)
        if m >= d:   # At least D, so device 0 never waits between chunks.
          self.assertTrue(all(d <= r < 2 * d for r in rounds))
        if m % d == 0:
          self.assertEqual([d] * (m // d), rounds)
    self.assertEqual([3, 2, 2], schedule_builders.InterleavedRounds(2, 7))
    self.assertEqual([2], schedule_builders.InterleavedRounds(4, 2))

  def testAnyNumberOfMicroBatches(self):
    # M < D and M not a multiple of D (PyTorch's ScheduleInterleaved1F1B
    # takes some; here every M >= 1). Build checks each action once, on its
    # stage's device, after what it needs, without deadlock.
    for d, m, v in itertools.product((2, 4), range(1, 9), (2, 3)):
      with self.subTest(d=d, m=m, v=v):
        schedule = ps.Build('interleaved_1f1b', d * v, d, m)
        self.assertEqual(tuple(s % d for s in range(d * v)),
                         schedule.stage_devices)
        for dev, device in enumerate(schedule.actions):
          self.assertCountEqual(
              [a(kind, s, j) for s in schedule.Stages(dev)
               for j in range(m) for kind in (F, B)], device)
          for t, x in enumerate(device):   # A device's F before its B.
            if x.kind == B:
              self.assertIn(a(F, x.stage, x.micro_batch), device[:t])
        # Memory: the warm-up's stage-micro-batches and the one forward
        # before each backward (at most v M); rounds under 2D, so at most
        # v (2D - 1), i.e. 2D - 1 micro-batches of a stage v times as
        # large; Megatron's (v - 1) D + 2 (D - d - 1) + 1 when D divides M.
        warm = [schedule_builders.InterleavedWarmUp(dev, d, v, m)
                for dev in range(d)]
        self.assertEqual([min(w + 1, v * m) for w in warm],
                         _PeakHeld(schedule))
        self.assertLessEqual(max(_PeakHeld(schedule)), v * (2 * d - 1))
        if m % d == 0:
          self.assertEqual(
              [min((v - 1) * d + 2 * (d - dev - 1) + 1, v * m)
               for dev in range(d)], _PeakHeld(schedule))
        # The bubble reported, each stage 1/v of a step: Megatron's for
        # M >= D; for M < D each micro-batch waits D stage-times to come
        # back to device 0 for its next stage.
        bubble = schedule.Bubble(lambda x: 1.0 / v)
        self.assertAllClose(
            ps.FormulaBubble('interleaved_1f1b', d * v, d, m), bubble)
        self.assertAllClose(
            (d - 1) / (v * m + d - 1) if m >= d else
            (v * (d - m) + m - 1) / (v * d + m - 1), bubble)

  def testHandWrittenLists(self):
    # D=4, v=2, M=2: one round of 2; device 3 goes from the first forward
    # of its last stage to 1F1B, the others run all their forwards first.
    self.assertEqual('F0:0 F0:1 F4:0 F4:1 B4:0 B4:1 B0:0 B0:1\n'
                     'F1:0 F1:1 F5:0 F5:1 B5:0 B5:1 B1:0 B1:1\n'
                     'F2:0 F2:1 F6:0 F6:1 B6:0 B6:1 B2:0 B2:1\n'
                     'F3:0 F3:1 F7:0 B7:0 F7:1 B7:1 B3:0 B3:1',
                     ps.Build('interleaved_1f1b', 8, 4, 2).Text())
    # D=2, v=2, M=5: rounds of 3 and 2 micro-batches.
    self.assertEqual(
        'F0:0 F0:1 F0:2 F2:0 F2:1 F2:2 B2:0 F0:3 B2:1 F0:4 B2:2 F2:3 B0:0 '
        'F2:4 B0:1 B0:2 B2:3 B2:4 B0:3 B0:4\n'
        'F1:0 F1:1 F1:2 F3:0 B3:0 F3:1 B3:1 F3:2 B3:2 F1:3 B1:0 F1:4 B1:1 '
        'F3:3 B1:2 F3:4 B3:3 B3:4 B1:3 B1:4',
        ps.Build('interleaved_1f1b', 4, 2, 5).Text())

  def testStagesAMultipleOfDevices(self):
    # The only size refused: no looped placement of v stages on each
    # device (every M >= 1 has a schedule).
    with self.assertRaisesRegex(
        ValueError, "Schedule 'interleaved_1f1b': interleaved stages: stage "
        r's on device s % K, num_stages=5 a multiple of num_devices=2 '
        r'\(stages_per_device = num_stages / num_devices on each device\)'):
      ps.Build('interleaved_1f1b', 5, 2, 4)


class ZeroBubbleTest(tf.test.TestCase):

  def testH1Exhaustive(self):
    for k, m in itertools.product(range(1, 6), range(1, 9)):
      with self.subTest(k=k, m=m):
        schedule = ps.Build('zb_h1', k, k, m)
        self.assertTrue(schedule.defers_w)
        # 1F1B's activations (F to B) and peak (F to W: S on every stage).
        self.assertEqual([min(k - i, m) for i in range(k)],
                         schedule.InFlight())
        self.assertLessEqual(max(_PeakHeld(schedule)), k)
        if m >= k:   # The paper's bubble when F = B = W.
          self.assertAllClose((k - 1) / (3 * m + k - 1), schedule.Bubble())

  def testH1OfTwoStagesByHand(self):
    self.assertEqual('F0:0 F0:1 B0:0 W0:0 F0:2 B0:1 W0:1 B0:2 W0:2\n'
                     'F1:0 B1:0 F1:1 B1:1 W1:0 F1:2 B1:2 W1:1 W1:2',
                     ps.Build('zb_h1', 2, 2, 3).Text())

  def testVPlacementAndBubbles(self):
    for d, m in itertools.product((1, 2, 4), (1, 2, 4, 8)):
      with self.subTest(d=d, m=m):
        schedule = ps.Build('zb_v', 2 * d, d, m)
        self.assertEqual(
            tuple(s if s < d else 2 * d - 1 - s for s in range(2 * d)),
            schedule.stage_devices)
        self.assertTrue(schedule.defers_w)
        # 1F1B's first stage: d micro-batches of a stage twice as large,
        # from F to B; one more until W.
        self.assertLessEqual(max(_PeakHeld(schedule)), 2 * min(d, m) + 1)
    # Each V stage is half a 1F1B stage: unit F, B, W of 1/2.
    half = lambda x: 0.5
    for d, m in ((2, 4), (4, 8), (4, 16)):
      v_bubble = ps.Build('zb_v', 2 * d, d, m).Bubble(half)
      h1_bubble = ps.Build('zb_h1', d, d, m).Bubble()
      one_f_one_b = ps.Build('1f1b', d, d, m).Bubble(
          lambda x: 1.0 if x.kind == F else 2.0)
      self.assertLess(v_bubble, h1_bubble)
      self.assertLess(h1_bubble, 0.5 * one_f_one_b)

  def testVNeedsTwoStagesPerDevice(self):
    with self.assertRaisesRegex(
        ValueError, r"Schedule 'zb_v': a V places 2 stages per device: "
        r'num_stages=3 must be 2 x num_devices=2'):
      ps.Build('zb_v', 3, 2, 4)


class TableTest(tf.test.TestCase):

  def testTableOfARegisteredScheduleIsThatSchedule(self):
    for name, k, d, m in (('1f1b', 2, 2, 4), ('zb_h1', 3, 3, 4),
                          ('zb_v', 4, 2, 4), ('interleaved_1f1b', 4, 2, 4)):
      with self.subTest(name=name):
        want = ps.Build(name, k, d, m)
        text = '# ' + name + '\n' + want.Text() + '\n\n'
        got = ps.Build(ps.TABLE, k, d, m, table=text)
        self.assertEqual(want.actions, got.actions)
        self.assertEqual(want.stage_devices, got.stage_devices)
        self.assertEqual(want.defers_w, got.defers_w)
        self.assertTrue(got.loss_inside)
    gpipe = ps.Build('gpipe', 2, 2, 2)
    self.assertFalse(ps.LossInside(ps.TABLE, gpipe.Text()))

  def testEachBadTable(self):
    good = 'F0:0 F0:1 B0:0 W0:0 B0:1 W0:1\nF1:0 B1:0 W1:0 F1:1 B1:1 W1:1'
    ps.Build(ps.TABLE, 2, 2, 2, table=good)
    cases = [
        ('F0:0 F0:1 B0:0 W0:0 B0:1 W0:1\nB1:0 F1:0 W1:0 F1:1 B1:1 W1:1',
         r'deadlocks: device 0 at tick 2: B\(0, 0\) waits for B\(1, 0\); '
         r'device 1 at tick 0: B\(1, 0\) waits for F\(1, 0\)'),
        ('F0:0 F0:1 B0:0 W0:0 B0:1 W0:1 F1:0\nB1:0 W1:0 F1:1 B1:1 W1:1',
         r'device 0, tick 6: F\(1, 0\): stage 1 runs on device 1, not 0'),
        ('F0:0 F0:1 B0:0 W0:0 W0:1\nF1:0 B1:0 W1:0 F1:1 B1:1 W1:1',
         r'device 0: micro-batch 1 never finishes stage 0: B\(0, 1\) is '
         'missing'),
        ('F0:0 F0:1 B0:0 W0:0 B0:1\nF1:0 B1:0 W1:0 F1:1 B1:1 W1:1',
         r'device 0: the weight gradient of B\(0, 1\) \(tick 4\) is never '
         r'applied: W\(0, 1\) is missing'),
        ('F0:0 F0:1 B0:0 W0:0 B0:1 W0:1', r'the table has 1 line\(s\); the '
         r'pipeline has 2 devices \(one line per device\)'),
        ('F0:0 F0:x', r"device 0, action 2: 'F0:x' is not an action written "
         r"kind stage:micro_batch \(e.g. 'F0:3'"),
        ('', r'needs its action lists as text \(schedule_table\)'),
    ]
    for text, error in cases:
      with self.subTest(error=error):
        with self.assertRaisesRegex(ValueError, "Schedule 'table'.*" + error):
          ps.Build(ps.TABLE, 2, 2, 2, table=text)


class ActionScopeTest(tf.test.TestCase):

  def testScopeRoundTrip(self):
    x = ps.Action(B, 1, 12)
    self.assertEqual('pipeline_action_B_1_12', x.scope)
    self.assertEqual(x, ps.ActionOfOp(f'train/{x.scope}/PartitionedCall/Mul'))
    # TF uniquifies a repeated scope with a suffix; the outermost counts
    # (gradient ops carry their forward op's name).
    self.assertEqual(x, ps.ActionOfOp(
        'pipeline_action_B_1_12_1/gradient_tape/pipeline_action_F_1_12/Mul'))
    self.assertEqual(ps.Action(B, 0, 3), ps.ActionOfOp(
        'gradient_tape/pipeline_action_F_0_3/MatMul_1/MatMul'))
    self.assertEqual(ps.Action(W, 2, 0), ps.ActionOfOp(
        'pipeline_action_W_2_0/MatMul'))
    self.assertIsNone(ps.ActionOfOp('pipeline_action_F_0_3'))
    self.assertIsNone(ps.ActionOfOp('dense/MatMul'))


class CheckTest(tf.test.TestCase):

  def testEachBrokenRule(self):
    good = [list(x) for x in ps.Build('1f1b', 2, 2, 2).actions]
    # good: [F0:0 F0:1 B0:0 B0:1], [F1:0 B1:0 F1:1 B1:1]
    cases = [
        ([[a(F, 0, 0), a(B, 0, 0), a(F, 0, 1), a(B, 0, 1)],
          [a(F, 1, 1), a(F, 1, 0), a(B, 1, 0), a(B, 1, 1)]],
         r'deadlocks: device 0 at tick 1: B\(0, 0\) waits for B\(1, 0\); '
         r'device 1 at tick 0: F\(1, 1\) waits for F\(0, 1\)'),
        ([good[0] + [a(F, 1, 0)], good[1]],
         r"device 0, tick 4: F\(1, 0\): stage 1 runs on device 1, not 0"),
        ([good[0] + [a(F, 0, 0)], good[1]],
         r"device 0, tick 4: F\(0, 0\) runs twice \(first at device 0, tick "
         r'0\)'),
        ([good[0][:-1], good[1]],
         r'device 0: micro-batch 1 never finishes stage 0: B\(0, 1\) is '
         'missing'),
        ([good[0] + [a(F, 2, 0)], good[1]],
         r"device 0, tick 4: F\(2, 0\) is not an action of kinds \('F', "
         r"'B', 'W'\) with stage < 2 and micro-batch < 2"),
        ([good[0] + [a('X', 0, 0)], good[1]], r'tick 4: X\(0, 0\) is not'),
        ([good[0] + [a(W, 0, 0)], good[1]],
         r'device 0: the weight gradient of B\(0, 1\) \(tick 3\) is never '
         r'applied: W\(0, 1\) is missing'),
    ]
    for lists, error in cases:
      with self.subTest(error=error):
        with self.assertRaisesRegex(ValueError, "Schedule 'hand'.*" + error):
          ps.Check(_Schedule(lists))
    ps.Check(_Schedule(good))

  def testLossOutsideNeedsForwardsFirst(self):
    lists = [list(x) for x in ps.Build('1f1b', 2, 2, 2).actions]
    with self.assertRaisesRegex(
        ValueError, r"device 1, tick 2: F\(1, 1\) comes after B\(1, 0\) at "
        'tick 1; with the loss outside the pipeline every forward'):
      ps.Check(_Schedule(lists, loss_inside=False))

  def testWeightGradientsAfterTheirBackward(self):
    # Each backward cut into B and W, W deferred: valid; W before its B
    # is not.
    lists = [[a(F, 0, 0), a(F, 0, 1), a(B, 0, 0), a(B, 0, 1), a(W, 0, 0),
              a(W, 0, 1)],
             [a(F, 1, 0), a(B, 1, 0), a(F, 1, 1), a(B, 1, 1), a(W, 1, 0),
              a(W, 1, 1)]]
    schedule = _Schedule(lists)
    ps.Check(schedule)
    self.assertTrue(schedule.defers_w)
    lists[1][4], lists[1][1] = lists[1][1], lists[1][4]
    with self.assertRaisesRegex(
        ValueError, r'device 1 at tick 1: W\(1, 0\) waits for B\(1, 0\)'):
      ps.Check(_Schedule(lists))


class RegistryTest(tf.test.TestCase):

  def testNames(self):
    self.assertEqual(('gpipe', '1f1b', 'interleaved_1f1b', 'zb_h1', 'zb_v',
                      'table'), ps.Names())
    self.assertEqual(ps.DEFAULT, 'gpipe')
    self.assertFalse(ps.LossInside('gpipe'))
    self.assertTrue(ps.LossInside('1f1b'))
    with self.assertRaisesRegex(
        KeyError, r"schedule='2f2b'; expected one of \['gpipe', '1f1b', "
        r"'interleaved_1f1b', 'zb_h1', 'zb_v', 'table'\]"):
      ps.Build('2f2b', 2, 2, 2)

  def testDocstringToySchedule(self):
    # The module docstring's example: one micro-batch's forward and
    # backward at a time. Registered, built and checked like any other.
    @ps.Register('one_at_a_time', loss_inside=True)
    def OneAtATime(stage_devices, num_devices, num_micro_batches):  # pylint: disable=unused-variable
      order = []
      for j in range(num_micro_batches):
        order += [a(F, s, j) for s in range(len(stage_devices))]
        order += [a(B, s, j) for s in reversed(range(len(stage_devices)))]
      return [[x for x in order if stage_devices[x.stage] == d]
              for d in range(num_devices)]

    try:
      schedule = ps.Build('one_at_a_time', 3, 3, 2)
      self.assertEqual('F0:0 B0:0 F0:1 B0:1\nF1:0 B1:0 F1:1 B1:1\n'
                       'F2:0 B2:0 F2:1 B2:1', schedule.Text())
      self.assertEqual([1, 1, 1], schedule.InFlight())
      # Each micro-batch walks 3 stages there and back: 2 x 3 ticks, one
      # device busy at a time.
      self.assertLen(schedule.Ticks(), 12)
      self.assertAllClose(2 / 3, schedule.Bubble())
      with self.assertRaisesRegex(ValueError, 'registered twice'):
        ps.Register('one_at_a_time', loss_inside=True)(OneAtATime)
    finally:
      ps.Unregister('one_at_a_time')
    self.assertNotIn('one_at_a_time', ps.Names())


class SimulateTest(tf.test.TestCase):

  def testCostsAndLatency(self):
    # GPipe, 2 stages x 2 micro-batches; F takes 1, B takes 2, a transfer
    # between devices 0.5.
    schedule = ps.Build('gpipe', 2, 2, 2)
    times = ps.Simulate(
        schedule, cost=lambda x: 1.0 if x.kind == F else 2.0,
        latency=lambda need, x: 0.5)
    self.assertEqual((0.0, 1.0), times[a(F, 0, 0)])
    self.assertEqual((1.0, 2.0), times[a(F, 0, 1)])
    self.assertEqual((1.5, 2.5), times[a(F, 1, 0)])
    self.assertEqual((2.5, 3.5), times[a(F, 1, 1)])
    self.assertEqual((3.5, 5.5), times[a(B, 1, 1)])
    self.assertEqual((5.5, 7.5), times[a(B, 1, 0)])
    self.assertEqual((6.0, 8.0), times[a(B, 0, 1)])
    self.assertEqual((8.0, 10.0), times[a(B, 0, 0)])
    # Busy 2 x (2 + 4) of 2 x 10: bubble 0.4; without the transfers the
    # step takes 9: 1/3.
    cost = lambda x: 1.0 if x.kind == F else 2.0
    self.assertAllClose(0.4, schedule.Bubble(cost, lambda need, x: 0.5))
    self.assertAllClose(1 / 3, schedule.Bubble(cost))


if __name__ == '__main__':
  tf.test.main()
