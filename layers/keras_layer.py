"""KerasLayer: a Keras layer or model as a Cadence layer.

Keras users bring their layers in unchanged: KerasLayer builds the Keras
object (a `keras.layers.Layer` class with `kwargs`, or a function returning
a layer or a `keras.Model`) for the input shape in its params, and exposes
its weights as the Cadence layer's `vars`. FProp runs the Keras object with
theta's values in place of its own variables (`keras.StatelessScope`), so
it is a pure function of theta like any Cadence layer: it works inside
Recurrent, as a pipeline cell (re-run for the backward pass), replicated,
and with per-micro-batch copies of theta.

Weights are built the Cadence way: eagerly, on the device in scope, by the
Keras initializers of the layer, with each random initializer re-seeded
from (random_seed, the weight's Cadence path), so equal params give equal
weights in every replica and every process. A weight's name in `vars` is
its Keras name ('kernel', 'bias') when that is unique in the layer, else
`w<i>_<name>` in the order of the layer's `weights` (Keras's own paths carry
process-wide counters, 'dense_7', and differ between copies).

Limits: Keras randomness (Dropout inside the layer) is not replayed by the
rematerialised backward, so the layer runs in inference mode (Keras's
default, training=None); put Cadence DropoutLayers between KerasLayers.
Non-trainable weights the layer updates (BatchNormalization's moving
statistics) are assigned when theta holds the variables themselves and are
an error where theta holds tensors (inside a pipeline or Recurrent).
`fprop_dtype` is not applied: give the Keras layer its dtype policy in
`kwargs` (e.g. 'dtype': 'mixed_bfloat16'). Building a KerasLayer initialises
every Keras variable still waiting for initialisation (Keras keeps one
process-wide list of them).

FPropMeta builds the Keras object once in a scratch graph (no weight values
are computed), takes the output shapes from `compute_output_shape`, and the
FLOPs from the products of the traced call (layers/graph_flops.py).

Example:
  p = KerasLayer.Params().Set(
      name='ffn', layer=keras.layers.Dense,
      kwargs={'units': 512, 'activation': 'relu'}, input_shape=(256,))
  ffn = p.Instantiate()                 # ffn.vars: kernel [256, 512], bias
  y = ffn.FProp(ffn.theta, x)           # x [batch, 256] -> y [batch, 512]
"""
import keras
import tensorflow as tf
# Keras keeps the initializer of a variable created in a StatelessScope
# until it is initialised; Cadence re-seeds it by path before that.
from keras.src.backend.common import variables as keras_variables  # pylint: disable=g-direct-tensorflow-import
from keras.src.initializers import random_initializers  # pylint: disable=g-direct-tensorflow-import

from cadence.framework import base_layer
from cadence.framework import cost
from cadence.framework import shapes
from cadence.framework import step_seed as step_seed_lib
from cadence.framework import validation
from cadence.layers import graph_flops

NestedMap = base_layer.NestedMap


# --- pure helpers ------------------------------------------------------------


def _InputShapes(owner, input_shape):
  """Params' input_shape as a list of per-input shapes (without batch).

  (16,) is one input; [(5, 16), (7, 16)] two (e.g. attention's query and
  value).
  """
  if not isinstance(input_shape, (list, tuple)) or not input_shape:
    raise validation.Error(
        owner, 'input_shape', input_shape,
        'must give the shape of one example, without the batch dim, e.g. '
        '(256,) for a Dense, (32, 32, 3) for a Conv2D; or a list of such '
        'shapes, one per input.')
  several = all(isinstance(s, (list, tuple)) for s in input_shape)
  out = [tuple(s) for s in input_shape] if several else [tuple(input_shape)]
  for s in out:
    if not all(d is None or (isinstance(d, int) and d >= 1) for d in s):
      raise validation.Error(
          owner, 'input_shape', input_shape,
          f'has {s}: dims must be ints >= 1 or None (a dim the layer does '
          'not need to build, e.g. the sequence length).')
  return out


