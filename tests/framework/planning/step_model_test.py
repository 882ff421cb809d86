"""Tests for cadence.framework.planning.step_model: a step's simulated time.

Bubbles of hand-worked schedules (equal-time actions) against their known
formulas; the simulation against schedules.Simulate where no compute is
shared; hand-computed steps for shared compute, remat, transfers, the
all-reduce and the update.
"""
import itertools
import unittest

from cadence.framework.pipeline import schedules
from cadence.framework.planning import hardware
from cadence.framework.planning import step_model

_ALONE = hardware.Parse('devices=64,tflops=1,memory_gbps=1000,link_gbps=1000')
A = schedules.Action


def _Stage(forward=1.0, backward=1.0, recompute=0.0, out_bytes=0,
           grad_bytes=0, update=0.0, accumulate=0.0):
  return step_model.StageCost(forward, backward, recompute, out_bytes,
                              grad_bytes, update, accumulate)


def _Bubble(name, stages, devices, micro_batches, per_stage=1.0,
            backward=1.0):
  schedule = schedules.Build(name, stages, devices, micro_batches)
  stage = _Stage(forward=per_stage, backward=backward * per_stage)
  return step_model.SimulateStep(schedule, [stage] * stages, _ALONE,
                                 'never').bubble


class KnownBubbleTest(unittest.TestCase):
  """Bubbles of equal-time actions: the formulas of each schedule's paper.

  GPipe and 1F1B (one stage per device, F = B): (K-1) / (M+K-1).
  Interleaved 1F1B (v stages per device, each stage F = B = 1/v):
    (D-1) / (v M + D - 1) (Narayanan et al., 2021).
  ZB-H1 (B split into B and W, F = B = W): (D-1) / (3 M + D - 1), for
    M >= D (Qi et al., 2023: the bubble shrinks from (D-1)(F+B+W) to
    (D-1)(F+B-W)).
  The last two are checked once their schedules are registered.
  """

  def testGPipeAnd1F1B(self):
    for name in ('gpipe', '1f1b'):
      for k, m in itertools.product(range(1, 5), range(1, 9)):
        with self.subTest(name=name, k=k, m=m):
          self.assertAlmostEqual((k - 1) / (m + k - 1),
                                 _Bubble(name, k, k, m))

  def testInterleaved(self):
    if 'interleaved_1f1b' not in schedules.Names():
      return   # Not registered on this branch yet.
    for d, v, m in itertools.product((2, 4), (1, 2, 3), (4, 8)):
      with self.subTest(d=d, v=v, m=m):
        self.assertAlmostEqual(
            (d - 1) / (v * m + d - 1),
            _Bubble('interleaved_1f1b', d * v, d, m, per_stage=1 / v))

  def testZeroBubbleH1(self):
    if 'zb_h1' not in schedules.Names():
      return   # Not registered on this branch yet.
    for d, m in itertools.product((2, 3, 4), (4, 6, 8)):
      with self.subTest(d=d, m=m):
        # backward 2: B and W take 1 each (W_SHARE = 1/2).
        self.assertAlmostEqual((d - 1) / (3 * m + d - 1),
                               _Bubble('zb_h1', d, d, m, backward=2.0))


class AgreesWithSchedulesSimulateTest(unittest.TestCase):

  def testEveryScheduleAtUnequalCosts(self):
    """Devices that share nothing: the same spans as schedules.Simulate,
    with each stage's own F and B costs."""
    checked = 0
    for name in [n for n in schedules.Names() if n != 'table']:
      for s, d, m in itertools.product((1, 2, 3, 4, 6), (1, 2, 3), (1, 2, 4,
                                                                     6)):
        try:
          schedule = schedules.Build(name, s, d, m)
        except ValueError:
          continue
        stages = [_Stage(forward=1 + 0.3 * i, backward=2.5 - 0.2 * i)
                  for i in range(s)]
        split = schedule.defers_w
        cost = lambda a, split=split, stages=stages: step_model.ActionCost(
            a, stages[a.stage], split, 'never', m)
        want = schedules.Simulate(schedule, cost=cost)
        got = step_model.SimulateStep(schedule, stages, _ALONE, 'never')
        self.assertEqual(set(want), set(got.spans))
        first = min(t for t, _ in want.values())
        for a, (start, end) in want.items():
          self.assertAlmostEqual(start - first, got.spans[a][0], msg=str(a))
          self.assertAlmostEqual(end - first, got.spans[a][1], msg=str(a))
        checked += 1
    self.assertGreater(checked, 40)


