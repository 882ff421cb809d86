"""Cutting a sequence of layers into pipeline cells of near-equal FLOPs.

`PartitionSequentialLayers` flattens a SequentialLayer / FeatureExtractionLayer
nest into its leaf layers, costs each with `FPropMeta` and cuts the list into
K contiguous groups whose largest FLOP count is as small as possible
(`BalancedPartition`, an exact dynamic programme). Each group becomes a
`FeatureExtractionLayer`, the cell type of layers/gpipe.py.

Example:
  cells = PartitionSequentialLayers(stack_params, 4, Shape([8, 128, 512]))
  # -> 4 FeatureExtractionLayer params 'cell0'..'cell3'
"""
from absl import logging

from cadence.framework import base_layer
from cadence.framework import shapes
from cadence.layers import combinators

NestedMap = base_layer.NestedMap


def AsTuple(x):
  """x as a tuple: tuples unchanged, lists converted, else (x,)."""
  return x if isinstance(x, tuple) else (tuple(x) if isinstance(x, list)
                                         else (x,))


def BalancedPartition(costs, num_parts):
  """Optimal contiguous partition of `costs` into `num_parts` parts.

  Minimises the largest part's sum (dynamic programming, O(K * L^2)); every
  part is non-empty.

  Args:
    costs: list of L non-negative numbers.
    num_parts: K, 1 <= K <= L.

  Returns:
    K + 1 boundaries [0, b_1, ..., L]: part i is costs[b_i:b_{i+1}].
  """
  n = len(costs)
  if not 1 <= num_parts <= n:
    raise ValueError(f'BalancedPartition: num_parts={num_parts} must be in '
                     f'[1, {n}] (the number of items).')
  prefix = [0]
  for c in costs:
    prefix.append(prefix[-1] + c)
  inf = float('inf')
  # best[k][j]: min max-part of costs[:j] in k parts; cut[k][j]: last start.
  best = [[inf] * (n + 1) for _ in range(num_parts + 1)]
  cut = [[0] * (n + 1) for _ in range(num_parts + 1)]
  best[0][0] = 0
  for k in range(1, num_parts + 1):
    for j in range(k, n - (num_parts - k) + 1):
      for s in range(k - 1, j):
        v = max(best[k - 1][s], prefix[j] - prefix[s])
        if v < best[k][j]:
          best[k][j], cut[k][j] = v, s
  bounds = [n]
  for k in range(num_parts, 0, -1):
    bounds.append(cut[k][bounds[-1]])
  return bounds[::-1]


def _FlattenLayers(params):
  """Flat list of leaf layer params of a (nest of) sequential layer(s)."""
  if isinstance(params, (list, tuple)):
    return [leaf for p in params for leaf in _FlattenLayers(p)]
  if issubclass(params.cls, combinators.SequentialLayer):
    return [leaf for sub in params.cls.FlatSubParams(params)
            for leaf in _FlattenLayers(sub)]
  if (issubclass(params.cls, FeatureExtractionLayer) and
      not params.num_act_inputs and not params.act_fetch_layers):
    return [leaf for sub in params.sub
            for leaf in _FlattenLayers(base_layer.InheritParams(params, sub))]
  return [params.Copy()]


def FmtShapes(in_shapes):
  """Shapes (or NestedMaps of them) as lists/dicts for error messages."""
  return [list(s) if isinstance(s, tuple) else dict(s) for s in in_shapes]


def LayerMeta(owner, what, layer_p, in_shapes):
  """layer_p.cls.FPropMeta with a clear error for a layer without one.

  `what` names the layer in the error, e.g. "layer 3 (Conv2DLayer 'conv')".
  """
  try:
    return layer_p.cls.FPropMeta(layer_p, *in_shapes)
  except NotImplementedError:
    raise ValueError(
        f'{owner}: {what} has no FPropMeta; the pipeline needs it to cost '
        'the layer and to know the shapes it passes on (inputs '
        f'{FmtShapes(in_shapes)}).') from None