def _Construct(owner, p):
  """Calls p.layer (a class with **p.kwargs, or a function) -> the object."""
  if p.layer is None or not callable(p.layer):
    raise validation.Error(
        owner, 'layer', p.layer,
        'must be a keras.layers.Layer class (e.g. keras.layers.Dense) or a '
        'function returning a Keras layer or keras.Model.')
  kwargs = dict(p.kwargs or {})
  try:
    obj = p.layer(**kwargs)
  except TypeError as e:
    raise validation.Error(owner, 'kwargs', kwargs,
                           f'do not fit {p.layer.__name__}: {e}') from None
  if not isinstance(obj, keras.layers.Layer):
    raise validation.Error(
        owner, 'layer', p.layer,
        f'returned a {type(obj).__name__}, not a Keras layer or model.')
  return obj


def _Build(owner, obj, input_shapes):
  """Builds `obj` for inputs [None] + each input shape, unless it is."""
  if obj.built:
    return
  batched = [(None,) + s for s in input_shapes]
  try:
    obj.build(*batched)
  except (ValueError, TypeError) as e:
    raise ValueError(f'{owner}: building {type(obj).__name__} for '
                     f'input_shape={input_shapes} failed: {e}') from None


def _WeightNames(weights):
  """The Cadence names of a Keras object's weights (see module docstring)."""
  names = [w.name for w in weights]
  if len(set(names)) == len(names) and all(n.isidentifier() for n in names):
    return names
  return [f'w{i}_{"".join(c if c.isalnum() else "_" for c in n)}'
          for i, n in enumerate(names)]


def _Reseeded(initializer, seed):
  """A copy of a random Keras initializer with an int seed; others as is."""
  if not isinstance(initializer, random_initializers.RandomInitializer):
    return initializer
  config = initializer.get_config()
  config['seed'] = seed
  return type(initializer).from_config(config)


def _InputDtypes(obj, n):
  """The dtypes a Keras object takes: its keras.Input's, int32 ids for an
  Embedding, else float32."""
  inputs = getattr(obj, 'inputs', None)
  if isinstance(obj, keras.Model) and inputs and len(inputs) == n:
    return [tf.as_dtype(x.dtype) for x in inputs]
  if isinstance(obj, keras.layers.Embedding):
    return [tf.int32] * n
  return [tf.float32] * n


def _Outputs(out):
  """Keras outputs as Cadence's: a tensor, or a tuple of them."""
  if isinstance(out, (list, tuple)):
    return tuple(out)
  return out


# --- the layer ---------------------------------------------------------------


