"""`--mode=inspect_model`: a model's variables, devices and FLOPs as text.

Inspecting needs neither data nor weights. The model is built inside a
throwaway `tf.Graph`: layers run their real constructors (so the variables,
their paths, shapes, dtypes and devices are exactly the trainer's), but a
graph variable is only a symbol whose initial value is never computed, so
no weight memory is allocated (the published-scale 1.7B-parameter LM builds
in a few seconds and a few hundred MB). The FLOPs come from the task's
`FPropMeta` on the input's `BatchShapes`, from params alone: no input file
is opened and no tokenizer is trained.

The report lists every variable (path, shape, dtype, device), the parameter
count, the forward FLOPs of one batch with the task's `breakdown`, per
device the variables' parameters and bytes, and per pipeline stage its
its units, parameters, forward FLOPs and their share of the step, and the
memory it needs at the step's peak (framework/pipeline/memory_estimate.py:
weights, gradients, optimizer slots, activations for the schedule and
remat), all from the task's FPropMeta `plan` (framework/pipeline/plan.py),
with whether it fits a given device memory.

Example:
  print(ModelReport(model_registry.GetParams('lm.one_billion_wds.'
                                             'OneBWdsGPipeTransformer',
                                             'Train')))
"""
import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import base_model
from cadence.framework import cluster as cluster_lib
from cadence.framework import cost
from cadence.framework.pipeline import memory_estimate
from cadence.framework import validation
from cadence.layers import gpipe_units

_Bytes = memory_estimate.FormatBytes   # '1.50 GiB'


def _Count(shape):
  n = 1
  for d in shape:
    n *= int(d)
  return n


def _Table(rows):
  widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
  return ''.join('  '.join(c.ljust(w) for c, w in zip(r, widths)).rstrip() +
                 '\n' for r in rows)


def _Flops(flops):
  return 'unknown' if flops is None else f'{flops:,}'


def _Share(part, total):
  if part is None or not total:
    return ''
  return f'{100.0 * part / total:.1f}%'


def _VarRows(task):
  """(path, shape list, dtype, device, trainable) of each variable of
  `task`."""
  return [(f'{task.path}.{k}', v.shape.as_list(), v.dtype, v.device,
           v.trainable) for k, v in task.vars.FlattenItems()]


def VariableReport(rows):
  """One line per variable: path, shape, dtype, device; then the totals."""
  table = [('variable', 'shape', 'dtype', 'device')]
  table += [(path, str(shape), dtype.name, device or '(default)')
            for path, shape, dtype, device, _ in rows]
  total = sum(_Count(shape) for _, shape, _, _, _ in rows)
  nbytes = sum(_Count(shape) * dtype.size for _, shape, dtype, _, _ in rows)
  return _Table(table) + (f'{len(rows)} variables, {total:,} parameters '
                          f'({_Bytes(nbytes)})\n')


def DeviceReport(rows):
  """Per device: variables, parameters and their bytes."""
  by_device = {}
  for _, shape, dtype, device, _ in rows:
    entry = by_device.setdefault(device or '(default)', [0, 0, 0])
    entry[0] += 1
    entry[1] += _Count(shape)
    entry[2] += _Count(shape) * dtype.size
  table = [('device', 'variables', 'parameters', 'bytes')]
  table += [(d, str(n), f'{p:,}', _Bytes(b))
            for d, (n, p, b) in sorted(by_device.items())]
  return _Table(table)


def FlopsReport(meta, batch_size):
  """Forward FLOPs of one batch, by part and by pipeline cell."""
  if meta is None:
    return 'FLOPs: not available (the task or its input has no static ' \
           'shapes: FPropMeta / BatchShapes)\n'
  train = None if meta.flops is None else 3 * meta.flops
  lines = [f'Forward FLOPs per batch of {batch_size}: {_Flops(meta.flops)} '
           f'(train step ~3x: {_Flops(train)})\n']
  breakdown = meta.get('breakdown') or []
  if breakdown:
    rows = [('layer', 'forward FLOPs', 'share')]
    rows += [(name, _Flops(f), _Share(f, meta.flops)) for name, f in breakdown]
    lines.append(_Table(rows))
  return ''.join(lines)


