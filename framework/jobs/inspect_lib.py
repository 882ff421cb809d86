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
parameters, forward FLOPs and their share of the step (`partitions`), and
the memory it needs at the step's peak (framework/pipeline/memory_estimate.py:
weights, gradients, optimizer slots, activations for the schedule and
remat; from the task's FPropMeta `memory`), with whether it fits a given
device memory.

Example:
  print(ModelReport(model_registry.GetParams('lm.one_billion_wds.'
                                             'OneBWdsGPipeTransformer',
                                             'Train')))
"""
import tensorflow as tf

from cadence.framework import cluster as cluster_lib
from cadence.framework.pipeline import memory_estimate
from cadence.framework.pipeline import schedules


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


def FormatBytes(n):
  """'1.50 GiB', '12.00 MiB', '3.00 KiB' or '12 B'."""
  for unit, size in (('GiB', 2**30), ('MiB', 2**20), ('KiB', 2**10)):
    if n >= size:
      return f'{n / size:.2f} {unit}'
  return f'{n} B'


def _VarRows(task):
  """(path, shape list, dtype, device) of each variable of `task`."""
  return [(f'{task.path}.{k}', v.shape.as_list(), v.dtype, v.device)
          for k, v in task.vars.FlattenItems()]


def VariableReport(rows):
  """One line per variable: path, shape, dtype, device; then the totals."""
  table = [('variable', 'shape', 'dtype', 'device')]
  table += [(path, str(shape), dtype.name, device or '(default)')
            for path, shape, dtype, device in rows]
  total = sum(_Count(shape) for _, shape, _, _ in rows)
  nbytes = sum(_Count(shape) * dtype.size for _, shape, dtype, _ in rows)
  return _Table(table) + (f'{len(rows)} variables, {total:,} parameters '
                          f'({FormatBytes(nbytes)})\n')


def DeviceReport(rows):
  """Per device: variables, parameters and their bytes."""
  by_device = {}
  for _, shape, dtype, device in rows:
    entry = by_device.setdefault(device or '(default)', [0, 0, 0])
    entry[0] += 1
    entry[1] += _Count(shape)
    entry[2] += _Count(shape) * dtype.size
  table = [('device', 'variables', 'parameters', 'bytes')]
  table += [(d, str(n), f'{p:,}', FormatBytes(b))
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


def StageDevices(memory, devices):
  """The device of each stage of a task's FPropMeta `memory`, as its
  schedule places them on the model split's `devices` (an unpipelined
  model: the first)."""
  if memory.schedule is None:
    return [devices[0]] * len(memory.cells)
  return [devices[d] for d in schedules.StageDevices(
      memory.schedule, len(memory.cells), len(devices),
      memory.get('schedule_table') or None)]


def OnDevices(memory, devices):
  """A copy of a task's FPropMeta `memory` whose stages run on the model
  split's `devices` (a task's FPropMeta knows its stages, not the cluster:
  K > D stages share devices)."""
  memory = memory.copy()
  if memory.schedule is not None:
    memory.num_devices = len(devices)
  return memory


def _CellWeights(rows, stage_devices, optimizer):
  """Per stage [parameters, their bytes, gradient bytes, slot bytes] of its
  device's variables (a device's variables count in its first stage;
  unplaced ones, or all of an unpipelined model's, in stage 0)."""
  num_cells = len(stage_devices)
  cell_of = {}
  for i, device in enumerate(stage_devices):
    cell_of.setdefault(_Short(device), i)
  out = [[0, 0, 0, 0] for _ in range(num_cells)]
  for _, shape, dtype, device in rows:
    cell = out[cell_of.get(_Short(device), 0) if num_cells > 1 else 0]
    n = _Count(shape)
    cell[0] += n
    cell[1] += n * dtype.size
    if dtype.is_floating:
      cell[2] += n * dtype.size
      cell[3] += sum(_Count(s) for s in optimizer.SlotShapes(shape).values()
                     ) * dtype.size
  return out


def _Stages(memory, weights, estimate=memory_estimate.StageMemory):
  return estimate(memory, [w[1] for w in weights], [w[3] for w in weights],
                  grads=[w[2] for w in weights])


