"""What each unit of a model costs, for the planner to lay out.

  FlopsCosts     each unit's seconds on one micro-batch from its cost
                 record (its FLOPs, or its ops on a cluster with an op
                 model, framework/planning/hardware.py).
  MeasuredCosts  each unit built from its params and timed on this host
                 (--plan_measure, plan_measure.py), per micro-batch size,
                 and the real steps of the calibration layouts
                 (calibration.py), which the planner fits what unit costs
                 leave out to.
  Overheads      what unit costs leave out, in seconds.
  StageCosts     a layout's stages' step_model.StageCosts from its units'.

Example:
  costs = FlopsCosts(model, hardware.Parse('h100x8'))
  costs.Items(8)    # [ItemCost(rerun, once, loss, backward)] per unit
"""
import collections
import statistics
import tempfile
import time

from absl import logging
import tensorflow as tf

from cadence.framework import op_cost
from cadence.framework.pipeline import schedules
from cadence.framework.planning import hardware as hardware_lib
from cadence.framework.planning import plan_measure
from cadence.framework.planning import step_model

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
  hw.OpSeconds, its gradient's ops (op_cost.Gradient) likewise, and a
  unit's forward or backward at least what the host takes to issue its
  ops (hw.PassSeconds); without
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
    """(forward, backward) seconds of units' ops (hardware.PassSeconds)."""
    ops = [op for u in units for op in u.cost.ops]
    return (self._hw.PassSeconds(ops),
            self._hw.PassSeconds(op_cost.Gradient(ops)))

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
                                                'replica', 'defer_w', 'action'],
                                   defaults=[0.0, 0.0, 0.0, 0.0, 0.0])


Overheads.__doc__ = """Seconds the measured layer costs leave out:
`layer`, what the executor adds to each layer of each action (an action
of a stage of n layers pays n x layer: its ops, and its weights' gradient
sums, are per layer and micro-batch); `step`, what a step pays once
(FitOverheads); `replica`, what each replica beyond the first adds to a
step (FitReplicaOverhead: the strategy's work beyond the simulated
all-reduce and updates); `defer_w`, what a backward cut in B and W
(zero-bubble schedules) adds per layer of each micro-batch beyond the
fused backward (FitDeferWOverhead); `action`, what each action pays
whatever its layers (FitOverheads: the executor's call, the hand-over
between stages).

Per layer, not per action: a step grows with the micro-batches far beyond
its layers' measured costs, but doubling the actions at the same layers
(interleaved stages) does not (figures: the README, "Measured on the development machine")."""


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
               overhead=0.0, defer_w=0.0, action=0.0):
  """The step_model.StageCost of each stage of `layout` from its layers'
  ItemCosts on one micro-batch and the FPropMeta `memory` of the layout.

  remat 'selective' re-runs what it does not keep: the forward times the
  share of the activation bytes it does not keep (1 - act_weights / act).
  `overhead`: seconds each action pays per layer of its stage beyond the
  layers' costs (Overheads.layer); `action`: what each action pays
  whatever its layers (Overheads.action); `defer_w`: what a deferred W
  adds per layer (Overheads.defer_w).
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
        overhead=overhead * (b - a) + action, defer_w=defer_w * (b - a)))
  return out


def ConcurrencyProbe(model):
  """The part plan_measure.Calibrate runs on several devices at once to
  read the host's concurrency: the model's costliest unit (by FLOPs) at a
  quarter of its batch, a size between the search's micro-batches."""
  mb = max(1, model.batch_size // 4)
  return plan_measure.UnitPart(max(model.plan.UnitsAt(mb),
                                   key=lambda u: u.cost.flops or 0))