def _Short(device):
  """'CPU:1' of '/job:localhost/replica:0/task:0/device:CPU:1'."""
  spec = tf.DeviceSpec.from_string(device or '')
  return f'{spec.device_type}:{spec.device_index}' if spec.device_type else ''


def TaskPlan(meta, devices, devices_from=''):
  """The plan.PipelinePlan of a task's FPropMeta `meta` on the model
  split's `devices` (its params say the stages, the cluster the devices:
  stages share devices when there are more), or None.

  Raises:
    ValueError: the stages do not fit the devices (PipelinePlan.OnDevices:
      the line ends with where the devices came from, `devices_from`, the
      cluster's split_size_from, and the fixes).
  """
  plan = meta.get('plan') if meta is not None else None
  return None if plan is None else plan.OnDevices(len(devices), devices_from)


def StageDevices(plan, devices):
  """The device of each stage of `plan` among the model split's `devices`
  (an unpipelined model: the first)."""
  return [devices[d] for d in plan.stage_devices]


def StageWeights(rows, plan, stage_devices, optimizer, unit_of=None):
  """Per stage [parameters, their bytes, gradient bytes, slot bytes]: a
  unit's variables in its stage (`unit_of`: {variable path: unit index},
  gpipe_units.UnitOfVariables), any other variable (an embedding before
  the pipeline, a softmax after it) in the first stage on its device, and
  an unplaced one, or all of an unpipelined model's, in stage 0."""
  unit_of = unit_of or {}
  stage_of_unit = {u: s for s in range(plan.num_stages)
                   for u in range(plan.bounds[s], plan.bounds[s + 1])}
  first_on = {}
  for i, device in enumerate(stage_devices):
    first_on.setdefault(_Short(device), i)
  out = [[0] * _COLUMNS for _ in range(plan.num_stages)]
  for path, shape, dtype, device, trainable in rows:
    if path in unit_of:
      stage = stage_of_unit[unit_of[path]]
    else:
      stage = first_on.get(_Short(device), 0) if plan.num_stages > 1 else 0
    _AddVariable(out[stage], shape, dtype, trainable, optimizer)
  return out


# A stage's weights row: [parameters, bytes, gradient bytes, slot bytes].
_COLUMNS = 4


def LearnerOptimizer(train_p, num_replicas=1):
  """The optimizer of task train params `train_p`, for an estimate: its
  slots one shard of `num_replicas` (the replicas of every host) with
  learner.shard_optimizer_state."""
  optimizer = train_p.learner.optimizer.Instantiate()
  if train_p.learner.shard_optimizer_state:
    optimizer.ForShards(num_replicas)
  return optimizer


def _AddVariable(row, shape, dtype, trainable, optimizer):
  """Adds a variable to a stage's weights row (a trainable float one has a
  gradient and `optimizer`'s slots)."""
  n = _Count(shape)
  row[0] += n
  row[1] += n * dtype.size
  if trainable and dtype.is_floating:
    row[2] += n * dtype.size
    row[3] += sum(_Count(s) for s in optimizer.SlotShapes(shape).values()
                  ) * dtype.size


def TaskWeights(plan, rows, stage_devices, optimizer, unit_of=None):
  """Per stage [parameters, bytes, gradient bytes, slot bytes]: the plan's
  own count (PlanStageWeights: exact per stage, several stages of one
  device apart), what the model holds beyond its units in stage 0; else
  by the model's variables (StageWeights). Also the parameters beyond
  the units (0 when counted by variables)."""
  weights = StageWeights(rows, plan, stage_devices, optimizer, unit_of)
  planned = PlanStageWeights(plan, optimizer)
  if planned is None:
    return weights, 0
  rest = [sum(w[i] for w in weights) - sum(w[i] for w in planned)
          for i in range(_COLUMNS)]
  planned[0] = [a + max(b, 0) for a, b in zip(planned[0], rest)]
  return planned, max(rest[0], 0)


