"""CheckLayer: a layer's FPropMeta held to its FProp, in one call.

The partitioner, the memory estimate and the planner trust a layer's
FPropMeta (its cost record, framework/cost.py); nothing checks it at run
time beyond its output shapes. CheckLayer builds the layer, runs FProp on
the given inputs and measures (framework/testing/measure.py) what the
record states:

  contract     FPropMeta returns a cost record (cost.CheckRecord);
  out_shapes   its out_shapes are FProp's outputs' shapes;
  flops        the products' FLOPs it states (its `ops` of kinds matmul
               and other: `flops` when it leaves `ops` out) against the
               traced graph's products, within `flops_rtol`;
  act, act_weights, residuals
               against the bytes the real gradient keeps (SavedBytes with
               remat policies 'all' and 'weights', ResidualBytes), within
               `memory_rtol`; a figure the layer leaves to cost.Complete's
               default is reported, and checked only with
               `check_defaults=True`;
  gradients    every trainable variable gets a gradient (not None);
  step_seed    FProp run twice with the same step seed gives the same
               outputs, and runs no stateful random op (a rematerialised
               backward and a pipeline re-run the forward).

It returns a LayerReport (each figure stated and measured) and raises one
AssertionError listing every failed check with its numbers, naming the
layer by its params path when its params come from an experiment
(`task.net_tpl.units[2]`).

Example (in a pytest test of one's own layer):
  from cadence.framework import testing

  def testMyBlock():
    report = testing.CheckLayer(MyBlock.Params().Set(dim=16), [4, 16])
    print(report)      # each figure, stated and measured
"""
import collections

import numpy as np
import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import cost as cost_lib
from cadence.framework import op_cost
from cadence.framework import shapes
from cadence.framework import step_seed
from cadence.framework import validation
from cadence.framework.testing import measure

# Every check, in the report's order.
CHECKS = ('contract', 'out_shapes', 'flops', 'act', 'act_weights',
          'residuals', 'gradients', 'step_seed')
_MEMORY = (('act', 'all'), ('act_weights', 'weights'),
           ('residuals', 'residuals'))


class Figure(collections.namedtuple(
    'Figure', ['name', 'stated', 'measured', 'ok', 'note'])):
  """One check: what FPropMeta states, what FProp does, whether they agree
  (None: not checked), and how it was judged."""
  __slots__ = ()

  def Line(self):
    verdict = {True: 'ok', False: 'FAILED', None: 'not checked'}[self.ok]
    return (f'{self.name}: stated {_Text(self.stated)}, measured '
            f'{_Text(self.measured)} ({verdict}{"; " if self.note else ""}'
            f'{self.note})')


def _Text(value):
  if isinstance(value, int) and not isinstance(value, bool):
    return f'{value:,}'
  return str(value)


class LayerReport:
  """What CheckLayer found: `figures` (a Figure per check run), `failures`
  (those that disagree); str() is one line per figure."""

  def __init__(self, owner, input_shapes, figures):
    self.owner = owner
    self.input_shapes = input_shapes
    self.figures = list(figures)

  @property
  def failures(self):
    return [f for f in self.figures if f.ok is False]

  @property
  def ok(self):
    return not self.failures

  def __getitem__(self, name):
    for f in self.figures:
      if f.name == name:
        return f
    raise KeyError(f'no figure {name!r}; the report has '
                   f'{[f.name for f in self.figures]}.')

  def __str__(self):
    head = (f'{self.owner} on input(s) '
            f'{cost_lib.ShapesText(self.input_shapes)}:')
    return '\n'.join([head] + [f'  {f.Line()}' for f in self.figures])


class LayerCheckError(AssertionError):
  """FPropMeta disagrees with FProp; `report` holds every figure."""

  def __init__(self, report):
    self.report = report
    lines = [f'  - {f.Line()}' for f in report.failures]
    super().__init__(
        f'{report.owner}: {len(lines)} check(s) of FPropMeta against FProp '
        f'failed on input(s) {cost_lib.ShapesText(report.input_shapes)}:\n'
        + '\n'.join(lines))


def _Inputs(params, inputs, seed):
  """The inputs as tensors: tensors and arrays as given; a shape (a list of
  ints, shapes.Shape, TensorShape) or a float tf.TensorSpec as normal(0, 1)
  values in the layer's activation dtype (a spec's own dtype); an integer
  spec as zeros (valid ids and labels; pass a tensor for others); an int
  as it is (a static value, e.g. a sequence length)."""
  rng = np.random.default_rng(seed)
  dtype = base_layer.FPropDtype(params)
  out = []
  for i, x in enumerate(inputs):
    if isinstance(x, (tf.Tensor, tf.Variable, np.ndarray)):
      out.append(tf.convert_to_tensor(x))
      continue
    if validation.IsInt(x):   # A static value, e.g. a sequence length.
      out.append(x)
      continue
    spec = x if isinstance(x, tf.TensorSpec) else None
    try:
      shape = shapes.AsShape(spec.shape if spec is not None else x)
    except (TypeError, ValueError):
      raise ValueError(
          f'CheckLayer: input {i}={validation.ShortRepr(x, 80)} must be a '
          'tensor, an array, a shape ([4, 16]), a tf.TensorSpec or an int '
          '(a static value).') from None
    if not shape.is_fully_defined:
      raise ValueError(f'CheckLayer: input {i} has shape {list(shape)}; '
                       'give every dim (the batch too).')
    want = spec.dtype if spec is not None else dtype
    if want.is_floating:
      out.append(tf.cast(rng.normal(size=list(shape)), want))
    else:
      out.append(tf.zeros(list(shape), want))
  return out


