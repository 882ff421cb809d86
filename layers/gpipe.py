"""GPipe: pipeline model parallelism over the devices of a model split.

Huang et al., 2019, "GPipe: Efficient Training of Giant Neural Networks
using Pipeline Parallelism", arXiv:1811.06965.

A model that is a sequence of layers is cut into S *stages* (contiguous
groups of layers of near-equal FLOPs, `PartitionSequentialLayers`; Lingvo
calls the layer that runs a stage a *cell*, `cell_tpl`), stage i on the
device its schedule places it on among the K devices of the current model
split (`cluster.Cluster`; stage i on device i % K for most schedules). The
batch is cut into M *micro-batches* (framework/pipeline/microbatch.py) and
one executor
(framework/pipeline/executor.py) runs the actions of the schedule `schedule`
names (framework/pipeline/schedules.py, a registry of schedules as data:
each device's ordered forwards and backwards). With GPipe's, stage i works
on micro-batch t - i at tick t, so the devices overlap except for the
(S-1)/(M+S-1) bubble, and the backward re-runs each stage's forward before
back-propagating through it (rematerialisation, `remat`), so a device holds
the activations of its stage for at most `backward_window` micro-batches at
a time (with remat='except_last', the last micro-batch keeps its forward
activations instead of re-running; it is back-propagated first); remat
'selective' keeps only the outputs of products with a weight
(framework/pipeline/remat_policy.py).

The loss: `FProp`/`FPropCells` return the cells' outputs and the caller
computes the loss after them, which works with a schedule that runs every
forward first (GPipe). A schedule whose backwards start before the forward
ends (1F1B: each stage alternates the forward of a new micro-batch with the
backward of an old one, so it holds at most S micro-batches' activations
instead of M) needs each micro-batch's loss as soon as it leaves the last
stage. The owner of a pipeline trains it with any schedule by calling
`FPropLoss(cells, loss, *inputs, side_inputs=)` with a per-micro-batch
loss, e.g. the LM's softmax and cross-entropy on that micro-batch's
labels; the layer runs the loss inside the pipeline or after it as its
schedule needs, and returns the losses and metric sums summed over
micro-batches: `tape.gradient` of the total equals the sequential model's.

Two ways to give a PipeliningLayer its cells:
  * `cell_tpl`: the layer builds the cells as its children `cells[i]`
    (Lingvo's form; `PartitionSequentialLayers` makes such a list);
  * composition: a layer that owns its sub-layers itself (so their variable
    paths do not depend on the partition, e.g. GPipeTransformerStack) keeps
    a PipeliningLayer child with an empty `cell_tpl` for the pipeline's
    settings and devices, and passes the cells to `FPropCells`.

Randomness: micro-batch j of a step runs with the seed
`step_seed.MicroBatchSeed(theta.step_seed, j)` in every cell, so dropout
differs between micro-batches and the re-run forward replays it exactly;
the pipelined model equals the sequential one run on each micro-batch with
that micro-batch's seed.

Devices: SeqLayer and PipeliningLayer read `cluster.Cluster.Current()` when
they are built: the cells' variables are created on their devices then and
FProp uses the same devices. Build them inside `with cluster:`.

Example:
  cells = PartitionSequentialLayers(stack_params, 2, Shape([8, 16, 32]))
  p = PipeliningLayer.Params().Set(name='pipe', cell_tpl=cells,
                                   num_micro_batches=4)
  with cluster_lib.Cluster.Params().Set(num_devices=2,
                                        worker_split_size=2).Instantiate():
    pipe = p.Instantiate()
  y = pipe.FProp(base_layer.WithStepSeed(pipe.theta, seed), x)
"""
import collections

from absl import logging
import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import cluster as cluster_lib
from cadence.framework import cost
from cadence.framework import device_call
from cadence.framework.pipeline import executor
from cadence.framework.pipeline import microbatch
from cadence.framework.pipeline import plan as plan_lib
from cadence.framework.pipeline import schedules
from cadence.framework import shapes
from cadence.framework import step_seed as step_seed_lib
from cadence.framework import validation
from cadence.layers import combinators
from cadence.layers import gpipe_partition

NestedMap = base_layer.NestedMap

# The cell type and the partitioner, re-exported (Lingvo users find them in
# gpipe).
FeatureExtractionLayer = combinators.FeatureExtractionLayer
PartitionSequentialLayers = gpipe_partition.PartitionSequentialLayers
BalancedPartition = gpipe_partition.BalancedPartition
CutBoundaries = gpipe_partition.CutBoundaries
StagesFromSplits = gpipe_partition.StagesFromSplits
CutIntoStages = gpipe_partition.CutIntoStages
# Their earlier names, kept for code written against them.
SplitBoundaries = CutBoundaries
StageSplits = StagesFromSplits
SplitCells = CutIntoStages

# `state_dtype` choices: an activation dtype (base_layer.FPROP_DTYPES), or
# float64 for a float64 model.
STATE_DTYPES = base_layer.FPROP_DTYPES + (tf.float64,)

