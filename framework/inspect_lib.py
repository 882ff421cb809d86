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
count, the forward FLOPs of one batch with the task's `breakdown`, and per
device the variables' parameters and bytes, next to each pipeline cell's
FLOP share (`partitions`) when the task has them.

Example:
  print(ModelReport(model_registry.GetParams('lm.one_billion_wds.'
                                             'OneBWdsGPipeTransformer',
                                             'Train')))
"""
import tensorflow as tf

from cadence.framework import cluster as cluster_lib


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


def _Bytes(n):
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
                          f'({_Bytes(nbytes)})\n')


def DeviceReport(rows):
  """Per device: variables, parameters and their bytes."""
  by_device = {}
  for _, shape, dtype, device in rows:
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
  partitions = meta.get('partitions') or []
  if partitions:
    known = [f for f in partitions if f is not None]
    total = sum(known) if len(known) == len(partitions) else None
    rows = [('pipeline cell', 'forward FLOPs', 'share')]
    rows += [(f'cell {i}', _Flops(f), _Share(f, total))
             for i, f in enumerate(partitions)]
    lines.append(_Table(rows))
  return ''.join(lines)


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


def ModelReport(params):
  """The variable, device and FLOP report of the model of `params`.

  Built without weights or data (see the module docstring); the current
  `cluster.Cluster` decides the devices, as in training.
  """
  model, _ = BuildSymbolically(params)
  task = model.task
  rows = _VarRows(task)
  batch = getattr(params.input, 'batch_size', None) if params.input else None
  meta = _Meta(type(task), task.params, batch)
  header = (f'Model {params.name} (task {type(task).__name__} '
            f'{task.path!r}; built without weights or data)\n')
  return (header + VariableReport(rows) + '\nPer device:\n' +
          DeviceReport(rows) + '\n' + FlopsReport(meta, batch))
