"""PipelinePlan: how a model runs as a pipeline, decided once, from params.

A pipelined model is an ordered list of *units*: the pieces the pipeline
may cut between (a Transformer layer, a ResNet block, a user's own layer).
Each unit has one complete cost record (framework/cost.py) on one
micro-batch. `PipeliningLayer.Plan` (layers/gpipe.py) turns the units, the
pipeline's settings and the batch into a `PipelinePlan`, and everything
that needs to know how the pipeline runs reads that plan:

  the layer      builds each unit on its stage's device and hands the
                 executor the plan's schedule (layers/gpipe_units.py);
  the executor   runs the plan's `schedule`, a `schedules.Schedule` built
                 once here (framework/pipeline/executor.py);
  the memory     estimate reads the plan's `cells` (bytes per stage and
                 micro-batch) and its schedule (memory_estimate.py);
  inspect        prints its stages (FLOPs, devices, memory) and times its
                 actions (framework/jobs/inspect_lib.py, inspect_pipeline.py);
  the planner    re-plans the same units under other layouts (`Replan`)
                 and writes the chosen one back as params overrides at
                 `path` and `splits_path` (framework/planning/plan_model.py).

A plan holds:
  units          [Unit], in order, each its cost on one micro-batch;
  bounds         [0, b_1, ..., U]: stage s runs units bounds[s]..[s+1]-1;
  schedule       the checked Schedule (None: the units run one after the
                 other on the whole batch, unpipelined or in inference);
  the micro-batching, remat and backward window;
  outs           per unit, the bytes of what it passes on (the pipeline's
                 state in its dtype, carried inputs included) a micro-batch;
  input          bytes of one micro-batch of the first stage's input;
  before         [Unit] run once on the whole batch before the pipeline, on
                 its first device (the LM's embedding), costs for the whole
                 batch;
  loss           the per-micro-batch loss (a Unit), inside the pipeline on
                 the last stage when the schedule needs it, else after it
                 on the whole batch; None if the owner computes none;
  path           the pipeline params' path (e.g. 'task.stack_tpl.
                 pipeline_tpl') and splits_path, where the cut is set.

Memory of what runs before the pipeline (an embedding lookup keeps only its
ids) is not counted: `cells` is what the stages hold.

Example:
  plan = PipeliningLayer.Plan(pipe_params, units, batch=32, ...)
  plan.num_stages, plan.schedule.stage_devices, plan.StageFlops()
  memory_estimate.DeviceMemory(plan, params_bytes, slot_bytes)
"""
import collections
import functools

from cadence.framework import cost as cost_lib
from cadence.framework import shapes
from cadence.framework.nested_map import NestedMap
from cadence.framework.pipeline import schedules


def _Max(a, b):
  return None if a is None or b is None else max(a, b)


def DevicesFix(num_devices, devices_from='', want_devices=None,
               want_stages=None, splits_path='', table=False,
               stages_per_device=1):
  """The sentence that ends a layout error (stages that do not fit a
  replica's devices): where the devices came from and the two fixes.

  Args:
    num_devices: a replica's devices, D.
    devices_from: where D came from, as cluster.Cluster.split_size_from
      says it (the flag as typed, '--worker_split_size=4', or the
      experiment's WORKER_SPLIT_SIZE); '': not said.
    want_devices: the devices the model's stages fit (the fix of the flag),
      or None (none do).
    want_stages: the stages that fit D devices (the fix of the cut), or
      None (the model has too few units to cut so).
    splits_path: the params path of the cut (e.g. 'task.stack_tpl.splits'),
      or ''.
    table: the schedule is a table: the cut's fix is a table of D lines.
    stages_per_device: v; an int `splits` K cuts K x v stages
      (gpipe_partition.StagesFromSplits), so the cut's override is
      want_stages / v.

  Example:
    DevicesFix(4, '--worker_split_size=4', 2, 4, 'task.stack_tpl.splits')
    # '--worker_split_size=4 gives a replica 4 devices: use
    #  --worker_split_size=2, or cut the model into 4 stages
    #  (task.stack_tpl.splits=4).'
  """
  where = (devices_from[:1].upper() + devices_from[1:] +
           f' gives a replica {num_devices} devices' if devices_from else
           f'A replica has {num_devices} devices')
  fixes = [f'--worker_split_size={want_devices}'] if want_devices else []
  if table:
    fixes.append(f'a schedule_table of {num_devices} lines')
  elif want_stages:
    splits, rest = divmod(want_stages, stages_per_device)
    override = (f' ({splits_path}={splits})' if splits_path and not rest
                else '')
    fixes.append(f'cut the model into {want_stages} stages{override}')
  if not fixes:
    return f'{where}.'
  return f'{where}: use {", or ".join(fixes)}.'