# A cell handed to `PipeliningLayer.FPropCells`:
#   fprop: fn(theta, *inputs) -> outputs (a tensor or a tuple of tensors; one
#     NestedMap in and out with nested_map_fprop);
#   theta: the cell's theta (without step seed; the pipeline adds it);
#   meta: fn(*input_shapes) -> NestedMap(flops, out_shapes), the cell's
#     FPropMeta (the pipeline needs the shapes it passes on).
PipelineCell = collections.namedtuple('PipelineCell', ['fprop', 'theta',
                                                       'meta'])


# --- pure helpers ------------------------------------------------------------


def _StripSeed(theta):
  """A copy of theta without `step_seed` entries (at every level)."""
  if isinstance(theta, NestedMap):
    return NestedMap({k: _StripSeed(v) for k, v in theta.items()
                      if k != base_layer.STEP_SEED_KEY})
  if isinstance(theta, (list, tuple)):
    return type(theta)(_StripSeed(v) for v in theta)
  return theta


def _SeedOf(theta, step_seed, micro_batch=None):
  """`theta` with the step seed of the whole batch (micro_batch None) or of
  micro-batch `micro_batch` (MicroBatchSeed), or as it is without one."""
  if step_seed is None:
    return theta
  if micro_batch is not None:
    step_seed = step_seed_lib.MicroBatchSeed(step_seed, micro_batch)
  return base_layer.WithStepSeed(theta, step_seed)


def _ShapesToSpecs(struct, dtype):
  """Maps Shape/TensorShape leaves of a NestedMap/list/tuple to TensorSpecs.

  (A Shape is a tuple, so generic nest utilities would descend into it.)
  """
  if isinstance(struct, (shapes.Shape, tf.TensorShape)):
    return tf.TensorSpec(shapes.AsShape(struct).ToTensorShape(), dtype)
  if isinstance(struct, NestedMap):
    return NestedMap({k: _ShapesToSpecs(v, dtype) for k, v in struct.items()})
  if isinstance(struct, (list, tuple)):
    return type(struct)(_ShapesToSpecs(v, dtype) for v in struct)
  raise ValueError(f'Expected a Shape in FPropMeta out_shapes; got {struct!r}.')


def _BatchOfShapes(owner, input_shapes, batch_dim):
  """The static batch size of FPropMeta input shapes (None if unknown)."""
  leaves = []
  for s in input_shapes:
    leaves += list(s.Flatten()) if isinstance(s, NestedMap) else [s]
  batches = set()
  for s in leaves:
    s = shapes.AsShape(s)
    if s.rank is not None and s.rank > batch_dim:
      batches.add(s[batch_dim])
  known = {b for b in batches if b is not None}
  if len(known) > 1:
    raise ValueError(f'{owner}: inputs disagree on the batch dim '
                     f'(batch_dim={batch_dim}): {sorted(known)}.')
  return known.pop() if known else None


# --- layers ------------------------------------------------------------------


