"""`--mode=inspect_model`: a model's variables and FLOPs as text.

The report lists every variable (path, shape, dtype, device), the parameter
count, and the forward FLOPs of one training batch from the task's
`FPropMeta`: the total, the task's `breakdown` (each part's FLOPs and share)
and, for a pipelined model, each partition's share (`partitions`).
"""
from cadence.framework import programs


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


def VariableReport(task):
  """One line per variable of `task`: path, shape, dtype, device."""
  rows = [('variable', 'shape', 'dtype', 'device')]
  total = 0
  for path, var in programs.VarsByPath(task).items():
    shape = var.shape.as_list()
    total += _Count(shape)
    rows.append((path, str(shape), var.dtype.name, var.device or '(default)'))
  return _Table(rows) + f'{len(rows) - 1} variables, {total:,} parameters\n'


def FlopsReport(task, input_generator):
  """Forward FLOPs of one global batch of the generator, by part."""
  dataset = input_generator.Dataset()
  batch = input_generator.GlobalBatchSize()
  input_shapes = programs.InputShapes(dataset, batch)
  try:
    meta = type(task).FPropMeta(task.params, input_shapes)
  except NotImplementedError as e:
    return f'FLOPs: not available ({e})\n'
  train = None if meta.flops is None else 3 * meta.flops
  lines = [f'Forward FLOPs per batch of {batch}: {_Flops(meta.flops)} '
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
    rows = [('pipeline partition', 'forward FLOPs', 'share')]
    rows += [(f'cell {i}', _Flops(f), _Share(f, total))
             for i, f in enumerate(partitions)]
    lines.append(_Table(rows))
  return ''.join(lines)


def ModelReport(params):
  """Builds the model of `params` and returns its variable and FLOP report."""
  model = params.Instantiate()
  task = model.task
  header = f'Model {params.name} (task {type(task).__name__} {task.path!r})\n'
  flops = FlopsReport(task, params.input.Instantiate())
  return header + VariableReport(task) + flops
