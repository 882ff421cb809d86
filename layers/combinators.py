"""Layers made of other layers: SequentialLayer.

A SequentialLayer runs its sub-layers one after another. The pipeline
partitioner does not instantiate it; it asks `SequentialLayer.FlatSubParams`
for the flat list of leaf layer params and cuts that list into stages.
"""
from cadence.framework import base_layer
from cadence.framework import hyperparams
from cadence.framework import shapes


def _AsTuple(outputs):
  """A layer's outputs as a tuple of next-layer inputs."""
  return outputs if isinstance(outputs, tuple) else (outputs,)


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
    if (isinstance(p.repeat, bool) or not isinstance(p.repeat, int) or
        p.repeat < 1):
      raise ValueError(
          f"SequentialLayer '{self.path}': repeat={p.repeat!r} must be an "
          'int >= 1.')
    if not isinstance(p.sub, (list, tuple)) or not p.sub:
      raise ValueError(
          f"SequentialLayer '{self.path}': sub={p.sub!r} must be a non-empty "
          'list of layer params.')
    for i, sub in enumerate(p.sub):
      if not isinstance(sub, hyperparams.InstantiableParams):
        raise ValueError(
            f"SequentialLayer '{self.path}': sub[{i}] is a "
            f'{type(sub).__name__}; expected a layer Params() '
            '(InstantiableParams).')
    self.sub = self.CreateChildren('sub', list(p.sub) * p.repeat)

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
      outputs = layer.FProp(layer_theta, *_AsTuple(outputs))
    return outputs

  @classmethod
  def FPropMeta(cls, p, *input_shapes):
    """Chains the sub-layers' FPropMeta.

    flops = sum of the sub-layers' flops over all repeats (None if any is
    None); out_shapes = the last sub-layer's out_shapes.
    """
    flops = 0
    in_shapes = tuple(shapes.AsShape(s) for s in input_shapes)
    for sub in list(p.sub) * p.repeat:
      meta = sub.cls.FPropMeta(sub, *in_shapes)
      flops = shapes.Add(flops, meta.flops)
      in_shapes = tuple(meta.out_shapes)
    return base_layer.NestedMap(flops=flops, out_shapes=in_shapes)

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