def _ShapeLeaves(structure):
  """The shapes of a nest of tensors or of shapes (a NestedMap's leaves in
  key order), as shapes.Shape."""
  if isinstance(structure, (tf.Tensor, tf.Variable)):
    return [shapes.AsShape(structure.shape)]
  if isinstance(structure, dict):
    return [s for k in sorted(structure) for s in _ShapeLeaves(structure[k])]
  if isinstance(structure, shapes.Shape) or (
      isinstance(structure, (list, tuple)) and all(
          isinstance(d, int) or d is None for d in structure) and structure
      and not isinstance(structure[0], (list, tuple))):
    return [shapes.AsShape(structure)]
  if isinstance(structure, (list, tuple)):
    return [s for v in structure for s in _ShapeLeaves(v)]
  return []


def _Run(layer, inputs, seed):
  theta = base_layer.WithStepSeed(layer.theta, step_seed.MakeStepSeed(seed))
  return layer.FProp(theta, *inputs)


def _ProductFlops(record):
  """The products' FLOPs a record states: its ops of kinds MATMUL and
  OTHER (FLOPs a layer does not break down, costed as products: what
  cost.Complete gives a layer that states no ops), or its `flops` when it
  has no ops; and how they were read."""
  if record.ops is None:
    return record.flops, 'flops (no ops)'
  stated = 'ops' not in record.defaulted or any(
      op.kind != op_cost.OTHER for op in record.ops)
  what = 'its matmul and other ops' if stated else (
      'flops (the layer states no ops)')
  return sum(op.flops for op in op_cost.Unfused(record.ops)
             if op.kind in (op_cost.MATMUL, op_cost.OTHER)), what


def _Close(stated, measured, rtol):
  if stated is None or measured is None:
    return None
  return abs(stated - measured) <= rtol * max(abs(measured), 1)


def _Ratio(stated, measured):
  if not measured or stated is None:
    return ''
  return f'stated/measured {stated / measured:.3f}'


def _FlopsFigure(layer, specs, record, rtol):
  """The products' FLOPs `record` states against the traced graph's."""
  products, what = _ProductFlops(record)
  got = measure.Flops(layer, specs)
  if got is None:
    return ('flops', products, 'unknown', None,
            'a loop or an unknown dim: the graph does not say')
  note = (f'products: {what}, rtol {rtol}; total flops '
          f'{_Text(record.flops)}; {_Ratio(products, got)}')
  return 'flops', products, got, _Close(products, got, rtol), note.rstrip(
      '; ')


def _MemoryFigure(layer, specs, record, field, policy, outputs, rtol,
                  check_defaults):
  """`record[field]` against what the real gradient keeps (`policy`: a
  remat policy, or 'residuals'); a defaulted figure fails only with
  `check_defaults`."""
  if policy == 'residuals':
    got = measure.ResidualBytes(layer, specs, outputs)
  else:
    got = measure.SavedBytes(layer, specs, policy, outputs)
  ok = _Close(record[field], got, rtol)
  note = f'bytes, rtol {rtol}; {_Ratio(record[field], got)}'
  if field in record.defaulted:
    note = 'defaulted by cost.Complete, not stated by the layer; ' + note
    if not check_defaults and ok is False:
      ok = None
  return field, record[field], got, ok, note.rstrip('; ')


def _GradientFigure(layer, xs, outputs):
  """Whether every trainable variable gets a gradient."""
  trainable = [(k, v) for k, v in layer.vars.FlattenItems() if v.trainable]
  with tf.GradientTape() as tape:
    out = _Run(layer, xs, seed=1)
    targets = measure.FloatLeaves(outputs(out) if outputs else out)
  grads = tape.gradient(targets, [v for _, v in trainable],
                        output_gradients=[tf.ones_like(t) for t in targets])
  missing = [k for (k, _), g in zip(trainable, grads) if g is None]
  got = f'{len(trainable) - len(missing)} with a gradient' + (
      f'; none for {", ".join(missing)}' if missing else '')
  return ('gradients', f'{len(trainable)} trainable variable(s)', got,
          not missing, 'a variable FProp does not use, or reads outside '
          'theta' if missing else '')