class SharedComputeTest(unittest.TestCase):

  def testTwoDevicesSharingACore(self):
    """GPipe, 2 stages, M=2, F=1, B=2; two actions at once run at 1.5 / 2
    of their speed each. By hand: F00 0-1; F01 and F10 together, 1/0.75 s:
    1-2.333; F11 alone 2.333-3.333; B11 alone 3.333-5.333; B01 and B10
    together, 2/0.75: 5.333-8; B00 alone 8-10."""
    hw = hardware.Parse('cpu,devices=2,tflops=1,memory_gbps=1,'
                        'concurrency=1/1.5')
    schedule = schedules.Build('gpipe', 2, 2, 2)
    step = step_model.SimulateStep(schedule, [_Stage(1.0, 2.0)] * 2, hw,
                                   'never')
    self.assertAlmostEqual(10.0, step.time)
    self.assertAlmostEqual(1 + 1 / 0.75, step.spans[A('F', 1, 0)][1])
    self.assertAlmostEqual(8.0, step.spans[A('B', 0, 1)][1])
    # Unshared devices: 9 (the two pairs overlap fully).
    alone = step_model.SimulateStep(schedule, [_Stage(1.0, 2.0)] * 2, _ALONE,
                                    'never')
    self.assertAlmostEqual(9.0, alone.time)

  def testNoGainMeansTheTotalWork(self):
    """Throughput 1 whatever runs at once: a K-stage pipeline takes all
    its work's time, as one device would."""
    hw = hardware.Parse('cpu,devices=4,tflops=1,memory_gbps=1,'
                        'concurrency=1/1/1')
    for name, m in (('gpipe', 8), ('1f1b', 4)):
      schedule = schedules.Build(name, 4, 4, m)
      step = step_model.SimulateStep(schedule, [_Stage(1.0, 2.0)] * 4, hw,
                                     'never')
      self.assertAlmostEqual(4 * m * 3.0, step.time)

  def testReplicasOnOneHostDivideIt(self):
    """Two replicas of one device each on a host whose throughput is 1.5
    with 2 actions: each runs at 0.75: F + B = 3 takes 4."""
    hw = hardware.Parse('cpu,devices=2,tflops=1,memory_gbps=1,'
                        'concurrency=1/1.5')
    schedule = schedules.Build('gpipe', 1, 1, 1)
    step = step_model.SimulateStep(schedule, [_Stage(1.0, 2.0)], hw, 'never',
                                   num_replicas=2)
    self.assertAlmostEqual(4.0, step.time)

  def testReplicasAtTheirOwnConcurrency(self):
    """The same, with 2 replicas gaining 1.8 together (the pipeline's
    concurrency 1.5 unused): each runs at 0.9: 3 / 0.9. With 2 stages a
    replica, its 2 running actions gain 1.5 x 1.8 / 2 together."""
    hw = hardware.Parse('cpu,devices=4,tflops=1,memory_gbps=1,'
                        'concurrency=1/1.5')
    one = schedules.Build('gpipe', 1, 1, 1)
    step = step_model.SimulateStep(one, [_Stage(1.0, 2.0)], hw, 'never',
                                   num_replicas=2,
                                   replica_concurrency=(1.0, 1.8))
    self.assertAlmostEqual(3 / 0.9, step.time)
    # GPipe, 2 stages, M=2 as testTwoDevicesSharingACore, at 0.9 alone and
    # 1.5 x 0.9 / 2 = 0.675 each of two: F00 1/0.9; F01, F10 together
    # 1/0.675; F11 1/0.9; B11 2/0.9; B01, B10 2/0.675; B00 2/0.9.
    two = schedules.Build('gpipe', 2, 2, 2)
    step = step_model.SimulateStep(two, [_Stage(1.0, 2.0)] * 2, hw, 'never',
                                   num_replicas=2,
                                   replica_concurrency=(1.0, 1.8))
    self.assertAlmostEqual(6 / 0.9 + 3 / 0.675, step.time)


