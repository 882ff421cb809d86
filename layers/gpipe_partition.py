"""Cutting a sequence of layers into pipeline cells of near-equal cost.

`PartitionSequentialLayers` flattens a SequentialLayer / FeatureExtractionLayer
nest into its leaf layers, costs each and cuts the list into K contiguous
groups whose largest cost is as small as possible (`BalancedPartition`, an
exact dynamic programme). Each group becomes a
`combinators.FeatureExtractionLayer`, the cell type of layers/gpipe.py.

The cost of a layer (`cost`):
  'flops':    its FPropMeta FLOPs (static; the default);
  'measured': the median time of its forward + backward (a tf.function of
              FProp and the gradients of its weights and inputs) on the
              target device, after warm-up runs, on random float inputs of
              its shapes. FLOPs understate layers bound by memory traffic
              (elementwise ops, normalisations, softmaxes); time does not.
              Each cell's share of both is logged side by side.

Example:
  cells = PartitionSequentialLayers(stack_params, 4, Shape([8, 128, 512]))
  # -> 4 FeatureExtractionLayer params 'cell0'..'cell3'
  cells = PartitionSequentialLayers(stack_params, 4, Shape([8, 128, 512]),
                                    cost='measured')
"""
import statistics
import time

from absl import logging
import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import cluster as cluster_lib
from cadence.framework import shapes
from cadence.framework import step_seed
from cadence.framework import validation
from cadence.framework.pipeline import partition
from cadence.layers import combinators

NestedMap = base_layer.NestedMap
BalancedPartition = partition.BalancedPartition
COSTS = ('flops', 'measured')


def CutBoundaries(owner, splits, costs, items, int_rule):
  """The K + 1 boundaries that a `splits` param gives a list of items.

  Args:
    owner: names the params in errors (validation.Owner).
    splits: an int K (K parts of near-equal `costs`, BalancedPartition) or
      a list of K-1 increasing indices where parts 1.. start.
    costs: one non-negative cost per item.
    items: what the items are, for the error ('layer', 'unit').
    int_rule: the error's rule for an int out of [1, len(costs)].

  Returns:
    [0, b_1, ..., len(costs)].

  Raises:
    ValueError: naming owner, 'splits', the value and the rule.
  """
  n = len(costs)
  if validation.IsInt(splits):
    if not 1 <= splits <= n:
      raise validation.Error(owner, 'splits', splits, int_rule)
    return BalancedPartition(costs, splits)
  if isinstance(splits, (list, tuple)):
    bounds = [0] + list(splits) + [n]
    if all(validation.IsInt(b) for b in splits) and all(
        a < b for a, b in zip(bounds, bounds[1:])):
      return bounds
  raise validation.Error(
      owner, 'splits', splits, f'must be an int K in [1, {n}] or a list of '
      f'increasing {items} indices in (0, {n}), e.g. [{n // 2}].')


def StagesFromSplits(owner, splits, pipeline_params, num_items, items):
  """`splits` of a layer that cuts its own cells, as the pipeline's stages:
  an int K is K * stages_per_device (v stages on each device); a list of
  boundaries gives the stages itself. pipeline_params may be None (no
  pipeline).

  Raises:
    ValueError: stages_per_device is not an int >= 1 (naming the
      pipeline's params), or an int K times it leaves a cell without one
      of the `num_items` items (naming both knobs and what to lower).
  """
  if pipeline_params is None:
    return splits
  v = validation.CheckInt(validation.Owner(pipeline_params),
                          'stages_per_device',
                          pipeline_params.stages_per_device)
  if validation.IsInt(splits) and v > 1 and splits >= 1 and (
      splits * v > num_items):
    lower = (f'stages_per_device to at most {num_items // splits}'
             if num_items >= splits else f'splits to at most {num_items}')
    raise validation.Error(
        owner, 'splits', splits,
        f'with stages_per_device={v} (params '
        f'{validation.UserPath(pipeline_params.Path())!r}) makes '
        f'{splits} x {v} = {splits * v} cells, more than the {num_items} '
        f'{items}s (each cell needs a {items}); lower {lower}.')
  return splits * v if validation.IsInt(splits) else splits


class CutIntoStages:
  """Mixin of a layer whose items are cut into pipeline stages (the cells
  of its PipeliningLayer): it sets `self._bounds` (CutBoundaries) when it
  builds them.

  Example:
    class MyStack(CutIntoStages, base_layer.BaseLayer):
      def __init__(self, params):
        ...
        self._bounds = CutBoundaries(owner, p.splits, costs, 'layer', rule)
    stack.num_cells, stack.boundaries   # K, [0, b_1, ..., n]
  """

  @property
  def boundaries(self):
    """[0, b_1, ..., n]: cell c runs items boundaries[c]..[c+1]-1."""
    return list(self._bounds)

  @property
  def num_cells(self):
    return len(self._bounds) - 1