def DescribeLayer(index, layer_p, name=None):
  """E.g. "layer 3 (Conv2DLayer 'conv')" for error messages."""
  return (f'layer {index} ({layer_p.cls.__name__} '
          f'{name or layer_p.name!r})')


def PartitionSequentialLayers(params, num_partitions, *shapes_in):
  """Cuts a sequence of layers into cells of near-equal FLOPs.

  Args:
    params: a layer's params, a SequentialLayer (nested and repeated ones are
      expanded), a FeatureExtractionLayer, or a list of any of these.
    num_partitions: K, the number of cells.
    *shapes_in: the first layer's input shapes (fully defined); a NestedMap
      of shapes for layers that take a NestedMap.

  Returns:
    K FeatureExtractionLayer params named 'cell0' .. 'cell{K-1}' whose
    `sub` lists run the flat layers in order; the largest cell's FLOPs are
    as small as a contiguous cut allows. Each cell's FLOP share is logged.
  """
  owner = 'PartitionSequentialLayers'
  layers = _FlattenLayers(params)
  if not isinstance(num_partitions, int) or not (
      1 <= num_partitions <= len(layers)):
    raise ValueError(
        f'{owner}: num_partitions={num_partitions!r} must be an int in [1, '
        f'{len(layers)}]: the model has {len(layers)} layers after '
        'flattening, and every partition needs at least one.')
  names = [lp.name for lp in layers]
  if len(set(names)) != len(names) or not all(names):
    for i, lp in enumerate(layers):
      lp.name = f'{lp.name or "layer"}_{i}'
  costs = []
  in_shapes = tuple(s if isinstance(s, NestedMap) else shapes.AsShape(s)
                    for s in shapes_in)
  for i, lp in enumerate(layers):
    meta = LayerMeta(owner, DescribeLayer(i, lp), lp, in_shapes)
    if meta.flops is None:
      raise ValueError(
          f'{owner}: layer {i} ({lp.name!r}) has uncountable FLOPs for input '
          f'shapes {FmtShapes(in_shapes)}; pass fully defined shapes.')
    costs.append(meta.flops)
    in_shapes = tuple(meta.out_shapes)
  bounds = BalancedPartition(costs, num_partitions)
  total = sum(costs) or 1
  cells = []
  for i in range(num_partitions):
    a, b = bounds[i], bounds[i + 1]
    share = sum(costs[a:b]) / total
    logging.info('%s: cell %d: layers %d..%d (%d), %.1f%% of %d FLOPs', owner,
                 i, a, b - 1, b - a, 100 * share, total)
    cells.append(FeatureExtractionLayer.Params().Set(
        name=f'cell{i}', sub=layers[a:b]))
  return cells


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
    where = f"FeatureExtractionLayer '{self.path}'"
    if not isinstance(p.sub, (list, tuple)) or not p.sub:
      raise ValueError(f'{where}: sub={p.sub!r} must be a non-empty list of '
                       'layer params.')
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
    """flops: the subs' sum; out_shapes: outputs, activations, fetches."""
    n_act = p.num_act_inputs
    in_shapes = tuple(input_shapes)
    main = in_shapes[:len(in_shapes) - n_act]
    acts = in_shapes[len(in_shapes) - n_act:]
    flops, fetched = 0, {}
    for i, sub in enumerate(p.sub):
      sub = base_layer.InheritParams(p, sub)
      meta = LayerMeta(f"FeatureExtractionLayer '{p.name}'",
                       DescribeLayer(i, sub), sub, main)
      flops = shapes.Add(flops, meta.flops)
      main = tuple(meta.out_shapes)
      if sub.name in p.act_fetch_layers:
        fetched[sub.name] = main[0]
    out = main + tuple(acts) + tuple(fetched[f] for f in p.act_fetch_layers)
    return NestedMap(flops=flops, out_shapes=out)
