"""UnitsPipeline: the contract between a model and its pipeline.

A pipelined model is an ordered list of *units*, the pieces the pipeline
may cut between (a Transformer layer, a ResNet block, a layer of a user's
own). A layer that mixes in `UnitsPipeline` declares only:

  Units(p)          its units in order: each a `Unit(name, layers)`, its
                    layers `Layer(key, params[, carried])` the child at
                    `key` ('x_layers[3]', 'stem', 'units[0]') built from
                    `params`, run one after the other;
  NumCarried(p)     how many trailing FProp inputs every layer marked
                    `carried` takes unchanged (a Transformer's paddings;
                    default 0);
  ExampleShapes(p)  one example's input shapes, so that `splits=K` cuts at
                    near-equal FLOPs (None, the default: equal units);

and its `splits` and `pipeline_tpl` params. From them the mixin derives
what every pipelined model used to write by hand:

  Bounds(p)         the cut of the units into stages (framework's
                    BalancedPartition on the units' FLOPs, or `splits` as
                    indices);
  UnitCosts(p, ...) each unit's cost.Cost on the FProp inputs' shapes (the
                    layers' FPropMeta, chained), what it passes on, in bytes;
  Plan(p, ...)      the plan.PipelinePlan (PipeliningLayer.Plan): the cut,
                    the Schedule, the micro-batching; FPropMeta returns it
                    as `plan`, and the memory estimate, inspect and the
                    planner read it;
  BuildUnits()      in __init__: the pipeline child and each unit's device;
                    CreateUnitChildren() builds the children there;
  FProp, FPropStats, FPropLoss: the units as the pipeline's stages: each
                    stage runs its units on a state NestedMap(x0.., c0..[,
                    stats]) (x: the units' outputs, c: the carried inputs).

Batch norm (layers/batch_norm.py): a unit layer that is a BatchStatsLayer
runs FPropStats in training; its statistics ride in the state, keyed by
unit, [1, ...] per micro-batch, leave the pipeline concatenated to
[M, ...], and `UpdateMovingStats` applies them in micro-batch order. The
stats are passed out through the per-micro-batch loss too, so a schedule
that runs the loss inside the pipeline (1F1B, zero-bubble) trains a BN
model as GPipe does.

Example (layers/gpipe_stack.py's GPipeStack is this, with a `units`
param):
  class MyNet(gpipe_units.UnitsPipeline, base_layer.BaseLayer):
    @classmethod
    def Units(cls, p):
      return [gpipe_units.Unit(f'unit{i}', [gpipe_units.Layer(
          f'blocks[{i}]', p.block_tpl.Copy().Set(name='blocks'))])
              for i in range(p.num_blocks)]

    def __init__(self, params):
      super().__init__(params)
      self.BuildUnits()
      self.CreateUnitChildren()
"""
import collections
import functools
import re

import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import cluster as cluster_lib
from cadence.framework import cost as cost_lib
from cadence.framework import hyperparams
from cadence.framework import shapes
from cadence.framework import step_seed as step_seed_lib
from cadence.framework import validation
from cadence.framework.pipeline import plan as plan_lib
from cadence.layers import batch_norm
from cadence.layers import combinators
from cadence.layers import gpipe

NestedMap = base_layer.NestedMap

_KEY = re.compile(r'^([A-Za-z_]\w*)(?:\[(\d+)\])?$')


class Layer(collections.namedtuple('Layer', ['key', 'params', 'carried'])):
  """One layer of a unit: the owner's child at `key` ('name' or
  'name[i]'), built from `params`; `carried`: whether it takes the
  carried inputs after the state."""
  __slots__ = ()

  def __new__(cls, key, params, carried=True):
    if not _KEY.match(key):
      raise ValueError(f"Unit layer key {key!r} must be 'name' or "
                       "'name[index]'.")
    return super().__new__(cls, key, params, carried)


class Unit(collections.namedtuple('Unit', ['name', 'layers'])):
  """A unit: its name (an identifier: it keys the unit's BN statistics)
  and its Layers, run in order."""
  __slots__ = ()