class Unit(collections.namedtuple('Unit', ['name', 'cost', 'build',
                                           'variables_fn'])):
  """A piece of the model the pipeline may cut between.

  Attributes:
    name: an identifier ('layer3', 'block2', 'emb', 'softmax').
    cost: its complete cost.Cost on its batch (one micro-batch's; the
      whole batch's for what runs before the pipeline).
    build: None, or fn() -> (layers, fprop, input specs, int maxval): the
      unit built for real on its batch, to time it (--plan_measure,
      framework/planning/plan_measure.py): its layers (for their theta),
      fprop(thetas, *inputs) -> outputs, the inputs' tf.TensorSpecs
      (random floats, ints below maxval).
    variables_fn: None, or fn() -> [(shape, dtype, trainable)] of its
      variables (`Variables`; built without weights when first asked).
  """
  __slots__ = ()

  def __new__(cls, name, cost, build=None, variables_fn=None):
    if variables_fn is not None:
      variables_fn = functools.lru_cache(maxsize=None)(variables_fn)
    return super().__new__(cls, name, cost, build, variables_fn)

  def Variables(self):
    """[(shape, dtype, trainable)] of its variables, or None: not known
    (its stage's weights then come from the model built)."""
    return None if self.variables_fn is None else self.variables_fn()