def StageReport(meta, rows, optimizer, devices, device_memory_gib=None):
  """Per pipeline stage: parameters, forward FLOPs and their share of the
  step, and the memory estimate at the step's peak (memory_estimate).

  Args:
    meta: the task's FPropMeta (with `memory`, and `partitions` when
      pipelined), or None.
    rows: the variables, as _VarRows gives them.
    optimizer: the learner's optimizer (its slot shapes).
    devices: the model split's devices (the schedule places the stages).
    device_memory_gib: if set, each stage says whether it fits.
  """
  memory = meta.get('memory') if meta is not None else None
  if memory is None:
    return ('Memory per stage: not available (the task has no FPropMeta '
            '`memory`, or the batch size is unknown).\n')
  memory = OnDevices(memory, devices)
  k = len(memory.cells)
  stage_devices = StageDevices(memory, devices)
  weights = _CellWeights(rows, stage_devices, optimizer)
  stages = _Stages(memory, weights)
  flops = meta.get('partitions') or [meta.flops]
  known = [f for f in flops if f is not None]
  total_flops = sum(known) if len(known) == len(flops) else None
  what = ('unpipelined' if memory.schedule is None else
          f'schedule {memory.schedule}, remat {memory.remat}, '
          f'{memory.num_micro_batches} micro-batches, backward_window '
          f'{memory.backward_window}')
  table = [('stage', 'device', 'parameters', 'forward FLOPs', 'share',
            'weights+grads+slots', 'activations', 'peak')]
  if device_memory_gib:
    table[0] += (f'fits {device_memory_gib:g} GiB',)
  limit = (device_memory_gib or 0) * 2**30
  for i, (stage, w) in enumerate(zip(stages, weights)):
    row = (f'cell {i}', stage_devices[i], f'{w[0]:,}',
           _Flops(flops[i]), _Share(flops[i], total_flops),
           FormatBytes(stage.params + stage.grads + stage.slots),
           FormatBytes(stage.activations + stage.transient), FormatBytes(stage.total))
    if device_memory_gib:
      row += ('yes' if stage.total <= limit else 'NO',)
    table.append(row)
  peak = max(s.total for s in stages)
  per_device = ''
  if len(set(stage_devices)) < k:   # Stages share devices.
    per_device_stages = _Stages(memory, weights,
                                memory_estimate.DeviceMemory)
    peak = max(s.total for s in per_device_stages)
    per_device = ('per device, its stages together at its worst moment: ' +
                  ', '.join(f'{d} {FormatBytes(s.total)}'
                            for d, s in zip(devices, per_device_stages)) +
                  '\n')
  verdict = ''
  if device_memory_gib:
    verdict = (f'; {"fits" if peak <= limit else "does NOT fit"} '
               f'{device_memory_gib:g} GiB per device')
  shared = ''
  if k > 1:
    together = _Stages(memory, weights, memory_estimate.SharedMemory).total
    shared = (f'; all stages together at the step\'s worst moment '
              f'{FormatBytes(together)} (stages sharing one memory: logical '
              f'devices of one host, a split onto one accelerator)')
  return (f'Memory per stage at the step\'s peak (estimate, {what}; '
          f'framework/pipeline/memory_estimate.py):\n' + _Table(table) +
          per_device + f'largest {"device" if per_device else "stage"} '
          f'{FormatBytes(peak)}{verdict}{shared}\n')


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


def BuildSymbolically(params):
  """Builds the model of `params` in a throwaway graph; no weight memory.

  Returns:
    (the model, the graph it lives in). Its variables are graph symbols:
    read their shapes, dtypes and devices, not their values.
  """
  graph = tf.Graph()
  # What places no variable itself gets the cluster's first device, as the
  # eager trainer's default placement does.
  first = cluster_lib.Cluster.Current().devices[0]
  with graph.as_default(), tf.device(first):
    model = params.Instantiate()
  return model, graph


def _TaskArgs(task):
  """(meta, rows, optimizer, devices) of a built task for StageReport."""
  p = task.params
  batch = getattr(p.input, 'batch_size', None) if p.input else None
  return (_Meta(type(task), p, batch), _VarRows(task),
          p.train.learner.optimizer.Instantiate(),
          cluster_lib.Cluster.Current().DevicesInModelSplit(0))


def TaskStageReport(task, device_memory_gib=None):
  """StageReport of a built task (its variables, FPropMeta on its input's
  batch shapes and optimizer) on the current cluster's devices."""
  return StageReport(*_TaskArgs(task), device_memory_gib)


def TaskStages(task, estimate=memory_estimate.StageMemory):
  """The memory estimate of a built task (as TaskStageReport): `estimate`
  (memory_estimate.StageMemory: a Stage per stage, or SharedMemory: one
  Stage for all together) of its FPropMeta `memory`, None without one."""
  meta, rows, optimizer, devices = _TaskArgs(task)
  memory = meta.get('memory') if meta is not None else None
  if memory is None:
    return None
  memory = OnDevices(memory, devices)
  return _Stages(memory, _CellWeights(rows, StageDevices(memory, devices),
                                      optimizer), estimate)


def TaskStageDevices(task):
  """The device of each stage of a built task's memory estimate (as
  TaskStages), None without one."""
  meta, _, _, devices = _TaskArgs(task)
  memory = meta.get('memory') if meta is not None else None
  return None if memory is None else StageDevices(
      OnDevices(memory, devices), devices)


def ModelReport(params, device_memory_gib=None):
  """The variable, device, FLOP and stage report of the model of `params`.

  Built without weights or data (see the module docstring); the current
  `cluster.Cluster` decides the devices, as in training. With
  `device_memory_gib`, each stage says whether it fits.
  """
  model, _ = BuildSymbolically(params)
  task = model.task
  rows = _VarRows(task)
  batch = getattr(params.input, 'batch_size', None) if params.input else None
  meta = _Meta(type(task), task.params, batch)
  header = (f'Model {params.name} (task {type(task).__name__} '
            f'{task.path!r}; built without weights or data)\n')
  return (header + VariableReport(rows) + '\nPer device:\n' +
          DeviceReport(rows) + '\n' + FlopsReport(meta, batch) + '\n' +
          TaskStageReport(task, device_memory_gib))