class Ends(collections.namedtuple('Ends', [
    'before', 'before_inputs', 'loss', 'loss_inputs', 'loss_key'])):
  """What runs before and after a model's units, declared as layers (the
  LM's embedding, its softmax and cross-entropy): `Plan` makes the plan's
  `before` and `loss` units of them, which the memory estimate sizes,
  inspect prints and --plan_measure times (built for real). A task or a
  stack declares them; it builds and runs the layers itself.

  Attributes:
    before: [Layer] children of the owner run in order on the whole batch
      before the units (on the first stage's device), the first on
      `before_inputs`, each next one on the outputs of the one before.
    before_inputs: fn(rows) -> [(tf.TensorSpec, maxval)] of the first
      before layer's inputs on `rows` examples (maxval: ids below it;
      None: floats); None: the owner's FProp inputs, floats.
    loss: a Layer run on each micro-batch after the units: its FProp(theta,
      the last unit's outputs, *the loss_inputs) (e.g. a softmax on the
      labels), or None.
    loss_inputs: fn(rows) -> [(tf.TensorSpec, maxval)] of its inputs after
      the units' outputs (the labels).
    loss_key: the scalar its FProp returns, in a NestedMap ('' : the output
      itself).
  """
  __slots__ = ()

  def __new__(cls, before=(), before_inputs=None, loss=None,
              loss_inputs=None, loss_key='loss'):
    return super().__new__(cls, tuple(before), before_inputs, loss,
                           loss_inputs, loss_key)


def _Split(key):
  """'x_layers[3]' -> ('x_layers', 3); 'stem' -> ('stem', None)."""
  name, index = _KEY.match(key).groups()
  return name, None if index is None else int(index)


def _Get(tree, key):
  """The value at child key `key` of a theta or children NestedMap (an
  empty NestedMap for a child without variables)."""
  name, index = _Split(key)
  value = tree.get(name, NestedMap())
  return value if index is None else value[index]


def _StatsShapes(params):
  """The stats shapes of a BatchStatsLayer's params (None: no stats)."""
  if not issubclass(params.cls, batch_norm.BatchStatsLayer):
    return None
  return params.cls.StatsShapes(params)


def _Join(path, name):
  return f'{path}.{name}' if path else name


# --- derived from params: for any class with Units(p) and NumCarried(p) ------
# (UnitsPipeline's classmethods call these; an unpipelined stack that
# declares its units, transformer.TransformerStack, uses them directly.)


def _PipelineParams(cls, p):
  """The pipeline's params as the layer's children inherit them, or None
  (no pipeline_tpl, or None)."""
  del cls
  tpl = p.pipeline_tpl if 'pipeline_tpl' in p else None
  return None if tpl is None else base_layer.InheritParams(p, tpl)


def CheckPipelineTpl(owner, pipe, giver):
  """A layer's optional `pipeline_tpl` (`pipe`): None or a PipeliningLayer's
  params whose cell_tpl and before_tpl are empty, since the layer (named
  `giver` in the message, e.g. 'the stack') gives the pipeline its cells."""
  if pipe is None:
    return
  if not (isinstance(pipe, hyperparams.InstantiableParams) and
          issubclass(pipe.cls, gpipe.PipeliningLayer)):
    raise validation.Error(owner, 'pipeline_tpl', getattr(pipe, 'cls', pipe),
                           'must be a PipeliningLayer.Params() or None.')
  for field in ('cell_tpl', 'before_tpl'):
    if pipe.Get(field):
      raise validation.Error(owner, f'pipeline_tpl.{field}', pipe.Get(field),
                             f'must stay empty: {giver} gives the pipeline '
                             'its cells.')


def StateDtype(cls, p):
  """The dtype of what passes between stages (PipeliningLayer's), or the
  layer's fprop dtype without a pipeline."""
  pipe = _PipelineParams(cls, p)
  dtype = base_layer.FPropDtype(p)
  return dtype if pipe is None else pipe.cls.StateDtype(pipe, dtype)


def _Chain(cls, p, specs, state, carry, stats, history=None):
  """Runs Units `specs` of layer class `cls` statically from `state`
  shapes: ([per unit (its chained cost, the state shapes after it)], the
  BN stats shapes so far).

  `history`: a list of the (params, input shapes, cost) of the layers run
  before (from the model's inputs), to which this appends. A layer whose
  FPropMeta refuses its input shapes has those layers checked (_Blame):
  the error names the one whose FPropMeta is wrong.
  """
  out = []
  stats = NestedMap(stats)
  history = [] if history is None else history
  for spec in specs:
    records = []
    for j, layer in enumerate(spec.layers):
      lp = base_layer.InheritParams(p, layer.params)
      args = tuple(state) + (tuple(carry) if layer.carried else ())
      try:
        record = base_layer.FPropCost(lp, *args)
      except cost_lib.ContractError:
        raise
      except ValueError as e:
        raise _Blame(cls, p, history, e) from None
      records.append(record)
      history.append((lp, args, record))
      state = tuple(record.out_shapes)
      unit_stats = _StatsShapes(lp)
      if unit_stats is not None and not p.is_inference:
        stats[_StatsKey(spec, j)] = _WithMicroBatchDim(unit_stats)
    out.append((cost_lib.Chain(records), state))
  del cls
  return out, stats