def _FlattenLayers(params):
  """Flat list of leaf layer params of a (nest of) sequential layer(s)."""
  if isinstance(params, (list, tuple)):
    return [leaf for p in params for leaf in _FlattenLayers(p)]
  if issubclass(params.cls, combinators.SequentialLayer):
    return [leaf for sub in params.cls.FlatSubParams(params)
            for leaf in _FlattenLayers(sub)]
  if (issubclass(params.cls, combinators.FeatureExtractionLayer) and
      not params.num_act_inputs and not params.act_fetch_layers):
    return [leaf for sub in params.sub
            for leaf in _FlattenLayers(base_layer.InheritParams(params, sub))]
  return [params.Copy()]


def MeasureLayer(layer_params, in_shapes, device=None, runs=5, warmup=2):
  """Median seconds of a layer's forward + backward on `device`.

  Args:
    layer_params: the layer's params (built here, with random weights).
    in_shapes: its input shapes (a tuple; NestedMaps of shapes allowed),
      fully defined; the inputs are random float32.
    device: where it runs; None: the current cluster's first device.
    runs: timed runs (the median counts); warmup: untimed runs first.
  """
  device = device or cluster_lib.Cluster.Current().DevicesInModelSplit(0)[0]

  def _Random(shape):
    return tf.random.stateless_normal(
        shapes.AsShape(shape).ToTensorShape(), [1, 2])

  with tf.device(device):
    layer = layer_params.Instantiate()
    inputs = tuple(s.Transform(_Random) if isinstance(s, NestedMap) else
                   _Random(s) for s in in_shapes)
    theta = base_layer.WithStepSeed(layer.theta, step_seed.MakeStepSeed(0))

    @tf.function(autograph=False)
    def _Step(xs):
      sources = layer.vars.Flatten() + tf.nest.flatten(xs)
      with tf.GradientTape() as tape:
        tape.watch(tf.nest.flatten(xs))
        out = layer.FProp(theta, *xs)
        loss = tf.add_n([tf.reduce_sum(o) for o in tf.nest.flatten(out)
                         if o.dtype.is_floating])
      return [g for g in tape.gradient(loss, sources) if g is not None]

    times = []
    for i in range(warmup + runs):
      start = time.perf_counter()
      tf.nest.map_structure(lambda g: g.numpy(), _Step(inputs))
      if i >= warmup:
        times.append(time.perf_counter() - start)
  return statistics.median(times)


def PartitionSequentialLayers(params, num_partitions, *shapes_in,
                              cost='flops', device=None):
  """Cuts a sequence of layers into cells of near-equal cost.

  Args:
    params: a layer's params, a SequentialLayer (nested and repeated ones are
      expanded), a FeatureExtractionLayer, or a list of any of these.
    num_partitions: K, the number of cells.
    *shapes_in: the first layer's input shapes (fully defined); a NestedMap
      of shapes for layers that take a NestedMap.
    cost: 'flops' or 'measured' (see the module docstring).
    device: where 'measured' times the layers; None: the current
      cluster's first device.

  Returns:
    K FeatureExtractionLayer params named 'cell0' .. 'cell{K-1}' whose
    `sub` lists run the flat layers in order; the largest cell's cost is
    as small as a contiguous cut allows. Each cell's FLOP share (and
    measured-time share) is logged.
  """
  owner = 'PartitionSequentialLayers'
  validation.CheckOneOf(owner, 'cost', cost, COSTS)
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
  flops, times = [], []
  in_shapes = tuple(s if isinstance(s, NestedMap) else shapes.AsShape(s)
                    for s in shapes_in)
  for i, lp in enumerate(layers):
    meta = combinators.LayerMeta(owner, combinators.DescribeLayer(i, lp), lp,
                                  in_shapes)
    if meta.flops is None:
      raise ValueError(
          f'{owner}: layer {i} ({lp.name!r}) has uncountable FLOPs for input '
          f'shapes {combinators.FmtShapes(in_shapes)}; pass fully defined '
          'shapes.')
    flops.append(meta.flops)
    if cost == 'measured':
      times.append(MeasureLayer(lp, in_shapes, device))
    in_shapes = tuple(meta.out_shapes)
  bounds = BalancedPartition(times or flops, num_partitions)
  cells = []
  for i in range(num_partitions):
    a, b = bounds[i], bounds[i + 1]
    line = (f'{owner}: cell {i}: layers {a}..{b - 1} ({b - a}), '
            f'{100 * sum(flops[a:b]) / (sum(flops) or 1):.1f}% of '
            f'{sum(flops)} FLOPs')
    if times:
      line += (f', {100 * sum(times[a:b]) / sum(times):.1f}% of '
               f'{1000 * sum(times):.1f} ms measured')
    logging.info('%s', line)
    cells.append(combinators.FeatureExtractionLayer.Params().Set(
        name=f'cell{i}', sub=layers[a:b]))
  return cells
