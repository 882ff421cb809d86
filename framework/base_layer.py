"""BaseLayer: the contract every Cadence layer keeps.

A layer is built from frozen `Params`, creates its variables and children
eagerly in `__init__`, and computes with `FProp(theta, *inputs)`, a pure
function of theta (a NestedMap mirroring `vars`) and its inputs. Purity is
what lets `Recurrent` and the pipeline run a layer on micro-batches and
re-run it for the backward pass. `FPropMeta` gives the layer's cost from
shapes alone, a `cost.Cost` (out_shapes, FLOPs, the activation bytes its
backward reads): the partitioner balances stages by it, the memory estimate
counts its bytes. `FPropCost` reads it with the unset fields filled by
cost.Complete's documented defaults.

Randomness in FProp is stateless and seeded from `theta.step_seed` (see
`step_seed.py` and `WithStepSeed`).

Example:
  class Scale(BaseLayer):

    @classmethod
    def Params(cls):
      p = super().Params()
      p.Define('dim', 0, 'Depth of the input, an int.')
      return p

    def __init__(self, params):
      super().__init__(params)
      self.CreateVariable('w', WeightParams([self.params.dim]))

    def FProp(self, theta, inputs):
      return inputs * theta.w                     # [..., dim]

    @classmethod
    def FPropMeta(cls, p, inputs):
      shape = shapes.AsShape(inputs)
      return cost.Cost(flops=shape.num_elements(), out_shapes=(shape,))

  layer = Scale.Params().Set(name='scale', dim=4).Instantiate()
  y = layer(tf.ones([2, 4]))
  FPropCost(layer.params, [2, 4]).act     # 64: its input and output, float32
"""
import difflib
import sys

import tensorflow as tf

from cadence.framework import cluster as cluster_lib
from cadence.framework import cost
from cadence.framework import hyperparams
from cadence.framework.nested_map import NestedMap
from cadence.framework import shapes
from cadence.framework import step_seed as step_seed_lib
from cadence.framework import validation
from cadence.framework import weight_init

WeightInit = weight_init.WeightInit
WeightParams = weight_init.WeightParams

# The theta key under which a step seed travels (see WithStepSeed).
STEP_SEED_KEY = 'step_seed'
# Params a child copies from its parent when it left them at their default.
INHERITED_PARAMS = ('dtype', 'fprop_dtype', 'params_init', 'random_seed',
                    'is_inference')


def InheritParams(parent_params, child_params):
  """Copy of `child_params` taking the parent's INHERITED_PARAMS.

  A child inherits each of INHERITED_PARAMS that it left at its class's
  default. CreateChild applies this; the pipeline partitioner and
  SequentialLayer apply it when they flatten nested layer params.
  """
  child = child_params.Copy()
  defaults = child.cls.Params()
  for key in INHERITED_PARAMS:
    if (key in child and key in parent_params and
        child.Get(key) == defaults.Get(key)):
      child.Set(**{key: parent_params.Get(key)})
  return child


# The dtypes a layer's variables and activations may have. float16 is not
# among them: its 5-bit exponent underflows small gradients unless the loss
# is scaled, which Cadence does not do (bfloat16 keeps float32's range).
VARIABLE_DTYPES = (tf.float32, tf.float64)
FPROP_DTYPES = (None, tf.float32, tf.bfloat16)


def _DtypeName(dtype):
  return 'None' if dtype is None else f'tf.{dtype.name}'


def CheckDtypes(owner, params):
  """Raises a ValueError unless `params.dtype` is one of VARIABLE_DTYPES
  and `params.fprop_dtype` one of FPROP_DTYPES (a tf.DType, not its name),
  naming `owner`, the field, the value and the choices."""
  CheckDtype(owner, 'dtype', params.dtype, VARIABLE_DTYPES)
  CheckDtype(owner, 'fprop_dtype', params.fprop_dtype, FPROP_DTYPES,
             FLOAT16_NOTE)


# Why an activation dtype may not be tf.float16 (see FPROP_DTYPES).
FLOAT16_NOTE = (' (tf.float16 is not supported: its range underflows small '
                'gradients without loss scaling; use tf.bfloat16)')


