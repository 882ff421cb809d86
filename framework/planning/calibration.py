"""The planner's model fitted to real steps of this host (--plan_measure).

Unit costs timed alone leave out what a whole step adds: the executor's
work per unit and action, a deferred W's extra call, the step's
fixed cost, what replicas add, and how much devices that share the
host's cores gain by running at once. The planner times real steps of the
trainer's loop for a few layouts (CalibrationLayouts) and fits each of
these to them, in order (each fit uses the ones before):

  FitOverheads           per unit of an action, per action, per step;
  FitScales              the units' times per micro-batch size;
  FitDeferWOverhead       a deferred W's extra per unit;
  FitConcurrency         the host's gain with 2 actions at once, per
                         micro-batch size;
  FitReplicaConcurrency  the gain of replicas on one host;
  FitReplicaOverhead     what each replica beyond the first adds.

CalibrationErrors says how far the fitted model is from the steps it was
fitted to: the report's "How sure" line.

Example:
  costs.MeasureSteps(CalibrationLayouts(model, num_devices=4))
  planner = planner_lib.Planner(model, hw, costs)   # fits all of these
"""
import itertools
import statistics

import numpy as np

from cadence.framework.pipeline import schedules
from cadence.framework.planning import plan_costs
from cadence.framework.planning import plan_model

DEFER_W_CALIBRATION = 'zb_h1'


def CalibrationLayouts(model, num_devices=1):
  """The layouts whose real steps fit the Overheads and the concurrency:
  the model on one device, as one micro-batch and as the most
  micro-batches m up to 8 that divide the batch (gpipe, no remat), at
  that M with its W deferred (DEFER_W_CALIBRATION) and at that M cut in
  2 stages (twice the actions: plan_costs.Overheads.action); and, with
  2 devices or more, 2 stages on 2 devices at m, m / 2 and 2 micro-batches
  (1f1b, no remat) and at one (DEFER_W_CALIBRATION): the concurrency from
  the smallest micro-batch to the whole batch; and 2 replicas of one
  device (one micro-batch).

  The whole batch is where a flat extrapolation went wrong: the Tiny LM of
  8 layers fitted 1.28 at 4 examples a micro-batch and 1.21 at 8, and held
  at 1.21 the planner put its layouts of one micro-batch (32 examples) on
  2 devices 16-20% under the trainer's steps, which took as long as one
  device's (bench/plan_vs_trainer.py)."""
  m = [n for n in plan_model.MicroBatchCounts(model.batch_size) if n <= 8][-1]
  out = [plan_model.Layout(1, 1, 1, n, 'gpipe', 'never', None)
         for n in sorted({1, m})]
  out.append(plan_model.Layout(1, 1, 1, m, DEFER_W_CALIBRATION, 'never', None))
  if model.num_units >= 2:   # Twice the actions of the same layers.
    out.append(plan_model.Layout(1, 1, 2, m, 'gpipe', 'never', None))
  if num_devices >= 2 and model.num_units >= 2:
    out += [plan_model.Layout(1, 2, 2, n, '1f1b', 'never', None)
            for n in sorted({m, m // 2, 2}, reverse=True)
            if n >= 2 and model.batch_size % n == 0]
    # The whole batch as one micro-batch, where a deferred W beside
    # the other stage's B is the only overlap: actions that alone keep the
    # cores busy gain least from a second device.
    out.append(plan_model.Layout(1, 2, 2, 1, DEFER_W_CALIBRATION, 'never',
                                 None))
  if num_devices >= 2 and model.batch_size % 2 == 0:
    out.append(plan_model.Layout(2, 1, 1, 1, 'gpipe', 'never', None))
  return out


def _DefersW(layout):
  return schedules.Build(layout.schedule, layout.stages, layout.devices,
                         layout.micro_batches).defers_w


def _OneDevice(steps, defer_w, stages=1):
  """The (layout, seconds) of `steps` of one stage (default) on one device
  (K = 1, R = 1) whose schedule defers W or not; stages=None:
  more than one stage."""
  return [(l, t) for l, t in steps.items()
          if l.devices == 1 and l.replicas == 1 and
          _DefersW(l) == defer_w and
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
  for layout, seconds in _OneDevice(steps, defer_w=False):
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
      whose schedule does not defer W count.
  """
  rows, excess = [], []
  for layout, seconds in (_OneDevice(steps, defer_w=False) +
                          _OneDevice(steps, defer_w=False, stages=None)):
    p = planner.Predict(layout, overheads=plan_costs.Overheads())
    actions = sum(len(a) for a in schedules.Build(
        layout.schedule, layout.stages, 1, layout.micro_batches).actions)
    rows.append([actions * planner.model.num_units / layout.stages,
                 actions, 1.0])
    excess.append(seconds - p.step.time)
  if not rows:
    return plan_costs.Overheads()
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
  return plan_costs.Overheads(layer=float(best[0]), step=float(best[2]),
                   action=float(best[1]))


def _MeanExcess(planner, steps, overheads, per):
  """max(0, the mean over (layout, seconds) of `steps` of (seconds - the
  step predicted with `overheads`) / per(layout)); 0 without steps."""
  rows = [(seconds - planner.Predict(layout, overheads=overheads).step.time)
          / per(layout) for layout, seconds in steps]
  return max(0.0, statistics.mean(rows)) if rows else 0.0


def FitDeferWOverhead(planner, steps):
  """Seconds a deferred W adds per layer of each micro-batch (>= 0):
  the mean over the one-device layouts of `steps` whose schedule defers
  W of (measured - predicted without it) / (M x layers). 0 without such
  layouts. A cut backward costs more than the fused one with the same
  actions and FLOPs (figures: the README, "Measured on the development
  machine")."""
  return _MeanExcess(
      planner, _OneDevice(steps, defer_w=True),
      planner.overheads._replace(defer_w=0.0),
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
  backward (plan_measure.Concurrency) does not see: the real steps fit a
  higher gain than the probe measures. The gain depends on the micro-batch
  too: an action on more examples keeps more of the cores busy alone
  (figures: the README, "Measured on the development machine").
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
  not: two replicas gain from a shared host about what its probe says,
  a 2-device pipeline on the same examples far less (figures: the README, "Measured on the development machine")."""
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


def CalibrationErrors(planner, steps):
  """{layout: predicted / measured - 1} of the real steps --plan_measure
  timed (`steps`: {layout: seconds}), predicted with what was fitted to
  them: the model's in-sample error on this host."""
  return {lay: planner.Predict(lay).step.time / t - 1
          for lay, t in steps.items()}
