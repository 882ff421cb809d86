"""`--mode=plan`: every layout of a model on a cluster, predicted and ranked.

For a model with a pipelined stack (plan_model.py) and a described cluster
(--plan_cluster, framework/planning/hardware.py), the planner predicts,
before anything trains, for every layout that fits the devices:

  R replicas x K devices per replica x v stages per device (S = K v stages)
  x M micro-batches x schedule (every registered one, `schedules.Names()`,
  except 'table'; sizes a schedule refuses are skipped) x remat
  x the cut of the layers into stages (the stack's even cut, and the cut
  that balances the predicted stage times, BalancedPartition)
  x with R > 1, the optimizer slots whole or sharded over the replicas
  (learner.shard_optimizer_state; an optimizer that updates each element
  on its own)

the step time, examples/s, MFU, bubble and memory per device, and ranks
them by step time (the global batch stays the input's batch_size: R
replicas take batch_size / R each). How:

  costs:   each layer's forward and backward seconds on one micro-batch:
           its FPropMeta FLOPs over the device's FLOP/s x efficiency (the
           backward 2x the forward), or, with --plan_measure, timed on this
           host's device as a compiled step pays them (plan_measure.py,
           plan_costs.py); the embedding counts in the first stage, the
           final norm, softmax and loss in the last. With --plan_measure
           the planner also times real steps of the trainer's loop for a
           few layouts and fits to them what unit costs leave out
           (calibration.py: the executor's cost per unit and micro-batch,
           what a deferred W adds, the step's fixed cost, each extra
           replica's, a factor of the units' times per micro-batch size,
           and the host's concurrency at each micro-batch size from the
           smallest to the whole batch, and of replicas);
  step:    the schedule's action lists run by a discrete-event simulation
           with transfers between stages, the gradient all-reduce and the
           update (framework/planning/step_model.py); devices that share
           compute (this host's logical CPUs) slow each other down;
  memory:  weights, gradients, slots and the activations the schedule and
           remat keep (framework/pipeline/memory_estimate.py), per device;
           on a host whose devices share memory, all of them together.

While it works the planner logs what it is doing: each calibration
layout built and each round of their steps, the host's measurements,
each micro-batch size its units are timed at (n of N), and every 5 s
of a long search how far it got, the best layout yet and the time left
(the search's shapes are simulated in an order spread over all of them,
and weighed by their work, so the time left does not grow as the larger
ones come).

A layout whose remat is slower than another fitting remat of the same
layout (never < selective < except_last < always: each re-runs more) is
dominated and left out; a layout is tried with sharded slots only when
it does not fit with whole ones (sharding buys memory, not speed); one that does not fit is ranked after those that
do; the table's rows are in step-time order. Step times within
`plan_report.TIE` (2%) of each other are a tie, well inside the cost
model's error (bench/planner_bench.py), marked in the table: the plan
chosen is the simplest layout within TIE of the fastest, on fewer
devices, then with fewer micro-batches and stages (less to go wrong, less
memory for transfers). The best layout is printed as the exact flags and
params overrides that run it, in the plan's --logdir; when the plan's
figures may be off by more than `plan_report.UNSURE` (20%: its fit's
worst error on the real steps it was fitted to) and several layouts lie
within that of the fastest, it names no best layout: it says it cannot
tell them apart and lists a shortlist, the fastest of them on each number
of devices, then the chosen layout's command as a place to start.
--plan_apply=FILE writes the overrides as a params file
(--model_params_file_override=FILE), and with --logdir the simulated
timeline of the layout chosen (or --plan_explain's rank) is drawn as the
timeline tool's chart (<logdir>/plan/plan_timeline.svg,
framework/pipeline/timeline_chart.py; its actions' times in
plan_timeline.txt) beside the report (plan.txt): the pipeline's actions,
then bands for the all-reduce, update and fixed cost after them, so its
title and time axis end at the table's step time.

Below the table a line says how sure the ranking is: where the costs came
from and, with --plan_measure, how far the fitted model is from the real
steps it was fitted to, and how many layouts lie within that error of the
best. The `tie` column marks layouts within TIE of each other.

Example:
  .venv/bin/python trainer.py \\
      --model=lm.one_billion_wds.OneBWdsGPipeTransformerTiny \\
      --mode=plan --plan_cluster=cpu --plan_measure --logdir=/tmp/plan
  .venv/bin/python trainer.py \\
      --model=lm.one_billion_wds.OneBWdsGPipeTransformer \\
      --mode=plan --plan_cluster=h100x8
"""
import collections
import math
import os
import time