class SeqLayer(base_layer.BaseLayer):
  """`before_tpl` layers on the split's first device, then the cells.

  Cell i runs on device i % D of the model split (D devices, from
  `Cluster.Current()` at construction), one cell after the other on the
  whole batch: no pipelining. Children: `before` and `cells` (lists).

  Example:
    p = SeqLayer.Params().Set(name='seq', cell_tpl=PartitionSequentialLayers(
        stack_params, 2, Shape([8, 16])))
    y = p.Instantiate()(tf.ones([8, 16]))
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('before_tpl', [], 'Layers run first, on the first device of '
             'the split, on the whole batch.')
    p.Define('cell_tpl', [], 'The cells: layer params (usually '
             'FeatureExtractionLayer) with FPropMeta.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    cluster = cluster_lib.Cluster.Current()
    self._devices = cluster.ReplicaDevices()
    self._split_size_from = cluster.split_size_from   # For layout errors.
    for field in ('before_tpl', 'cell_tpl'):
      if not isinstance(p.Get(field), (list, tuple)):
        raise validation.Error(validation.Owner(self), field, p.Get(field),
                               'must be a list of layer params.')
    if not p.cell_tpl and not self._CellsGivenByOwner():
      raise validation.Error(validation.Owner(self), 'cell_tpl', p.cell_tpl,
                             'must be a non-empty list of layer params.')
    if p.cell_tpl:
      self.CheckNumCells(len(p.cell_tpl))
    self.CreateChildren('before', list(p.before_tpl),
                        devices=[self._devices[0]] * len(p.before_tpl))
    self.CreateChildren('cells', list(p.cell_tpl), devices=[
        self.CellDevice(i) for i in range(len(p.cell_tpl))])

  def _CellsGivenByOwner(self):
    """Whether an empty cell_tpl is allowed (the cells come from FPropCells)."""
    return False

  @property
  def devices(self):
    """The model split's devices this layer was built for."""
    return list(self._devices)

  def StageDevices(self, num_cells):
    """The device of each of `num_cells` cells: cell i on device i % D of
    the model split (`schedules.Looped`)."""
    return [self._devices[d] for d in schedules.Looped(num_cells,
                                                        len(self._devices))]

  def CellDevice(self, i, num_cells=None):
    """The device of cell i of `num_cells` (default: len(cell_tpl))."""
    return self.StageDevices(num_cells or len(self.params.cell_tpl))[i]

  def CheckNumCells(self, num_cells, splits_path='', num_units=None):
    """Checks S cells (stages) against the K devices of the model split.

    S < K would leave devices idle: an error, ending with where K came
    from (the cluster's split_size_from) and the fixes (`DevicesFix`).
    S > K puts several cells on a device (`StageDevices`; most schedules:
    cell i on device i % K): allowed, and logged, as a deliberate choice
    (e.g. a 4-stage model on 2 GPUs).

    Args:
      num_cells: S.
      splits_path: the params path of the owner's cut (its `splits`), ''
        when the cells are given as a list.
      num_units: the most cells the owner can cut (None: no bound).
    """
    d = len(self._devices)
    if num_cells < d:
      raise ValueError(
          f'{validation.Owner(self)}: {num_cells} pipeline cell(s) on a model '
          f'split of {d} devices would leave {d - num_cells} device(s) idle. '
          + self.DevicesFix(num_cells, splits_path, num_units))
    if num_cells > d:
      logging.info('%s: %d pipeline cells on %d device(s): %s.',
                   validation.Owner(self), num_cells, d, ', '.join(
                       f'cell {i} on {cluster_lib.DeviceLabel(device)}'
                       for i, device in
                       enumerate(self.StageDevices(num_cells))))

  def Layout(self, num_cells):
    """(the devices `num_cells` cells fill, or None when no number does;
    whether a schedule table places them; the cells a device runs, v): one
    device per cell here."""
    return num_cells, False, 1

  def DevicesFix(self, num_cells, splits_path='', num_units=None):
    """The end of a layout error of `num_cells` cells on this layer's D
    devices (plan.DevicesFix): where D came from, and the devices the
    cells fill or the cut that fills D devices ('' when the cells fill D:
    the devices are not what is wrong)."""
    d = len(self._devices)
    want, table, v = self.Layout(num_cells)
    if want == d:
      return ''
    fits = num_units is None or d * v <= num_units
    return plan_lib.DevicesFix(d, self._split_size_from, want,
                               d * v if fits else None, splits_path, table,
                               v)

  def _Before(self, theta, inputs):
    with cluster_lib.DeviceScope(self._devices[0]):
      for layer, th in zip(self.before, theta.before):
        inputs = combinators.AsTuple(layer.FProp(th, *inputs))
    return inputs

  def _OwnCells(self, theta):
    """PipelineCells of the cells built from cell_tpl."""
    if not self.cells:
      raise ValueError(
          f'{validation.Owner(self)}: has no cells (cell_tpl is empty); '
          'set cell_tpl, or call FPropCells from the layer that owns them.')
    owner = validation.Owner(self)
    out = []
    for i, (cell, th) in enumerate(zip(self.cells, theta.cells)):
      what = f'cell {i} ({type(cell).__name__} {cell.path!r})'
      out.append(PipelineCell(
          fprop=cell.FProp, theta=th,
          meta=lambda *s, cell=cell, what=what: combinators.LayerMeta(
              owner, what, cell.params, s)))
    return out

  @tf.autograph.experimental.do_not_convert
  def FProp(self, theta, *inputs):
    """Runs before layers then every cell in order on the whole batch."""
    out = self._Before(theta, inputs)
    for i, cell in enumerate(self._OwnCells(theta)):
      with cluster_lib.DeviceScope(self.CellDevice(i)):
        out = cell.fprop(cell.theta, *combinators.AsTuple(out))
    return out

  @classmethod
  def FPropMeta(cls, p, *input_shapes):
    """The cost.Chain of before_tpl's and cell_tpl's complete records
    (flops summed, ops in order, each tensor passed on counted once where
    the records say so). Its bytes are its cells' unpipelined; what a
    PipeliningLayer keeps depends on its schedule and remat: the memory
    estimate's (framework/pipeline/memory_estimate.py), from its plan."""
    records, in_shapes = [], tuple(input_shapes)
    owner = validation.Owner(p)
    for i, sub in enumerate(list(p.before_tpl) + list(p.cell_tpl)):
      sub = base_layer.InheritParams(p, sub)
      records.append(combinators.LayerCost(
          owner, combinators.DescribeLayer(i, sub), sub, in_shapes))
      in_shapes = tuple(records[-1].out_shapes)
    return cost.Chain(records).Replace(out_shapes=in_shapes)


