"""Layers made of other layers: SequentialLayer, FeatureExtractionLayer.

A SequentialLayer runs its sub-layers one after another. The pipeline
partitioner does not instantiate it; it asks `SequentialLayer.FlatSubParams`
for the flat list of leaf layer params and cuts that list into stages.
A FeatureExtractionLayer also runs sub-layers in order and can pass
activations through and fetch intermediate ones: it is the pipeline's cell
type (layers/gpipe.py), as in Lingvo.

`LayerMeta`, `LayerCost`, `DescribeLayer` and `FmtShapes` are the shared
pieces of chaining sub-layers' FPropMeta with clear errors. A chain's cost
record is the cost.Chain of its sub-layers' complete records.
"""
from cadence.framework import base_layer
from cadence.framework import cost
from cadence.framework import hyperparams
from cadence.framework import shapes
from cadence.framework import validation

NestedMap = base_layer.NestedMap


def AsTuple(x):
  """x as a tuple: tuples unchanged, lists converted, else (x,)."""
  return x if isinstance(x, tuple) else (tuple(x) if isinstance(x, list)
                                         else (x,))


def FmtShapes(in_shapes):
  """Shapes (or NestedMaps of them) as lists/dicts for error messages."""
  return [list(s) if isinstance(s, tuple) else dict(s) for s in in_shapes]


def LayerMeta(owner, what, layer_p, in_shapes):
  """layer_p.cls.FPropMeta with a clear error for a layer without one, and
  its cost-record contract checked (cost.CheckRecord).

  `what` names the layer in the error, e.g. "layer 3 (Conv2DLayer 'conv')".
  """
  try:
    return cost.CheckRecord(layer_p.cls.FPropMeta(layer_p, *in_shapes),
                            validation.Owner(layer_p))
  except NotImplementedError:
    raise ValueError(
        f'{owner}: {what} has no FPropMeta; the pipeline needs it to cost '
        'the layer and to know the shapes it passes on (inputs '
        f'{FmtShapes(in_shapes)}).') from None


def LayerCost(owner, what, layer_p, in_shapes):
  """LayerMeta's record completed as base_layer.FPropCost completes it
  (cost.Complete's defaults, in layer_p's activation dtype)."""
  return cost.Complete(LayerMeta(owner, what, layer_p, in_shapes),
                       tuple(in_shapes), base_layer.FPropDtype(layer_p))


def CheckSubParams(owner, sub):
  """Raises unless `sub` is a non-empty list of layer params."""
  if not isinstance(sub, (list, tuple)) or not sub:
    raise validation.Error(owner, 'sub', sub,
                           'must be a non-empty list of layer params.')
  for i, p in enumerate(sub):
    if not isinstance(p, hyperparams.InstantiableParams):
      raise validation.Error(owner, f'sub[{i}]', p, 'must be a layer '
                             'Params() (InstantiableParams).')


def DescribeLayer(index, layer_p, name=None):
  """E.g. "layer 3 (Conv2DLayer 'conv')" for error messages."""
  return (f'layer {index} ({layer_p.cls.__name__} '
          f'{name or layer_p.name!r})')