class CostsTest(unittest.TestCase):

  def testRematReRunsTheForward(self):
    """One stage, M=3, F=1, B=2, a re-run 0.5: 3 + 6 plus one re-run for
    each micro-batch that re-runs."""
    schedule = schedules.Build('gpipe', 1, 1, 3)
    stage = _Stage(1.0, 2.0, recompute=0.5)
    for remat, want in (('never', 9.0), ('except_last', 10.0),
                        ('always', 10.5), ('selective', 10.5)):
      with self.subTest(remat=remat):
        self.assertAlmostEqual(want, step_model.SimulateStep(
            schedule, [stage], _ALONE, remat).time)

  def testGradientSumsFromTheSecondMicroBatch(self):
    schedule = schedules.Build('1f1b', 1, 1, 3)
    stage = _Stage(1.0, 2.0, accumulate=0.1)
    self.assertAlmostEqual(9.2, step_model.SimulateStep(
        schedule, [stage], _ALONE, 'never').time)

  def testTransfersBetweenStages(self):
    """2 stages, M=1, F=B=1; 1 GB crosses twice (forward, gradient) at 10
    GB/s plus 1 ms each."""
    hw = hardware.Parse('devices=2,tflops=1,memory_gbps=1,link_gbps=10,'
                        'latency_us=1000')
    schedule = schedules.Build('1f1b', 2, 2, 1)
    step = step_model.SimulateStep(schedule, [_Stage(out_bytes=1e9)] * 2,
                                   hw, 'never')
    self.assertAlmostEqual(4 + 2 * (1e-3 + 0.1), step.time)
    self.assertAlmostEqual(1.101, step.spans[A('F', 1, 0)][0])

  def testAllReduceAndUpdateAfterTheBackward(self):
    """R=4 replicas of one device: a ring all-reduce of 4 GB at 10 GB/s,
    1 ms a hop: 2 (R-1) (4 GB / 4 / 10 GB/s + 1 ms) = 0.606 s; then the
    update."""
    hw = hardware.Parse('devices=4,tflops=1,memory_gbps=1,link_gbps=10,'
                        'latency_us=1000')
    schedule = schedules.Build('gpipe', 1, 1, 1)
    step = step_model.SimulateStep(
        schedule, [_Stage(grad_bytes=4e9, update=0.5)], hw, 'never',
        num_replicas=4)
    self.assertAlmostEqual(0.606, step.allreduce)
    self.assertAlmostEqual(2 + 0.606 + 0.5, step.time)
    self.assertAlmostEqual(2.0, step.pipeline)

  def testOverheadsPerActionAndStep(self):
    """Each action pays its stage's overhead (F, B and a deferred W), the
    step its fixed cost once: gpipe, one stage, M=3, F=1, B=2, overhead
    0.25: 3 (1 + 0.25) + 3 (2 + 0.25) + fixed 0.5 = 11."""
    stage = step_model.StageCost(1.0, 2.0, 0.0, 0, 0, 0.0, 0.0,
                                 overhead=0.25)
    step = step_model.SimulateStep(schedules.Build('gpipe', 1, 1, 3),
                                   [stage], _ALONE, 'never', fixed=0.5)
    self.assertAlmostEqual(11.0, step.time)
    self.assertAlmostEqual(10.5, step.pipeline)
    self.assertAlmostEqual(0.5, step.fixed)
    self.assertAlmostEqual(1.25, step_model.ActionCost(
        A('W', 0, 0), stage, True, 'never', 3))

  def testSplitBackward(self):
    """With W actions, B is the input-gradient half of the backward (plus
    any re-run) and W the weight half (plus the gradient sum)."""
    stage = _Stage(1.0, 2.0, recompute=0.5, accumulate=0.1)
    self.assertAlmostEqual(1.5, step_model.ActionCost(
        A('B', 0, 1), stage, True, 'always', 4))
    self.assertAlmostEqual(1.1, step_model.ActionCost(
        A('W', 0, 1), stage, True, 'always', 4))
    self.assertAlmostEqual(2.6, step_model.ActionCost(
        A('B', 0, 1), stage, False, 'always', 4))

  def testSplitCostIsChargedToW(self):
    """A stage's `split` (what cutting the backward adds) lands on W
    only; a fused backward and F never pay it."""
    stage = _Stage(1.0, 2.0, accumulate=0.1)._replace(defer_w=0.3)
    for kind, splits, cost in (('W', True, 1.4), ('B', True, 1.0),
                               ('B', False, 2.1), ('F', True, 1.0)):
      with self.subTest(kind=kind, splits=splits):
        self.assertAlmostEqual(cost, step_model.ActionCost(
            A(kind, 0, 1), stage, splits, 'never', 4))


class RunTest(unittest.TestCase):

  def testDeadlockNamesWhatWaits(self):
    lists = {0: ['a1', 'a2'], 1: ['b1', 'b2']}
    cost = dict(a1=1, a2=1, b1=1, b2=1)
    needs = {'a1': [('b2', 0)], 'b1': [('a2', 0)]}
    with self.assertRaisesRegex(ValueError, 'deadlock: device 0 at item 0: '
                                'a1 waits for b2; device 1 at item 0: b1 '
                                'waits for a2'):
      step_model.Run(lists, cost, needs)

  def testDelaysAndZeroCosts(self):
    lists = {0: ['a', 'z'], 1: ['b']}
    times = step_model.Run(lists, dict(a=1.0, z=0.0, b=2.0),
                           {'b': [('a', 0.5)], 'z': [('b', 0.0)]})
    self.assertEqual({'a': (0.0, 1.0), 'b': (1.5, 3.5), 'z': (3.5, 3.5)},
                     times)


if __name__ == '__main__':
  unittest.main()