def _Blame(cls, p, history, error):
  """`error`, a layer's FPropMeta refusing its input shapes, made of what
  the layers before it stated (`history`: their params, input shapes and
  costs, in order); or, when one of those states output shapes that its
  FProp (traced, nothing computed) does not give, the ContractError naming
  the first such layer and both shapes."""
  dtype = StateDtype(cls, p)
  for lp, args, record in history:
    stated = cost_lib.LeafShapes(record.out_shapes)
    try:
      traced = base_layer.TracedOutShapes(lp, args, dtype)
    except Exception:  # pylint: disable=broad-except
      return error   # A diagnosis only: a layer that does not trace so.
    if cost_lib.ShapeMismatch(stated, traced):
      return cost_lib.ShapesError(validation.Owner(lp), stated, traced, args)
  return error


def UnitCosts(cls, p, input_shapes):
  """The units of layer class `cls` (params `p`) on FProp inputs of
  `input_shapes` (their batch: one micro-batch's).

  Returns:
    ([plan.Unit] with each unit's chained cost, per unit the bytes of what
    it passes on (its outputs, the carried inputs and the BN stats so far,
    in the state dtype), the bytes of the first stage's input).
  """
  shapes_in = tuple(shapes.AsShape(s) for s in input_shapes)
  n = len(shapes_in) - cls.NumCarried(p)
  state, carry = shapes_in[:n], shapes_in[n:]
  dtype = StateDtype(cls, p)
  units, outs, stats, history = [], [], NestedMap(), []
  built = {}   # Variables of each layer params (the LM's layers: one).
  for spec in cls.Units(p):
    inputs = tuple(state) + tuple(carry)
    [(record, state)], stats = _Chain(cls, p, [spec], state, carry, stats,
                                      history)
    units.append(plan_lib.Unit(
        spec.name, record, _UnitBuild(p, spec, inputs, len(carry), dtype),
        functools.partial(_UnitVariables, p, spec, built)))
    outs.append(shapes.Add(cost_lib.Bytes(tuple(state) + tuple(carry), dtype),
                           cost_lib.Bytes(tuple(stats.Flatten()), dtype)))
  return units, outs, cost_lib.Bytes(shapes_in, dtype)


def _UnitVariables(p, spec, built):
  """[(shape, dtype, trainable)] of unit `spec`'s variables."""
  return [v for layer in spec.layers for v in _LayerVariables(p, layer, built)]


def _LayerVariables(p, layer, built):
  """base_layer.VariableSpecs of unit layer `layer` of layer params `p`,
  memoised in `built` by the params' text."""
  lp = base_layer.InheritParams(p, layer.params).Copy().Set(
      name=_Split(layer.key)[0])
  try:
    key = lp.ToText()
  except ValueError:   # A value without text form: build it each time.
    key = None
  if key is None or key not in built:
    specs = base_layer.VariableSpecs(lp)
    if key is None:
      return specs
    built[key] = specs
  return built[key]


def _UnitBuild(p, spec, input_shapes, num_carried, dtype):
  """plan.Unit's `build` of unit `spec` of layer params `p` on inputs of
  `input_shapes` (its state, then the carried ones) in `dtype`: its layers
  built for real (on the device in scope), run in order as in the
  pipeline (a BatchStatsLayer normalising with the batch's statistics, as
  in training)."""
  def _Build():
    layers = [base_layer.InheritParams(p, layer.params).Copy().Set(
        name=_Split(layer.key)[0]).Instantiate() for layer in spec.layers]
    n = len(input_shapes) - num_carried

    def _FProp(thetas, *inputs):
      xs, carry = tuple(inputs[:n]), tuple(inputs[n:])
      for built, layer, theta in zip(layers, spec.layers, thetas):
        args = xs + (carry if layer.carried else ())
        xs = combinators.AsTuple(built.FProp(theta, *args))
      return xs

    specs = [tf.TensorSpec(s.ToTensorShape(), dtype) for s in input_shapes]
    return layers, _FProp, specs, None
  return _Build


def _OwnEnds(cls, p):
  """The Ends layer class `cls` holds itself (PipelineEnds), or none."""
  return cls.PipelineEnds(p) if hasattr(cls, 'PipelineEnds') else Ends()


def _BeforeRecords(cls, p, shapes_in):
  """(the cost records of the layer's own before layers on FProp inputs
  of `shapes_in`, the units' input shapes after them)."""
  records, state = [], tuple(shapes_in)
  for layer in _OwnEnds(cls, p).before:
    record = base_layer.FPropCost(base_layer.InheritParams(p, layer.params),
                                  *state)
    records.append(record)
    state = tuple(record.out_shapes)
  return records, state


def UnitInputShapes(cls, p, input_shapes):
  """The units' input shapes given the layer's FProp inputs' (after its own
  before layers, `PipelineEnds`)."""
  return _BeforeRecords(cls, p, tuple(shapes.AsShape(s)
                                      for s in input_shapes))[1]


