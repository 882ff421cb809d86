"""Cost: the one record every layer's FPropMeta returns.

A layer's `FPropMeta(params, *input_shapes)` says, from params and static
shapes alone (nothing built, no data), what one forward of it costs. Every
consumer reads the same record: the pipeline's plan (framework/pipeline/
plan.py) cuts units into stages by it, the memory estimate counts its bytes,
inspect prints it, the planner simulates layouts with it.

Fields (ints; None where a dim is unknown):

  out_shapes   the outputs' shapes, a tuple of `shapes.Shape` (or NestedMaps
               of them).
  flops        forward FLOPs (a multiply-add is 2).
  bwd_flops    backward FLOPs: the input gradient and the weight gradient.
  act          bytes the backward reads when nothing is recomputed (remat
               'never'; the 'all' policy of framework/pipeline/
               remat_policy.py).
  act_weights  of them, what remat 'selective' keeps: the outputs of the
               products with a weight (the 'weights' policy); the rest is
               recomputed in the backward.
  residuals    bytes a deferred W (zero-bubble schedules) reads
               after B: the inputs of the weight products and their output
               gradients (framework/pipeline/deferred_w.py).
  transient    bytes the backward allocates beyond what it keeps, at its
               peak (the gradients in flight, temporaries).
  weight_bytes bytes of the layer's variables.
  act_outputs  of `act`, the bytes of the layer's own outputs (its backward
               reads them: a layer ending in a relu or a max pool). A
               pipeline stage's output waits for the next stage's backward
               anyway; the memory estimate counts it once for a micro-batch
               whose `act` it keeps.
  act_inputs   of `act` (and of `act_weights`), the bytes of the layer's
               inputs its backward reads (a weight product's input). In a
               chain, a tensor that is one layer's `act_outputs` and the
               next one's `act_inputs` is one buffer: `Chain` counts it
               once.
  ops          what one forward runs, a tuple of framework/op_cost.py's
               `Op`s (products with their dims, element-wise ops, norms,
               softmaxes, gathers): how an accelerator's hardware model
               times it (framework/planning/hardware.py).

A layer sets what it knows. What it leaves None, `Complete` fills with a
documented default, and names in `defaulted` (inspect says which figures
are estimates); never a silent zero:

  bwd_flops    2 x flops (a product's input and weight gradients each cost
               one forward; exact for matmuls and convolutions);
  act          the bytes of its inputs and outputs in the activation dtype
               (what a chain of products and element-wise ops reads);
  act_weights  = act (a layer that does not say keeps everything);
  residuals    = act;
  transient    the bytes of its outputs (their gradient in flight);
  act_outputs  0: the outputs counted beside `act` (an over-estimate by at
               most one output a kept micro-batch, never an under-estimate);
  act_inputs   the bytes of its inputs when `act` is defaulted too (the
               default `act` holds them), else 0: a chain then counts the
               tensor between two layers twice (an over-estimate, never an
               under-estimate);
  ops          one `other` op of its FLOPs and the bytes of `act`: timed
               at the device's flat efficiency (what the planner assumed
               before ops had kinds);
  weight_bytes stays None: the plan sums the variables of each unit built
               without weights (framework/pipeline/plan.py).

A record may carry more keys (a task's `breakdown`, its `plan`); it is a
NestedMap, so `meta.flops` reads as before.

Example:
  @classmethod
  def FPropMeta(cls, p, inputs):
    shape = shapes.AsShape(inputs)
    return cost.Cost(flops=2 * shape.num_elements(), out_shapes=(shape,),
                     act=4 * shape.num_elements())
  c = cost.Complete(MyLayer.FPropMeta(p, [8, 16]), ([8, 16],), tf.float32)
  c.bwd_flops, c.defaulted     # 2 x flops, ('bwd_flops', 'act_weights', ...)
"""
from cadence.framework import op_cost
from cadence.framework import shapes
from cadence.framework import validation
from cadence.framework.nested_map import NestedMap

# The fields, in the order above; the memory ones are bytes of one forward.
FIELDS = ('out_shapes', 'flops', 'bwd_flops', 'act', 'act_weights',
          'residuals', 'transient', 'weight_bytes', 'act_outputs',
          'act_inputs', 'ops')
MEMORY_FIELDS = ('act', 'act_weights', 'residuals', 'transient')
# Summed along a chain of layers (transient: see Chain).
_SUMMED = ('flops', 'bwd_flops', 'act', 'act_weights', 'residuals',
           'weight_bytes')