class KerasLayer(base_layer.BaseLayer):
  """A Keras layer or model run as a Cadence layer; see the module docstring.

  Example:
    p = KerasLayer.Params().Set(name='ffn', layer=keras.layers.Dense,
                                kwargs={'units': 8}, input_shape=(4,))
    layer = p.Instantiate()
    y = layer.FProp(layer.theta, tf.ones([2, 4]))     # [2, 8]
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('layer', None, 'A keras.layers.Layer class (built as '
             'layer(**kwargs)) or a function returning a Keras layer or '
             'keras.Model (called with **kwargs).')
    p.Define('kwargs', {}, 'Keyword arguments of `layer`, a dict of '
             'params-text values (ints, floats, strings, lists).')
    p.Define('input_shape', None, 'Shape of one example of the input, '
             'without the batch dim: (256,), (seq, dim) (None for a dim the '
             'layer does not build on); a list of such shapes for several '
             'inputs (MultiHeadAttention: [query, value]). Not needed when '
             '`layer` returns a built model (keras.Input).')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    owner = validation.Owner(self)
    # Weights are created uninitialised, keeping their initializers, ...
    with keras.StatelessScope(initialize_variables=False):
      obj = _Construct(owner, p)
      if not obj.built:
        if p.input_shape is None:
          raise validation.Error(
              owner, 'input_shape', None,
              f'is needed to build {type(obj).__name__} (it has no '
              'keras.Input): the shape of one example without the batch '
              'dim, e.g. (256,).')
        _Build(owner, obj, _InputShapes(owner, p.input_shape))
    self._keras = obj
    self._weights = list(obj.weights)
    names = _WeightNames(self._weights)
    # ... then initialised here, each re-seeded by its Cadence path.
    for name, w in zip(names, self._weights):
      if getattr(w, '_initializer', None) is not None:
        w._initializer = _Reseeded(  # pylint: disable=protected-access
            w._initializer,  # pylint: disable=protected-access
            self._WeightSeed(name))
    keras_variables.initialize_all_variables()
    for name, w in zip(names, self._weights):
      self._CheckConstructing('CreateVariable', name)
      self._variables_by_name[name] = w.value   # The tf.Variable.
    self._names = names
    self._num_traces = 0

  def _WeightSeed(self, name):
    seed = ((self.params.random_seed or 0) & 0x7FFFFFFF) * 1_000_003
    return (seed + step_seed_lib.PathHash(f'{self.path}.{name}')) % (2**31)

  @property
  def keras_object(self):
    """The wrapped Keras layer or model (its variables are `vars`')."""
    return self._keras

  @property
  def num_traces(self):
    """How many times FProp ran in graph mode (traced): once per compiled
    function and input signature that calls it."""
    return self._num_traces

  def FProp(self, theta, *inputs):
    """Runs the Keras object with theta's values.

    Args:
      theta: NestedMap of this layer's weights (tensors or variables).
      *inputs: the Keras call's positional inputs, e.g. x [batch, ...] or
        (query, value) for attention.

    Returns:
      The Keras call's output: a tensor, or a tuple of tensors.
    """
    if not tf.executing_eagerly():
      self._num_traces += 1
    values = [theta[n] for n in self._names]
    mapping = [(w, tf.convert_to_tensor(v)) for w, v in
               zip(self._weights, values)]
    with keras.StatelessScope(state_mapping=mapping,
                              initialize_variables=False) as scope:
      out = self._keras(*inputs)
    for (w, before), name, var in zip(mapping, self._names, values):
      after = scope.get_current_value(w)
      if after is None or after is before:
        continue
      if not isinstance(var, tf.Variable):
        raise ValueError(
            f"KerasLayer '{self.path}': {type(self._keras).__name__} "
            f'updated its weight {name!r} ({w.path}) but theta holds a '
            'tensor there (inside a pipeline or Recurrent), so the update '
            'would be lost; use a Cadence layer for updated state.')
      var.assign(after)
    return _Outputs(out)

  @classmethod
  def FPropMeta(cls, params, *input_shapes):
    """Output shapes (compute_output_shape) and FLOPs (the call's products).

    Args:
      params: KerasLayer params.
      *input_shapes: one Shape per input, with the batch dim.

    Returns:
      cost.Cost(flops, out_shapes); flops is None if a dim a product needs
      is unknown; the bytes are cost.Complete's defaults.
    """
    owner = validation.Owner(params)
    in_shapes = [shapes.AsShape(s) for s in input_shapes]
    graph = tf.Graph()
    with graph.as_default():
      obj = _Construct(owner, params)
      if not obj.built:
        _Build(owner, obj, [tuple(s[1:]) for s in in_shapes])
      dtypes = _InputDtypes(obj, len(in_shapes))
      placeholders = [tf.compat.v1.placeholder(d, s.ToTensorShape())
                      for d, s in zip(dtypes, in_shapes)]
      first = len(graph.get_operations())
      traced = obj(*placeholders)
      flops = graph_flops.ProductFlops(graph.get_operations()[first:])
      try:
        out = obj.compute_output_shape(*[tuple(s) for s in in_shapes])
      except NotImplementedError:
        out = tf.nest.map_structure(lambda t: tuple(t.shape.as_list()),
                                    traced)
    if isinstance(out, tuple) and all(
        d is None or isinstance(d, int) for d in out):
      out_shapes = (shapes.Shape(out),)
    else:
      out_shapes = tuple(shapes.Shape(s) for s in out)
    return cost.Cost(flops=flops, out_shapes=out_shapes)

