"""Tests for the layout planner: plan_model, planner and plan_measure."""

import collections
import re
from unittest import mock

import numpy as np
import tensorflow as tf

from cadence.framework import base_model
from cadence.framework import cluster as cluster_lib
from cadence.framework.jobs import inspect_lib
from cadence.framework import model_registry
from cadence.framework.pipeline import executor
from cadence.framework.pipeline import memory_estimate
from cadence.framework.pipeline import schedules
from cadence.framework.pipeline import timeline_chart
from cadence.framework.planning import calibration
from cadence.framework.planning import hardware
from cadence.framework.planning import plan_costs
from cadence.framework.planning import plan_measure
from cadence.framework.planning import plan_model
from cadence.framework.planning import plan_report
from cadence.framework.planning import planner
from cadence.framework.train import programs

_TINY = 'lm.one_billion_wds.OneBWdsGPipeTransformerTiny'
Layout = plan_model.Layout


def _Bytes(v):
  return v.shape.num_elements() * v.dtype.size


# H100-like, every op at 0.5 of peak (the op model is hardware_test's).
_FLAT_H100 = ('devices=4,tflops=989,efficiency=0.5,memory_gib=74.5,'
              'memory_gbps=3350,link_gbps=450,latency_us=5')

class PlanModelTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.params = model_registry.GetParams(_TINY, 'Train')
    cls.model = plan_model.PlanModel(cls.params)

  def testLayersCostWhatTheModelCosts(self):
    model = self.model
    self.assertEqual((4, 32), (model.num_units, model.batch_size))
    meta = model.Meta(self.params, 32)      # The experiment's 2 cells.
    self.assertEqual(meta.flops, model.flops)
    self.assertEqual(sum(meta.plan.StageFlops()), sum(model.item_flops))
    # Middle layers alike; the embedding in the first, softmax in the last.
    self.assertEqual(model.item_flops[1], model.item_flops[2])
    self.assertGreater(model.item_flops[0], model.item_flops[1])
    self.assertGreater(model.item_flops[3], model.item_flops[0])
    # Every variable once: the weights' bytes are the model's.
    task = base_model.BuildSymbolically(self.params)[0].task
    self.assertEqual(sum(_Bytes(v) for v in task.vars.Flatten()),
                     sum(w[0] for w in model.item_weights))
    # Adam: two slots of each trained weight.
    self.assertEqual([2 * w[1] for w in model.item_weights],
                     [w[2] for w in model.item_weights])
    self.assertEqual([[sum(w[i] for w in model.item_weights[:1])
                       for i in range(3)],
                      [sum(w[i] for w in model.item_weights[1:])
                       for i in range(3)]],
                     model.StageWeights([0, 1, 4]))

  def testOverridesRunTheLayout(self):
    model = self.model
    layout = Layout(2, 2, 4, 4, '1f1b', 'never', (0, 1, 2, 3, 4))
    params = model.LayoutParams(layout)
    self.assertEqual([1, 2, 3], params.task.stack_tpl.splits)
    self.assertEqual((4, 2, '1f1b', 'never', 16), (
        params.task.stack_tpl.pipeline_tpl.num_micro_batches,
        params.task.stack_tpl.pipeline_tpl.stages_per_device,
        params.task.stack_tpl.pipeline_tpl.schedule,
        params.task.stack_tpl.pipeline_tpl.remat, params.input.batch_size))
    # The params file text sets the same values.
    again = self.params.Copy()
    again.FromText(model.OverridesText(layout))
    self.assertEqual(params.ToText(), again.ToText())
    self.assertEqual(
        f'--model={_TINY} --worker_replicas=2 --worker_split_size=2 '
        '--model_params_override="task.stack_tpl.splits=[1, 2, 3];'
        'task.stack_tpl.pipeline_tpl.num_micro_batches=4;'
        "task.stack_tpl.pipeline_tpl.schedule='1f1b';"
        'task.stack_tpl.pipeline_tpl.stages_per_device=2;'
        "task.stack_tpl.pipeline_tpl.remat='never';input.batch_size=16\"",
        model.Flags(layout, _TINY))
    self.assertEqual([0, 2, 4], model.Bounds(
        Layout(1, 2, 2, 4, 'gpipe', 'never', None)))

  def testDeviceMemoryIsTheStageEstimate(self):
    """One stage a device: each device's peak is its stage's
    (memory_estimate.StageMemory of the task built with that layout)."""
    model = self.model
    for schedule, remat in (('gpipe', 'except_last'), ('1f1b', 'never')):
      layout = Layout(1, 2, 2, 4, schedule, remat, None)
      cluster = cluster_lib.Cluster.Params().Set(
          job='plan', num_devices=2, worker_split_size=2).Instantiate()
      with cluster:
        task, _ = base_model.BuildSymbolically(model.LayoutParams(layout))
        want = [s.total for s in inspect_lib.TaskStages(task.task)]
        shared = inspect_lib.TaskStages(task.task,
                                        memory_estimate.SharedMemory).total
      per_device, together = model.DeviceMemory(layout)
      self.assertEqual(want, per_device)
      self.assertEqual(shared, together)
    # Two stages on one device hold their sum at each moment: more than
    # either alone, at most both peaks.
    layout = Layout(1, 1, 2, 4, 'gpipe', 'never', None)
    per_device, together = model.DeviceMemory(layout)
    self.assertEqual([together], per_device)

  def testShardedLayoutHoldsOneRthOfTheSlots(self):
    # Sharded over 2 replicas: each device's peak is the estimate of the
    # task built with that layout (its slots' shards, the update's blocks).
    model = self.model
    layout = Layout(2, 2, 2, 4, 'gpipe', 'never', None, True)
    params = model.LayoutParams(layout)
    self.assertTrue(params.task.train.learner.shard_optimizer_state)
    self.assertIn('task.train.learner.shard_optimizer_state=True',
                  model.Flags(layout, _TINY))
    self.assertEqual('R=2 K=2 v=1 M=4 gpipe never cut=even sharded',
                     layout.Name())
    cluster = cluster_lib.Cluster.Params().Set(
        job='plan', num_devices=2, worker_split_size=2).Instantiate()
    with cluster:
      task, _ = base_model.BuildSymbolically(params)
      want = [s.total for s in inspect_lib.TaskStages(task.task,
                                                       num_replicas=2)]
    per_device, _ = model.DeviceMemory(layout)
    # Padding aside (a shard of each variable, not of the stage's sum).
    self.assertAllClose(want, per_device, rtol=1e-3)
    whole, _ = model.DeviceMemory(layout._replace(shard=False))
    slots = [w[2] for w in model.StageWeights(model.Bounds(layout))]
    for d in range(2):
      self.assertLess(per_device[d], whole[d])
      self.assertGreaterEqual(whole[d] - per_device[d], slots[d] // 4)

  def testNoPipeline(self):
    params = model_registry.GetParams(
        'synthetic.linear_regression.RegressionTiny', 'Train')
    with self.assertRaisesRegex(plan_model.NotPlannable,
                                'runs no pipeline'):
      plan_model.PlanModel(params)


class PlannerTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.model = plan_model.PlanModel(model_registry.GetParams(_TINY,
                                                              'Train'))
    # A device timed at one flat rate (no op model), so that the tests of
    # the search and the simulation can work the times out by hand.
    cls.hw = hardware.Parse(_FLAT_H100)
    cls.planner = planner.Planner(cls.model, cls.hw,
                                  plan_costs.FlopsCosts(cls.model, cls.hw))

  def testShardsTheSlotsOnlyWhereWholeOnesDoNotFit(self):
    layout = Layout(2, 2, 2, 4, 'gpipe', 'always', None)
    whole = max(self.model.DeviceMemory(layout)[0])
    sharded = max(self.model.DeviceMemory(layout._replace(shard=True))[0])
    self.assertLess(sharded, whole)
    hw = self.hw._replace(memory=(whole + sharded) // 2)
    search = planner.Planner(self.model, hw, plan_costs.FlopsCosts(
        self.model, hw))
    predictions, _ = search.Search(progress_secs=1e9)
    found = {p.layout: p for p in predictions}
    self.assertIs(found[layout].fits, False)
    self.assertTrue(found[layout._replace(shard=True)].fits)
    # Sharding is tried only where whole slots do not fit, never at R=1.
    for p in predictions:
      if p.layout.shard:
        self.assertGreater(p.layout.replicas, 1)
        self.assertIs(found[p.layout._replace(shard=False)].fits, False)

  def testRematsAreTheExecutors(self):
    self.assertCountEqual(executor.REMAT_MODES, planner.REMATS)

  def testOneDeviceByHand(self):
    """R=K=M=1: forward + backward (2x) of all FLOPs at peak x efficiency,
    then the update: weights, gradients and slots read and written."""
    model, hw = self.model, self.hw
    p = self.planner.Predict(Layout(1, 1, 1, 1, 'gpipe', 'never', None))
    compute = 3 * model.flops / (hw.flops * hw.efficiency)
    w, g, s = [sum(x[i] for x in model.item_weights) for i in range(3)]
    update = 2 * (w + g + s) / hw.memory_bandwidth
    self.assertAllClose(compute + update, p.step.time, rtol=1e-9)
    self.assertAllClose(update, p.step.update, rtol=1e-9)
    self.assertEqual(0.0, p.step.bubble)
    self.assertAllClose(model.batch_size / p.step.time, p.examples_per_sec)
    self.assertAllClose(3 * model.flops / p.step.time / hw.flops, p.mfu)
    self.assertTrue(p.fits)

  def testBalancedCutEvensTheStages(self):
    """3 stages of 4 layers: the even cut is 1/1/2, whose last stage also
    holds the final norm and the softmax (1.3 layers' FLOPs here). The
    balanced cut gives the middle stage two plain layers: 1/2/1, its
    largest stage ~2 layers instead of ~2.3."""
    layout = Layout(1, 3, 3, 4, 'gpipe', 'never', None)
    self.assertEqual([0, 1, 2, 4], self.model.Bounds(layout))
    balanced = self.planner.BalancedBounds(layout)
    self.assertEqual([0, 1, 3, 4], balanced)
    faster = self.planner.Predict(layout._replace(bounds=tuple(balanced)))
    self.assertLess(faster.step.time, self.planner.Predict(layout).step.time)

  def testSearch(self):
    with self.assertLogs(level='INFO') as logs:
      predictions, counts = self.planner.Search(progress_secs=0)
    # A progress line before each shape (R, K, S, M, schedule) at 0 s.
    shapes = len(logs.output)
    self.assertRegex(logs.output[0], r'Planning: 0 of \d+ shapes ')
    self.assertRegex(logs.output[-1], rf'Planning: {shapes - 1} of {shapes} '
                     r'shapes \(R, K, S, M, schedule\) simulated in \d+ s, '
                     r'\d+ layouts so far; best yet R=\d+ K=\d+ v=\d+ M=\d+ '
                     r'\S+ \S+ cut=\S+: [\d.]+ ms; about \d+ s left\.\.\.')
    # --plan_measure times the parts at these sizes before the search.
    self.assertEqual(
        sorted({self.model.PerReplicaBatch(p.layout) //
                p.layout.micro_batches for p in predictions}),
        planner.MicroBatchSizes(self.model, 4))
    self.assertGreater(len(predictions), 50)
    self.assertEqual(plan_report.Rank(predictions), predictions)
    seen = set()
    for p in predictions:
      lay = p.layout
      self.assertLessEqual(lay.replicas * lay.devices, 4)
      self.assertEqual(0, 32 % lay.replicas)
      self.assertEqual(0, (32 // lay.replicas) % lay.micro_batches)
      self.assertIn(lay.schedule, schedules.Names())
      # One remat per layout: the cheapest that fits (all fit here).
      key = lay._replace(remat=None)
      self.assertNotIn(key, seen)
      seen.add(key)
      self.assertEqual('never', lay.remat)
    self.assertEqual(3 * len(predictions), counts['dominated'])
    # The best is within TIE of the fastest.
    self.assertLessEqual(predictions[0].step.time,
                         (1 + plan_report.TIE) *
                         min(p.step.time for p in predictions))

  def testSearchFindsTheBestOfEveryLayoutSimulated(self):
    """The search's shortcuts (schedules with the same action lists
    simulated once; a remat left out once a cheaper one fits) lose
    nothing: simulating every layout (every shape, schedule, cut and
    remat) one by one ranks the same layout first, at the same time."""
    plan = self.planner
    predictions, _ = plan.Search(progress_secs=1e9)
    every = []
    for r, k, s in planner.Shapes(self.hw.num_devices, self.model.num_units,
                                  self.model.batch_size):
      for m in plan_model.MicroBatchCounts(self.model.batch_size // r,
                                        self.model.current.micro_batches):
        for name in planner.Schedules():
          try:
            schedules.Build(name, s, k, m)
          except ValueError:
            continue
          layout = Layout(r, k, s, m, name, 'never', None)
          for bounds in plan._Cuts(layout):  # pylint: disable=protected-access
            for remat in planner.REMATS:
              every.append(plan.Predict(layout._replace(remat=remat,
                                                        bounds=bounds)))
    self.assertGreater(len(every), 2 * len(predictions))
    best = min(p.step.time for p in every if p.fits is not False)
    self.assertAllClose(best, min(p.step.time for p in predictions
                                  if p.fits is not False), rtol=1e-12)
    self.assertEqual(plan_report.Rank(every)[0].step.time,
                     predictions[0].step.time)

  def testRankIsStepTimeOrderAndTheTieGoesToFewerDevices(self):
    step = collections.namedtuple('Step', ['time'])

    def _P(r, k, m, time, fits=True):
      return planner.Prediction(Layout(r, k, k, m, '1f1b', 'never', None),
                                step(time), None, None, fits, None, None)

    fast4 = _P(1, 4, 8, 1.000)   # The fastest, on 4 devices.
    tie2 = _P(1, 2, 8, 1.015)    # 1.5% slower on 2: a tie, it wins.
    tie2_m4 = _P(1, 2, 4, 1.019)  # Same devices, fewer micro-batches.
    slow1 = _P(1, 1, 1, 1.030)   # 3% slower than the fastest.
    big = _P(2, 2, 8, 0.5, fits=False)   # Does not fit: last.
    got = plan_report.Rank([big, slow1, fast4, tie2, tie2_m4])
    self.assertEqual([fast4, tie2, tie2_m4, slow1, big], got)
    # The layout chosen: the simplest within TIE of the fastest (1.019 is
    # within 2% of 1.000; 1.030 is not).
    best = plan_report.Best(got)
    self.assertIs(tie2_m4, best)
    self.assertEqual(3, plan_report.RankOf(got, best))
    # The table's tie column: the first rank within TIE of the row (1.030
    # is within 2% of 1.015, not of 1.000), the layout chosen starred; the
    # last ties with none.
    self.assertEqual(['1', '1', '1*', '2', ''],
                     plan_report.TieLabels(got, 5, best))
    self.assertEqual(['1', '1', '1'], plan_report.TieLabels(got[1:], 3))
    self.assertEqual(['', ''], plan_report.TieLabels([fast4, big], 5))
    # Nothing fits: the fastest of those that do not.
    self.assertIs(big, plan_report.Best([big]))

  def testBestCommandRunsInTheGivenLogdir(self):
    ranked = plan_report.Rank([self.planner.Predict(Layout(
        r, k, k, m, '1f1b', 'never', None)) for r, k, m in (
            (1, 1, 1), (1, 2, 4), (2, 2, 4), (4, 1, 2))])
    best = plan_report.Best(ranked)
    flags = self.model.Flags(best.layout, _TINY)
    text = plan_report.BestText(_TINY, self.model, ranked,
                                logdir='/tmp/my_run')
    self.assertRegex(text, r'^Best layout \(rank \d[^)]*\): '
                     + re.escape(best.layout.Name()))
    self.assertTrue(text.endswith(f'trainer.py {flags} --logdir=/tmp/my_run'
                                  '\n'), text)
    # No logdir given: a fresh one of the plan's own.
    self.assertIn('--logdir=/tmp/cadence_plan_OneBWdsGPipeTransformerTiny\n',
                  plan_report.BestText(_TINY, self.model, ranked))
    # A fit within UNSURE of the real steps, or the op model's published
    # check: a best layout.
    sure = plan_report.BestText(_TINY, self.model, ranked, logdir='/tmp/r',
                                calibration={ranked[0].layout: 0.15})
    self.assertIn('Best layout (', sure)
    self.assertIn('Best layout (', plan_report.BestText(
        _TINY, self.model, ranked, hw=hardware.Parse('h100x8')))

  def testAnUnsureFitNamesNoBestPlan(self):
    """A fit 542.3% off in sample (the README's PipelinedMlp in issue 49):
    every layout lies within that of the fastest; the plan says it cannot
    tell them apart, lists the fastest on each number of devices, and
    gives the chosen layout's command only as a place to start."""
    ranked = plan_report.Rank([self.planner.Predict(Layout(
        r, k, k, m, '1f1b', 'never', None)) for r, k, m in (
            (1, 1, 1), (1, 1, 2), (1, 2, 4), (1, 2, 2), (2, 2, 4),
            (1, 4, 4))])
    errors = {ranked[0].layout: 0.05, ranked[1].layout: -5.423}
    text = plan_report.BestText(_TINY, self.model, ranked, logdir='/tmp/r',
                                calibration=errors)
    self.assertNotIn('Best layout', text)
    n = len(plan_report.Candidates(ranked, 5.423))
    self.assertEqual(len(ranked), n)
    self.assertIn(
        'No best layout: the plan\'s step times may be off by 542.3% (its '
        'fit\'s worst error on the 2 real steps it was fitted to; above '
        f'20%), and {n} layouts lie within that of the fastest: the plan '
        'cannot tell them apart.', text)
    shown = re.findall(r'\n  rank (\d+): (.*): [\d.]+ ms a step, on (\d+) '
                       r'device\(s\)', text)
    # The fastest of each number of devices, fewest first.
    devices = sorted({p.layout.replicas * p.layout.devices for p in ranked})
    self.assertEqual(devices, [int(d) for _, _, d in shown])
    for rank, name, d in shown:
      first = next(p for p in ranked
                   if p.layout.replicas * p.layout.devices == int(d))
      self.assertEqual((plan_report.RankOf(ranked, first), first.layout.Name()),
                       (int(rank), name))
    best = plan_report.Best(ranked)
    self.assertIn('A layout to start from, not a confident best (rank '
                  f'{plan_report.RankOf(ranked, best)}', text)
    self.assertTrue(text.endswith(
        f'{self.model.Flags(best.layout, _TINY)} --logdir=/tmp/r\n'))
    # The same fit with one layout within its error names it.
    alone = [ranked[0]] + [p._replace(step=p.step._replace(
        time=100 * p.step.time)) for p in ranked[1:]]
    self.assertIn('Best layout (rank 1)', plan_report.BestText(
        _TINY, self.model, alone, calibration=errors))

  def testSearchOrderSpreadsAndTheTimeLeftIsThePaceSoFar(self):
    for n in (1, 2, 10, 262):
      order = planner.Interleaved(list(range(n)))
      self.assertCountEqual(range(n), order)
    # Any eighth of the order reaches every quarter of the list.
    order = planner.Interleaved(list(range(262)))
    for start in range(0, 262 - 33, 33):
      self.assertEqual({0, 1, 2, 3},
                       {i * 4 // 262 for i in order[start:start + 33]})
    self.assertEqual(30.0, planner.TimeLeft(10.0, 1, 4))
    self.assertEqual(0.0, planner.TimeLeft(0.5, 0, 4))

  def testSurenessSaysWhereCostsCameFromAndHowFarOff(self):
    step = collections.namedtuple('Step', ['time'])
    ranked = [planner.Prediction(Layout(1, k, k, 4, '1f1b', 'never', None),
                                 step(t), None, None, True, None, None)
              for k, t in ((1, 1.0), (2, 1.05), (4, 1.2))]
    line = plan_report.Sureness(ranked, {'a': 0.05, 'b': -0.10, 'c': 0.02})
    # Median |error| 5%, worst 10%: 1.0 and 1.05 lie within 10% of 1.0.
    self.assertIn('within 5.0% (median) and 10.0% (worst: in sample). '
                  '2 layouts lie within 10.0% of the best', line)
    self.assertIn('not checked', plan_report.Sureness(ranked, None))
    # A preset with the op model quotes the published check.
    line = plan_report.Sureness(ranked, None, hardware.Parse('a100x8'))
    check = hardware.PUBLISHED_CHECK
    self.assertIn(f'against {check["rows"]} published step times', line)
    self.assertIn(f'off by {100 * check["median"]:.1f}% at the median', line)

  def _AssertPredictsAs(self, truth, fitted, rtol, layouts):
    """`fitted` predicts each of `layouts`' step time as `truth` does."""
    for layout in layouts:
      with self.subTest(layout=layout.Name()):
        self.assertAllClose(truth.Predict(layout).step.time,
                            fitted.Predict(layout).step.time, rtol=rtol)

  def testCalibrationRecoversKnownOverheadsAndConcurrency(self):
    """Real steps made by a planner with known overheads and a known
    throughput of 2 devices at once (1.8, and 1.95 of 4), a deferred W
    among them: a planner of the same layer costs with none and a probe's
    1.2 and 1.3 fits them back
    from the calibration layouts' steps (4 at once keeps its ratio to 2),
    and then predicts every layout as the first."""
    model = self.model
    truth_hw = hardware.Parse('cpu,devices=4,tflops=0.2,memory_gbps=20,'
                              'concurrency=1/1.8/1.95')
    known = plan_costs.Overheads(0.002, 0.03, 0.01, defer_w=0.004,
                                 action=0.003)
    truth = planner.Planner(model, truth_hw,
                            plan_costs.FlopsCosts(model, truth_hw), known)
    layouts = calibration.CalibrationLayouts(model, 4)
    self.assertEqual(
        [(1, 1, 1, 1, 'gpipe'), (1, 1, 1, 8, 'gpipe'), (1, 1, 1, 8, 'zb_h1'),
         (1, 1, 2, 8, 'gpipe'), (1, 2, 2, 8, '1f1b'), (1, 2, 2, 4, '1f1b'),
         (1, 2, 2, 2, '1f1b'), (1, 2, 2, 1, 'zb_h1'), (2, 1, 1, 1, 'gpipe')],
        [(l.replicas, l.devices, l.stages, l.micro_batches, l.schedule)
         for l in layouts])
    costs = plan_costs.FlopsCosts(model, truth_hw)
    costs.steps = {l: truth.Predict(l).step.time for l in layouts}
    fitted = planner.Planner(
        model, truth_hw._replace(concurrency=(1.0, 1.2, 1.3)), costs)
    self.assertAllClose(known, fitted.overheads, atol=1e-9)
    # Examples a micro-batch: 32 / 8, 4, 2 and 1.
    self.assertEqual([4, 8, 16, 32], sorted(fitted.concurrency))
    for concurrency in fitted.concurrency.values():
      self.assertAllClose(1.8, concurrency[1], rtol=1e-6)
      self.assertAllClose(1.95, concurrency[2])
    self._AssertPredictsAs(truth, fitted, rtol=1e-6, layouts=(
        Layout(1, 2, 2, 4, 'gpipe', 'except_last', None),
        Layout(1, 2, 4, 8, 'zb_v', 'never', None),
        Layout(1, 2, 2, 8, 'zb_h1', 'never', None),
        Layout(2, 2, 2, 2, '1f1b', 'never', None)))

  def testSplitBackwardPaysItsOverheadOnW(self):
    """A split overhead of x s per layer: a zb_h1 step on one device of
    the Tiny LM's layers and M micro-batches takes M x layers x x more
    than with none, and a fused schedule's step nothing more."""
    model = self.model
    none = planner.Planner(model, self.hw,
                           plan_costs.FlopsCosts(model, self.hw))
    split = planner.Planner(model, self.hw, none.costs,
                            plan_costs.Overheads(defer_w=0.005))
    zb = Layout(1, 1, 1, 4, 'zb_h1', 'never', None)
    fused = Layout(1, 1, 1, 4, 'gpipe', 'never', None)
    self.assertAllClose(
        none.Predict(zb).step.time + 4 * model.num_units * 0.005,
        split.Predict(zb).step.time, rtol=1e-9)
    self.assertAllClose(none.Predict(fused).step.time,
                        split.Predict(fused).step.time, rtol=1e-12)

  def testCalibrationStepsAreTimedAfterAnUntimedStep(self):
    """Steps whose first after another layout's pays for the switch (10 s,
    then 1 s each): MeasureSteps interleaves the layouts but times each
    after an untimed step, so it reads the trainer's 1 s a step."""
    last = []

    def _Build(params, devices, logdir, num_replicas=1):
      del params, devices, logdir, num_replicas
      me = object()

      def _Run(n):
        switch = 9.0 if not last or last[-1] is not me else 0.0
        last.append(me)
        return (n + switch) / n
      return _Run
    layouts = calibration.CalibrationLayouts(self.model)
    costs = plan_costs.MeasuredCosts(self.model, 'CPU:0', None, parts={},
                                  update_rate=1e-9)
    with mock.patch.object(plan_measure, 'BuildStep', _Build), \
        self.assertLogs(level='INFO') as logs:
      got = costs.MeasureSteps(layouts, runs=3, steps=4)
    self.assertEqual({l: 1.0 for l in layouts}, got)
    # A progress line for each layout built and for each round.
    n = len(layouts)
    self.assertEqual(
        [f'INFO:absl:Timing real steps: building the train step of layout '
         f'{i + 1} of {n} ({l.Name()}) and running 2 steps...'
         for i, l in enumerate(layouts)] +
        [f'INFO:absl:Timing real steps: round {r} of 3 (steps of each of the '
         f'{n} layouts, interleaved)...' for r in (1, 2, 3)] +
        [f'INFO:absl:Timing real steps: done; freeing the {n} programs built '
         'for them...'], logs.output)

  def testShortStepsAreTimedOverAWindow(self):
    """Steps of 0.1 s: 3 of them, or as many as fill a window of 1 s (10),
    after an untimed one; steps longer than the window: 3."""
    for step, window, calls in ((0.1, 1.0, [1, 10]), (0.1, 0.0, [1, 3]),
                                (2.0, 1.0, [1, 3])):
      asked = []

      def _Run(n, step=step, asked=asked):
        asked.append(n)
        return step
      self.assertEqual(step, plan_measure.SteadySeconds(_Run, 3, window))
      self.assertEqual(calls, asked)

  def testUnitTimesAreScaledPerMicroBatchSize(self):
    """Steps whose units run 5% under their timing at 4 examples a
    micro-batch and 6% over it at 32 (one micro-batch), as the Tiny LM of 8
    layers did: no cost per action or step (each >= 0) fits both, and the
    fitted factors of each size bring the planner to every one-device
    step, at the calibrated sizes exactly (in between: linear in log2 of
    the size)."""
    model = self.model
    hw = hardware.Parse('cpu,devices=4,tflops=0.2,memory_gbps=20,'
                        'concurrency=1/1.3/1.4')
    truth = planner.Planner(model, hw, plan_costs.FlopsCosts(model, hw),
                            plan_costs.Overheads())
    truth.scales = {4: 0.95, 32: 1.06}
    costs = plan_costs.FlopsCosts(model, hw)
    costs.steps = {l: truth.Predict(l).step.time
                   for l in calibration.CalibrationLayouts(model, 1)}
    fitted = planner.Planner(model, hw, costs)
    # The additive fit takes what it can (a cost per step), the factors
    # the rest: every calibration step is met.
    for layout, seconds in costs.steps.items():
      self.assertAllClose(seconds, fitted.Predict(layout).step.time,
                          rtol=1e-9)
    self.assertEqual([4, 32], sorted(fitted.scales))
    self.assertLess(fitted.scales[4], 1.0)
    self.assertGreater(fitted.scales[32], fitted.scales[4])
    self.assertAllClose(fitted.scales[4], fitted.ScaleAt(2))  # Held beyond.
    self.assertAllClose((2 * fitted.scales[4] + fitted.scales[32]) / 3,
                        fitted.ScaleAt(8))
    # Elsewhere near the truth (its factors are log-linear too).
    self._AssertPredictsAs(truth, fitted, rtol=0.02, layouts=(
        Layout(1, 1, 1, 2, 'gpipe', 'never', None),
        Layout(1, 1, 1, 4, 'gpipe', 'always', None),
        Layout(1, 2, 2, 4, '1f1b', 'never', None)))
    # What the report calls the model's error on this host: none here.
    errors = calibration.CalibrationErrors(fitted, costs.steps)
    self.assertEqual(sorted(costs.steps), sorted(errors))
    self.assertAllClose([0.0] * len(errors), list(errors.values()),
                        atol=1e-9)
    report = plan_report.Report('key', model, hw, costs, [], dict(
        dominated=0, refused=0), 5, 1.0, fitted.overheads, {},
                            fitted.scales, errors)
    self.assertIn(f'the units\' timed seconds x {fitted.scales[4]:.3f} at 4 '
                  'examples a micro-batch', report)
    self.assertIn(f'fitted to {len(errors)} real steps, which the model then '
                  'predicts within 0.0% (median) and 0.0% (worst', report)

  def testConcurrencyIsFittedPerMicroBatchSize(self):
    """Steps of a host whose 2 devices gain 1.6x together on micro-batches
    of 4 examples and 1.1x on 8: the fit finds both; between and beyond
    them, the concurrency is linear in log2(examples), then held."""
    model = self.model
    hw = hardware.Parse('cpu,devices=4,tflops=0.2,memory_gbps=20,'
                        'concurrency=1/1.3/1.4')
    known = plan_costs.Overheads(0.002, 0.03, 0.0)
    truth = planner.Planner(model, hw, plan_costs.FlopsCosts(model, hw), known)

    def conc(c2):   # The probe's ratio of 4 at once to 2 kept.
      return (1.0, c2, c2 * 1.4 / 1.3)
    truth.concurrency = {4: conc(1.6), 8: conc(1.1)}
    self.assertAllClose(conc(1.35), truth.ConcurrencyAt(2 ** 2.5))
    costs = plan_costs.FlopsCosts(model, hw)
    costs.steps = {l: truth.Predict(l).step.time
                   for l in calibration.CalibrationLayouts(model, 4)}
    fitted = planner.Planner(model, hw, costs)
    self.assertAllClose(1.6, fitted.concurrency[4][1], rtol=1e-6)
    self.assertAllClose(1.1, fitted.concurrency[8][1], rtol=1e-6)
    self.assertAllClose(conc(1.6), fitted.ConcurrencyAt(2))
    self.assertAllClose(conc(1.1), fitted.ConcurrencyAt(16))
    self._AssertPredictsAs(truth, fitted, rtol=1e-5, layouts=(
        Layout(1, 2, 2, 4, 'gpipe', 'except_last', None),
        Layout(1, 2, 2, 2, 'gpipe', 'never', None),
        Layout(1, 4, 4, 8, '1f1b', 'never', None),
        Layout(1, 2, 4, 8, 'zb_v', 'never', None)))

  def testReplicaConcurrencyIsFitted(self):
    """Steps of a host whose 2 replicas gain 1.7x together while its
    2-device pipelines gain 1.2x: the fit finds the replicas' own gain
    from the R=2 calibration step, and predicts a replicated pipeline as
    the truth does."""
    model = self.model
    hw = hardware.Parse('cpu,devices=4,tflops=0.2,memory_gbps=20,'
                        'concurrency=1/1.3/1.4')
    truth = planner.Planner(model, hw, plan_costs.FlopsCosts(model, hw),
                            plan_costs.Overheads(0.002, 0.03, 0.0))
    truth.concurrency = {4: (1.0, 1.2, 1.2 * 1.4 / 1.3)}
    truth.replica_concurrency = (1.0, 1.7, 1.7 * 1.4 / 1.3)
    costs = plan_costs.FlopsCosts(model, hw)
    costs.steps = {l: truth.Predict(l).step.time
                   for l in calibration.CalibrationLayouts(model, 4)}
    self.assertIn(Layout(2, 1, 1, 1, 'gpipe', 'never', None), costs.steps)
    fitted = planner.Planner(model, hw, costs)
    self.assertAllClose(truth.replica_concurrency,
                        fitted.replica_concurrency, rtol=1e-6)
    self.assertEqual(0.0, fitted.overheads.replica)
    self._AssertPredictsAs(truth, fitted, rtol=1e-5, layouts=(
        Layout(2, 1, 1, 2, 'gpipe', 'never', None),
        Layout(2, 2, 2, 2, '1f1b', 'never', None)))

  def testOverheadsAreNotNegative(self):
    """Steps faster than the layer costs alone: no negative overheads."""
    costs = plan_costs.FlopsCosts(self.model, self.hw)
    plain = planner.Planner(self.model, self.hw, costs)
    costs.steps = {l: 0.5 * plain.Predict(l).step.time
                   for l in calibration.CalibrationLayouts(self.model)}
    fitted = planner.Planner(self.model, self.hw, costs)
    self.assertEqual(plan_costs.Overheads(), fitted.overheads)

  def testSimulatedTimelineDrawsTheSpans(self):
    p = self.planner.Predict(Layout(1, 2, 2, 4, '1f1b', 'never', None))
    timeline = plan_report.SimulatedTimeline(p)
    self.assertAllClose(p.step.pipeline, timeline.span)
    self.assertAllClose(p.step.bubble, timeline.measured_bubble)
    for action, (start, end) in p.step.spans.items():
      self.assertAllClose((start, end), timeline.actions[action])
    # One box per action in the chart, and the chart is drawn.
    boxes = [b for b in timeline_chart.Layout(timeline).boxes if b.action]
    self.assertCountEqual(p.step.spans, [b.action for b in boxes])
    self.assertLen(boxes, 2 * 2 * 4)
    self.assertIn('<svg', timeline.Svg())

  def testSimulatedChartSaysTheTablesStepTime(self):
    """The chart's title and time axis end at the table's step time: its
    pipeline's actions, then the all-reduce and update, then the fixed
    cost; a simulation has no ops outside the actions, so no grey row."""
    layout = Layout(2, 2, 2, 4, '1f1b', 'never', None)
    p = self.planner.Predict(layout, overheads=plan_costs.Overheads(
        step=0.003, replica=0.001))
    step = p.step
    self.assertGreater(step.allreduce, 0)
    svg = plan_report.SimulatedChart(p)
    table_ms = plan_report._Row(1, p).split()[8]  # pylint: disable=protected-access
    self.assertEqual(plan_report._Ms(step.time), table_ms)  # pylint: disable=protected-access
    # The title's lines: after the background, before the legend.
    lines = svg.splitlines()[2:]
    lines = lines[:[l.startswith('<rect') for l in lines].index(True)]
    title = ' '.join(re.fullmatch(r'<text x="4" y="\d+">(.*)</text>',
                                  line).group(1) for line in lines)
    self.assertRegex(title, rf'^Simulated step of {layout.Name()} '
                     rf'\(planner\): {table_ms} ms \(the step time of the '
                     r'plan\'s table\) = ')
    # Its terms add up to the step time: the actions, all-reduce and update
    # after them, and the fixed cost (0.003 + 0.001 a replica beyond one).
    terms = re.findall(r'[=+] ([\d.]+) ms (?:of )?([a-z -]+)', title)
    self.assertEqual(['pipeline actions', 'all-reduce and update', 'fixed'],
                     [name.strip() for _, name in terms])
    self.assertAllClose([step.pipeline, step.time - step.pipeline - 0.004,
                         0.004], [float(ms) / 1000 for ms, _ in terms],
                        rtol=1e-3)
    self.assertIn(f'>{table_ms} ms</text>', svg)     # The axis's end.
    self.assertIn('>all-reduce and update</text>', svg)   # The legend.
    self.assertNotIn('outside', svg)
    self.assertNotIn(f'rgb{timeline_chart.OTHER_COLOUR}', svg)
    self.assertNotIn('Marks under a row', svg)
    self.assertIn('Idle (white): the device waits for an action', svg)
    path = plan_report.WriteTimeline(p, self.get_temp_dir())
    with open(path) as f:
      self.assertEqual(svg, f.read())
    with open(path.replace('.svg', '.txt')) as f:
      self.assertEqual(plan_report.SimulatedTimeline(p).SpanTable(), f.read())


class PlanMeasureTest(tf.test.TestCase):

  def testCalibrationStepsReadTheirBatchWithoutAutotuning(self):
    """BuildStep's steps read one random batch over and over from a
    dataset without tf.data's autotuning: nothing to tune, and with it
    freeing the planner's calibration steps waited for its threads."""
    model = plan_model.PlanModel(model_registry.GetParams(_TINY, 'Train'))
    layout = Layout(1, 1, 1, 1, 'gpipe', 'never', None)
    datasets = []
    runner = programs.TrainProgram.StepRunner

    def _Runner(program, dataset=None):
      datasets.append(dataset)
      return runner(program, dataset)

    with mock.patch.object(programs.TrainProgram, 'StepRunner', _Runner):
      run = plan_measure.BuildStep(model.LayoutParams(layout),
                                   ['/device:CPU:0'], self.get_temp_dir())
    self.assertGreater(run(1), 0.0)
    self.assertLen(datasets, 1)
    self.assertFalse(datasets[0].options().autotune.enabled)

  def testPartsAreTimedForwardAndBackward(self):
    """The timed backward is the real one: its gradients equal numpy's."""
    w = tf.Variable(np.arange(6, dtype=np.float32).reshape(2, 3))

    class _Layer:
      vars = plan_measure.base_layer.NestedMap(w=w)
      theta = plan_measure.base_layer.NestedMap(w=w)

    part = plan_measure.Part([_Layer()], lambda th, x: x @ th[0].w,
                             [tf.TensorSpec([4, 2])])
    _, both = plan_measure._Functions(part)  # pylint: disable=protected-access
    x = tf.ones([4, 2])
    dw, dx = both(x)
    self.assertAllClose(np.full([2, 3], 4.0), dw)   # Sum over the rows.
    self.assertAllClose(np.tile([[3.0, 12.0]], [4, 1]), dx)
    # A chain of copies runs that backward each time (its value: the sum
    # of one copy's gradients, as the inputs only add 0 x the last sum).
    for copies in (1, 3):
      self.assertAllClose(
          24.0 + 60.0, plan_measure._Chain(part, copies, True)(x))  # pylint: disable=protected-access
      self.assertAllClose(
          4 * 15.0, plan_measure._Chain(part, copies, False)(x))  # pylint: disable=protected-access
    (forward, total), = plan_measure.MeasureParts([part], '/device:CPU:0',
                                                  runs=1, warmup=1)
    self.assertGreaterEqual(forward, 0)
    self.assertGreaterEqual(total, 0)

  def testCalibrateFillsOnlyWhatItMeasures(self):
    hw = hardware.Parse('cpu,devices=2,tflops=20,concurrency=1/1.3')
    with self.assertLogs(level='INFO') as logs:
      got = plan_measure.Calibrate(hw, ['/device:CPU:0'])
    self.assertEqual(['INFO:absl:Measuring this host (1 of 1): a device\'s '
                      'memory bandwidth...'], logs.output)
    self.assertEqual((20e12, (1.0, 1.3)), (got.flops, got.concurrency))
    self.assertGreater(got.memory_bandwidth, 0)
    self.assertGreater(got.memory, 0)            # The host's.
    self.assertFalse(got.needs_calibration)


if __name__ == '__main__':
  tf.test.main()