def PlanStageWeights(plan, optimizer):
  """Per stage [parameters, their bytes, gradient bytes, slot bytes] from
  the plan alone: each unit's variables (plan.Unit.Variables, built
  without weights) in its stage, what runs before the pipeline in the
  first, the loss's in the last; None when a unit does not say them."""
  out = [[0] * _COLUMNS for _ in range(plan.num_stages)]
  parts = [(u, s) for s in range(plan.num_stages) for u in plan.StageUnits(s)]
  parts += [(u, 0) for u in plan.before]
  if plan.loss is not None:
    parts.append((plan.loss, plan.num_stages - 1))
  for unit, stage in parts:
    variables = unit.Variables()
    if variables is None:
      return None
    for shape, dtype, trainable in variables:
      _AddVariable(out[stage], shape, dtype, trainable, optimizer)
  return out


def PlanStages(plan, weights, estimate=memory_estimate.StageMemory,
               num_replicas=1):
  """memory_estimate's `estimate` of `plan` with per-stage `weights`
  (rows of [parameters, bytes, gradient bytes, slot bytes], StageWeights)
  for one of `num_replicas` replicas (of every host: with more than one,
  the update's moment holds the all-reduce's buffers,
  memory_estimate.UpdateBytes)."""
  grads = [w[2] for w in weights]
  return estimate(plan, [w[1] for w in weights], [w[3] for w in weights],
                  grads=grads,
                  update=memory_estimate.UpdateBytes(grads, num_replicas))


_Stages = PlanStages


def StageReport(meta, rows, optimizer, devices, device_memory_gib=None,
                unit_of=None, devices_from=''):
  """Per pipeline stage: parameters, forward FLOPs and their share of the
  step, and the memory estimate at the step's peak (memory_estimate), all
  from the task's plan (framework/pipeline/plan.py).

  Args:
    meta: the task's FPropMeta (with its `plan`), or None.
    rows: the variables, as _VarRows gives them.
    optimizer: the learner's optimizer (its slot shapes).
    devices: the model split's devices (the schedule places the stages).
    device_memory_gib: if set, each stage says whether it fits.
    unit_of: {variable path: unit index} (gpipe_units.UnitOfVariables).
    devices_from: where the split's size came from (TaskPlan).
  """
  plan = TaskPlan(meta, devices, devices_from)
  if plan is None:
    return ('Memory per stage: not available (the task\'s FPropMeta has no '
            '`plan`, or the batch size is unknown).\n')
  k = plan.num_stages
  stage_devices = StageDevices(plan, devices)
  weights, rest = TaskWeights(plan, rows, stage_devices, optimizer,
                              unit_of)
  outside = (f'; {rest:,} parameters outside the pipeline\'s units, in '
             'stage 0' if rest else '')
  stages = _Stages(plan, weights)
  flops = plan.StageFlops()
  known = [f for f in flops if f is not None]
  total_flops = sum(known) if len(known) == len(flops) else None
  what = ('unpipelined' if plan.schedule is None else
          f'schedule {plan.schedule.name}, remat {plan.remat}, '
          f'{plan.num_micro_batches} micro-batches, backward_window '
          f'{plan.backward_window}')
  table = [('stage', 'device', 'parameters', 'forward FLOPs', 'share',
            'weights+grads+slots', 'activations', 'peak')]
  if device_memory_gib:
    table[0] += (f'fits {device_memory_gib:g} GiB',)
  table[0] += ('units',)
  limit = (device_memory_gib or 0) * 2**30
  for i, (stage, w) in enumerate(zip(stages, weights)):
    units = plan.StageUnits(i)
    names = (units[0].name if len(units) == 1 else
             f'{units[0].name}..{units[-1].name}')
    row = (f'cell {i}', stage_devices[i], f'{w[0]:,}',
           _Flops(flops[i]), _Share(flops[i], total_flops),
           _Bytes(stage.params + stage.grads + stage.slots),
           _Bytes(stage.activations + stage.transient),
           _Bytes(stage.total))
    if device_memory_gib:
      row += ('yes' if stage.total <= limit else 'NO',)
    table.append(row + (names,))
  peak = max(s.total for s in stages)
  per_device = ''
  if len(set(stage_devices)) < k:   # Stages share devices.
    per_device_stages = _Stages(plan, weights, memory_estimate.DeviceMemory)
    peak = max(s.total for s in per_device_stages)
    per_device = ('per device, its stages together at its worst moment: ' +
                  ', '.join(f'{d} {_Bytes(s.total)}'
                            for d, s in zip(devices, per_device_stages)) +
                  '\n')
  verdict = ''
  if device_memory_gib:
    verdict = (f'; {"fits" if peak <= limit else "does NOT fit"} '
               f'{device_memory_gib:g} GiB per device')
  shared = ''
  if k > 1:
    together = _Stages(plan, weights, memory_estimate.SharedMemory).total
    shared = (f'; all stages together at the step\'s worst moment '
              f'{_Bytes(together)} (stages sharing one memory: logical '
              f'devices of one host, a split onto one accelerator)')
  defaulted = sorted({f for u in plan.units for f in u.cost.defaulted
                      if f in cost.MEMORY_FIELDS})
  estimated = (f'; {", ".join(defaulted)} of some units by the default '
               'rule (framework/cost.py)' if defaulted else '')
  return (f'Memory per stage at the step\'s peak (estimate, {what}; '
          f'framework/pipeline/memory_estimate.py{estimated}{outside}):\n' +
          _Table(table) + per_device + f'largest '
          f'{"device" if per_device else "stage"} {_Bytes(peak)}'
          f'{verdict}{shared}\n')