def Bounds(cls, p):
  """[0, b_1, ..., U]: the stages `splits` cuts the units into (an int K:
  K x stages_per_device stages of near-equal FLOPs on the class's
  ExampleShapes, or of equal units)."""
  owner = validation.Owner(p)
  n = len(cls.Units(p))
  splits = gpipe.StagesFromSplits(owner, p.splits, p.pipeline_tpl, n, cls.ITEM)
  costs = [1] * n
  example = cls.ExampleShapes(p)
  if example is not None and validation.IsInt(splits) and 1 <= splits <= n:
    costs = [u.cost.flops for u in UnitCosts(
        cls, p, UnitInputShapes(cls, p, example))[0]]
  return gpipe.CutBoundaries(owner, splits, costs, cls.ITEM,
                               cls.SplitsRule(p, n))


def _LayersUnit(name, p, layers, specs, key=None):
  """A plan.Unit of `layers` (Layers of owner params `p`) run in order on
  inputs `specs` ([(tf.TensorSpec, maxval)]): their chained cost, their
  build (for --plan_measure: the layers built for real, run in order; the
  last one's output `key` of a NestedMap, with `key`) and variables."""
  built = {}
  records, state = [], tuple(shapes.Shape(s.shape.as_list()) for s, _ in specs)
  for layer in layers:
    record = base_layer.FPropCost(base_layer.InheritParams(p, layer.params),
                                  *state)
    records.append(record)
    state = tuple(record.out_shapes)
  maxvals = [m for _, m in specs if m is not None]

  def _Build():
    built_layers = [base_layer.InheritParams(p, layer.params).Copy().Set(
        name=_Split(layer.key)[0]).Instantiate() for layer in layers]

    def _FProp(thetas, *inputs):
      out = inputs
      for built_layer, theta in zip(built_layers, thetas):
        out = combinators.AsTuple(built_layer.FProp(theta, *out))
      out = out[0] if len(out) == 1 else out
      return out[key] if key else out
    return (built_layers, _FProp, [s for s, _ in specs],
            max(maxvals) if maxvals else None)

  return plan_lib.Unit(
      name, cost_lib.Chain(records), _Build,
      lambda: [v for layer in layers
               for v in _LayerVariables(p, layer, built)])


def _EndsFns(cls, p, shapes_in, units_in, ends):
  """(before_fn, loss_fn) of the plan (plan.PipelinePlan.With) from `ends`
  of layer class `cls` (params `p`, FProp inputs of `shapes_in`, the
  units' of `units_in`)."""
  before_fn = loss_fn = None
  if ends.before:
    def before_fn(rows):
      specs = (ends.before_inputs(rows) if ends.before_inputs else
               [(tf.TensorSpec(s.WithDim(0, rows).ToTensorShape(),
                               base_layer.FPropDtype(p)), None)
                for s in shapes_in])
      return [_LayersUnit('before', p, ends.before, specs)]
  if ends.loss is not None:
    n = len(units_in) - cls.NumCarried(p)
    dtype = StateDtype(cls, p)

    def loss_fn(rows):
      pairs, _ = _Chain(cls, p, cls.Units(p), tuple(
          s.WithDim(0, rows) for s in units_in[:n]), units_in[n:],
                        NestedMap())
      outputs = [(tf.TensorSpec(s.ToTensorShape(), dtype), None)
                 for s in pairs[-1][1]]
      return _LayersUnit(_Split(ends.loss.key)[0], p, [ends.loss],
                         outputs + list(ends.loss_inputs(rows)),
                         ends.loss_key)
  return before_fn, loss_fn


def Plan(cls, p, *input_shapes, ends=None):
  """The plan.PipelinePlan of layer class `cls` (params `p`) on FProp
  inputs of these shapes (the whole batch), or None when the batch is
  unknown. Without a pipeline (no pipeline_tpl, or None): one stage of
  every unit on the whole batch, no schedule. What runs before and after
  the units (the plan's `before` and `loss`): the class's own
  (`PipelineEnds(p)`: its FProp inputs go to its own before layers), and
  what `ends` (an `Ends`, a task's) adds where the class has none."""
  shapes_in = tuple(shapes.AsShape(s) for s in input_shapes)
  batch = shapes_in[0][0] if shapes_in and shapes_in[0].rank else None
  if batch is None:
    return None
  own = _OwnEnds(cls, p)
  units_in = UnitInputShapes(cls, p, shapes_in)

  costed = {}

  def _Costs(size):
    # Once per micro-batch size: the planner re-plans every layout of a
    # size, and re-costing the units was most of a search's time.
    if size not in costed:
      units, outs, first = UnitCosts(
          cls, p, tuple(s.WithDim(0, size) for s in units_in))
      costed[size] = (tuple(units), tuple(outs), first)
    return costed[size]

  splits_path = _Join(p.Path(), 'splits') if 'splits' in p else ''
  pipe = _PipelineParams(cls, p)
  if pipe is None:
    units, outs, first = _Costs(batch)
    plan = plan_lib.PipelinePlan(
        units, [0, len(units)], None, 1, batch, None, None, outs, first,
        splits_path=splits_path, cost_fn=_Costs)
  else:
    plan = pipe.cls.Plan(pipe, Bounds(cls, p), batch, _Costs,
                         splits_path=splits_path)
  if ends is not None:   # A task's, where the class has none of its own.
    own = Ends(own.before or ends.before,
               own.before_inputs if own.before else ends.before_inputs,
               own.loss or ends.loss,
               own.loss_inputs if own.loss else ends.loss_inputs,
               own.loss_key if own.loss else ends.loss_key)
  if not own.before and own.loss is None:
    return plan
  return plan.With(*_EndsFns(cls, p, shapes_in, units_in, own))


