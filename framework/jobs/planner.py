"""`--mode=plan`: every layout of a model on a cluster, predicted and ranked.

For a model with a pipelined stack (plan_model.py) and a described cluster
(--plan_cluster, framework/pipeline/hardware.py), the planner predicts,
before anything trains, for every layout that fits the devices:

  R replicas x K devices per replica x v cells per device (S = K v stages)
  x M micro-batches x schedule (every registered one, `schedules.Names()`,
  except 'table'; sizes a schedule refuses are skipped) x remat
  x the cut of the layers into stages (the stack's even cut, and the cut
  that balances the predicted stage times, BalancedPartition)

the step time, examples/s, MFU, bubble and memory per device, and ranks
them by step time (the global batch stays the input's batch_size: R
replicas take batch_size / R each). How:

  costs:   each layer's forward and backward seconds on one micro-batch:
           its FPropMeta FLOPs over the device's FLOP/s x efficiency (the
           backward 2x the forward), or, with --plan_measure, timed on this
           host's device as a compiled step pays them (plan_measure.py);
           the embedding counts in the first stage, the final norm,
           softmax and loss in the last. With --plan_measure the planner
           also times real steps of the trainer's loop for a few layouts
           (CalibrationLayouts) and fits to them what unit costs leave
           out (Overheads: the executor's cost per unit and micro-batch,
           what a split backward adds, the step's fixed cost, each extra
           replica's), a factor of the units' times per micro-batch size
           (FitScales) and the host's concurrency at each micro-batch size
           from the smallest to the whole batch (FitConcurrency);
  step:    the schedule's action lists run by a discrete-event simulation
           with transfers between stages, the gradient all-reduce and the
           update (framework/pipeline/step_model.py); devices that share
           compute (this host's logical CPUs) slow each other down;
  memory:  weights, gradients, slots and the activations the schedule and
           remat keep (framework/pipeline/memory_estimate.py), per device;
           on a host whose devices share memory, all of them together.

While it works the planner logs what it is doing: each calibration
layout built and each round of their steps, the host's measurements,
each micro-batch size its units are timed at (n of N), and every 5 s
of a long search how far it got, the best layout yet and the time left.

A layout whose remat is slower than another fitting remat of the same
layout (never < selective < except_last < always: each re-runs more) is
dominated and left out; one that does not fit is ranked after those that
do. Step times within `TIE` (2%) of each other are a tie, well inside the
cost model's error (bench/planner_bench.py): a tie goes to the layout on
fewer devices, then with fewer micro-batches and stages (less to go
wrong, less memory for transfers). The best plan is printed as the exact
flags and params overrides that run it; --plan_apply=FILE writes the
overrides as a params file (--model_params_file_override=FILE), and with
--logdir the best plan's simulated timeline is drawn as the timeline
tool's chart (<logdir>/plan/plan_timeline.svg,
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
import itertools
import json
import math
import os
import statistics
import sys
import tempfile
import time

from absl import logging
import numpy as np
import tensorflow as tf

from cadence.framework import cluster as cluster_lib
from cadence.framework import op_cost
from cadence.framework.jobs import command_line
from cadence.framework.jobs import inspect_lib
from cadence.framework.jobs import plan_measure
from cadence.framework.jobs import plan_model
from cadence.framework.pipeline import hardware as hardware_lib
from cadence.framework.pipeline import schedules
from cadence.framework.pipeline import step_model
from cadence.framework.pipeline import timeline as timeline_lib
from cadence.framework.pipeline import timeline_chart
from cadence.layers import gpipe_partition

Layout = plan_model.Layout
# Cheapest first: each re-runs more of the forward than the one before.
REMATS = ('never', 'selective', 'except_last', 'always')
_SKIP_SCHEDULES = ('table',)   # Written by hand, not searched.
MAX_PER_DEVICE = 4             # v: cells per device.
TIE = 0.02                     # Step times this close rank as equal.
# The schedule whose one-device step measures what a split backward costs.
SPLIT_CALIBRATION = 'zb_h1'


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


# --- costs --------------------------------------------------------------------


ItemCost = collections.namedtuple('ItemCost', ['rerun', 'once', 'loss',
                                               'backward'])
ItemCost.__doc__ = """One unit's seconds on one micro-batch: `rerun`, the
forward a remat re-runs; `once`, the forward it does not (what runs before
the pipeline, in the first unit: the embedding); `loss`, the forward of
the loss (in the last unit; re-run only inside the pipeline); `backward`,
input and weight gradients without re-run."""


class FlopsCosts:
  """Unit costs from the plan's cost records (each unit's FPropMeta, what
  runs before the pipeline and the loss apart) on a device of `hw`
  (calibrated). With the hardware's op model (the accelerator presets),
  each op of a unit's record at the micro-batch size takes
  hw.OpSeconds, its gradient's ops (op_cost.Backward) likewise; without
  it, a forward takes flops / (peak x efficiency), a backward its
  bwd_flops likewise."""

  def __init__(self, model, hw):
    self._model, self._rate, self._hw = model, hw.flops * hw.efficiency, hw
    self.source = (f'FLOPs at {hw.flops / 1e12:.3g} TFLOP/s x efficiency '
                   f'{hw.efficiency:g} per device')
    if hw.op_model:
      self.source = (f'each op of the units\' cost records timed by kind '
                     f'and shape ({hardware_lib.Figure(hw.flops / 1e12)} '
                     f'TFLOP/s peak, products at up to {hw.efficiency:g} of '
                     f'it, {hardware_lib.Figure(hw.memory_bandwidth / 1e9)} '
                     'GB/s)')
    self.seconds = 0.0
    self.update_rate = None   # Seconds per weight byte: from bandwidth.
    self.steps = {}           # Measured steps to fit: none, or set by hand.
    self._items = {}          # {micro-batch size: [ItemCost]}

  def _Seconds(self, units):
    """(forward, backward) seconds of units' ops (hardware.OpSeconds)."""
    ops = [op for u in units for op in u.cost.ops]
    seconds = self._hw.OpSeconds
    return (sum(seconds(op) for op in ops),
            sum(seconds(b) for op in ops for b in op_cost.Backward(op)))

  def _OpItems(self, micro_batch):
    plan = self._model.plan
    units = plan.UnitsAt(micro_batch)
    once, once_back = self._Seconds(plan.BeforeAt(micro_batch))
    loss_unit = plan.LossAt(micro_batch)
    loss, loss_back = self._Seconds([loss_unit] if loss_unit else [])
    out = []
    for i, u in enumerate(units):
      forward, backward = self._Seconds([u])
      first, last = i == 0, i == len(units) - 1
      out.append(ItemCost(forward, once if first else 0.0,
                          loss if last else 0.0,
                          backward + (once_back if first else 0.0) +
                          (loss_back if last else 0.0)))
    return out

  def Items(self, micro_batch):
    if self._hw.op_model:
      if micro_batch not in self._items:
        self._items[micro_batch] = self._OpItems(micro_batch)
      return self._items[micro_batch]
    model = self._model
    scale = micro_batch / model.batch_size / self._rate
    n = model.num_units
    out = []
    for i, (f, b) in enumerate(zip(model.item_flops, model.item_bwd_flops)):
      once = model.before_flops if i == 0 else 0
      loss = model.loss_flops if i == n - 1 else 0
      rerun = f - once - loss
      out.append(ItemCost(rerun * scale, once * scale, loss * scale,
                          b * scale))
    return out