def CheckDtype(owner, field, value, choices, note=''):
  """Raises a ValueError unless `value` is one of `choices` (tf.DTypes or
  None; a dtype's name, a str, is refused, naming the dtype meant), naming
  `owner`, `field`, the value, the choices and `note`. Returns `value`.

  Example:
    CheckDtype(owner, 'state_dtype', p.state_dtype, (None, tf.float32))
  """
  is_dtype = value is None or isinstance(value, tf.DType)
  if is_dtype and value in choices:
    return value
  names = [_DtypeName(c) for c in choices]
  rule = f'must be one of {", ".join(names)}{note}'
  hint = ''
  if isinstance(value, str):
    try:
      named = tf.as_dtype(value.rpartition('tf.')[2])
    except TypeError:
      named = None
    if named is not None and named in choices:
      hint = f' Did you mean {_DtypeName(named)} (a dtype, not a string)?'
    else:
      close = difflib.get_close_matches(value, names, n=1, cutoff=0.6)
      hint = f' Did you mean {close[0]}?' if close else ''
  text = _DtypeName(value) if is_dtype else repr(value)
  raise ValueError(f'{owner}: {field}={text} {rule}.{hint}')


def CheckBaseParams(owner, params):
  """The checks of the params every layer has (BaseLayer.Params): dtype and
  fprop_dtype (CheckDtypes), random_seed (None or an int >= 0),
  params_init (weight_init.CheckInit) and is_inference (a bool). Raises a
  ValueError naming `owner`, the field, the value and the rule."""
  CheckDtypes(owner, params)
  validation.CheckOptionalInt(owner, 'random_seed', params.random_seed,
                              low=0)
  weight_init.CheckInit(owner, 'params_init', params.params_init)
  validation.CheckBool(owner, 'is_inference', params.is_inference)


def FPropDtype(params):
  """The dtype of the activations of layer params `params` (tf.DType):
  fprop_dtype, or dtype when fprop_dtype is None."""
  return tf.as_dtype(params.fprop_dtype or params.dtype)


def FPropCost(params, *input_shapes):
  """The complete cost record of layer params `params` on `input_shapes`:
  its class's FPropMeta with the fields it leaves None filled by
  cost.Complete's documented defaults (named in `defaulted`), bytes in its
  activation dtype. The one way a consumer reads a layer's cost.

  Example:
    p = ProjectionLayer.Params().Set(name='fc', input_dim=8, output_dim=4)
    FPropCost(p, [2, 8]).bwd_flops    # 2 x its forward FLOPs
  """
  record = cost.CheckRecord(params.cls.FPropMeta(params, *input_shapes),
                            validation.Owner(params))
  return cost.Complete(record, input_shapes, FPropDtype(params))


def TracedOutShapes(params, input_shapes, dtype=None):
  """The shapes of the outputs of the layer of `params` (its FProp, with a
  step seed) on inputs of `input_shapes`, traced in a throwaway tf.Graph:
  nothing is computed or allocated. Inputs are placeholders of `dtype`
  (default: the layer's activation dtype).

  Returns:
    A list of shapes.Shape, one per output tensor (tf.nest order).
  """
  dtype = dtype or FPropDtype(params)
  with tf.Graph().as_default():
    layer = params.Copy().Set(name=params.name or 'layer').Instantiate()
    inputs = [tf.compat.v1.placeholder(dtype, shapes.AsShape(s).
                                       ToTensorShape())
              for s in input_shapes]
    theta = WithStepSeed(layer.theta, step_seed_lib.MakeStepSeed(0))
    out = layer.FProp(theta, *inputs)
    return [shapes.AsShape(t.shape) for t in tf.nest.flatten(out)]


def VariableSpecs(params):
  """[(tf.TensorShape, dtype, trainable)] of the variables of the layer of
  `params` (its name set), built in a throwaway tf.Graph: their values are
  never computed, so nothing is allocated (a unit's weights for the memory
  estimate, framework/pipeline/plan.py)."""
  with tf.Graph().as_default():
    layer = params.Instantiate()
    return [(v.shape, v.dtype.base_dtype, v.trainable)
            for v in layer.vars.Flatten()]