class PipeliningLayer(SeqLayer):
  """SeqLayer whose cells run as a pipeline over micro-batches.

  The inputs (after `before_tpl`) are split into M micro-batches along
  `batch_dim`; the cells run them through `StackedRecurrent` on their
  devices; the outputs come back concatenated in the input's batch order
  and layout. With is_inference and one device per split it runs the cells
  one after the other.

  Cells take and return tuples of tensors (or, with nested_map_fprop, one
  NestedMap). Every state passed between cells has one dtype,
  `StateDtype`: `state_dtype` if set, else `fprop_dtype` if set (e.g.
  bfloat16 activations: half the bytes between stages), else the dtype of
  the first input; the pipeline casts the inputs and each cell's floating
  outputs to it. Cells need FPropMeta: it gives the shapes of the
  micro-batch states.

  With an empty `cell_tpl` the layer holds only the pipeline's settings and
  devices; the layer that owns the cells runs them with `FPropCells` (see
  the module docstring).

  Example:
    p = PipeliningLayer.Params().Set(
        name='pipe', num_micro_batches=4,
        cell_tpl=PartitionSequentialLayers(stack_p, 2, Shape([4, 16])))
    with cluster:                       # 2 devices per split
      pipe = p.Instantiate()
    y = pipe.FProp(base_layer.WithStepSeed(pipe.theta, seed), x)  # x [16, ..]
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('num_micro_batches', None, 'Number of micro-batches M; None: '
             'batch / micro_batch_size, or 1.')
    p.Define('micro_batch_size', None, 'Examples per micro-batch; None: '
             'batch / num_micro_batches.')
    p.Define('batch_dim', 0, 'The batch dimension of every input.')
    p.Define('state_dtype', None, 'Dtype of the states between cells (the '
             'cells\' floating outputs are cast to it); None: fprop_dtype '
             'if set, else the first input\'s dtype.')
    p.Define('nested_map_fprop', False, 'Whether cells take and return one '
             'NestedMap instead of tuples of tensors.')
    p.Define('remat', 'except_last', 'Which micro-batches re-run their '
             'forward in the backward: ' + ', '.join(
                 executor.REMAT_MODES) +
             ' (see framework/pipeline/executor.py).')
    p.Define('backward_window', 1, 'Each action of a device waits for the '
             'one this many places before it, so at most this many '
             'micro-batches per device hold re-run activations (1: a device '
             'runs one action at a time; 2: the next re-run overlaps the '
             'current back-propagation; None: no wait); see '
             'framework/pipeline/executor.py.')
    p.Define('trace_actions', False, 'Inline the cells\' traced functions '
             'into the step\'s graph per (cell, micro-batch) call, so that a '
             'profile names the action of every op (framework/pipeline/'
             'timeline.py, --mode=inspect_pipeline sets it); by '
             'default each call runs the cell\'s one traced body (a smaller '
             'graph, faster tracing).')
    p.Define('schedule', schedules.DEFAULT, 'The pipeline schedule, a '
             'registered name (framework/pipeline/schedules.py): '
             + ', '.join(schedules.Names()) + '. A schedule whose '
             'backwards start before the forward ends (e.g. 1F1B: each cell '
             'holds at most S micro-batches of activations) runs the loss '
             'inside the pipeline: the owner calls FPropLoss.')
    p.Define('stages_per_device', 1, 'v: pipeline stages per device '
             '(interleaved_1f1b: v >= 1, zb_v: 2). A layer that cuts its own '
             'cells (GPipeTransformerStack, ResNet) cuts its `splits` K '
             '(the devices) into K * v stages; with cell_tpl, give K * v '
             'cells.')
    p.Define('schedule_table', '', "With schedule='table': the action lists "
             'as text, one line per device, e.g. "F0:0 F0:1 B0:0 B0:1" '
             '(kind F, B or W, stage:micro_batch; W: a deferred weight '
             'gradient); '
             'checked before the first step.')
    return p

  def __init__(self, params):
    # Checked first: SeqLayer places the cells by the schedule.
    self.CheckParams(params, validation.Owner(params))
    # (cells, micro-batches) -> the Schedule run (`Schedule`), built once.
    self._schedules = {}
    super().__init__(params)

  @classmethod
  def CheckParams(cls, p, owner):
    """Raises ValueError for bad pipeline settings (no batch needed)."""
    super().CheckParams(p, owner)
    base_layer.CheckDtype(owner, 'state_dtype', p.state_dtype,
                          STATE_DTYPES, base_layer.FLOAT16_NOTE)
    validation.CheckOptionalInt(owner, 'num_micro_batches',
                                p.num_micro_batches)
    validation.CheckOptionalInt(owner, 'micro_batch_size', p.micro_batch_size)
    validation.CheckInt(owner, 'batch_dim', p.batch_dim, low=0)
    validation.CheckOneOf(owner, 'remat', p.remat, executor.REMAT_MODES)
    validation.CheckOneOf(owner, 'schedule', p.schedule, schedules.Names())
    validation.CheckInt(owner, 'stages_per_device', p.stages_per_device,
                        low=1)
    if schedules.TakesText(p.schedule):   # Its text parses.
      try:
        schedules.LossInside(p.schedule, p.schedule_table)
      except ValueError as e:
        raise validation.Error(owner, 'schedule_table', p.schedule_table,
                               str(e).split(': ', 1)[-1]) from None
    validation.CheckOptionalInt(owner, 'backward_window', p.backward_window)
    validation.CheckBool(owner, 'nested_map_fprop', p.nested_map_fprop)
    validation.CheckBool(owner, 'trace_actions', p.trace_actions)

  def _CellsGivenByOwner(self):
    return True

  def StageDevices(self, num_cells):
    """The device of each of `num_cells` cells, as `schedule` places its
    stages on the D devices of the model split (most: cell i on device
    i % D; zb_v: a V)."""
    p = self.params
    try:
      placed = schedules.StageDevices(p.schedule, num_cells,
                                      len(self._devices), p.schedule_table)
    except ValueError as e:
      raise validation.Error(validation.Owner(self), 'schedule', p.schedule,
                             f'with {num_cells} cells on {len(self._devices)} '
                             f'device(s): {e}') from None
    return [self._devices[d] for d in placed]

  def Schedule(self, num_cells, num_micro_batches):
    """The Schedule this layer runs `num_cells` cells over
    `num_micro_batches` with, built once and kept: in training its own
    (BuildSchedule of its params, as its PipelinePlan's), in inference the
    default one (every forward; no backward), its stages where this
    layer's schedule placed them (zb_v's V)."""
    key = (num_cells, num_micro_batches)
    if key not in self._schedules:
      self._schedules[key] = self._BuildSchedule(num_cells,
                                                 num_micro_batches)
    return self._schedules[key]

  def _BuildSchedule(self, num_cells, num_micro_batches):
    p = self.params
    devices = self.StageDevices(num_cells)
    if not p.is_inference or p.schedule == schedules.DEFAULT:
      return self.BuildSchedule(p, num_cells, num_micro_batches,
                                len(set(devices)))
    unique = list(dict.fromkeys(devices))
    try:
      return schedules.Build(schedules.DEFAULT, num_cells, len(unique),
                             num_micro_batches,
                             stage_devices=[unique.index(d) for d in devices])
    except ValueError as e:
      raise validation.Error(validation.Owner(self), 'schedule', p.schedule,
                             f'its stages\' placement does not suit '
                             f'{schedules.DEFAULT!r}, which runs them in '
                             f'inference: {e}') from None

  def CheckNumCells(self, num_cells, splits_path='', num_units=None):
    """SeqLayer's check, then `stages_per_device`: v > 1 needs S = K * v
    cells (v per device), and the schedule's placement must fit; each
    error ends with where K came from and the fixes (`DevicesFix`)."""
    super().CheckNumCells(num_cells, splits_path, num_units)
    d, v = len(self._devices), self.params.stages_per_device
    fix = self.DevicesFix(num_cells, splits_path, num_units)
    if v > 1 and num_cells != d * v:
      raise validation.Error(
          validation.Owner(self), 'stages_per_device', v,
          f'needs {d} devices x {v} = {d * v} cells; got {num_cells}.'
          + (f' {fix}' if fix else ''))
    try:
      self.StageDevices(num_cells)
    except ValueError as e:
      if not fix:
        raise
      raise ValueError(f'{e} {fix}') from None
    if self.params.num_micro_batches:   # Its schedule, built once, now.
      self.Schedule(num_cells, self.params.num_micro_batches)

  def Layout(self, num_cells):
    """SeqLayer's, under this layer's schedule: the devices NumDevices
    gives (a table's lines, else S / stages_per_device; None when v does
    not divide S), and v = stages_per_device."""
    p = self.params
    table = schedules.TakesText(p.schedule)
    v = p.stages_per_device
    if not table and num_cells % v:
      return None, table, v
    return self.NumDevices(p, num_cells), table, v

  @classmethod
  def MicroBatching(cls, p, batch, owner=None):
    """(num_micro_batches, micro_batch_size) of params `p` for a batch size.

    Raises a ValueError naming the knob and the batch when they do not fit.
    """
    return microbatch.Count(owner or validation.Owner(p), batch,
                            p.num_micro_batches, p.micro_batch_size,
                            p.batch_dim)

  @classmethod
  def NumDevices(cls, p, num_stages):
    """The devices of a model split that runs `num_stages` stages under
    params `p`: a table's lines, else num_stages / stages_per_device."""
    return schedules.NumDevices(p.schedule, num_stages, p.stages_per_device,
                                p.schedule_table)

  @classmethod
  def BuildSchedule(cls, p, num_stages, num_micro_batches, num_devices=None):
    """The checked Schedule of params `p` for its stages and micro-batches
    (num_devices: default `NumDevices`); a ValueError names the field
    (schedule, or schedule_table), the sizes and the rule."""
    devices = num_devices or cls.NumDevices(p, num_stages)
    try:
      return schedules.Build(p.schedule, num_stages, devices,
                             num_micro_batches, table=p.schedule_table)
    except ValueError as e:
      field = ('schedule_table' if schedules.TakesText(p.schedule) else
               'schedule')
      raise validation.Error(validation.Owner(p), field, p.Get(field),
                             f'with {num_stages} stages, {devices} devices '
                             f'and {num_micro_batches} micro-batches: {e}'
                             ) from None

  @classmethod
  def Plan(cls, p, bounds, batch, unit_costs, splits_path='',
           num_devices=None):
    """The `plan.PipelinePlan` of params `p` (the pipeline's settings, as
    its owner inherits them) for the owner's units.

    Args:
      p: this class's params.
      bounds: [0, b_1, ..., U], the cut of the owner's U units.
      batch: the static batch size.
      unit_costs: fn(micro_batch_size) -> (units, outs, input bytes): the
        owner's units costed on one micro-batch (plan.PipelinePlan), also
        at the other sizes a planner asks for.
      splits_path: the params path of the owner's `splits`.
      num_devices: the model split's devices (default `NumDevices`).

    Raises:
      ValueError: the micro-batching does not fit the batch, or the
        schedule does not fit the sizes (naming the field).
    """
    cls.CheckParams(p, validation.Owner(p))
    m, size = cls.MicroBatching(p, batch)
    schedule = cls.BuildSchedule(p, len(bounds) - 1, m, num_devices)
    units, outs, first = unit_costs(size)
    return plan_lib.PipelinePlan(
        units, bounds, schedule, m, size, p.remat, p.backward_window, outs,
        first, path=p.Path(), splits_path=splits_path, cost_fn=unit_costs,
        schedule_fn=lambda s, mb, d: cls.BuildSchedule(p, s, mb, d))

  @classmethod
  def CheckBatch(cls, p, input_shapes, owner=None):
    """Checks the micro-batching of params `p` against static input shapes.

    Returns:
      (num_micro_batches, micro_batch_size), or None when the batch dim of
      the shapes is unknown.
    """
    owner = owner or validation.Owner(p)
    batch = _BatchOfShapes(owner, input_shapes, p.batch_dim)
    return None if batch is None else cls.MicroBatching(p, batch, owner)

  @classmethod
  def FPropMeta(cls, p, *input_shapes):
    """SeqLayer's chain; checks the micro-batching against the batch."""
    cls.CheckBatch(p, input_shapes)
    return super().FPropMeta(p, *input_shapes)

  def _ToState(self, outputs):
    if self.params.nested_map_fprop:
      return outputs
    return NestedMap({f's{i}': x for i, x in
                      enumerate(combinators.AsTuple(outputs))})

  def _FromState(self, state):
    if self.params.nested_map_fprop:
      return (state,)
    return tuple(state[f's{i}'] for i in range(len(state)))

  def _Outputs(self, state):
    outs = self._FromState(state)
    if self.params.nested_map_fprop:
      return outs[0]
    return outs[0] if len(outs) == 1 else outs

  @tf.autograph.experimental.do_not_convert
  def FProp(self, theta, *inputs):
    """Pipelined forward; see the class docstring.

    Args:
      theta: this layer's theta; its `step_seed` (if any) seeds micro-batch
        j with MicroBatchSeed(step_seed, j).
      *inputs: tensors with a static batch dim at `batch_dim` (or one
        NestedMap of them with nested_map_fprop).

    Returns:
      The last cell's outputs for the whole batch: a tensor if it has one
      output, else a tuple (or a NestedMap with nested_map_fprop).
    """
    cells = self._OwnCells(theta)
    inputs = self._Before(theta, inputs)
    return self.FPropCells(cells, *inputs,
                           step_seed=theta.get(base_layer.STEP_SEED_KEY))

  @classmethod
  def StateDtype(cls, p, first_input_dtype=tf.float32):
    """The dtype of the states between the cells of params `p`: its
    state_dtype, else its fprop_dtype (inherited: a bfloat16 stack passes
    bfloat16 between its stages), else the first input's dtype."""
    return tf.as_dtype(p.state_dtype or p.fprop_dtype or first_input_dtype)

  def _StateSpecs(self, cells, state, size):
    """Per cell, the template of its output state for one micro-batch."""
    p = self.params
    dtype = self.StateDtype(p, state.Flatten()[0].dtype)
    in_specs = state.Transform(lambda x: tf.TensorSpec(
        shapes.AsShape(x.shape).WithDim(p.batch_dim, size).ToTensorShape(),
        dtype))
    out = []
    for i, cell in enumerate(cells):
      meta = cell.meta(*self._FromState(in_specs.Transform(
          lambda spec: shapes.Shape(spec.shape))))
      out_shapes = (meta.out_shapes[0] if p.nested_map_fprop else
                    tuple(meta.out_shapes))
      in_specs = self._ToState(_ShapesToSpecs(out_shapes, dtype))
      for spec in in_specs.Flatten():
        if not spec.shape.is_fully_defined():
          raise ValueError(
              f'{validation.Owner(self)}: cell {i} outputs shape '
              f'{spec.shape.as_list()} per micro-batch; the pipeline needs '
              'fully defined shapes.')
      out.append(in_specs)
    return out

  def _Sequential(self, cells, inputs, step_seed):
    """The cells one after the other on the whole batch (inference)."""
    out = inputs
    for cell in cells:
      th = cell.theta if step_seed is None else base_layer.WithStepSeed(
          cell.theta, step_seed)
      out = cell.fprop(th, *combinators.AsTuple(out))
    return out

  def _MicroBatches(self, cells, inputs):
    """Checks the inputs; returns (M, per-cell output specs, M input parts).
    """
    p = self.params
    owner = validation.Owner(self)
    if p.nested_map_fprop and (len(inputs) != 1 or
                               not isinstance(inputs[0], NestedMap)):
      raise ValueError(f'{owner}: nested_map_fprop=True needs exactly one '
                       f'NestedMap input; got {len(inputs)} inputs.')
    state = self._ToState(inputs[0] if p.nested_map_fprop else inputs)
    leaves = state.Flatten()
    if any(x is None for x in leaves):
      raise ValueError(f'{owner}: inputs must be tensors; got None.')
    bd = p.batch_dim
    batches = {x.shape[bd] if x.shape.rank and x.shape.rank > bd else -1
               for x in leaves}
    if len(batches) != 1 or None in batches or -1 in batches:
      raise ValueError(
          f'{owner}: every input needs the same static batch dim at '
          f'batch_dim={bd}; got shapes {[x.shape.as_list() for x in leaves]}.')
    m, size = self.MicroBatching(p, batches.pop(), owner)
    specs = self._StateSpecs(cells, state, size)
    dtype = self.StateDtype(p, leaves[0].dtype)
    with cluster_lib.DeviceScope(self._devices[0]):
      parts = microbatch.Slice(
          state.Transform(lambda x: tf.cast(x, dtype)), m, bd)
    return m, specs, parts

  def _CellFn(self, cell, dtype):
    """A PipelineCell as a function of (theta, micro-batch state), its
    floating outputs cast to the state dtype `dtype`."""
    def _Cast(x):
      x = tf.convert_to_tensor(x)
      return tf.cast(x, dtype) if x.dtype.is_floating else x

    def _Fn(th, cell_inputs):
      out = self._ToState(cell.fprop(th, *self._FromState(cell_inputs)))
      return out.Transform(_Cast)
    return _Fn

  @tf.autograph.experimental.do_not_convert
  def FPropCells(self, cells, *inputs, step_seed=None):
    """Runs `cells` (a list of PipelineCell) as this layer's pipeline, the
    loss the caller's after it (`_Run`); a training step whose schedule
    needs the loss inside (`schedules.LossInside`) is an error: call
    FPropLoss.

    Args:
      cells: S PipelineCells (cell i on `CellDevice(i, S)`).
      *inputs: the first cell's inputs (see FProp).
      step_seed: the step seed of the whole batch, or None.

    Returns:
      The last cell's outputs for the whole batch, as FProp.
    """
    return self._Run(cells, inputs, step_seed)

  @tf.autograph.experimental.do_not_convert
  def FPropLoss(self, cells, loss, *inputs, side_inputs, step_seed=None):
    """Runs `cells`, then `loss` on each micro-batch, as this `schedule`.

    The documented way to train a pipeline with any schedule: the layer,
    not its owner, decides where the loss runs (`_Run`). Either way the
    same math as running the cells and the loss on each micro-batch in
    turn with `MicroBatchSeed(step_seed, j)` and summing.

    Args:
      cells: S PipelineCells.
      loss: a PipelineCell whose fprop(theta, outputs, side) returns a
        NestedMap holding `loss`, a float scalar: the micro-batch's summed
        loss; other scalars (metric sums) and tensors with the batch at
        `batch_dim` (per-example values) may come along. theta: the loss's
        weights (e.g. a softmax's); meta is not used.
      *inputs: the first cell's inputs (see FProp).
      side_inputs: a NestedMap of tensors with the batch at `batch_dim`,
        cut into micro-batches like the inputs; no gradient flows to them.
      step_seed: the step seed of the whole batch, or None.

    Returns:
      A NestedMap like the loss function's: scalars summed over the
      micro-batches, other tensors concatenated along batch_dim. Only
      `loss` carries a gradient (to the cells', the loss's weights and the
      inputs).
    """
    return self._Run(cells, inputs, step_seed, loss, side_inputs)

  def _Run(self, cells, inputs, step_seed, loss=None, side_inputs=None):
    """The one run path: the cells over M micro-batches as this layer's
    schedule (`Schedule`, built once for the cells and M), then the loss
    of each micro-batch (`loss` given) where the schedule says:

      inside   (loss_inside: 1F1B, zero bubble) the last cell ends in it,
               on its device, so that micro-batch's backward starts at once
               (executor.Run's loss inside);
      after    (GPipe) on each micro-batch's output as the executor hands
               it over, on the last cell's device; no loss: the outputs
               joined in the batch's order (FPropCells).

    In inference on one device the cells (and the loss) run one after the
    other on the whole batch; on several, the default schedule runs them
    where this layer's placed them.
    """
    p = self.params
    bd = p.batch_dim
    last_device = self.CellDevice(len(cells) - 1, len(cells))
    loss_fn = None if loss is None else self._LossFn(loss)
    if p.is_inference and len(self._devices) == 1:
      out = self._Sequential(cells, inputs, step_seed)
      if loss_fn is None:
        return out
      return loss_fn(_SeedOf(loss.theta, step_seed),
                     (self._ToState(out), side_inputs))
    m, specs, mb_inputs = self._MicroBatches(cells, inputs)
    schedule = self.Schedule(len(cells), m)
    if loss_fn is None and schedule.loss_inside:
      raise ValueError(
          f'{validation.Owner(self)}: schedule={p.schedule!r} runs each '
          "micro-batch's backward inside the pipeline, so it needs the "
          'loss: call FPropLoss(cells, loss, *inputs, side_inputs=...) '
          f'(or set schedule={schedules.DEFAULT!r}).')
    with cluster_lib.DeviceScope(self._devices[0]):
      side_parts = (None if side_inputs is None else
                    microbatch.Slice(side_inputs, m, bd))
    dtype = specs[0].Flatten()[0].dtype
    cell_fns = [lambda th, unused_state, x, fn=self._CellFn(c, dtype):
                fn(th, x) for c in cells]
    thetas = [_StripSeed(c.theta) for c in cells]
    if schedule.loss_inside:
      last_fn = cell_fns[-1]
      cell_fns[-1] = lambda th, unused_state, xs: loss_fn(
          th.loss, (last_fn(th.cell, None, xs[0]), xs[1]))
      thetas[-1] = NestedMap(cell=thetas[-1], loss=_StripSeed(loss.theta))
      specs = specs[:-1] + [self._LossTemplate(
          loss_fn, thetas[-1].loss, specs[-1], side_parts[0], step_seed)]
    run = executor.Run(
        self.StageDevices(len(cells)), cell_fns, thetas, specs, mb_inputs,
        side_inputs=side_parts if schedule.loss_inside else None,
        step_seed=step_seed, schedule=schedule, remat=p.remat,
        backward_window=p.backward_window, owner=validation.Owner(self),
        trace_actions=p.trace_actions)
    if schedule.loss_inside:
      with cluster_lib.DeviceScope(last_device):
        out = self._Combine([run.outputs.Transform(lambda x, j=j: x[j])
                             for j in range(m)])
      out[executor.LOSS_KEY] = run.loss
      return out
    if loss_fn is None:
      with cluster_lib.DeviceScope(last_device):
        return self._Outputs(microbatch.Concat(run.outputs, bd))

    def _Losses(theta, outputs, sides):
      return self._Combine([
          loss_fn(_SeedOf(theta, step_seed, j), (out, side))
          for j, (out, side) in enumerate(zip(outputs, sides))])

    return device_call.OnDevice(last_device, _Losses, _StripSeed(loss.theta),
                                run.outputs, side_parts)

  # --- the loss inside the pipeline ------------------------------------------

  def _LossFn(self, loss):
    """`loss` as the end of the last cell: (theta, (outputs, side)) ->
    its NestedMap, every leaf but `loss` without gradient."""
    owner = validation.Owner(self)

    def _Fn(th, xs):
      outputs, side = xs
      res = loss.fprop(th, self._Outputs(outputs), side)
      if not isinstance(res, NestedMap) or executor.LOSS_KEY not in res:
        raise ValueError(f'{owner}: the loss function must return a '
                         f'NestedMap with a scalar {executor.LOSS_KEY!r}'
                         f'; got {type(res).__name__} {res!r}.')
      return res.Transform(tf.convert_to_tensor).Pack([
          x if k == executor.LOSS_KEY else tf.stop_gradient(x)
          for k, x in res.Transform(tf.convert_to_tensor).FlattenItems()])
    return _Fn

  def _Combine(self, parts):
    """Per-micro-batch loss NestedMaps -> scalars summed, the rest
    concatenated along batch_dim."""
    bd = self.params.batch_dim
    return parts[0].Pack([
        tf.add_n(list(xs)) if xs[0].shape.rank == 0 else
        (tf.concat(xs, bd) if len(xs) > 1 else xs[0])
        for xs in zip(*[part.Flatten() for part in parts])])

  def _LossTemplate(self, loss_fn, theta, out_spec, side, step_seed):
    """TensorSpecs of the loss function's NestedMap for one micro-batch."""
    def _Spec(x):
      return tf.TensorSpec(x.shape, x.dtype)

    def _Trace(th, out, sd, seed):
      if seed is not None:
        th = base_layer.WithStepSeed(th, seed)
      return loss_fn(th, (out, sd))

    seed_spec = None if step_seed is None else tf.TensorSpec([2], tf.int64)
    fn = tf.function(_Trace, autograph=False).get_concrete_function(
        tf.nest.map_structure(_Spec, theta), out_spec,
        tf.nest.map_structure(_Spec, side), seed_spec)
    return tf.nest.map_structure(_Spec, fn.structured_outputs)