class UnitsPipeline(gpipe.CutIntoStages):
  """Mixin of a layer made of units; see the module docstring. Mix it in
  before the layer's base class; the layer defines `splits` and
  `pipeline_tpl` (None: the units run one after the other on the whole
  batch). `boundaries` and `num_cells` (CutIntoStages) are its cut."""

  # What `splits` counts, for errors ('unit'; a Transformer stack: 'layer').
  ITEM = 'unit'

  # --- what a model declares -------------------------------------------------

  @classmethod
  def Units(cls, p):
    """[Unit] of params `p`, in order."""
    raise NotImplementedError(f'{cls.__name__} must declare Units(p).')

  @classmethod
  def NumCarried(cls, p):
    """How many trailing FProp inputs the carried layers take unchanged."""
    del p
    return 0

  @classmethod
  def ExampleShapes(cls, p):
    """One example's FProp input shapes (batch 1) to cut by FLOPs, or None
    (units of equal cost)."""
    del p
    return None

  @classmethod
  def PipelineEnds(cls, p):
    """The `Ends` (what runs before and after the units, as layers) the
    layer holds itself; default none (a task declares its own, Plan's
    `ends`)."""
    del p
    return Ends()

  @classmethod
  def SplitsRule(cls, p, num_units):
    """The rule an int `splits` out of range breaks, for its error."""
    del p
    return (f'must be in [1, {num_units}]; each stage needs a '
            f'{cls.ITEM}.')

  # --- derived from params (the module functions, for this class) -----------

  @classmethod
  def StateDtype(cls, p):
    return StateDtype(cls, p)

  @classmethod
  def UnitCosts(cls, p, input_shapes):
    return UnitCosts(cls, p, input_shapes)

  @classmethod
  def Bounds(cls, p):
    return Bounds(cls, p)

  @classmethod
  def Plan(cls, p, *input_shapes, ends=None):
    return Plan(cls, p, *input_shapes, ends=ends)

  @classmethod
  def FPropMeta(cls, p, *input_shapes):
    """The units' chained cost on the whole batch (`out_shapes`: the last
    unit's outputs), with the `plan` (Plan). Its bytes are the units'
    unpipelined (as exact as theirs); pipelined, what each stage keeps is
    the memory estimate's, from the plan."""
    cls.CheckParams(p, validation.Owner(p))
    before, shapes_in = _BeforeRecords(cls, p, tuple(
        shapes.AsShape(s) for s in input_shapes))
    n = len(shapes_in) - cls.NumCarried(p)
    pairs, _ = _Chain(cls, p, cls.Units(p), shapes_in[:n], shapes_in[n:],
                      NestedMap())
    total = cost_lib.Chain(before + [record for record, _ in pairs])
    return total.Replace(plan=cls.Plan(p, *input_shapes))

  # --- construction ----------------------------------------------------------

  def BuildUnits(self):
    """In __init__, after the params checks: the cut (`self._bounds`), the
    pipeline child `pipeline` (pipeline_tpl set), and each unit's device
    (`UnitDevice`)."""
    p = self.params
    self._units = self.Units(p)
    self._bounds = self.Bounds(p)
    # (unit, layer, input shapes) -> its FProp's output shapes, checked
    # against its FPropMeta's at the first trace (_CheckOutShapes).
    self._checked_shapes = {}
    k = len(self._bounds) - 1
    stage_devices = [None] * k
    if p.pipeline_tpl is not None:
      if p.pipeline_tpl.batch_dim != 0:
        raise validation.Error(
            validation.Owner(p.pipeline_tpl), 'batch_dim',
            p.pipeline_tpl.batch_dim, f'must be 0: the units of '
            f'{type(self).__name__} are batch-major.')
      pipe = self.CreateChild('pipeline', p.pipeline_tpl.Copy().Set(
          nested_map_fprop=True))
      pipe.CheckNumCells(
          k, _Join(p.Path(), 'splits') if 'splits' in p else '',
          len(self._units))
      stage_devices = pipe.StageDevices(k)
    self._unit_devices = [stage_devices[s] for s in range(k)
                          for _ in range(self._bounds[s], self._bounds[s + 1])]

  def UnitDevice(self, u):
    """The device of unit u's variables (its stage's; None unpipelined)."""
    return self._unit_devices[u]

  def CreateUnitChildren(self):
    """Builds every unit layer's child at its key, on its unit's device (a
    'name[i]' key: the i-th of the list child `name`)."""
    lists, singles = collections.OrderedDict(), []
    for u, spec in enumerate(self._units):
      for layer in spec.layers:
        name, index = _Split(layer.key)
        if index is None:
          singles.append((name, layer.params, self.UnitDevice(u)))
        else:
          lists.setdefault(name, {})[index] = (layer.params,
                                                self.UnitDevice(u))
    for name, items in lists.items():
      if sorted(items) != list(range(len(items))):
        raise ValueError(f'{validation.Owner(self)}: the units name '
                         f'{name}[i] for i in {sorted(items)}; expected 0.. '
                         f'{len(items) - 1}.')
      self.CreateChildren(name, [items[i][0] for i in range(len(items))],
                          devices=[items[i][1] for i in range(len(items))])
    for name, params, device in singles:
      self.CreateChild(name, params, device=device)

  @property
  def input_device(self):
    """The first stage's device (where a task puts what feeds the units)."""
    return self.UnitDevice(0)

  @property
  def output_device(self):
    """The last stage's device (where a task puts what reads them)."""
    return self.UnitDevice(len(self._units) - 1)

  # --- the stages ------------------------------------------------------------

  def _UnitTheta(self, theta, u):
    return NestedMap({f'l{j}': _Get(theta, layer.key)
                      for j, layer in enumerate(self._units[u].layers)})

  def _RunUnit(self, u, theta, xs, carry, stats):
    """Unit u on state tensors `xs` and the carried ones; its BN stats go
    into `stats`. Returns the new state tensors, a tuple."""
    spec = self._units[u]
    for j, layer in enumerate(spec.layers):
      child = _Get(self.children, layer.key)
      args = tuple(xs) + (tuple(carry) if layer.carried else ())
      th = theta[f'l{j}']
      if (isinstance(child, batch_norm.BatchStatsLayer) and
          not self.params.is_inference):
        out, unit_stats = child.FPropStats(th, *args)
        if unit_stats is not None:   # [...] -> [1, ...], no gradient.
          stats[_StatsKey(spec, j)] = tf.nest.map_structure(
              lambda s: tf.stop_gradient(s)[tf.newaxis], unit_stats)
      else:
        out = child.FProp(th, *args)
      self._CheckOutShapes((u, j), child, args, out)
      xs = combinators.AsTuple(out)
    return xs

  def _CheckOutShapes(self, key, child, args, out):
    """At the first trace of unit layer `child` on inputs of these shapes:
    raises cost.ContractError naming it and both shapes unless its
    FPropMeta's out_shapes are its FProp's outputs' (`out`) on `args`."""
    outs = tf.nest.flatten(out)
    if any(t.shape.rank is None for t in list(args) + outs):
      return
    self._CheckShapes(key, child, [shapes.AsShape(a.shape) for a in args],
                      [shapes.AsShape(t.shape) for t in outs])

  def _CheckShapes(self, key, child, in_shapes, actual):
    """Compares `actual`, the output shapes of unit layer `child`'s FProp
    on `in_shapes`, with its FPropMeta's (once per key and shapes)."""
    key += (tuple(in_shapes),)
    if key in self._checked_shapes:
      return
    stated = cost_lib.LeafShapes(
        base_layer.FPropCost(child.params, *in_shapes).out_shapes)
    if cost_lib.ShapeMismatch(stated, actual):
      raise cost_lib.ShapesError(validation.Owner(child), stated, actual,
                                 in_shapes)
    self._checked_shapes[key] = actual

  def _CheckPipelinedShapes(self, theta, inputs):
    """Before the pipeline's first trace (`inputs`: the units', after the
    layer's own before layers): it sizes each stage's state by
    the units' FPropMeta, so every unit layer's FProp is traced first on
    one micro-batch's shapes (in a tf.function of its own: nothing enters
    the step's graph) and checked against its FPropMeta (_CheckShapes);
    once per input shapes."""
    pipe = self.pipeline
    if any(x.shape.rank is None or x.shape[0] is None for x in inputs):
      return
    _, size = pipe.MicroBatching(pipe.params, inputs[0].shape[0],
                                 validation.Owner(pipe))
    dtype = self.StateDtype(self.params)
    n = len(inputs) - self.NumCarried(self.params)
    mb = [shapes.AsShape(x.shape).WithDim(0, size) for x in inputs]
    xs, carry = mb[:n], mb[n:]
    seed = step_seed_lib.MakeStepSeed(0)
    for u, spec in enumerate(self._units):
      for j, layer in enumerate(spec.layers):
        args = list(xs) + (list(carry) if layer.carried else [])
        key = (u, j, tuple(args))
        if key not in self._checked_shapes:
          child = _Get(self.children, layer.key)
          th = base_layer.WithStepSeed(_Get(theta, layer.key), seed)
          traced = tf.function(
              lambda *a, child=child, th=th: child.FProp(th, *a),
              autograph=False).get_concrete_function(
                  *[tf.TensorSpec(a.ToTensorShape(), dtype) for a in args])
          self._CheckShapes(
              (u, j), child, args, [shapes.AsShape(t.shape) for t in
                                    tf.nest.flatten(traced.structured_outputs)])
        xs = self._checked_shapes[key]

  def _StageFProp(self, s, theta, state):
    """Stage s on its input state NestedMap(x0.., c0..[, stats])."""
    xs, carry = _Unpack(state)
    stats = NestedMap(state.get('stats') or {})
    for u in range(self._bounds[s], self._bounds[s + 1]):
      xs = self._RunUnit(u, theta[f'u{u}'], xs, carry, stats)
    return _Pack(xs, carry, stats)

  def _StageMeta(self, s, state):
    """Stage s's cost on state shapes (what the pipeline sizes its state
    by): its units' chained cost, out_shapes the state it passes on."""
    xs, carry = _Unpack(state)
    pairs, stats = _Chain(
        type(self), self.params,
        self._units[self._bounds[s]:self._bounds[s + 1]], xs, carry,
        NestedMap(state.get('stats') or {}))
    record = cost_lib.Chain([r for r, _ in pairs])
    return record.Replace(out_shapes=(_Pack(pairs[-1][1], carry, stats),))

  def _Cells(self, theta):
    """The stages as the pipeline's cells (gpipe.PipelineCell)."""
    cells = []
    for s in range(len(self._bounds) - 1):
      th = NestedMap({f'u{u}': self._UnitTheta(theta, u) for u in range(
          self._bounds[s], self._bounds[s + 1])})
      cells.append(gpipe.PipelineCell(
          fprop=functools.partial(self._StageFProp, s), theta=th,
          meta=functools.partial(self._StageMeta, s)))
    return cells

  def _Inputs(self, inputs):
    """FProp's inputs as the first state, floats in fprop_dtype."""
    n = len(inputs) - self.NumCarried(self.params)
    return _Pack([self.CastToFPropDtype(x) for x in inputs[:n]],
                 inputs[n:], NestedMap())

  def _Before(self, theta, inputs):
    """The layer's own before layers (PipelineEnds) on its FProp inputs,
    in order on the first stage's device: the units' inputs."""
    layers = self.PipelineEnds(self.params).before
    if not layers:
      return inputs
    with cluster_lib.DeviceScope(self.input_device):
      for layer in layers:
        inputs = combinators.AsTuple(_Get(self.children, layer.key).FProp(
            _Get(theta, layer.key), *inputs))
    return inputs

  def _RunStages(self, theta, inputs):
    """(the last unit's outputs, a tuple; the stats or None)."""
    cells = self._Cells(theta)
    inputs = self._Before(theta, inputs)
    state = self._Inputs(inputs)
    if self.params.pipeline_tpl is None:
      for cell in cells:
        state = cell.fprop(cell.theta, state)
    else:
      self._CheckPipelinedShapes(theta, inputs)
      state = self.pipeline.FPropCells(
          cells, state, step_seed=theta.get(base_layer.STEP_SEED_KEY))
    xs, _ = _Unpack(state)
    return xs, state.get('stats') or None

  @tf.autograph.experimental.do_not_convert
  def FPropStats(self, theta, *inputs):
    """(the last unit's outputs, the units' BN stats: NestedMap unit ->
    [M, ...] per micro-batch, or None); FProp's inputs."""
    xs, stats = self._RunStages(theta, inputs)
    return (xs[0] if len(xs) == 1 else xs), stats

  @tf.autograph.experimental.do_not_convert
  def FProp(self, theta, *inputs):
    """The units in order (pipelined over the stages): their outputs."""
    return self.FPropStats(theta, *inputs)[0]

  @tf.autograph.experimental.do_not_convert
  def FPropLossStats(self, theta, *inputs, loss, side_inputs):
    """The units, then `loss` on each micro-batch, as the pipeline's
    schedule needs (PipeliningLayer.FPropLoss); also the units' BN stats.

    Args:
      theta: this layer's theta (its step seed seeds the micro-batches).
      *inputs: FProp's inputs.
      loss: a gpipe.PipelineCell whose fprop(theta, outputs, side) returns
        a NestedMap with a scalar `loss` (the micro-batch's sum), other
        scalars (sums) and [mb, ...] tensors; outputs: the last unit's
        (a tensor, or a tuple).
      side_inputs: NestedMap of [batch, ...] tensors (labels), cut into
        micro-batches; the loss's `side`.

    Returns:
      (the loss's NestedMap: scalars summed over micro-batches, tensors
      concatenated; the stats, as FPropStats).
    """
    def _Loss(th, state, side):
      xs, _ = _Unpack(state)
      out = loss.fprop(th, xs[0] if len(xs) == 1 else xs, side)
      if state.get('stats'):   # Out through the loss: [1, ...] each.
        out = NestedMap(out)
        out[_STATS_OUT] = state.stats
      return out

    if self.params.pipeline_tpl is None:
      xs, stats = self._RunStages(theta, inputs)
      return loss.fprop(loss.theta, xs[0] if len(xs) == 1 else xs,
                        side_inputs), stats
    inputs = self._Before(theta, inputs)
    self._CheckPipelinedShapes(theta, inputs)
    out = self.pipeline.FPropLoss(
        self._Cells(theta), gpipe.PipelineCell(
            fprop=_Loss, theta=loss.theta, meta=None),
        self._Inputs(inputs), side_inputs=side_inputs,
        step_seed=theta.get(base_layer.STEP_SEED_KEY))
    stats = out.pop(_STATS_OUT, None)
    return out, stats

  def FPropLoss(self, theta, *inputs, loss, side_inputs):
    """FPropLossStats' loss NestedMap alone."""
    return self.FPropLossStats(theta, *inputs, loss=loss,
                               side_inputs=side_inputs)[0]

  def UpdateMovingStats(self, stats):
    """Applies FPropStats' stats ([M, ...] per micro-batch) to each unit's
    BN layers, one update per micro-batch in order; once per step."""
    for spec in self._units:
      for j, layer in enumerate(spec.layers):
        key = _StatsKey(spec, j)
        if stats and key in stats:
          _Get(self.children, layer.key).UpdateMovingStats(stats[key])