class Cost(NestedMap):
  """The cost record; see the module docstring.

  Args:
    out_shapes: a tuple of output shapes.
    flops ... weight_bytes: ints, or None where the layer does not say.
    defaulted: the fields `Complete` filled (a tuple of names).
    **extra: more keys (e.g. a task's `breakdown` or `plan`).
  """

  def __init__(self, out_shapes=(), flops=None, bwd_flops=None, act=None,
               act_weights=None, residuals=None, transient=None,
               weight_bytes=None, act_outputs=None, act_inputs=None,
               ops=None, defaulted=(), **extra):
    super().__init__(out_shapes=tuple(out_shapes), flops=flops,
                     bwd_flops=bwd_flops, act=act, act_weights=act_weights,
                     residuals=residuals, transient=transient,
                     weight_bytes=weight_bytes, act_outputs=act_outputs,
                     act_inputs=act_inputs,
                     ops=None if ops is None else tuple(ops),
                     defaulted=tuple(defaulted), **extra)

  def Replace(self, **changes):
    """A copy with `changes` (fields or extra keys)."""
    out = Cost(**{k: v for k, v in self.items()})
    for key, value in changes.items():
      out[key] = value
    return out


class ContractError(ValueError):
  """A layer's FPropMeta broke its contract: it returned something other
  than a cost record (`CheckRecord`), or stated output shapes that are not
  its FProp's (`ShapeMismatch`). A ValueError: the trainer reports it as
  one line and exit code 2."""


# How a record is written, for the contract's error messages.
_CONTRACT = ('FPropMeta(params, *input_shapes) must return a cost record, '
             'cost.Cost(out_shapes=(...), flops=...) (framework/cost.py)')


def CheckRecord(record, owner):
  """Returns `record` if it is a cost record: a Cost, or a NestedMap with
  `out_shapes` (a tuple or list of shapes, or of NestedMaps of them) and
  `flops` (an int, or None where a dim is unknown), its other FIELDS ints
  or None; else raises ContractError naming `owner` (validation.Owner of
  the layer's params: its params path), what it returned and the contract.

  Example:
    CheckRecord(MyLayer.FPropMeta(p, [8, 16]), validation.Owner(p))
  """
  def _Fail(what):
    raise ContractError(f'{owner}: FPropMeta returned {what}; {_CONTRACT}.')

  if not isinstance(record, dict):
    kind = type(record).__name__
    _Fail(f'{validation.ShortRepr(record, 80)} '
          f'({"an" if kind[0] in "aeiou" else "a"} {kind})')
  if 'out_shapes' not in record:
    _Fail(f'a {type(record).__name__} without out_shapes (keys '
          f'{sorted(record)})')
  out = record['out_shapes']
  try:
    if not isinstance(out, (list, tuple)):
      raise ValueError(out)
    _LeafShapes(tuple(out))
  except (ValueError, TypeError):
    _Fail(f'out_shapes={validation.ShortRepr(out, 80)}, not a tuple of '
          'shapes')
  for field in FIELDS[1:-1]:
    value = record.get(field)
    if value is not None and not validation.IsInt(value, low=0):
      _Fail(f'{field}={validation.ShortRepr(value, 80)}, not an int >= 0 '
            'or None')
  return record


def LeafShapes(structure):
  """The `shapes.Shape`s of a record's out_shapes (a tuple of shapes, or of
  NestedMaps of them), in order."""
  return _LeafShapes(tuple(structure))


def ShapeMismatch(stated, actual):
  """Whether `stated` and `actual` (lists of shapes.Shape) disagree: a
  different count or rank, or a dim both know that differs (None matches
  any dim)."""
  if len(stated) != len(actual):
    return True
  for a, b in zip(stated, actual):
    if len(a) != len(b) or any(x is not None and y is not None and x != y
                               for x, y in zip(a, b)):
      return True
  return False


def ShapesError(owner, stated, actual, inputs):
  """The ContractError of a layer (`owner`) whose FPropMeta states output
  shapes `stated` where its FProp gives `actual`, on `inputs` (lists of
  shapes)."""
  return ContractError(
      f'{owner}: FPropMeta states output shape(s) {ShapesText(stated)} but '
      f'FProp gives {ShapesText(actual)} on input(s) {ShapesText(inputs)}; '
      "FPropMeta's out_shapes must be FProp's (the next layer, the pipeline's "
      'stages and the memory estimate are sized by them).')


def ShapesText(shape_list):
  """'[4, 8]' for one shape, '[4, 8], [4]' for several (None as '?'; an
  int, a static value, as it is)."""
  return ', '.join(
      str(s) if validation.IsInt(s) else
      '[' + ', '.join('?' if d is None else str(d) for d in s) + ']'
      for s in shape_list) or 'none'