def AccumulationDtype(dtype):
  """The dtype of sums over many terms (a norm's statistics, a softmax
  cross-entropy) for activations of `dtype`: float64 for float64, else
  float32, so that bfloat16 activations (8 bits of mantissa) do not round
  them away."""
  return tf.float64 if tf.as_dtype(dtype) == tf.float64 else tf.float32


def WithStepSeed(theta, seed):
  """Returns a copy of `theta` carrying `seed` at every layer level.

  Args:
    theta: a layer's theta NestedMap (nested by child name).
    seed: an int64 [2] step seed (`step_seed.MakeStepSeed`, or a
      `MicroBatchSeed` inside a pipeline).

  Returns:
    A NestedMap of theta's structure plus `step_seed` in it and in each
    nested child theta. Variables are shared, not copied.
  """

  def _Attach(node):
    if isinstance(node, NestedMap):
      out = NestedMap({k: _Attach(v) for k, v in node.items()
                       if k != STEP_SEED_KEY})
      out[STEP_SEED_KEY] = seed
      return out
    if isinstance(node, (list, tuple)):
      return type(node)(_Attach(v) for v in node)
    return node

  return _Attach(theta)


class BaseLayer(tf.Module):
  """Base class of all layers; see the module docstring."""

  @classmethod
  def Params(cls):
    """The layer's hyper-parameters; subclasses extend this."""
    p = hyperparams.InstantiableParams(cls)
    p.Define('name', '', 'Name of the layer, a Python identifier; the last '
             'component of its path.')
    p.Define('dtype', tf.float32, 'Dtype of the variables.')
    p.Define('fprop_dtype', None, 'Dtype of the activations in FProp; None '
             'means `dtype`. E.g. tf.bfloat16 with float32 variables.')
    p.Define('random_seed', None, 'Int seed of the weight initialisers and of '
             'FProp randomness; None means 0.')
    p.Define('params_init', WeightInit.Xavier(1.0),
             'Default initialiser of variables that name none.')
    p.Define('is_inference', False, 'True in inference: no dropout or other '
             'training-only randomness.')
    return p

  def __init__(self, params):
    """Keeps a frozen copy of `params`; subclasses then build children/vars.

    Args:
      params: this class's `Params()`, with `name` set.
    """
    name = params.name
    if not isinstance(name, str) or not name.isidentifier():
      raise ValueError(
          f'{type(self).__name__}: params.name={name!r} must be a Python '
          'identifier (letters, digits, underscores), e.g. "encoder".')
    super().__init__(name=name)
    # A parent's CreateChild sets `_assigned_path` before __init__ runs.
    self._path = getattr(self, '_assigned_path', None) or name
    self._params = params.Copy()
    self._params.Freeze()
    CheckBaseParams(validation.Owner(self), params)
    self._children_by_name = {}
    self._variables_by_name = {}

  # --- construction ------------------------------------------------------

  def _InConstruction(self):
    """True while an `__init__` of this very object is on the call stack."""
    frame = sys._getframe(1)  # pylint: disable=protected-access
    while frame is not None:
      if (frame.f_code.co_name == '__init__' and
          frame.f_locals.get('self') is self):
        return True
      frame = frame.f_back
    return False

  def _CheckConstructing(self, what, name):
    if not self._InConstruction():
      raise RuntimeError(
          f"{type(self).__name__} '{self.path}': {what}({name!r}) is only "
          'allowed inside __init__; layers are built eagerly and are '
          'immutable afterwards.')
    if name == STEP_SEED_KEY:
      raise ValueError(
          f"{type(self).__name__} '{self.path}': the name {name!r} is "
          'reserved for the step seed carried in theta.')
    if name in self._children_by_name or name in self._variables_by_name:
      raise ValueError(
          f"{type(self).__name__} '{self.path}': a child or variable named "
          f'{name!r} already exists.')

  def _ChildParams(self, name, p):
    if not isinstance(p, hyperparams.InstantiableParams):
      raise TypeError(
          f"{type(self).__name__} '{self.path}': child {name!r} needs "
          f'InstantiableParams (a Layer.Params()), got {type(p).__name__}.')
    p = InheritParams(self._params, p)
    p.name = name
    return p

  @staticmethod
  def _Build(p, path, device):
    child = p.cls.__new__(p.cls)
    # The child learns its full path before its __init__ runs, so its own
    # variables are seeded by their full paths.
    object.__setattr__(child, '_assigned_path', path)
    with cluster_lib.DeviceScope(device):
      child.__init__(p)
    return child

  def CreateChild(self, name, p, device=None):
    """Builds child layer `name` from params `p`; only inside __init__.

    The child inherits dtype, fprop_dtype, params_init, random_seed and
    is_inference from this layer when it left them at their defaults.

    Args:
      name: the child's name, a Python identifier.
      p: the child's params.
      device: if set, the device the child's variables are created on (the
        pipeline places each cell's layers on its stage's device).

    Returns:
      The child layer, also reachable as `self.children[name]` and
      `self.<name>`.
    """
    self._CheckConstructing('CreateChild', name)
    child = self._Build(self._ChildParams(name, p), f'{self.path}.{name}',
                        device)
    self._children_by_name[name] = child
    return child

  def CreateChildren(self, name, params_list, devices=None):
    """Builds a list of children `name[0]`, `name[1]`, ...; inside __init__.

    Args:
      name: the list's name.
      params_list: one params per child.
      devices: None, or one device (or None) per child for its variables.

    Returns:
      The list of child layers, also `self.children[name]` and
      `self.<name>`.
    """
    self._CheckConstructing('CreateChildren', name)
    params_list = list(params_list)
    devices = [None] * len(params_list) if devices is None else list(devices)
    if len(devices) != len(params_list):
      raise ValueError(
          f"{type(self).__name__} '{self.path}': CreateChildren({name!r}) got "
          f'{len(devices)} devices for {len(params_list)} children.')
    children = []
    for i, (p, device) in enumerate(zip(params_list, devices)):
      cp = self._ChildParams(name, p)
      children.append(self._Build(cp, f'{self.path}.{name}[{i}]', device))
    self._children_by_name[name] = children
    return children

  def CreateVariable(self, name, var_params):
    """Creates variable `name` now, on the device in scope; inside __init__.

    Args:
      name: the variable's name inside this layer.
      var_params: `WeightParams(shape, init, dtype, trainable)`.

    Returns:
      The tf.Variable, also `self.vars[name]`.
    """
    self._CheckConstructing('CreateVariable', name)
    p = self._params
    dtype = var_params.dtype or p.dtype
    init = var_params.init or p.params_init
    var_path = f'{self.path}.{name}'
    seed = ((p.random_seed or 0) & 0x7FFFFFFF,
            step_seed_lib.PathHash(var_path))
    try:
      value = weight_init.InitialValue(init, var_params.shape, dtype, seed)
    except ValueError as e:
      raise ValueError(f"{type(self).__name__} '{var_path}': {e}") from None
    if var_params.trainable and (
        var_params.aggregation != tf.VariableAggregation.NONE):
      raise ValueError(
          f"{type(self).__name__} '{var_path}': aggregation="
          f'{var_params.aggregation} needs trainable=False; the learner '
          'keeps trained variables equal across replicas.')
    var = tf.Variable(value, name=name, trainable=var_params.trainable,
                      aggregation=var_params.aggregation,
                      synchronization=var_params.synchronization)
    self._variables_by_name[name] = var
    return var

  # --- accessors ---------------------------------------------------------

  def __getattr__(self, name):
    # Only called when normal lookup fails: children by name, as Lingvo
    # layers write `self.fc.FProp(theta.fc, x)`.
    children = self.__dict__.get('_children_by_name')
    if children is not None and name in children:
      return children[name]
    raise AttributeError(
        f"'{type(self).__name__}' object has no attribute {name!r}")

  @property
  def params(self):
    """The frozen params this layer was built from."""
    return self._params

  @property
  def path(self):
    """Unique dotted name, e.g. 'lm.stack.cells[1].ffn'."""
    return self._path

  @property
  def fprop_dtype(self):
    """The activations' dtype (`FPropDtype` of the params). Variables keep
    `dtype`; FProp casts what it reads of theta to this (mixed precision:
    float32 variables, bfloat16 activations, float32 gradients at the
    variables)."""
    return FPropDtype(self._params)

  @property
  def children(self):
    """NestedMap: child name -> layer (or list of layers)."""
    return NestedMap({k: (list(v) if isinstance(v, (list, tuple)) else v)
                      for k, v in self._children_by_name.items()})

  def _Tree(self, leaf_fn):
    out = NestedMap({k: leaf_fn(v) for k, v in
                     self._variables_by_name.items()})
    for name, child in self._children_by_name.items():
      if isinstance(child, (list, tuple)):
        out[name] = [c._Tree(leaf_fn) for c in child]  # pylint: disable=protected-access
      else:
        out[name] = child._Tree(leaf_fn)  # pylint: disable=protected-access
    return out

  @property
  def vars(self):
    """NestedMap of this layer's and its children's tf.Variables."""
    return self._Tree(lambda v: v)

  @property
  def theta(self):
    """The default theta: `vars`' structure; leaves are the variables.

    FProp reads theta leaves as tensors, so a caller may substitute any
    tensors of the same shapes (e.g. per-micro-batch copies in a pipeline).
    """
    return self.vars

  # --- computation -------------------------------------------------------

  def FProp(self, theta, *inputs):
    """Forward pass; a pure function of `theta` and `inputs`."""
    raise NotImplementedError(
        f'{type(self).__name__} does not implement FProp.')

  def FPropDefaultTheta(self, *inputs, **kwargs):
    """FProp with this layer's own variables as theta."""
    return self.FProp(self.theta, *inputs, **kwargs)

  def __call__(self, *inputs, **kwargs):
    return self.FPropDefaultTheta(*inputs, **kwargs)

  @classmethod
  def CheckParams(cls, p, owner):
    """Raises ValueError for a bad value of params `p`, from params alone.

    `owner` names the layer in the message (`validation.Owner`: of the
    layer in `__init__`, of `p` in `FPropMeta`). A subclass checks its
    params here (super first) and calls it from `__init__` and from
    `FPropMeta` before it reads a dim: FPropMeta runs on params before any
    layer is built (`BaseTask.CheckStaticShapes`), so a value of the wrong
    type or range ('512' for an int) is named there, with its params path,
    instead of failing as a shape. Here: the params every layer has
    (CheckBaseParams: dtypes, random_seed, params_init, is_inference).
    """
    CheckBaseParams(owner, p)

  @classmethod
  def FPropMeta(cls, params, *input_shapes):
    """Static cost from params and shapes alone: a `cost.Cost`.

    A layer sets out_shapes and flops, and the fields it knows exactly (the
    activation bytes `act`, `act_weights`, `residuals`, `transient`,
    `bwd_flops`, `weight_bytes`); it leaves the others None, which
    `FPropCost` fills with cost.Complete's documented defaults.

    Args:
      params: this class's params.
      *input_shapes: one `shapes.Shape` (or tuple/TensorShape) per input.

    Returns:
      A cost.Cost (see framework/cost.py).
    """
    raise NotImplementedError(
        f'{cls.__name__} does not implement FPropMeta(params, *shapes); the '
        'pipeline partitioner and FLOP accounting need it.')

  def OpSeed(self, theta, op_index=0):
    """The stateless seed, int64 [2], for random op `op_index` in FProp.

    Derived from theta's step seed, this layer's path and `random_seed`.
    Raises ValueError naming the layer if theta carries no step seed.
    """
    seed = step_seed_lib.CheckStepSeed(
        theta.get(STEP_SEED_KEY) if isinstance(theta, dict) else None,
        f"{type(self).__name__} '{self.path}'")
    if self._params.random_seed:
      seed = step_seed_lib.MicroBatchSeed(seed, self._params.random_seed)
    return step_seed_lib.LayerSeed(seed, self.path, op_index)

  def CastToFPropDtype(self, x):
    """Casts a floating tensor (or NestedMap of them) to `fprop_dtype`."""
    dtype = self.fprop_dtype

    def _Cast(v):
      v = tf.convert_to_tensor(v)
      return tf.cast(v, dtype) if v.dtype.is_floating else v

    if isinstance(x, NestedMap):
      return x.Transform(_Cast)
    return _Cast(x)