def _SeedFigure(layer, xs, specs):
  """Whether two runs with one step seed agree, with no stateful random
  op in FProp."""
  first, again = _Run(layer, xs, seed=1), _Run(layer, xs, seed=1)
  differ = [i for i, (a, b) in enumerate(zip(tf.nest.flatten(first),
                                             tf.nest.flatten(again)))
            if not np.array_equal(np.asarray(a), np.asarray(b))]
  stateful = measure.StatefulRandomOps(layer, specs)
  got = ((f'outputs {differ} differ on a re-run' if differ else
          'identical on a re-run') +
         (f'; stateful random ops {stateful}' if stateful else ''))
  note = ('draw randomness from self.OpSeed(theta) with '
          'tf.random.stateless_* ops' if differ or stateful else '')
  return ('step_seed', 'outputs replayed by the same seed', got,
          not differ and not stateful, note)


def CheckLayer(layer_params, *inputs, flops_rtol=0.02, memory_rtol=0.05,
               outputs=None, out_shapes_of=None, checks=CHECKS,
               check_defaults=False, raise_on_failure=True):
  """Checks a layer's FPropMeta against its FProp on `inputs`.

  Args:
    layer_params: the layer's params (`MyLayer.Params().Set(...)`); its
      name may be empty. From an experiment's params tree, errors name it
      by its params path.
    *inputs: FProp's inputs: tensors or arrays, or shapes ([4, 16]) or
      tf.TensorSpecs of random values (integer specs: zeros), or ints
      (static values such as a sequence length, given to FPropMeta too).
    flops_rtol: the relative tolerance of the products' FLOPs.
    memory_rtol: the relative tolerance of act, act_weights, residuals.
    outputs: None, or fn(FProp's output) -> what training differentiates
      (the memory figures and the gradients are of it), e.g.
      `lambda out: out.total_xent`; default every floating output.
    out_shapes_of: None, or fn(FProp's output) -> the tensors FPropMeta's
      out_shapes describe, for a layer whose output holds more, e.g.
      `lambda out: (out.logits, out.per_example_xent)`; default all of it.
    checks: the names of the checks to run (CHECKS); others are reported
      as not checked.
    check_defaults: also hold to the measurement a memory figure the
      layer left to cost.Complete's default.
    raise_on_failure: raise LayerCheckError when a check fails (else only
      return the report).

  Returns:
    A LayerReport.

  Raises:
    LayerCheckError (an AssertionError): a check failed; it lists every
      failed check with its numbers.
    ValueError: for an unknown check or an input that is not one.
  """
  unknown = sorted(set(checks) - set(CHECKS))
  if unknown:
    raise ValueError(f'CheckLayer: checks={list(checks)}: unknown {unknown};'
                     f' the checks are {list(CHECKS)}.')
  owner = validation.Owner(layer_params)
  p = layer_params.Copy()
  if not p.name:
    p.name = 'layer'
  xs = _Inputs(p, inputs, seed=0)
  # FPropMeta's arguments: each tensor's shape, an int as it is.
  in_shapes = [shapes.AsShape(x.shape) if tf.is_tensor(x) else x for x in xs]
  figures = []

  def _Add(name, stated, measured, ok, note=''):
    if name not in checks:
      ok, note = None, 'skipped'
    figures.append(Figure(name, stated, measured, ok, note))

  def _Done():
    report = LayerReport(owner, in_shapes, figures)
    if raise_on_failure and report.failures:
      raise LayerCheckError(report)
    return report

  try:
    record = cost_lib.CheckRecord(p.cls.FPropMeta(p, *in_shapes), owner)
  except cost_lib.ContractError as e:
    _Add('contract', 'a cost record', 'something else', False,
         str(e).split(': ', 1)[-1])
    return _Done()
  record = cost_lib.Complete(record, in_shapes, base_layer.FPropDtype(p))
  _Add('contract', 'a cost record', type(record).__name__, True)
  layer = p.Instantiate()
  out = _Run(layer, xs, seed=1)

  # out_shapes: FProp's outputs (a NestedMap's by key).
  stated = _ShapeLeaves(tuple(record.out_shapes))
  actual = _ShapeLeaves(out_shapes_of(out) if out_shapes_of else out)
  _Add('out_shapes', cost_lib.ShapesText(stated),
       cost_lib.ShapesText(actual),
       not cost_lib.ShapeMismatch(stated, actual))

  specs = [tf.TensorSpec(x.shape, x.dtype) if tf.is_tensor(x) else x
           for x in xs]
  if 'flops' in checks:
    _Add(*_FlopsFigure(layer, specs, record, flops_rtol))
  else:
    _Add('flops', record.flops, None, None)
  for field, policy in _MEMORY:
    if field in checks:
      _Add(*_MemoryFigure(layer, specs, record, field, policy, outputs,
                          memory_rtol, check_defaults))
    else:
      _Add(field, record[field], None, None)
  _Add(*_GradientFigure(layer, xs, outputs))
  _Add(*_SeedFigure(layer, xs, specs))
  return _Done()