def _LeafShapes(structure):
  """The Shape leaves of a tuple/NestedMap of shapes (a NestedMap's by
  key, as tf.nest flattens its tensors)."""
  if isinstance(structure, NestedMap):
    return [s for k in sorted(structure) for s in _LeafShapes(structure[k])]
  if isinstance(structure, (list, tuple)) and not isinstance(
      structure, shapes.Shape) and not (structure and all(
          isinstance(d, int) or d is None for d in structure)):
    return [s for v in structure for s in _LeafShapes(v)]
  return [shapes.AsShape(structure)]


def Bytes(structure, dtype):
  """Bytes of the tensors of a (nest of) shape(s) in `dtype` (None if a dim
  is unknown)."""
  total = 0
  for shape in _LeafShapes(structure):
    total = shapes.Add(total, shapes.Mul(shape.num_elements(), dtype.size))
  return total


def Complete(record, input_shapes, dtype):
  """The record with its unset fields filled by the documented defaults.

  Args:
    record: a Cost (or the NestedMap(flops, out_shapes) of a layer not yet
      returning a Cost).
    input_shapes: the shapes FPropMeta was given, a tuple.
    dtype: the layer's activation dtype (base_layer.FPropDtype).

  Returns:
    A Cost with every field set (weight_bytes may stay None) and
    `defaulted` naming the fields filled here.
  """
  if not isinstance(record, Cost):
    record = Cost(**record)
  values = {k: record[k] for k in FIELDS}
  filled = list(record.defaulted)
  inputs = Bytes(tuple(input_shapes), dtype)
  io = shapes.Add(inputs, Bytes(record.out_shapes, dtype))
  act_says = values['act'] is not None
  defaults = (('bwd_flops', lambda: shapes.Mul(2, values['flops'])),
              ('act', lambda: io),
              ('act_weights', lambda: values['act']),
              ('residuals', lambda: values['act']),
              ('transient', lambda: Bytes(record.out_shapes, dtype)),
              ('act_outputs', lambda: 0),
              ('act_inputs', lambda: 0 if act_says else inputs),
              ('ops', lambda: None if values['flops'] is None else (
                  op_cost.Other(values['flops'], values['act'] or 0),)))
  for field, default in defaults:
    if values[field] is None:
      values[field] = default()
      filled.append(field)
  extra = {k: v for k, v in record.items() if k not in FIELDS and
           k != 'defaulted'}
  return Cost(defaulted=tuple(dict.fromkeys(filled)), **values, **extra)


def Chain(records):
  """The cost of running complete records one after the other: the summed
  fields add up, but a tensor one record passes on and the next one keeps
  (the smaller of the first's `act_outputs` and the second's `act_inputs`)
  is counted once in `act` and in `act_weights`; `transient` is what the
  backward holds beyond the chain's act at its peak: a record's transient
  less what the records after it kept (freed by then: the backward runs in
  reverse), the largest of them; `out_shapes` and `act_outputs` the last
  one's, `act_inputs` the first one's, `ops` all of theirs in order; None
  where any part is None."""
  records = list(records)
  if not records:
    return Cost(flops=0, bwd_flops=0, act=0, act_weights=0, residuals=0,
                transient=0, weight_bytes=0, act_outputs=0, act_inputs=0,
                ops=())
  values = {}
  for field in _SUMMED:
    values[field] = shapes.Add(*[r[field] for r in records])
  # shared[i]: the bytes between records i - 1 and i counted twice above.
  shared = [0] + [_Shared(a, b) for a, b in zip(records, records[1:])]
  for field in ('act', 'act_weights'):
    if values[field] is not None:
      values[field] -= sum(shared)
  transients = [r.transient for r in records]
  acts = [r.act for r in records]
  if any(x is None for x in transients + acts):
    values['transient'] = None
  else:
    # The backward runs the chain in reverse, each record's act freed once
    # its backward has read it: at record i's backward, those after it
    # hold nothing (what they kept is counted in act, now free) but the
    # tensor i passed on, which i's act holds.
    after = [sum(acts[i + 1:]) - sum(shared[i + 1:])
             for i in range(len(records))]
    values['transient'] = max(0, max(t - a for t, a in zip(transients,
                                                          after)))
  defaulted = tuple(dict.fromkeys(f for r in records for f in r.defaulted))
  ops = [r.ops for r in records]
  values['ops'] = (None if any(o is None for o in ops) else
                   tuple(op for o in ops for op in o))
  return Cost(out_shapes=records[-1].out_shapes, defaulted=defaulted,
              act_outputs=records[-1].act_outputs,
              act_inputs=records[0].get('act_inputs'), **values)


def _Shared(first, second):
  """Bytes of the tensor `first` passes to `second` that both records'
  act count (0 where either does not say)."""
  out, kept = first.get('act_outputs'), second.get('act_inputs')
  return min(out, kept) if out and kept else 0