def _Meta(task_cls, params, batch_size):
  """FPropMeta on the input's BatchShapes, a None batch dim taken as
  `batch_size` (a generator without fixed shapes still has a batch size);
  None when the task or its input cannot say."""
  if params.input is None:
    return None
  try:
    batch_shapes = params.input.cls.BatchShapes(params.input)
  except NotImplementedError:
    return None
  batch_shapes = batch_shapes.Transform(
      lambda s: s.WithDim(0, batch_size) if s.rank and s[0] is None else s)
  try:
    return task_cls.FPropMeta(params, batch_shapes)
  except NotImplementedError:
    return None


def PipelineKeys(params):
  """The params paths of every pipeline in model `params` (the parents of
  each `trace_actions` param), e.g. ['task.stack_tpl.pipeline_tpl']."""
  keys = [line.split(' : ', 1)[0] for line in str(params).splitlines()]
  return [k.rsplit('.', 1)[0] for k in keys
          if k.rsplit('.', 1)[-1] == 'trace_actions']


def ParamsMeta(params):
  """The task FPropMeta of model `params` on its input's batch shapes
  (None: it or its input cannot say); nothing built."""
  p = params.task.Copy()
  p.input = params.input
  batch = getattr(p.input, 'batch_size', None) if p.input else None
  return _Meta(p.cls, p, batch)


def TaskMeta(task):
  """A built task's FPropMeta on its input's batch shapes (None: it or its
  input cannot say)."""
  p = task.params
  batch = getattr(p.input, 'batch_size', None) if p.input else None
  return _Meta(type(task), p, batch)


def _TaskArgs(task, num_replicas=1):
  """(meta, rows, optimizer, devices, unit_of) of a built task for
  StageReport; `num_replicas`: LearnerOptimizer's."""
  p = task.params
  return (TaskMeta(task), _VarRows(task),
          LearnerOptimizer(p.train, num_replicas),
          cluster_lib.Cluster.Current().DevicesInModelSplit(0),
          gpipe_units.UnitOfVariables(task))