from absl import logging
import tensorflow as tf

from cadence.framework import cluster as cluster_lib
from cadence.framework.pipeline import memory_estimate
from cadence.framework.pipeline import partition
from cadence.framework.pipeline import schedules
from cadence.framework.pipeline import timeline_chart
from cadence.framework.planning import calibration
from cadence.framework.planning import hardware as hardware_lib
from cadence.framework.planning import plan_costs
from cadence.framework.planning import plan_measure
from cadence.framework.planning import plan_model
from cadence.framework.planning import plan_report
from cadence.framework.planning import step_model

Layout = plan_model.Layout
# Cheapest first: each re-runs more of the forward than the one before.
REMATS = ('never', 'selective', 'except_last', 'always')
_SKIP_SCHEDULES = ('table',)   # Written by hand, not searched.
MAX_PER_DEVICE = 4             # v: stages per device.
# What a shape's schedule, cuts and memory plan cost Search beside its
# S x M forward actions, in actions (_Work): fitted to the 1.7B LM's
# search on h100x8, where the shapes' times ran from 0.2 to 840 ms.
_SHAPE_WORK = 10
# The schedule whose one-device step measures what a deferred W costs.


Prediction = collections.namedtuple('Prediction', [
    'layout', 'step', 'memory', 'together', 'fits', 'examples_per_sec',
    'mfu'])
Prediction.__doc__ = """One layout's prediction.

Attributes:
  layout: the Layout.
  step: the step_model.Step.
  memory: per device of a replica, its bytes at its worst moment.
  together: a replica's devices together at the step's worst moment.
  fits: whether it fits the cluster's memory (None: unknown memory).
  examples_per_sec: global batch / step time.
  mfu: model FLOPs (3x the forward) / (step time x R K peak FLOP/s).
"""


# --- the search ---------------------------------------------------------------


def MicroBatchSizes(model, num_devices):
  """The examples a micro-batch of the layouts on at most `num_devices`
  devices holds (Search's), sorted."""
  out = set()
  for r in {r for r, _, _ in Shapes(num_devices, model.num_units,
                                    model.batch_size)}:
    per_replica = model.batch_size // r
    out.update(per_replica // m for m in plan_model.MicroBatchCounts(
        per_replica, model.current.micro_batches))
  return sorted(out)


def Schedules():
  return [n for n in schedules.Names() if n not in _SKIP_SCHEDULES]


def Interleaved(items):
  """`items` in the order every g-th one (g about 0.618 of their number,
  coprime to it): any prefix of it spreads over the whole list, so the
  pace of what is done stands for what is left."""
  n = len(items)
  g = max(1, round(0.618034 * n))
  while math.gcd(g, n) > 1:
    g += 1
  return [items[i * g % n] for i in range(n)]


def _Work(shape):
  """The relative work of simulating a shape (R, K, S, M, schedule): its S
  x M forward actions (each with its backward and transfers) and
  _SHAPE_WORK for the rest."""
  _, _, s, m, _ = shape
  return s * m + _SHAPE_WORK


def TimeLeft(seconds, done, total):
  """Seconds left of a search that took `seconds` for `done` of `total`
  work, at the pace so far."""
  return seconds / done * (total - done) if done else 0.0