class SequentialLayer(base_layer.BaseLayer):
  """Runs `sub` layers in order, `repeat` times, each with its own weights.

  FProp threads values: the inputs of layer i+1 are the outputs of layer i;
  a layer returning a tuple feeds its items as separate inputs, a layer
  returning one tensor feeds one input. The last layer's outputs are
  returned as it returned them.

  Children are the list `sub` of len(p.sub) * p.repeat layers (paths
  'name.sub[0]', 'name.sub[1]', ...), in execution order.

  Example:
    p = SequentialLayer.Params().Set(
        name='mlp', repeat=2,
        sub=[ProjectionLayer.Params().Set(name='proj', input_dim=8,
                                          output_dim=8, activation='RELU')])
    mlp = p.Instantiate()     # two ProjectionLayers with separate weights
    y = mlp(tf.ones([4, 8]))  # [4, 8]
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('sub', [], 'List of layer params run in order; names need not '
             'be unique.')
    p.Define('repeat', 1, 'Number of times the `sub` list is repeated, each '
             'repetition with separate weights.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CheckParams(p, validation.Owner(self))
    self.sub = self.CreateChildren('sub', list(p.sub) * p.repeat)

  @classmethod
  def CheckParams(cls, p, owner):
    super().CheckParams(p, owner)
    validation.CheckInt(owner, 'repeat', p.repeat)
    CheckSubParams(owner, p.sub)

  def FProp(self, theta, *inputs):
    """Runs the sub-layers in order.

    Args:
      theta: NestedMap with `sub`, a list of the children's thetas.
      *inputs: the first sub-layer's inputs.

    Returns:
      The last sub-layer's outputs (a tensor or a tuple).
    """
    outputs = inputs
    for layer, layer_theta in zip(self.sub, theta.sub):
      outputs = layer.FProp(layer_theta, *AsTuple(outputs))
    return outputs

  @classmethod
  def FPropMeta(cls, p, *input_shapes):
    """Chains the sub-layers' FPropMeta: the cost.Chain of their complete
    records (base_layer.FPropCost) over all repeats.

    flops = sum of the sub-layers' flops over all repeats (None if any is
    None); out_shapes = the last sub-layer's out_shapes.
    Its bytes are as exact as its parts': parts left on cost.Complete's
    defaults (act_outputs 0) count the tensor between two of them twice.
    Measured (tests/layers/layer_contract_test.py, two ProjectionLayers
    [2, 8] -> 16 RELU -> 8): act and act_weights 384 stated, 192 kept.
    """
    cls.CheckParams(p, validation.Owner(p))
    records = []
    in_shapes = tuple(shapes.AsShape(s) for s in input_shapes)
    for sub in list(p.sub) * p.repeat:
      records.append(base_layer.FPropCost(sub, *in_shapes))
      in_shapes = tuple(records[-1].out_shapes)
    return cost.Chain(records)

  @classmethod
  def FlatSubParams(cls, p):
    """The flat list of leaf layer params that this layer runs, in order.

    Repeats are unrolled and nested SequentialLayers are expanded
    recursively, so running the returned layers one after another (threading
    outputs as FProp does) computes the same function with the same number
    of weights. Each returned params is a copy that inherits dtype,
    fprop_dtype, params_init, random_seed and is_inference from the
    enclosing SequentialLayer(s) as CreateChild would. Names stay
    identifiers and are unique when the names inside each `sub` list are:
    '<sub name>' (or 'layer<i>' if unset) with '_<repeat index>' appended
    when repeat > 1, prefixed by '<nested sequential name>_' for the leaves
    of a nested SequentialLayer.

    Args:
      p: a SequentialLayer params (or a subclass's).

    Returns:
      A list of InstantiableParams of non-SequentialLayer layers.
    """
    flat = []
    for r in range(p.repeat):
      for i, sub in enumerate(p.sub):
        sub = base_layer.InheritParams(p, sub)
        sub.name = sub.name or f'layer{i}'
        suffix = f'_{r}' if p.repeat > 1 else ''
        if issubclass(sub.cls, SequentialLayer):
          for leaf in sub.cls.FlatSubParams(sub):
            leaf.name = f'{sub.name}{suffix}_{leaf.name}'
            flat.append(leaf)
        else:
          sub.name = f'{sub.name}{suffix}'
          flat.append(sub)
    return flat


class FeatureExtractionLayer(base_layer.BaseLayer):
  """Runs `sub` layers in sequence; can fetch and forward activations.

  FProp(theta, *inputs): the last `num_act_inputs` inputs are activations
  passed through untouched; the others feed the first sub-layer, whose
  outputs feed the next, and so on. Returned: the last sub-layer's outputs,
  then the passed-through activations, then the first output of each layer
  named in `act_fetch_layers` (so num_act_outputs = num_act_inputs +
  len(act_fetch_layers)). Without activations it returns exactly what the
  last sub-layer returned.

  Example:
    p = FeatureExtractionLayer.Params().Set(
        name='cell0', act_fetch_layers=['conv0'], num_act_outputs=1,
        sub=[Conv2DLayer.Params().Set(name='conv0', filter_shape=[3, 3, 1, 4]),
             Conv2DLayer.Params().Set(name='conv1', filter_shape=[3, 3, 4, 4])])
    y, conv0_out = p.Instantiate()(tf.ones([2, 8, 8, 1]))
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('sub', [], 'List of layer params run in order; unique names.')
    p.Define('num_act_inputs', 0, 'Number of trailing inputs that are '
             'activations to pass through.')
    p.Define('num_act_outputs', 0, 'Number of trailing outputs that are '
             'activations: num_act_inputs + len(act_fetch_layers).')
    p.Define('act_fetch_layers', [], 'Names of sub-layers whose (first) '
             'output is appended to the outputs.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    where = validation.Owner(self)
    CheckSubParams(where, p.sub)
    names = [s.name for s in p.sub]
    if len(set(names)) != len(names):
      raise ValueError(f'{where}: sub-layer names {names} must be unique.')
    fetch = list(p.act_fetch_layers or [])
    for f in fetch:
      if f not in names:
        raise ValueError(f'{where}: act_fetch_layers has {f!r}, which is not '
                         f'a sub-layer; sub-layers are {names}.')
    if p.num_act_inputs < 0 or (
        p.num_act_outputs != p.num_act_inputs + len(fetch)):
      raise ValueError(
          f'{where}: num_act_outputs={p.num_act_outputs} must equal '
          f'num_act_inputs={p.num_act_inputs} + len(act_fetch_layers)='
          f'{len(fetch)} (and num_act_inputs >= 0).')
    self._subs = [(s.name, self.CreateChild(s.name, s)) for s in p.sub]

  def FProp(self, theta, *inputs):
    """Runs the sub-layers; see the class docstring for the outputs."""
    p = self.params
    n_act = p.num_act_inputs
    if len(inputs) <= n_act:
      raise ValueError(
          f"FeatureExtractionLayer '{self.path}': got {len(inputs)} inputs; "
          f'need more than num_act_inputs={n_act}.')
    main = inputs[:len(inputs) - n_act]
    acts = tuple(inputs[len(inputs) - n_act:])
    fetched = {}
    out = main
    for name, layer in self._subs:
      out = layer.FProp(theta[name], *AsTuple(out))
      if name in p.act_fetch_layers:
        fetched[name] = AsTuple(out)[0]
    if not n_act and not p.act_fetch_layers:
      return out
    return AsTuple(out) + acts + tuple(fetched[f]
                                        for f in p.act_fetch_layers)

  @classmethod
  def FPropMeta(cls, p, *input_shapes):
    """The cost.Chain of the subs' complete records (flops: their sum);
    out_shapes: outputs, activations, fetches.
    Its bytes are as exact as its parts': parts left on cost.Complete's
    defaults (act_outputs 0) count the tensor between two of them twice.
    Measured (tests/layers/layer_contract_test.py, two ProjectionLayers
    [2, 8] -> 16 RELU -> 8): act and act_weights 384 stated, 192 kept.
    """
    n_act = p.num_act_inputs
    in_shapes = tuple(input_shapes)
    main = in_shapes[:len(in_shapes) - n_act]
    acts = in_shapes[len(in_shapes) - n_act:]
    records, fetched = [], {}
    for i, sub in enumerate(p.sub):
      sub = base_layer.InheritParams(p, sub)
      records.append(LayerCost(f"FeatureExtractionLayer '{p.name}'",
                               DescribeLayer(i, sub), sub, main))
      main = tuple(records[-1].out_shapes)
      if sub.name in p.act_fetch_layers:
        fetched[sub.name] = main[0]
    out = main + tuple(acts) + tuple(fetched[f] for f in p.act_fetch_layers)
    return cost.Chain(records).Replace(out_shapes=out)