def FindUnitsLayer(root):
  """The first UnitsPipeline layer in the tree of built layer `root`
  (depth first, itself included), or None."""
  todo = [root]
  while todo:
    layer = todo.pop(0)
    if isinstance(layer, UnitsPipeline):
      return layer
    for child in layer.children.values():
      todo.extend(child if isinstance(child, list) else [child])
  return None


def UnitOfVariables(root):
  """{variable path: unit index} of the units' variables of the first
  UnitsPipeline layer under built layer `root`, the paths as `root.path`
  joined with `root.vars.FlattenItems()` keys ('lm.stack.x_layers[3]....');
  {} without one."""
  layer = FindUnitsLayer(root)
  if layer is None:
    return {}
  prefixes = [(f'{layer.path}.{spec_layer.key}', u)
              for u, spec in enumerate(layer._units)   # pylint: disable=protected-access
              for spec_layer in spec.layers]
  out = {}
  for key, _ in root.vars.FlattenItems():
    path = f'{root.path}.{key}'
    for prefix, u in prefixes:
      if path.startswith(prefix + '.'):
        out[path] = u
        break
  return out


# The key the stats travel under through a per-micro-batch loss's outputs.
_STATS_OUT = 'units_bn_stats'


def _StatsKey(spec, j):
  """The stats key of layer j of unit `spec`: the unit's name for its
  first layer ('block3'), with '_<j>' after."""
  return spec.name if j == 0 else f'{spec.name}_{j}'


def _WithMicroBatchDim(stats_shapes):
  """[...] stats shapes -> [1, ...] (one micro-batch's)."""
  if isinstance(stats_shapes, NestedMap):
    return stats_shapes.Transform(lambda s: shapes.Shape([1] + list(s)))
  return shapes.Shape([1] + list(stats_shapes))


def _Pack(xs, carry, stats):
  """The stage state NestedMap(x0.., c0..[, stats])."""
  state = NestedMap({f'x{i}': x for i, x in enumerate(xs)})
  state.update({f'c{i}': c for i, c in enumerate(carry)})
  if stats:
    state.stats = stats
  return state


def _Unpack(state):
  """(the x tensors, the carried ones) of a stage state, in order."""
  def _Ordered(prefix):
    keys = sorted((k for k in state if re.match(rf'^{prefix}\d+$', k)),
                  key=lambda k: int(k[1:]))
    return tuple(state[k] for k in keys)
  return _Ordered('x'), _Ordered('c')