Overheads = collections.namedtuple('Overheads', ['layer', 'step',
                                                'replica', 'split', 'action'],
                                   defaults=[0.0, 0.0, 0.0, 0.0, 0.0])
Overheads.__doc__ = """Seconds the measured layer costs leave out:
`layer`, what the executor adds to each layer of each action (an action
of a stage of n layers pays n x layer: its ops, and its weights' gradient
sums, are per layer and micro-batch); `step`, what a step pays once
(FitOverheads); `replica`, what each replica beyond the first adds to a
step (FitReplicaOverhead: the strategy's work beyond the simulated
all-reduce and updates); `split`, what a backward cut in B and W
(zero-bubble schedules) adds per layer of each micro-batch beyond the
fused backward (FitSplitOverhead); `action`, what each action pays
whatever its layers (FitOverheads: the executor's call, the hand-over
between stages).

Per layer, not per action: on this machine the Tiny LM's step grows from
1 to 8 micro-batches far beyond its layers' measured costs, but 2 devices
holding 2 cells each (interleaved, 32 actions) step as fast as holding
one (1F1B, 16 actions)."""


def CalibrationLayouts(model, num_devices=1):
  """The layouts whose real steps fit the Overheads and the concurrency:
  the model on one device, as one micro-batch and as the most
  micro-batches m up to 8 that divide the batch (gpipe, no remat), at
  that M with its backward split (SPLIT_CALIBRATION) and at that M cut in
  2 stages (twice the actions: Overheads.action); and, with
  2 devices or more, 2 stages on 2 devices at m, m / 2 and 2 micro-batches
  (1f1b, no remat) and at one (SPLIT_CALIBRATION): the concurrency from
  the smallest micro-batch to the whole batch; and 2 replicas of one
  device (one micro-batch).

  The whole batch is where a flat extrapolation went wrong: the Tiny LM of
  8 layers fitted 1.28 at 4 examples a micro-batch and 1.21 at 8, and held
  at 1.21 the planner put its layouts of one micro-batch (32 examples) on
  2 devices 16-20% under the trainer's steps, which took as long as one
  device's (bench/plan_vs_trainer.py)."""
  m = [n for n in MicroBatchCounts(model.batch_size) if n <= 8][-1]
  out = [Layout(1, 1, 1, n, 'gpipe', 'never', None) for n in sorted({1, m})]
  out.append(Layout(1, 1, 1, m, SPLIT_CALIBRATION, 'never', None))
  if model.num_units >= 2:   # Twice the actions of the same layers.
    out.append(Layout(1, 1, 2, m, 'gpipe', 'never', None))
  if num_devices >= 2 and model.num_units >= 2:
    out += [Layout(1, 2, 2, n, '1f1b', 'never', None)
            for n in sorted({m, m // 2, 2}, reverse=True)
            if n >= 2 and model.batch_size % n == 0]
    # The whole batch as one micro-batch, where a split backward's W beside
    # the other stage's B is the only overlap: actions that alone keep the
    # cores busy gain least from a second device.
    out.append(Layout(1, 2, 2, 1, SPLIT_CALIBRATION, 'never', None))
  if num_devices >= 2 and model.batch_size % 2 == 0:
    out.append(Layout(2, 1, 1, 1, 'gpipe', 'never', None))
  return out


def _SplitsBackward(layout):
  return schedules.Build(layout.schedule, layout.stages, layout.devices,
                         layout.micro_batches).splits_backward


def _OneDevice(steps, split, stages=1):
  """The (layout, seconds) of `steps` of one stage (default) on one device
  (K = 1, R = 1) whose schedule splits the backward or not; stages=None:
  more than one stage."""
  return [(l, t) for l, t in steps.items()
          if l.devices == 1 and l.replicas == 1 and
          _SplitsBackward(l) == split and
          (l.stages == 1 if stages == 1 else l.stages > 1)]


def FitScales(planner, steps):
  """{micro-batch size: factor} of the units' times that brings the
  planner's predictions (its fitted Overheads included) to the real steps
  of the one-device layouts of `steps` with a fused backward, what the
  Overheads leave: on one device every action runs in turn, so such a
  step is linear in the units' times, and the factor solves it at that
  layout's micro-batch size (kept within [0.5, 2]).

  The units are timed alone, each on its own inputs (plan_measure); a step
  runs them back to back on one micro-batch's activations, and the two
  differ with the size of the work. The Tiny LM of 8 layers fitted
  factors of 0.89 and 0.99 at 4 examples a micro-batch, and 0.97 and 1.02
  at 32, in two runs of bench/plan_vs_trainer.py; in another, the
  additive fit (FitOverheads: a cost per action and one per step, each
  >= 0) came out zero and left its one-micro-batch step 6% short."""
  out = {}
  for layout, seconds in _OneDevice(steps, split=False):
    once = planner.Predict(layout, scale=1.0).step.time
    work = planner.Predict(layout, scale=2.0).step.time - once
    if work > 0:
      out[planner.model.PerReplicaBatch(layout) // layout.micro_batches] = (
          min(2.0, max(0.5, 1.0 + (seconds - once) / work)))
  return out


def FitOverheads(planner, steps):
  """Overheads `layer`, `action` and `step` (each >= 0) that bring the
  planner's predictions of one-device layouts with a fused backward to
  their measured step times: the least-squares fit of t = simulated +
  (actions x layers of a stage) x `layer` + actions x `action` + `step`
  (on one device every action runs in turn, so each adds its overheads
  to the step) whose terms are all >= 0 (each subset of the three tried;
  a cost the rows cannot tell apart stays 0). One stage tells `layer`
  from `step`; the same layers in 2 stages (twice the actions) tell
  `action` from `layer`.

  The Tiny LM of 8 layers ran its layouts of 3 and 4 devices, or 2 to 4
  stages a device, 7-25% over the planner's predictions without `action`,
  all of the same sign (bench/plan_vs_trainer.py).

  Args:
    planner: a Planner (its own overheads are not used).
    steps: {Layout: measured seconds}; those on one device (K = 1, R = 1)
      whose schedule does not split the backward count.
  """
  rows, excess = [], []
  for layout, seconds in (_OneDevice(steps, split=False) +
                          _OneDevice(steps, split=False, stages=None)):
    p = planner.Predict(layout, overheads=Overheads())
    actions = sum(len(a) for a in schedules.Build(
        layout.schedule, layout.stages, 1, layout.micro_batches).actions)
    rows.append([actions * planner.model.num_units / layout.stages,
                 actions, 1.0])
    excess.append(seconds - p.step.time)
  if not rows:
    return Overheads()
  a, y = np.array(rows), np.array(excess)
  best, best_err = np.zeros(3), float(np.sum(y ** 2))
  for n in range(1, 4):
    for cols in itertools.combinations(range(3), n):
      x = np.linalg.lstsq(a[:, cols], y, rcond=None)[0]
      if np.all(x >= 0):
        full = np.zeros(3)
        full[list(cols)] = x
        err = float(np.sum((a @ full - y) ** 2))
        if err < best_err - 1e-18:
          best, best_err = full, err
  return Overheads(layer=float(best[0]), step=float(best[2]),
                   action=float(best[1]))


def _MeanExcess(planner, steps, overheads, per):
  """max(0, the mean over (layout, seconds) of `steps` of (seconds - the
  step predicted with `overheads`) / per(layout)); 0 without steps."""
  rows = [(seconds - planner.Predict(layout, overheads=overheads).step.time)
          / per(layout) for layout, seconds in steps]
  return max(0.0, statistics.mean(rows)) if rows else 0.0


def FitSplitOverhead(planner, steps):
  """Seconds a split backward adds per layer of each micro-batch (>= 0):
  the mean over the one-device layouts of `steps` whose schedule splits
  it of (measured - predicted without it) / (M x layers). 0 without such
  layouts.

  Measured on this machine (bench-style interleaved steps, 10 a sample):
  the Tiny LM on one device at M=8 took 163 ms with zb_h1 against 140 ms
  with gpipe, and on 2 devices 135 ms against 1f1b's 117 ms, all actions
  and FLOPs alike but for the cut."""
  return _MeanExcess(
      planner, _OneDevice(steps, split=True),
      planner.overheads._replace(split=0.0),
      lambda l: l.micro_batches * planner.model.num_units)


def FitReplicaOverhead(planner, steps):
  """Seconds each replica beyond the first adds to a step (>= 0): the
  mean over the R > 1 layouts of `steps` of (measured - predicted without
  it) / (R - 1). 0 without such layouts."""
  return _MeanExcess(
      planner, [(l, t) for l, t in steps.items() if l.replicas > 1],
      planner.overheads._replace(replica=0.0), lambda l: l.replicas - 1)


def FitConcurrency(planner, steps, highest=None):
  """{micro-batch size: the host's concurrency} (hardware.Hardware.
  concurrency) with the throughput of 2 actions at once fitted so that the
  planner predicts the measured step of each 2-device layout of `steps`
  (R = 1) at its micro-batch size, found by bisection between 1 and
  `highest` (default: the host's devices); the throughputs of more actions
  keep their ratios to it. {}: no such layout, or a host whose devices do
  not share compute. The planner interpolates between the sizes
  (Planner.ConcurrencyAt).

  Logical devices of one host share its cores and thread pools, and how
  much two of them gain together depends on the work: a chain of small
  ops (a pipeline's actions on micro-batches) leaves cores idle that a
  second device's actions fill, which a probe of one layer's forward and
  backward (plan_measure.Concurrency) does not see. On this machine the
  probe measured 1.13-1.25; the real 2-device steps of the Tiny LM fitted
  1.5-1.6, of the bench Transformer 1.7 (bench/planner_bench.py). The gain
  depends on the micro-batch too: an action on more examples keeps more
  of the cores busy alone (the Tiny LM's 2-device layouts at 8 examples a
  micro-batch were predicted 10-31% fast from a fit at 4 examples).
  """
  hw = planner.hw
  two = [(l, t) for l, t in steps.items()
         if l.devices == 2 and l.replicas == 1]
  if not two or not hw.shared or len(hw.concurrency) < 2:
    return {}
  return {planner.model.PerReplicaBatch(l) // l.micro_batches:
          _FitConcurrency(planner, l, t, highest) for l, t in two}


def _FitConcurrency(planner, layout, seconds, highest):
  """FitConcurrency's bisection for one layout."""
  base = planner.hw.concurrency
  return _Bisect(
      lambda c: planner.Predict(layout, hw=planner.hw._replace(
          concurrency=_Scaled(base, c))).step.time,
      seconds, 1.0, max(highest or float(planner.hw.devices_per_host), 1.0),
      lambda c: _Scaled(base, c))


def _Scaled(base, c2):
  """Concurrencies (1, c2, ...) whose throughputs of 4, 8, ... actions
  keep their ratios to 2's in `base` (1, base2, ...)."""
  return (1.0, c2) + tuple(c * c2 / base[1] for c in base[2:])


def _Bisect(time_of, seconds, lo, hi, result):
  """result(c) for the c in [lo, hi] with time_of(c) = `seconds` (time_of
  falls as c grows; held at lo or hi when `seconds` is beyond them)."""
  if time_of(hi) >= seconds:
    return result(hi)
  if time_of(lo) <= seconds:
    return result(lo)
  for _ in range(30):
    mid = (lo + hi) / 2
    if time_of(mid) > seconds:
      lo = mid
    else:
      hi = mid
  return result((lo + hi) / 2)


def FitReplicaConcurrency(planner, steps):
  """The host's throughput with 1, 2, 4, ... replicas each running one
  action (step_model.SimulateStep's replica_concurrency), with 2's fitted
  so that the planner predicts the measured steps of the layouts of
  `steps` with R > 1 on one host that step faster than the pipeline's
  concurrency predicts (the median of their fits, bisected between 1 and
  the replicas' devices on the host); 4's and beyond keep their ratios to
  2's in the host's probe. None: no such layout (a slower step is the
  strategy's work, FitReplicaOverhead: one step cannot tell the two
  apart), or a host whose devices do not share compute.

  Replicas are independent streams of work, a pipeline's devices are
  not: the pipelined ResNet's 2-device pipeline at 16 examples a
  micro-batch fitted a concurrency of 1.02, but its 2 replicas of 16
  examples, one device each, stepped in 36.9 ms where that concurrency
  predicted 49.5 ms (its step on one device of 32 examples took 36.0
  ms: 2 replicas gained 1.3-1.4x, as the host's probe said)."""
  hw = planner.hw
  many = [(l, t) for l, t in steps.items()
          if l.replicas > 1 and l.replicas * l.devices <= hw.devices_per_host]
  if not many or not hw.shared or len(hw.concurrency) < 2:
    return None
  fits = []
  for layout, seconds in many:
    if seconds >= planner.Predict(layout).step.time:
      continue
    on_host = min(layout.replicas, hw.devices_per_host // layout.devices)
    fits.append(_Bisect(
        lambda c, l=layout: planner.Predict(
            l, replica_concurrency=_Scaled(hw.concurrency, c)).step.time,
        seconds, 1.0, float(on_host), lambda c: c))
  return _Scaled(hw.concurrency, statistics.median(fits)) if fits else None


class MeasuredCosts:
  """Unit costs timed on `device` (--plan_measure), per micro-batch size,
  measured once each: every distinct unit of the plan, what runs before
  the pipeline and the loss, each built from its params and timed forward
  and backward (plan_measure.MeasureParts of plan_measure.UnitPart); the
  optimizer update's seconds per weight byte (plan_measure.MeasureUpdate
  on the largest unit); and the real steps of the CalibrationLayouts
  (`MeasureSteps`), to which a Planner fits its Overheads and the host's
  concurrency.

  `MedianOf` merges several measurements (a benchmark's rounds) into one
  of their medians.
  """

  def __init__(self, model, device, learner_params, parts=None,
               update_rate=None, steps=None, devices=None):
    self._model, self._device = model, device
    self._devices = list(devices or [device])
    self.parts = dict(parts or {})   # {micro-batch: {name: (F, F + B)}}
    self.steps = dict(steps or {})   # {Layout: seconds}
    self.seconds = 0.0
    self.update_rate = update_rate
    if update_rate is None:
      start = time.perf_counter()
      largest = max(model.plan.UnitsAt(1),
                    key=lambda u: u.cost.weight_bytes or u.cost.flops or 0)
      with tf.device(device):
        layers = plan_measure.UnitPart(largest).layers
      secs, size = plan_measure.MeasureUpdate(learner_params, layers, device)
      self.update_rate = secs / max(size, 1)
      self.seconds += time.perf_counter() - start
    self.source = f'measured on {device} (--plan_measure)'

  @classmethod
  def MedianOf(cls, runs):
    """One MeasuredCosts of the medians of `runs` (MeasuredCosts of one
    model and device): each part's times, the update's rate and the
    steps."""
    first = runs[0]
    parts = {}
    for mb in set.intersection(*(set(r.parts) for r in runs)):
      parts[mb] = {name: tuple(statistics.median(r.parts[mb][name][i]
                                                 for r in runs)
                               for i in range(2))
                   for name in first.parts[mb]}
    steps = {l: statistics.median(r.steps[l] for r in runs)
             for l in set.intersection(*(set(r.steps) for r in runs))}
    out = cls(first._model, first._device, None, parts,  # pylint: disable=protected-access
              statistics.median(r.update_rate for r in runs), steps)
    out.source += f', medians of {len(runs)} measurements'
    return out

  def _UnitsAt(self, micro_batch):
    """{key: Unit} of what is timed at `micro_batch`: the units (one of
    each kind: equal costs are equal units), 'before:<name>' and 'loss'."""
    plan = self._model.plan
    units = plan.UnitsAt(micro_batch)
    out = {}
    for u in units:
      out.setdefault(_UnitKind(u), u)
    for u in plan.BeforeAt(micro_batch):
      out[f'before:{u.name}'] = u
    loss = plan.LossAt(micro_batch)
    if loss is not None:
      out['loss'] = loss
    return units, out

  def Parts(self, micro_batch):
    """{part key: (forward s, forward + backward s)} at `micro_batch`."""
    if micro_batch not in self.parts:
      start = time.perf_counter()
      _, todo = self._UnitsAt(micro_batch)
      with tf.device(self._device):
        parts = [plan_measure.UnitPart(u) for u in todo.values()]
      times = plan_measure.MeasureParts(parts, self._device)
      self.parts[micro_batch] = dict(zip(todo, times))
      self.seconds += time.perf_counter() - start
    return self.parts[micro_batch]

  def MeasureParts(self, sizes):
    """Times the parts (`Parts`) at each micro-batch size of `sizes` not
    timed yet, with a progress line for each."""
    todo = [mb for mb in sizes if mb not in self.parts]
    for i, mb in enumerate(todo):
      _, parts = self._UnitsAt(mb)
      logging.info('Timing the model\'s units, forward and backward, on '
                   'micro-batches of %d examples (%d of %d sizes): %s...',
                   mb, i + 1, len(todo),
                   ', '.join(u.name for u in parts.values()))
      self.Parts(mb)

  def MeasureSteps(self, layouts, runs=5, steps=3, min_seconds=0.5):
    """Times real steps of `layouts` (R x K <= the devices given) on the
    first R x K devices: the medians of `runs`, interleaved, each of
    `steps` steps or more, to take `min_seconds`, after an untimed one
    (plan_measure.SteadySeconds); returns {Layout: seconds}."""
    start = time.perf_counter()
    times = {l: [] for l in layouts}
    with tempfile.TemporaryDirectory() as logdir:
      built = {}
      for i, l in enumerate(layouts):
        logging.info('Timing real steps: building the train step of layout '
                     '%d of %d (%s) and running 2 steps...', i + 1,
                     len(layouts), l.Name())
        built[l] = plan_measure.BuildStep(
            self._model.LayoutParams(l),
            self._devices[:l.devices * l.replicas], logdir, l.replicas)
      for r in range(runs):
        logging.info('Timing real steps: round %d of %d (steps of each of '
                     'the %d layouts, interleaved)...', r + 1, runs,
                     len(layouts))
        for layout, run in built.items():
          times[layout].append(
              plan_measure.SteadySeconds(run, steps, min_seconds))
      # Freed here, said first: deleting a 2-replica program's distributed
      # input iterator took 15 s in `trainer.py --mode=plan` on this 2-core
      # host (load 2-4), the other programs 0.0 s.
      logging.info('Timing real steps: done; freeing the %d programs built '
                   'for them...', len(built))
      run = None   # The loop's reference to the last one.
      built.clear()
    self.steps.update({l: statistics.median(t) for l, t in times.items()})
    self.seconds += time.perf_counter() - start
    return self.steps

  def Items(self, micro_batch):
    t = self.Parts(micro_batch)
    back = lambda key: max(t[key][1] - t[key][0], 0.0)  # pylint: disable=unnecessary-lambda-assignment
    units, _ = self._UnitsAt(micro_batch)
    n = len(units)
    before = [k for k in t if k.startswith('before:')]
    out = []
    for i, u in enumerate(units):
      kind = _UnitKind(u)
      rerun, backward = t[kind][0], back(kind)
      once = loss = 0.0
      if i == 0:
        once = sum(t[k][0] for k in before)
        backward += sum(back(k) for k in before)
      if i == n - 1 and 'loss' in t:
        loss, backward = t['loss'][0], backward + back('loss')
      out.append(ItemCost(rerun, once, loss, backward))
    return out


def _UnitKind(unit):
  """A unit's key among the timed parts: units of the same cost (FLOPs,
  bytes and output shapes) are one kind, timed once (the LM's layers)."""
  c = unit.cost
  return (f'unit:{c.flops}|{c.bwd_flops}|{c.act}|{c.act_weights}|'
          f'{c.out_shapes}').replace(' ', '')


def StageCosts(model, layout, items, memory, hw, update_rate=None,
               overhead=0.0, split=0.0, action=0.0):
  """The step_model.StageCost of each stage of `layout` from its layers'
  ItemCosts on one micro-batch and the FPropMeta `memory` of the layout.

  remat 'selective' re-runs what it does not keep: the forward times the
  share of the activation bytes it does not keep (1 - act_weights / act).
  `overhead`: seconds each action pays per layer of its stage beyond the
  layers' costs (Overheads.layer); `action`: what each action pays
  whatever its layers (Overheads.action); `split`: what a split backward adds per
  layer (Overheads.split).
  """
  inside = schedules.LossInside(layout.schedule)
  weights = model.StageWeights(model.Bounds(layout))
  bounds = model.Bounds(layout)
  out = []
  for s, (a, b) in enumerate(zip(bounds, bounds[1:])):
    mine = items[a:b]
    rerun = sum(c.rerun for c in mine) + (
        sum(c.loss for c in mine) if inside else 0.0)
    cell = memory.cells[s]
    if layout.remat == 'selective' and cell.act:
      rerun *= max(0.0, 1.0 - cell.act_weights / cell.act)
    w, g, slots = weights[s]
    update = (update_rate * w if update_rate else
              2 * (w + g + slots) / hw.memory_bandwidth)
    out.append(step_model.StageCost(
        forward=sum(c.rerun + c.once + c.loss for c in mine),
        backward=sum(c.backward for c in mine), recompute=rerun,
        out_bytes=cell.out, grad_bytes=g, update=update,
        accumulate=3 * g / hw.memory_bandwidth,
        overhead=overhead * (b - a) + action, split=split * (b - a)))
  return out


# --- the search ---------------------------------------------------------------


def MicroBatchCounts(batch, current=None):
  """The M to try for a replica's `batch`: powers of two dividing it, and
  the experiment's own M if it divides it."""
  out = {m for m in (2 ** i for i in range(batch.bit_length()))
         if batch % m == 0}
  if current and batch % current == 0:
    out.add(current)
  return sorted(out)


def MicroBatchSizes(model, num_devices):
  """The examples a micro-batch of the layouts on at most `num_devices`
  devices holds (Search's), sorted."""
  out = set()
  for r in {r for r, _, _ in Shapes(num_devices, model.num_units,
                                    model.batch_size)}:
    per_replica = model.batch_size // r
    out.update(per_replica // m for m in MicroBatchCounts(
        per_replica, model.current.micro_batches))
  return sorted(out)


def Schedules():
  return [n for n in schedules.Names() if n not in _SKIP_SCHEDULES]


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
    costs: FlopsCosts or MeasuredCosts.
    overheads: the Overheads to predict with; None: fitted to the costs'
      measured steps, if any (the host's concurrency too), else none.
  """

  def __init__(self, model, hw, costs, overheads=None):
    self.model, self.hw, self.costs = model, hw, costs
    self._items = {}
    self._memory = {}
    self.overheads = overheads or Overheads()
    # {micro-batch size: fitted concurrency}; {}: the hardware's.
    self.concurrency = {}
    # {micro-batch size: the factor of its units' times}; {}: 1.
    self.scales = {}
    # The host's throughput with 1, 2, 4, ... replicas; None: from the
    # concurrency (step_model.SimulateStep).
    self.replica_concurrency = None
    if overheads is None and costs.steps:
      # In this order: each fit uses the ones before.
      self.overheads = FitOverheads(self, costs.steps)
      self.scales = FitScales(self, costs.steps)
      self._items.clear()
      self.overheads = self.overheads._replace(
          split=FitSplitOverhead(self, costs.steps))
      self.concurrency = FitConcurrency(self, costs.steps)
      self.replica_concurrency = FitReplicaConcurrency(self, costs.steps)
      self.overheads = self.overheads._replace(
          replica=FitReplicaOverhead(self, costs.steps))

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
    """The factor of the units' times on `micro_batch` examples (FitScales),
    linear in log2(micro_batch) between the fitted sizes and held beyond
    them; 1 with none fitted."""
    if not self.scales:
      return 1.0
    return hardware_lib.Interpolate(
        sorted((math.log2(b), f) for b, f in self.scales.items()),
        math.log2(micro_batch))

  def Items(self, micro_batch, scale=None):
    """The ItemCost of each unit on `micro_batch` examples: the costs'
    times x `scale` (default ScaleAt)."""
    if scale is not None:
      return [ItemCost(*(scale * t for t in c))
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
    return gpipe_partition.BalancedPartition(times, layout.stages)

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
    stages = StageCosts(model, layout, self.Items(mb, scale), memory, hw,
                        self.costs.update_rate, overheads.layer,
                        overheads.split, overheads.action)
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
    """Every layout's Prediction, best first (see the module docstring);
    returns (predictions, counts: NestedMap of what was skipped). Logs a
    progress line as it starts and every `progress_secs` seconds: shapes
    done of all, layouts so far, the best one yet and the time left at the
    pace so far."""
    model, hw = self.model, self.hw
    out, dominated, refused = [], 0, 0
    shapes = [(r, k, s, m, name)
              for r, k, s in Shapes(hw.num_devices, model.num_units,
                                    model.batch_size)
              for m in MicroBatchCounts(model.batch_size // r,
                                        model.current.micro_batches)
              for name in Schedules()]
    start = last = time.perf_counter()
    seen, same = set(), 0
    for i, (r, k, s, m, name) in enumerate(shapes):
      if i == 0 or time.perf_counter() - last >= progress_secs:
        last = time.perf_counter()
        logging.info('Planning: %d of %d shapes (R, K, S, M, schedule) '
                     'simulated in %.0f s, %d layouts so far%s...', i,
                     len(shapes), last - start, len(out),
                     _BestSoFar(out, i, len(shapes), last - start))
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
          p = self.Predict(Layout(r, k, s, m, name, remat, bounds), schedule)
          out.append(p)
          found = p.fits is not False
    return Rank(out), dict(dominated=dominated, refused=refused, same=same)

  def _Cuts(self, layout):
    """The even cut (None) and, if it differs, the balanced one."""
    even = self.model.EvenBounds(layout.stages)
    balanced = self.BalancedBounds(layout)
    return [None] if balanced == even else [None, tuple(balanced)]


def _BestSoFar(predictions, done, total, seconds):
  """'; best yet <layout> <ms> ms; about <s> s left' of a search under
  way ('' before any layout)."""
  fits = [p for p in predictions if p.fits is not False] or predictions
  if not fits:
    return ''
  best = min(fits, key=lambda p: p.step.time)
  left = seconds / done * (total - done) if done else 0.0
  return (f'; best yet {best.layout.Name()}: {_Ms(best.step.time)} ms; '
          f'about {left:.0f} s left')


def Rank(predictions):
  """`predictions` best first: those that fit (or may) before those that
  do not; by step time, where times within TIE of the fastest of a group
  tie and the tie goes to fewer devices (R x K), then fewer micro-batches,
  then fewer stages."""
  def _Simple(p):
    lay = p.layout
    return (lay.replicas * lay.devices, lay.micro_batches, lay.stages)

  out = []
  for fits in (True, False):
    rest = sorted((p for p in predictions if (p.fits is not False) == fits),
                  key=lambda p: p.step.time)
    while rest:
      # The group: the layouts within TIE of the fastest left (a prefix).
      limit = rest[0].step.time * (1 + TIE)
      end = 1
      while end < len(rest) and rest[end].step.time <= limit:
        end += 1
      best = min(range(end), key=lambda i: (_Simple(rest[i]), i))
      out.append(rest.pop(best))
  return out


# --- the report ---------------------------------------------------------------


_Ms = timeline_chart.FormatMs   # The table's and the chart's ms alike.


def ConcurrencyText(concurrency):
  """The fitted {micro-batch size: concurrency} as text."""
  return ', '.join(f'{c[1]:.2f} at {b} examples a micro-batch'
                   for b, c in sorted(concurrency.items()))


def _OverheadsText(costs, o, concurrency, scales=None,
                   replica_concurrency=None):
  if not costs.steps:
    return ''
  steps = ', '.join(
      f'R={l.replicas} K={l.devices}'
      f'{f" S={l.stages}" if l.stages != l.devices else ""} '
      f'M={l.micro_batches} {l.schedule}: {_Ms(t)} ms'
      for l, t in sorted(costs.steps.items()))
  fitted = (f', and the throughput of 2 actions at once on a host '
            f'{ConcurrencyText(concurrency)} (the cluster line gives the '
            'probe\'s)') if concurrency else ''
  fitted += (f', of 2 replicas on a host {replica_concurrency[1]:.2f}'
             if replica_concurrency else '')
  fitted += (', the units\' timed seconds x ' + ', '.join(
      f'{f:.3f} at {b} examples a micro-batch'
      for b, f in sorted(scales.items()))) if scales else ''
  return (f'; fitted to real steps ({steps}): {_Ms(o.layer)} ms a unit '
          f'of an action, {_Ms(o.action)} ms an action, {_Ms(o.split)} ms a unit of a micro-batch\'s '
          f'split backward, {_Ms(o.step)} ms a step, {_Ms(o.replica)} ms a '
          f'replica beyond the first{fitted}')


def TieLabels(ranked, top):
  """Per row of the table (the first `top` of `ranked`): the rank of the
  first row whose step time is within TIE of its own, if another row ties
  with it, else ''."""
  rows = ranked[:top]
  out = []
  for i, p in enumerate(rows):
    tied = [j for j, q in enumerate(rows) if j != i and _Ties(p, q)]
    out.append(str(min([i] + tied) + 1) if tied else '')
  return out


def _Ties(a, b):
  """Whether two predictions' step times are within TIE of each other."""
  low, high = sorted((a.step.time, b.step.time))
  return high <= low * (1 + TIE)


def _Row(rank, p, tie=''):
  lay = p.layout
  fmt = inspect_lib.FormatBytes
  fits = {None: '?', True: 'yes', False: 'NO'}[p.fits]
  cut = 'even' if lay.bounds is None else '/'.join(
      str(b - a) for a, b in zip(lay.bounds, lay.bounds[1:]))
  return (f'{rank:>4} {lay.replicas:>2} {lay.devices:>2} {lay.per_device:>2}'
          f' {lay.micro_batches:>3}  {lay.schedule:<16} {lay.remat:<12}'
          f'{cut:<12}{_Ms(p.step.time):>10}{p.examples_per_sec:>11.1f}'
          f'{100 * p.mfu:>7.1f}%{p.step.bubble:>7.2f}'
          f'{fmt(max(p.memory)):>13}{fits:>5}{tie:>5}')


_HEADER = (f'{"rank":>4} {"R":>2} {"K":>2} {"v":>2} {"M":>3}  '
           f'{"schedule":<16} {"remat":<12}{"cut":<12}{"step ms":>10}'
           f'{"examples/s":>11}{"MFU":>8}{"bubble":>7}{"memory/dev":>13}'
           f'{"fits":>5}{"tie":>5}')


def CalibrationErrors(planner, steps):
  """{layout: predicted / measured - 1} of the real steps --plan_measure
  timed (`steps`: {layout: seconds}), predicted with what was fitted to
  them: the model's in-sample error on this host."""
  return {lay: planner.Predict(lay).step.time / t - 1
          for lay, t in steps.items()}


def Sureness(ranked, calibration, hw=None):
  """One line: where the costs came from, how far the cost model was off
  where it could be checked (`calibration`: CalibrationErrors of the
  measured steps; else, for a cluster with the op model, the published
  check of hardware.PUBLISHED_CHECK), and how many of the layouts lie
  within that error of the best (any of them may be the fastest in
  fact)."""
  fits = [p for p in ranked if p.fits is not False]

  def _Close(error):
    if not fits:
      return ''
    n = sum(1 for p in fits if p.step.time <= fits[0].step.time * (1 + error))
    return (f' {n} layout{"s" if n != 1 else ""} lie within '
            f'{100 * error:.1f}% of the best: any of them may be the '
            'fastest.')

  if calibration:
    errors = sorted(abs(e) for e in calibration.values())
    median, worst = statistics.median(errors), errors[-1]
    return (f'How sure: the units\' times were measured on this host; the '
            f'overheads and the host\'s concurrency fitted to '
            f'{len(errors)} real steps, which the model then predicts '
            f'within {100 * median:.1f}% (median) and {100 * worst:.1f}% '
            f'(worst: in sample).' + _Close(worst))
  if hw is not None and hw.op_model:
    check = hardware_lib.PUBLISHED_CHECK
    return (f'How sure: the costs are each op\'s FLOPs and bytes on the '
            'cluster\'s public specifications, not measured; the same op '
            f'model against {check["rows"]} published step times of '
            f'pipelined training from {check["sources"]} sources '
            f'(bench/published_check.py) is off by '
            f'{100 * check["median"]:.1f}% at the median and '
            f'{100 * check["worst"]:.0f}% at worst.' +
            _Close(check['median']))
  return ('How sure: the costs are FLOPs at the cluster\'s peak x '
          'efficiency, not measured and not checked against measured step '
          'times, so read the ranking as a guide, not a measurement.')


def _UnitNames(model):
  """'layer0..layer3' (the plan's unit names, first and last)."""
  names = model.unit_names
  return names[0] if len(names) == 1 else f'{names[0]}..{names[-1]}'


def Report(key, model, hw, costs, predictions, counts, top, seconds,
           overheads=None, concurrency=None, scales=None, calibration=None,
           replica_concurrency=None):
  """The ranked table and how sure it is (Sureness; `calibration`: the
  CalibrationErrors of the planner), as text."""
  fits = [p for p in predictions if p.fits is not False]
  lines = [
      f'Layout plan of {key}: global batch {model.batch_size} '
      f'(input.batch_size; R replicas take batch_size / R each), '
      f'{model.num_units} units ({_UnitNames(model)}), '
      f'{model.flops * 3 / 1e9:.4g} GFLOP a '
      'training step.',
      f'Cluster {hw.Describe()}.',
      f'Costs: {costs.source}' + (f' ({costs.seconds:.0f} s of timing)' if
                                   costs.seconds else '') +
      _OverheadsText(costs, overheads or Overheads(), concurrency or {},
                     scales, replica_concurrency) +
      f'; {len(predictions)} layouts simulated, {seconds:.1f} s in all '
      f'({counts["dominated"]} dominated by a cheaper remat that fits, '
      f'{counts["refused"]} sizes refused by their schedule, '
      f'{counts.get("same", 0)} the same action lists as another '
      'schedule\'s); '
      f'{len(predictions) - len(fits)} do not fit.',
      'R replicas x K devices x v cells per device (S = K v stages), M '
      'micro-batches; cut: units per stage; memory/dev: the largest '
      'device\'s peak' + (' (the host\'s devices share its memory: fits '
                          'counts them all)' if hw.shared else '') + '.',
      _HEADER]
  ties = TieLabels(predictions, top)
  lines += [_Row(i + 1, p, tie)
            for i, (p, tie) in enumerate(zip(predictions[:top], ties))]
  if any(ties):
    lines.append(
        f'tie: the first rank within {100 * TIE:g}% of the row\'s step '
        'time; within a tie the ranking prefers fewer devices (R x K), '
        'then fewer micro-batches, then fewer stages.')
  if not fits:
    lines.append('No layout fits the cluster\'s memory.')
  lines.append(Sureness(predictions, calibration, hw))
  return '\n'.join(lines) + '\n'


def BestText(key, model, best, params_file=None):
  """The command that runs the best plan, as pasted in the repository
  (the README's interpreter; a fresh logdir of its own)."""
  logdir = f'/tmp/cadence_plan_{key.rsplit(".", 1)[-1]}'
  return (f'Best plan: {best.layout.Name()}: {_Ms(best.step.time)} ms '
          f'a step, {best.examples_per_sec:.1f} examples/s, MFU '
          f'{100 * best.mfu:.1f}%, bubble {best.step.bubble:.2f}.\n'
          f'  .venv/bin/python trainer.py '
          f'{model.Flags(best.layout, key, params_file)} --logdir={logdir}'
          '\n')


def SimulatedTimeline(prediction, device_names=None):
  """A timeline.Timeline of a prediction's simulated actions (replica 0):
  the timeline tool's object, built from one op event per action named in
  its scope, so it draws the same chart."""
  lay = prediction.layout
  devices = device_names or [f'/device:SIM:{d}' for d in range(lay.devices)]
  events = [timeline_lib.OpEvent(f'{a.scope}/simulated', s, e)
            for a, (s, e) in prediction.step.spans.items()]
  return timeline_lib.Timeline(events, devices, schedule=lay.schedule)


def _After(step):
  """The chart's bands for what a simulated step pays after its last
  action, as the plan's table counts it: [(name, seconds, what)]."""
  rest = max(0.0, step.time - step.fixed - step.pipeline)
  parts = [(n, what, t) for n, what, t in (
      ('all-reduce', 'gradient all-reduce', step.allreduce),
      ('update', 'optimizer update', step.update)) if t > 0]
  out = []
  if parts and rest > 0:
    out.append((' and '.join(n for n, _, _ in parts), rest,
                'from the last action\'s end to the end of the last '
                'device\'s ' + ' and '.join(
                    f'{what} (up to {_Ms(t)} ms a device)'
                    for _, what, t in parts) +
                '; each device\'s starts after its own last action'))
  if step.fixed > 0:
    out.append(('fixed', step.fixed, 'what a step pays once beyond its '
                'actions, all-reduce and update (the loop, the gradients\' '
                'norm and clipping, each replica beyond the first), fitted '
                'to the real steps --plan_measure timed'))
  return out


def SimulatedChart(prediction):
  """The chart of a prediction's simulated step (SVG text): its pipeline's
  actions, then bands for what the step pays after them, so that the time
  axis ends, and the title adds up, at the step time of the plan's
  table."""
  step, lay = prediction.step, prediction.layout
  timeline = SimulatedTimeline(prediction)
  after = _After(step)
  title = (f'Simulated step of {lay.Name()} (planner): {_Ms(step.time)} '
           'ms (the step time of the plan\'s table) = '
           f'{_Ms(step.pipeline)} ms of pipeline actions ({lay.stages} '
           f'stages x {lay.micro_batches} micro-batches; bubble '
           f'{step.bubble:.2f}, ideal {timeline.ideal_bubble:.2f})' +
           ''.join(f' + {_Ms(seconds)} ms {name}'
                   for name, seconds, _ in after))
  return timeline_chart.Svg(
      timeline, title=title, after=after,
      idle='the device waits for an action it needs (and its transfer '
      'from another device)')


def WriteTimeline(prediction, folder):
  """Writes plan_timeline.svg (SimulatedChart) and plan_timeline.txt (its
  actions' times, Timeline.SpanTable) to `folder`; returns the chart's
  path."""
  path = os.path.join(folder, 'plan_timeline.svg')
  _WriteText(path, SimulatedChart(prediction))
  _WriteText(os.path.join(folder, 'plan_timeline.txt'),
             SimulatedTimeline(prediction).SpanTable())
  return path


def _WriteText(path, text):
  """Writes `text` to `path` whole or not at all (a temporary file, then a
  rename)."""
  tf.io.gfile.makedirs(os.path.dirname(path) or '.')
  tmp = f'{path}.tmp-{os.getpid()}'
  with tf.io.gfile.GFile(tmp, 'w') as f:
    f.write(text)
  tf.io.gfile.rename(tmp, path, overwrite=True)


def ConcurrencyProbe(model):
  """The part plan_measure.Calibrate runs on several devices at once to
  read the host's concurrency: the model's costliest unit (by FLOPs) at a
  quarter of its batch, a size between the search's micro-batches."""
  mb = max(1, model.batch_size // 4)
  return plan_measure.UnitPart(max(model.plan.UnitsAt(mb),
                                   key=lambda u: u.cost.flops or 0))


def Plan(key, params, plan, logdir=''):
  """Runs --mode=plan; returns the report text (also written with
  --logdir).

  Args:
    key: the experiment's registry key (for the printed flags).
    params: its model params (Train, overrides applied).
    plan: command_line.PlanOptions (cluster, measure, top, apply, explain).
    logdir: where plan.txt and the chart go ('' : nowhere).

  Raises:
    hardware.SpecError: a bad cluster text.
    plan_model.NotPlannable: a model the planner cannot lay out.
    command_line.UserError: a --plan_explain rank beyond the layouts.
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
    costs = MeasuredCosts(model, devices[0], params.task.train.learner,
                          devices=devices)
    costs.MeasureSteps(CalibrationLayouts(model, len(devices)))
  if hw.needs_calibration:
    hw = plan_measure.Calibrate(hw, devices,
                                ConcurrencyProbe(model) if plan.measure
                                else None)
  if plan.measure:
    costs.MeasureParts(MicroBatchSizes(model, hw.num_devices))
  costs = costs or FlopsCosts(model, hw)
  if costs.steps:
    logging.info('Fitting what the layers\' costs leave out (overheads, the '
                 'host\'s concurrency) to the real steps...')
  planner = Planner(model, hw, costs)
  predictions, counts = planner.Search()
  calibration = (CalibrationErrors(planner, costs.steps) if costs.steps
                 else None)
  text = Report(key, model, planner.hw, costs, predictions, counts, plan.top,
                time.perf_counter() - start, planner.overheads,
                planner.concurrency, planner.scales, calibration,
                planner.replica_concurrency)
  if plan.explain > len(predictions):
    raise command_line.UserError(
        f'--plan_explain={plan.explain} is beyond the {len(predictions)} '
        'layouts planned.')
  best = predictions[0]
  if best.fits is False:   # Sorted: the fitting ones first.
    raise NothingFits(_NothingFitsLine(key, planner.hw, predictions), text)
  if plan.apply:
    _WriteText(plan.apply, model.OverridesText(best.layout))
    text += f'Wrote the best plan\'s overrides to {plan.apply}.\n'
  text += BestText(key, model, best, plan.apply or None)
  if logdir:
    folder = os.path.join(logdir, 'plan')
    explained = predictions[plan.explain - 1]
    path = WriteTimeline(explained, folder)
    text += (f'Simulated timeline of plan {plan.explain} '
             f'({explained.layout.Name()}): {path}\n')
    _WriteText(os.path.join(folder, 'plan.txt'), text)
    _WriteText(os.path.join(folder, 'layouts.json'),
               LayoutsJson(key, model, predictions[:plan.top]))
  return text


def LayoutsJson(key, model, predictions):
  """The ranked table for scripts (plan/layouts.json): per layout its
  name, predicted step seconds, largest device's bytes, whether it fits
  (null: unknown) and the trainer flags that run it."""
  return json.dumps([
      dict(rank=i + 1, name=p.layout.Name(), step_seconds=p.step.time,
           memory_bytes=max(p.memory), fits=p.fits,
           flags=model.FlagList(p.layout, key))
      for i, p in enumerate(predictions)], indent=1) + '\n'


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
  fmt = inspect_lib.FormatBytes
  where = 'the host\'s devices together' if hw.shared else 'a device'
  return (f'no layout of {key} fits the cluster\'s memory ({fmt(hw.memory)} '
          f'{"a host" if hw.shared else "a device"}): the closest, '
          f'{closest.layout.Name()}, needs {fmt(_Need(closest))} on '
          f'{where}. Lower input.batch_size or the model\'s size, or plan '
          'a cluster with more memory (--plan_cluster=...,memory_gib=N); '
          'nothing was written.')


def Run(options, params):
  """--mode=plan for the trainer (trainer_lib): prints the plan of
  `params` (options.model's, Train); a user error is a UserError (with
  no layout that fits, the table is printed first)."""
  try:
    text = Plan(options.model, params, command_line.PlanOptions.Of(options),
                options.logdir)
  except NothingFits as e:
    sys.stdout.write(e.report)
    sys.stdout.flush()
    raise command_line.UserError(f'--mode=plan: {e}') from None
  except (hardware_lib.SpecError, plan_model.NotPlannable) as e:
    raise command_line.UserError(f'--mode=plan: {e}') from None
  sys.stdout.write(text)
  sys.stdout.flush()