def Shapes(num_devices, num_layers, batch):
  """(R, K, S) of every layout on at most `num_devices` devices: R divides
  the global batch, S = K v <= the layers, v <= MAX_PER_DEVICE (v = 1 on
  one device)."""
  for r in range(1, num_devices + 1):
    if batch % r:
      continue
    for k in range(1, num_devices // r + 1):
      for v in range(1, (MAX_PER_DEVICE if k > 1 else 1) + 1):
        if k * v <= num_layers:
          yield r, k, k * v


class Planner:
  """Predicts layouts of a PlanModel on a calibrated Hardware.

  Args:
    model: a plan_model.PlanModel.
    hw: a calibrated hardware.Hardware.
    costs: plan_costs.FlopsCosts or plan_costs.MeasuredCosts.
    overheads: the plan_costs.Overheads to predict with; None: fitted to
      the costs' measured steps, if any (the host's concurrency too), else none.
  """

  def __init__(self, model, hw, costs, overheads=None):
    self.model, self.hw, self.costs = model, hw, costs
    # Whether its optimizer's slots can be sharded over the replicas.
    self._can_shard = model.params.task.train.learner.optimizer.cls.ELEMENTWISE
    self._items = {}
    self._memory = {}
    self.overheads = overheads or plan_costs.Overheads()
    # {micro-batch size: fitted concurrency}; {}: the hardware's.
    self.concurrency = {}
    # {micro-batch size: the factor of its units' times}; {}: 1.
    self.scales = {}
    # The host's throughput with 1, 2, 4, ... replicas; None: from the
    # concurrency (step_model.SimulateStep).
    self.replica_concurrency = None
    if overheads is None and costs.steps:
      # In this order: each fit uses the ones before.
      self.overheads = calibration.FitOverheads(self, costs.steps)
      self.scales = calibration.FitScales(self, costs.steps)
      self._items.clear()
      self.overheads = self.overheads._replace(
          defer_w=calibration.FitDeferWOverhead(self, costs.steps))
      self.concurrency = calibration.FitConcurrency(self, costs.steps)
      self.replica_concurrency = calibration.FitReplicaConcurrency(
          self, costs.steps)
      self.overheads = self.overheads._replace(
          replica=calibration.FitReplicaOverhead(self, costs.steps))

  def ConcurrencyAt(self, micro_batch):
    """The host's concurrency for actions on `micro_batch` examples: the
    fitted one (self.concurrency), linear in log2(micro_batch) between the
    fitted sizes and held beyond them; the hardware's if none is
    fitted."""
    if not self.concurrency:
      return self.hw.concurrency
    points = sorted((math.log2(b), c) for b, c in self.concurrency.items())
    return tuple(
        hardware_lib.Interpolate([(x, c[i]) for x, c in points],
                                 math.log2(micro_batch))
        for i in range(len(points[0][1])))

  def ScaleAt(self, micro_batch):
    """The factor of the units' times on `micro_batch` examples
    (calibration.FitScales), linear in log2(micro_batch) between the
    fitted sizes and held beyond them; 1 with none fitted."""
    if not self.scales:
      return 1.0
    return hardware_lib.Interpolate(
        sorted((math.log2(b), f) for b, f in self.scales.items()),
        math.log2(micro_batch))

  def Items(self, micro_batch, scale=None):
    """The plan_costs.ItemCost of each unit on `micro_batch` examples: the
    costs' times x `scale` (default ScaleAt)."""
    if scale is not None:
      return [plan_costs.ItemCost(*(scale * t for t in c))
              for c in self.costs.Items(micro_batch)]
    if micro_batch not in self._items:
      self._items[micro_batch] = self.Items(micro_batch,
                                            self.ScaleAt(micro_batch))
    return self._items[micro_batch]

  def BalancedBounds(self, layout):
    """The cut whose stages' predicted times (forward, backward and re-run
    of each layer, extras included) are as even as a contiguous cut
    allows."""
    mb = self.model.PerReplicaBatch(layout) // layout.micro_batches
    times = [c.rerun + c.once + c.loss + c.backward +
             (c.rerun if layout.remat != 'never' else 0.0)
             for c in self.Items(mb)]
    return partition.BalancedPartition(times, layout.stages)

  def Memory(self, layout, schedule=None):
    """The layout's pipeline plan (cached; `schedule`: its Schedule, if
    built already)."""
    if layout not in self._memory:
      self._memory[layout] = self.model.LayoutPlan(layout, schedule)
    return self._memory[layout]

  def Predict(self, layout, schedule=None, overheads=None, hw=None,
              scale=None, replica_concurrency=None):
    """The Prediction of one layout (`schedule`: its built Schedule;
    `overheads`, `hw`, `scale` (of the units' times),
    `replica_concurrency`: instead of the planner's own)."""
    model = self.model
    schedule = schedule or schedules.Build(
        layout.schedule, layout.stages, layout.devices,
        layout.micro_batches)
    memory = self.Memory(layout, schedule)
    mb = model.PerReplicaBatch(layout) // layout.micro_batches
    if hw is None:
      hw = self.hw._replace(concurrency=self.ConcurrencyAt(mb))
    overheads = overheads or self.overheads
    stages = plan_costs.StageCosts(
        model, layout, self.Items(mb, scale), memory, hw,
        self.costs.update_rate, overheads.layer, overheads.defer_w,
        overheads.action)
    if layout.shard and layout.replicas > 1:
      # Each replica updates 1/R of its stage's weights, after the
      # all-reduce of the unsharded step (sharded_update.py: exact); the
      # all-gather of the new weights moves half an all-reduce's bytes.
      stages = [s._replace(update=s.update / layout.replicas,
                           grad_bytes=1.5 * s.grad_bytes) for s in stages]
    step = step_model.SimulateStep(
        schedule, stages, hw, layout.remat, layout.replicas,
        fixed=overheads.step + (layout.replicas - 1) * overheads.replica,
        replica_concurrency=(replica_concurrency or
                             self.replica_concurrency))
    per_device, together = model.DeviceMemory(layout, memory)
    if hw.memory is None:
      fits = None
    elif hw.shared:
      on_host = min(layout.replicas, max(1, hw.devices_per_host //
                                         layout.devices))
      fits = together * on_host <= hw.memory
    else:
      fits = max(per_device) <= hw.memory
    peak = hw.flops * layout.replicas * layout.devices
    return Prediction(layout, step, per_device, together, fits,
                      model.batch_size / step.time,
                      3 * model.flops / step.time / peak)

  def Search(self, progress_secs=5.0):
    """Every layout's Prediction in Rank's order (see the module
    docstring); returns (predictions, counts: NestedMap of what was
    skipped). Logs a progress line as it starts and every `progress_secs`
    seconds: shapes done of all, layouts so far, the best one yet and the
    time left at the pace so far. The (R, K, S, M) are simulated
    Interleaved and the pace is weighed by each shape's _Work, so the
    time left does not grow as the larger shapes come."""
    model, hw = self.model, self.hw
    out, dominated, refused = [], 0, 0
    shapes = [(r, k, s, m, name)
              for r, k, s, m in Interleaved([
                  (r, k, s, m)
                  for r, k, s in Shapes(hw.num_devices, model.num_units,
                                        model.batch_size)
                  for m in plan_model.MicroBatchCounts(
                      model.batch_size // r, model.current.micro_batches)])
              for name in Schedules()]
    total, done = sum(_Work(x) for x in shapes), 0
    start = last = time.perf_counter()
    seen, same = set(), 0
    for i, (r, k, s, m, name) in enumerate(shapes):
      if i == 0 or time.perf_counter() - last >= progress_secs:
        last = time.perf_counter()
        logging.info('Planning: %d of %d shapes (R, K, S, M, schedule) '
                     'simulated in %.0f s, %d layouts so far%s...', i,
                     len(shapes), last - start, len(out),
                     _BestSoFar(out, TimeLeft(last - start, done, total)))
      done += _Work((r, k, s, m, name))
      try:
        schedule = schedules.Build(name, s, k, m)
      except ValueError:
        refused += 1
        continue
      # Schedules that run the same action lists here, the loss at the
      # same place (1f1b and interleaved_1f1b on one device), are one
      # layout: the first registered (the default first) stands for them.
      key = (r, schedule.actions, tuple(schedule.stage_devices),
             schedules.LossInside(name))
      if key in seen:
        same += 1
        continue
      seen.add(key)
      for bounds in self._Cuts(Layout(r, k, s, m, name, 'never', None)):
        found = False
        for remat in REMATS:
          if found:
            dominated += 1
            continue
          # Sharded slots (R > 1) buy memory: tried when the layout does
          # not fit with whole ones.
          for shard in (False, True) if r > 1 and self._can_shard else (
              False,):
            p = self.Predict(Layout(r, k, s, m, name, remat, bounds, shard),
                             schedule)
            out.append(p)
            found = p.fits is not False
            if found:
              break
    return plan_report.Rank(out), dict(dominated=dominated, refused=refused,
                                       same=same)

  def _Cuts(self, layout):
    """The even cut (None) and, if it differs, the balanced one."""
    even = self.model.EvenBounds(layout.stages)
    balanced = self.BalancedBounds(layout)
    return [None] if balanced == even else [None, tuple(balanced)]


def _BestSoFar(predictions, left):
  """'; best yet <layout> <ms> ms; about <s> s left' of a search under
  way ('' before any layout)."""
  fits = [p for p in predictions if p.fits is not False] or predictions
  if not fits:
    return ''
  best = min(fits, key=lambda p: p.step.time)
  return (f'; best yet {best.layout.Name()}: '
          f'{timeline_chart.FormatMs(best.step.time)} ms; '
          f'about {left:.0f} s left')


# --- the plan -----------------------------------------------------------------


def Plan(key, params, plan, logdir=''):
  """Runs --mode=plan; returns the report text (also written with
  --logdir).

  Args:
    key: the experiment's registry key (for the printed flags).
    params: its model params (Train, overrides applied).
    plan: the --plan_* flags (jobs/plan_mode.PlanFlags: cluster, measure,
      top, apply, explain: a rank, 0 the layout chosen).
    logdir: where plan.txt and the chart go ('' : nowhere).

  Raises:
    hardware.SpecError: a bad cluster text.
    plan_model.NotPlannable: a model the planner cannot lay out.
    BadRequest: a --plan_explain rank beyond the layouts.
    NothingFits: no layout fits the cluster's memory.
  """
  start = time.perf_counter()
  hw = hardware_lib.Parse(plan.cluster)
  model = plan_model.PlanModel(params)
  devices = cluster_lib.Cluster.Current().devices
  if plan.measure and tf.DeviceSpec.from_string(devices[0]).device_type != (
      'CPU'):
    raise ValueError(f'--plan_measure times layers on this host\'s CPU; '
                     f'this run\'s first device is {devices[0]}.')
  logging.info('Planning %s on %s: %s...', key, plan.cluster,
               'timing its layers and real steps on this host, then '
               'simulating every layout' if plan.measure else
               'simulating every layout')
  costs = None
  if plan.measure:
    costs = plan_costs.MeasuredCosts(model, devices[0],
                                     params.task.train.learner,
                                     devices=devices)
    costs.MeasureSteps(calibration.CalibrationLayouts(model, len(devices)))
  if hw.needs_calibration:
    hw = plan_measure.Calibrate(
        hw, devices,
        plan_costs.ConcurrencyProbe(model) if plan.measure else None)
  if plan.measure:
    costs.MeasureParts(MicroBatchSizes(model, hw.num_devices))
  costs = costs or plan_costs.FlopsCosts(model, hw)
  if costs.steps:
    logging.info('Fitting what the layers\' costs leave out (overheads, the '
                 'host\'s concurrency) to the real steps...')
  planner = Planner(model, hw, costs)
  predictions, counts = planner.Search()
  errors = (calibration.CalibrationErrors(planner, costs.steps)
            if costs.steps else None)
  text = plan_report.Report(
      key, model, planner.hw, costs, predictions, counts, plan.top,
      time.perf_counter() - start, planner.overheads, planner.concurrency,
      planner.scales, errors, planner.replica_concurrency)
  if plan.explain > len(predictions):
    raise BadRequest(
        f'--plan_explain={plan.explain} is beyond the {len(predictions)} '
        'layouts planned.')
  best = plan_report.Best(predictions)
  if best.fits is False:   # Sorted: the fitting ones first.
    raise NothingFits(_NothingFitsLine(key, planner.hw, predictions), text)
  if plan.apply:
    plan_report.WriteText(plan.apply, model.OverridesText(best.layout))
    text += (f'Wrote the overrides of {best.layout.Name()} (rank '
             f'{plan_report.RankOf(predictions, best)}) to {plan.apply}.\n')
  text += plan_report.BestText(key, model, predictions, plan.apply or None,
                               logdir, errors, planner.hw)
  if logdir:
    folder = os.path.join(logdir, 'plan')
    explained = (predictions[plan.explain - 1] if plan.explain else best)
    rank = plan_report.RankOf(predictions, explained)
    path = plan_report.WriteTimeline(explained, folder)
    text += (f'Simulated timeline of plan {rank} '
             f'({explained.layout.Name()}): {path}\n')
    plan_report.WriteText(os.path.join(folder, 'plan.txt'), text)
    plan_report.WriteText(
        os.path.join(folder, 'layouts.json'),
        plan_report.LayoutsJson(key, model, predictions[:plan.top], best))
  return text


class BadRequest(ValueError):
  """A plan asked of the planner that it cannot give (its line names the
  flag)."""


class NothingFits(ValueError):
  """No layout fits the cluster's memory: its line, and the plan's table
  (`report`), which is printed but nothing is written."""

  def __init__(self, line, report):
    super().__init__(line)
    self.report = report


def _NothingFitsLine(key, hw, predictions):
  """What the closest layout needs, when no layout of `key` fits."""
  def _Need(p):
    if not hw.shared:
      return max(p.memory)
    return p.together * min(p.layout.replicas,
                            max(1, hw.devices_per_host // p.layout.devices))
  closest = min(predictions, key=_Need)
  fmt = memory_estimate.FormatBytes
  where = 'the host\'s devices together' if hw.shared else 'a device'
  return (f'no layout of {key} fits the cluster\'s memory ({fmt(hw.memory)} '
          f'{"a host" if hw.shared else "a device"}): the closest, '
          f'{closest.layout.Name()}, needs {fmt(_Need(closest))} on '
          f'{where}. Lower input.batch_size or the model\'s size, or plan '
          'a cluster with more memory (--plan_cluster=...,memory_gib=N); '
          'nothing was written.')