def _CurrentPlan(meta, devices):
  """TaskPlan on the current cluster's `devices`, its errors naming where
  the split's size came from."""
  return TaskPlan(meta, devices,
                  cluster_lib.Cluster.Current().split_size_from)


def TaskStageReport(task, device_memory_gib=None):
  """StageReport of a built task (its variables, FPropMeta on its input's
  batch shapes and optimizer) on the current cluster's devices."""
  meta, rows, optimizer, devices, unit_of = _TaskArgs(task)
  return StageReport(meta, rows, optimizer, devices, device_memory_gib,
                     unit_of, cluster_lib.Cluster.Current().split_size_from)


def TaskStages(task, estimate=memory_estimate.StageMemory, num_replicas=1):
  """The memory estimate of a built task (as TaskStageReport): `estimate`
  (memory_estimate.StageMemory: a Stage per stage, or SharedMemory: one
  Stage for all together) of its plan, None without one, for one of
  `num_replicas` replicas of every host (sharded slots are cut over them,
  LearnerOptimizer; their update's all-reduce, PlanStages)."""
  meta, rows, optimizer, devices, unit_of = _TaskArgs(task, num_replicas)
  plan = _CurrentPlan(meta, devices)
  if plan is None:
    return None
  weights, _ = TaskWeights(plan, rows, StageDevices(plan, devices),
                           optimizer, unit_of)
  return PlanStages(plan, weights, estimate, num_replicas)


def TaskStageDevices(task):
  """The device of each stage of a built task's plan (as TaskStages),
  None without one."""
  meta, _, _, devices, _ = _TaskArgs(task)
  plan = _CurrentPlan(meta, devices)
  return None if plan is None else StageDevices(plan, devices)


def CheckParamsAlone(params):
  """The params checks of a build, in its order, building nothing: the
  input's params, the task's own (base_layer.CheckBaseParams) and train
  params, then its FPropMeta on the input's batch shapes (each layer
  checks its params there; a pipeline, its micro-batching and schedule).
  What the trainer runs before its memory estimate, and --mode=plan (which
  lays the model out on devices of its own).

  Returns:
    The task's FPropMeta (None: it or its input cannot say).

  Raises:
    ValueError: a bad param, naming its params path.
  """
  if params.input is not None:
    check = getattr(params.input.cls, 'CheckParams', None)
    if check is not None:
      check(params.input)
  task = params.task.Copy()
  task.input = params.input
  base_layer.CheckBaseParams(validation.Owner(task), task)
  task.cls.CheckTrainParams(task)
  return task.cls.CheckStaticShapes(task)


def CheckModel(params):
  """The params checks every trainer mode runs before it does anything:
  the model of `params` built without weights (each layer checks its
  params) and its task's FPropMeta on the input's batch shapes (the
  micro-batching; a schedule at its stages, devices and micro-batches).

  Returns:
    The symbolic model (BuildSymbolically).

  Raises:
    ValueError: a bad param, naming its params path.
  """
  model, _ = base_model.BuildSymbolically(params)
  task = model.task
  batch = getattr(params.input, 'batch_size', None) if params.input else None
  _Meta(type(task), task.params, batch)
  return model


def ModelReport(params, device_memory_gib=None, model=None):
  """The variable, device, FLOP and stage report of the model of `params`.

  Built without weights or data (see the module docstring), unless given
  as `model` (CheckModel's); the current `cluster.Cluster` decides the
  devices, as in training. With `device_memory_gib`, each stage says
  whether it fits.
  """
  model = model or base_model.BuildSymbolically(params)[0]
  task = model.task
  rows = _VarRows(task)
  batch = getattr(params.input, 'batch_size', None) if params.input else None
  meta = _Meta(type(task), task.params, batch)
  header = (f'Model {params.name} (task {type(task).__name__} '
            f'{task.path!r}; built without weights or data)\n')
  return (header + VariableReport(rows) + '\nPer device:\n' +
          DeviceReport(rows) + '\n' + FlopsReport(meta, batch) + '\n' +
          TaskStageReport(task, device_memory_gib))