class PipelinePlan:
  """How a model runs as a pipeline; see the module docstring.

  Args:
    units: [Unit], each cost on one micro-batch.
    bounds: [0, b_1, ..., len(units)].
    schedule: a schedules.Schedule of len(bounds) - 1 stages, or None.
    num_micro_batches: M; micro_batch_size: B / M (None: unknown batch).
    remat, backward_window: the pipeline's (executor.REMAT_MODES).
    outs: per unit, bytes of what it passes on, one micro-batch.
    input: bytes of one micro-batch of the first stage's input.
    before: [Unit], costs on the whole batch.
    loss: a Unit on one micro-batch, or None.
    path, splits_path: params paths of the pipeline and of the cut.
    cost_fn: fn(micro_batch_size) -> (units, outs, input) at another
      micro-batch size (`Replan`); None: Replan keeps the sizes.
    loss_fn: fn(micro_batch_size) -> the loss Unit at that size, or None.
    before_fn: fn(batch) -> [Unit] of what runs before the pipeline on
      `batch` examples (`before` is it on the whole batch), or None.
    schedule_fn: fn(num_stages, num_micro_batches, num_devices) -> the
      pipeline's Schedule for other sizes (`OnDevices`), or None.
  """

  def __init__(self, units, bounds, schedule, num_micro_batches,
               micro_batch_size, remat, backward_window, outs, input=0,
               before=(), loss=None, path='', splits_path='', cost_fn=None,
               loss_fn=None, schedule_fn=None, before_fn=None):
    # pylint: disable=redefined-builtin
    self.units = list(units)
    self.bounds = list(bounds)
    self.schedule = schedule
    self.num_micro_batches = num_micro_batches
    self.micro_batch_size = micro_batch_size
    self.remat = remat
    self.backward_window = backward_window
    self.outs = list(outs)
    self.input = input
    self.before = list(before)
    self.loss = loss
    self.path = path
    self.splits_path = splits_path
    self._cost_fn = cost_fn
    self._loss_fn = loss_fn
    self._schedule_fn = schedule_fn
    self._before_fn = before_fn
    if not self.before and before_fn is not None and self.batch:
      self.before = list(before_fn(self.batch))
    if loss is None and loss_fn is not None and micro_batch_size:
      self.loss = loss_fn(micro_batch_size)
    self._cells = None
    if len(self.bounds) < 2 or self.bounds[0] != 0 or self.bounds[-1] != len(
        self.units):
      raise ValueError(f'PipelinePlan: bounds {self.bounds} must run from 0 '
                       f'to the {len(self.units)} units.')
    if schedule is not None and schedule.num_stages != self.num_stages:
      raise ValueError(f'PipelinePlan: the schedule has '
                       f'{schedule.num_stages} stages, the cut '
                       f'{self.num_stages}.')

  # --- the cut -----------------------------------------------------------------

  @property
  def num_stages(self):
    return len(self.bounds) - 1

  @property
  def num_devices(self):
    return 1 if self.schedule is None else self.schedule.num_devices

  @property
  def stage_devices(self):
    """The device index of each stage (0 for all when unpipelined)."""
    return (list(self.schedule.stage_devices) if self.schedule is not None
            else [0] * self.num_stages)

  @property
  def loss_inside(self):
    return self.schedule is not None and self.schedule.loss_inside

  @property
  def batch(self):
    return shapes.Mul(self.num_micro_batches, self.micro_batch_size)

  def StageUnits(self, s):
    """The units of stage s."""
    return self.units[self.bounds[s]:self.bounds[s + 1]]

  def StageCost(self, s):
    """The cost.Chain of stage s's units on one micro-batch."""
    return cost_lib.Chain([u.cost for u in self.StageUnits(s)])

  def StageFlops(self):
    """Per stage, the forward FLOPs of the whole batch (its units costed on
    it, as the task's FPropMeta counts them), what runs before the
    pipeline in the first stage, the loss in the last."""
    batch = self.batch
    units, loss = self.units, self.loss
    m = self.num_micro_batches
    if self._cost_fn is not None and m != 1 and batch is not None:
      units = self._cost_fn(batch)[0]
      if self._loss_fn is not None:
        loss = self._loss_fn(batch)
      m = 1
    out = [shapes.Add(*[u.cost.flops for u in units[a:b]])
           for a, b in zip(self.bounds, self.bounds[1:])]
    out = [shapes.Mul(m, f) for f in out]
    for unit in self.before:
      out[0] = shapes.Add(out[0], unit.cost.flops)
    if loss is not None:
      out[-1] = shapes.Add(out[-1], shapes.Mul(m, loss.cost.flops))
    return out

  # --- what memory_estimate reads ------------------------------------------------

  @property
  def cells(self):
    if self._cells is None:
      self._cells = self._Cells()
    return self._cells

  def _Cells(self):
    """Per stage, NestedMap(act, act_weights, residuals, out, transient,
    act_outputs, outside[, outside_transient]) in bytes of one micro-batch
    (the memory_estimate record): its units' chained cost, the bytes its last
    unit passes on, and the loss's: inside the last stage when the schedule
    runs it there, else `outside` (on the whole batch, after the
    pipeline's forwards)."""
    out = []
    for s in range(self.num_stages):
      c = self.StageCost(s)
      out.append(NestedMap(act=c.act, act_weights=c.act_weights,
                           residuals=c.residuals, transient=c.transient,
                           out=self.outs[self.bounds[s + 1] - 1],
                           act_outputs=c.act_outputs, outside=0))
    if self.loss is not None:
      last, loss = out[-1], self.loss.cost
      if self.schedule is None or self.loss_inside:
        m = 1 if self.schedule is not None else self.num_micro_batches
        last.act = shapes.Add(last.act, shapes.Mul(m, loss.act))
        last.act_weights = shapes.Add(last.act_weights,
                                      shapes.Mul(m, loss.act_weights))
        last.residuals = shapes.Add(last.residuals,
                                    shapes.Mul(m, loss.residuals))
        last.transient = _Max(last.transient, shapes.Mul(m, loss.transient))
      else:
        m = self.num_micro_batches
        last.outside = shapes.Mul(m, loss.act)
        last.outside_transient = shapes.Mul(m, loss.transient)
    return out

  # --- other layouts -------------------------------------------------------------

  def Replan(self, bounds=None, schedule=None, micro_batch_size=None,
             remat=None, backward_window=None):
    """The same units under another cut, schedule (with its own M and
    devices), micro-batch size (the units' and the loss's costs at that
    size, through `cost_fn` and `loss_fn`), remat or backward window."""
    units, outs, first = self.units, self.outs, self.input
    size = micro_batch_size or self.micro_batch_size
    loss, before = self.loss, self.before
    if size != self.micro_batch_size:
      if self._cost_fn is None:
        raise ValueError('PipelinePlan.Replan: this plan cannot cost its '
                         'units at another micro-batch size.')
      units, outs, first = self._cost_fn(size)
      loss = None   # loss_fn's, at that size.
    schedule = schedule or self.schedule
    m = schedule.num_micro_batches if schedule else self.num_micro_batches
    if m * size != self.batch:
      before = ()   # before_fn's, on the new whole batch.
    return PipelinePlan(
        units, bounds or self.bounds, schedule, m, size, remat or self.remat,
        backward_window if backward_window is not None else
        self.backward_window, outs, first, before, loss, self.path,
        self.splits_path, self._cost_fn, self._loss_fn, self._schedule_fn,
        self._before_fn)

  def With(self, before_fn=None, loss_fn=None):
    """This plan with what runs before the pipeline (`before_fn(batch)` ->
    [Unit] on `batch` examples) and the per-micro-batch loss
    (`loss_fn(micro_batch_size)` -> a Unit), as a task adds them to its
    stack's plan."""
    return PipelinePlan(
        self.units, self.bounds, self.schedule, self.num_micro_batches,
        self.micro_batch_size, self.remat, self.backward_window, self.outs,
        self.input, (), None, self.path, self.splits_path, self._cost_fn,
        loss_fn, self._schedule_fn, before_fn)

  def BeforeAt(self, batch):
    """[Unit] of what runs before the pipeline, on `batch` examples (e.g.
    one micro-batch's, to time it)."""
    return [] if self._before_fn is None else list(self._before_fn(batch))

  def LossAt(self, micro_batch_size):
    """The loss Unit on `micro_batch_size` examples, or None."""
    return (None if self._loss_fn is None else
            self._loss_fn(micro_batch_size))

  def UnitsAt(self, micro_batch_size):
    """[Unit] costed on `micro_batch_size` examples."""
    if micro_batch_size == self.micro_batch_size or self._cost_fn is None:
      return list(self.units)
    return list(self._cost_fn(micro_batch_size)[0])

  def OnDevices(self, num_devices, devices_from=''):
    """This plan on a model split of `num_devices` devices (its params say
    the stages, a cluster the devices: with fewer devices than stages,
    stages share devices), its schedule rebuilt for them.

    Raises:
      ValueError: the stages do not fit the devices (the schedule's rule,
        e.g. devices left idle), ending with where the devices came from
        (`devices_from`: cluster.Cluster.split_size_from) and the fixes
        (`DevicesFix`): the devices this plan's stages fit, or a cut that
        fits the devices.
    """
    if (self.schedule is None or num_devices == self.num_devices or
        self._schedule_fn is None):
      return self
    try:
      schedule = self._schedule_fn(self.num_stages, self.num_micro_batches,
                                   num_devices)
    except ValueError as e:
      # v stages a device, as this plan's own layout has them.
      v, rest = divmod(self.num_stages, self.num_devices)
      v = 1 if rest else v
      fits = num_devices * v <= len(self.units)
      raise ValueError(f'{e} ' + DevicesFix(
          num_devices, devices_from, self.num_devices,
          num_devices * v if fits else None, self.splits_path,
          schedules.TakesText(self.schedule.name), v)) from None
    return self.Replan(schedule=schedule)

  def __repr__(self):
    return (f'PipelinePlan({self.path or "?"}: {len(self.units)} units in '
            f'{self.num_stages} stages {self.bounds}, '
            f'{self.schedule.name if self.schedule else "unpipelined"}, '
            f'M={self.num_micro_batches} x {self.micro_batch_size}, '
            f'remat={self.remat})')
