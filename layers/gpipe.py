"""GPipe: pipeline model parallelism over the devices of a model split.

Huang et al., 2019, "GPipe: Efficient Training of Giant Neural Networks
using Pipeline Parallelism", arXiv:1811.06965.

A model that is a sequence of layers is cut into K *cells* (contiguous
groups of layers of near-equal FLOPs, `PartitionSequentialLayers`); cell i
lives on device i % D of the current model split (`cluster.Cluster`). The
batch is split into M micro-batches and the cells process them as a
wavefront (`framework.stacked_recurrent`): cell i works on micro-batch t - i
at tick t, so the devices overlap except for the (K-1)/(M+K-1) bubble. In
the backward pass each cell re-runs its forward on each micro-batch before
back-propagating through it (rematerialisation), so a device holds the
activations of its cell for at most `backward_window` micro-batches at a
time (with remat='except_last', the last micro-batch keeps its forward
activations instead of re-running; it is back-propagated first).

Files: the cell type `FeatureExtractionLayer` and the partitioner
`PartitionSequentialLayers` live in gpipe_partition.py (re-exported here);
the pipelined Transformer stack in gpipe_transformer.py.

Randomness: micro-batch j of a step runs with the seed
`step_seed.MicroBatchSeed(theta.step_seed, j)` in every cell, so dropout
differs between micro-batches and the re-run forward replays it exactly;
the pipelined model equals the sequential one run on each micro-batch with
that micro-batch's seed.

Devices: SeqLayer and PipeliningLayer read `cluster.Cluster.Current()` when
they are built: the cells' variables are created on their devices then and
FProp uses the same devices. Build them inside `with cluster:`.

Example:
  cells = PartitionSequentialLayers(stack_params, 2, Shape([8, 16, 32]))
  p = PipeliningLayer.Params().Set(name='pipe', cell_tpl=cells,
                                   num_micro_batches=4)
  with cluster_lib.Cluster.Params().Set(num_devices=2,
                                        worker_split_size=2).Instantiate():
    pipe = p.Instantiate()
  y = pipe.FProp(base_layer.WithStepSeed(pipe.theta, seed), x)
"""
import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import cell_program
from cadence.framework import cluster as cluster_lib
from cadence.framework import shapes
from cadence.framework import stacked_recurrent
from cadence.layers import gpipe_partition

NestedMap = base_layer.NestedMap


# The cell type and the partitioner (layers/gpipe_partition.py).
FeatureExtractionLayer = gpipe_partition.FeatureExtractionLayer
PartitionSequentialLayers = gpipe_partition.PartitionSequentialLayers
BalancedPartition = gpipe_partition.BalancedPartition
_AsTuple = gpipe_partition.AsTuple


# --- pure helpers ------------------------------------------------------------


def _StripSeed(theta):
  """A copy of theta without `step_seed` entries (at every level)."""
  if isinstance(theta, NestedMap):
    return NestedMap({k: _StripSeed(v) for k, v in theta.items()
                      if k != base_layer.STEP_SEED_KEY})
  if isinstance(theta, (list, tuple)):
    return type(theta)(_StripSeed(v) for v in theta)
  return theta


def _ShapesToSpecs(struct, dtype):
  """Maps Shape/TensorShape leaves of a NestedMap/list/tuple to TensorSpecs.

  (A Shape is a tuple, so generic nest utilities would descend into it.)
  """
  if isinstance(struct, (shapes.Shape, tf.TensorShape)):
    return tf.TensorSpec(shapes.AsShape(struct).ToTensorShape(), dtype)
  if isinstance(struct, NestedMap):
    return NestedMap({k: _ShapesToSpecs(v, dtype) for k, v in struct.items()})
  if isinstance(struct, (list, tuple)):
    return type(struct)(_ShapesToSpecs(v, dtype) for v in struct)
  raise ValueError(f'Expected a Shape in FPropMeta out_shapes; got {struct!r}.')


# --- layers ------------------------------------------------------------------


class SeqLayer(base_layer.BaseLayer):
  """`before_tpl` layers on the split's first device, then the cells.

  Cell i runs on device i % D of the model split (D devices, from
  `Cluster.Current()` at construction), one cell after the other on the
  whole batch: no pipelining. Children: `before` and `cells` (lists).

  Example:
    p = SeqLayer.Params().Set(name='seq', cell_tpl=PartitionSequentialLayers(
        stack_params, 2, Shape([8, 16])))
    y = p.Instantiate()(tf.ones([8, 16]))
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('before_tpl', [], 'Layers run first, on the first device of '
             'the split, on the whole batch.')
    p.Define('cell_tpl', [], 'The cells: layer params (usually '
             'FeatureExtractionLayer) with FPropMeta.')
    return p

  def __init__(self, params):
    super().__init__(params)
    self._devices = cluster_lib.Cluster.Current().DevicesInModelSplit(0)
    self._child_devices = {}
    self._CreateLayers()

  def _Build(self, p, path):
    # Builds each child (and so its variables) on its cell's device.
    with cell_program.Device(self._child_devices.get(path)):
      return super()._Build(p, path)

  def _CreateLayers(self):
    p = self.params
    if not isinstance(p.cell_tpl, (list, tuple)) or not p.cell_tpl:
      raise ValueError(f"{type(self).__name__} '{self.path}': cell_tpl="
                       f'{p.cell_tpl!r} must be a non-empty list of params.')
    for i in range(len(p.before_tpl)):
      self._child_devices[f'{self.path}.before[{i}]'] = self._devices[0]
    for i in range(len(p.cell_tpl)):
      self._child_devices[f'{self.path}.cells[{i}]'] = self.CellDevice(i)
    self.CreateChildren('before', list(p.before_tpl))
    self.CreateChildren('cells', list(p.cell_tpl))

  @property
  def devices(self):
    """The model split's devices this layer was built for."""
    return list(self._devices)

  def CellDevice(self, i):
    return self._devices[i % len(self._devices)]

  # Cell hooks: a subclass may define cells differently (GPipeTransformerStack).
  def NumCells(self):
    return len(self.children.cells)

  def CellThetas(self, theta):
    return list(theta.cells)

  def CellFProp(self, i, theta, *inputs):
    return self.children.cells[i].FProp(theta, *inputs)

  def CellFPropMeta(self, i, *input_shapes):
    cell = self.children.cells[i]
    return gpipe_partition.LayerMeta(
        f"{type(self).__name__} '{self.path}'",
        f'cell {i} ({type(cell).__name__} {cell.path!r})', cell.params,
        input_shapes)

  def _Before(self, theta, inputs):
    with cell_program.Device(self._devices[0]):
      for layer, th in zip(self.children.get('before', []),
                           theta.get('before', [])):
        inputs = _AsTuple(layer.FProp(th, *_AsTuple(inputs)))
    return inputs

  @tf.autograph.experimental.do_not_convert
  def FProp(self, theta, *inputs):
    """Runs before layers then every cell in order on the whole batch."""
    out = self._Before(theta, inputs)
    for i, th in enumerate(self.CellThetas(theta)):
      with cell_program.Device(self.CellDevice(i)):
        out = self.CellFProp(i, th, *_AsTuple(out))
    return out

  @classmethod
  def FPropMeta(cls, p, *input_shapes):
    """Chains before_tpl and cell_tpl FPropMeta; flops are summed."""
    flops, in_shapes = 0, tuple(input_shapes)
    for i, sub in enumerate(list(p.before_tpl) + list(p.cell_tpl)):
      sub = base_layer.InheritParams(p, sub)
      meta = gpipe_partition.LayerMeta(
          f"{cls.__name__} '{p.name}'", gpipe_partition.DescribeLayer(i, sub),
          sub, in_shapes)
      flops = shapes.Add(flops, meta.flops)
      in_shapes = tuple(meta.out_shapes)
    return NestedMap(flops=flops, out_shapes=in_shapes)


class PipeliningLayer(SeqLayer):
  """SeqLayer whose cells run as a pipeline over micro-batches.

  The inputs (after `before_tpl`) are split into M micro-batches along
  `batch_dim`; the cells run them through `StackedRecurrent` on their
  devices; the outputs come back concatenated in the input's batch order
  and layout. With is_inference and one device per split it runs the cells
  one after the other (SeqLayer.FProp).

  Cells take and return tuples of tensors (or, with nested_map_fprop, one
  NestedMap). Every state passed between cells has `state_dtype` (default:
  the dtype of the first input). Cells need FPropMeta: it gives the shapes
  of the micro-batch states.

  Example:
    p = PipeliningLayer.Params().Set(
        name='pipe', num_micro_batches=4,
        cell_tpl=PartitionSequentialLayers(stack_p, 2, Shape([4, 16])))
    with cluster:                       # 2 devices per split
      pipe = p.Instantiate()
    y = pipe.FProp(base_layer.WithStepSeed(pipe.theta, seed), x)  # x [16, ..]
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('num_micro_batches', None, 'Number of micro-batches M; None: '
             'batch / micro_batch_size, or 1.')
    p.Define('micro_batch_size', None, 'Examples per micro-batch; None: '
             'batch / num_micro_batches.')
    p.Define('batch_dim', 0, 'The batch dimension of every input.')
    p.Define('state_dtype', None, 'Dtype of the states between cells; None: '
             'the first input\'s dtype.')
    p.Define('nested_map_fprop', False, 'Whether cells take and return one '
             'NestedMap instead of tuples of tensors.')
    p.Define('remat', 'except_last', 'Which micro-batches re-run their '
             'forward in the backward: ' + ', '.join(
                 stacked_recurrent.REMAT_MODES) +
             ' (see framework/stacked_recurrent.py).')
    p.Define('backward_window', 1, 'At most this many micro-batches per '
             'cell hold activations in the backward (1: one at a time; 2: '
             'the next re-run overlaps the current back-propagation; None: '
             'unbounded); see framework/stacked_recurrent.py.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    for name in ('num_micro_batches', 'micro_batch_size'):
      v = p.Get(name)
      if v is not None and (isinstance(v, bool) or not isinstance(v, int) or
                            v < 1):
        raise ValueError(f"{type(self).__name__} '{self.path}': {name}={v!r} "
                         'must be None or an int >= 1.')
    if p.remat not in stacked_recurrent.REMAT_MODES:
      raise ValueError(f"{type(self).__name__} '{self.path}': remat="
                       f'{p.remat!r} must be one of '
                       f'{stacked_recurrent.REMAT_MODES}.')

  def _Fail(self, msg):
    raise ValueError(f"{type(self).__name__} '{self.path}': {msg}")

  def MicroBatching(self, batch):
    """(num_micro_batches, micro_batch_size) for a batch size."""
    p = self.params
    m, size = p.num_micro_batches, p.micro_batch_size
    if m is None and size is None:
      m = 1
    if size is None:
      if batch % m:
        self._Fail(f'num_micro_batches={m} does not divide batch {batch} '
                   f'(inputs dim batch_dim={p.batch_dim}).')
      return m, batch // m
    if m is None:
      if batch % size:
        self._Fail(f'micro_batch_size={size} does not divide batch {batch} '
                   f'(inputs dim batch_dim={p.batch_dim}).')
      return batch // size, size
    if m * size != batch:
      self._Fail(f'micro_batch_size={size} * num_micro_batches={m} = '
                 f'{m * size} != batch {batch} (inputs dim batch_dim='
                 f'{p.batch_dim}).')
    return m, size

  def _ToState(self, outputs):
    if self.params.nested_map_fprop:
      return outputs
    return NestedMap({f's{i}': x for i, x in enumerate(_AsTuple(outputs))})

  def _FromState(self, state):
    if self.params.nested_map_fprop:
      return (state,)
    return tuple(state[f's{i}'] for i in range(len(state)))

  @tf.autograph.experimental.do_not_convert
  def FProp(self, theta, *inputs):
    """Pipelined forward; see the class docstring.

    Args:
      theta: this layer's theta; its `step_seed` (if any) seeds micro-batch
        j with MicroBatchSeed(step_seed, j).
      *inputs: tensors with a static batch dim at `batch_dim` (or one
        NestedMap of them with nested_map_fprop).

    Returns:
      The last cell's outputs for the whole batch: a tensor if it has one
      output, else a tuple (or a NestedMap with nested_map_fprop).
    """
    p = self.params
    if p.is_inference and len(self._devices) == 1:
      return super().FProp(theta, *inputs)
    inputs = self._Before(theta, inputs)
    if p.nested_map_fprop:
      if len(inputs) != 1 or not isinstance(inputs[0], NestedMap):
        self._Fail('nested_map_fprop=True needs exactly one NestedMap input; '
                   f'got {len(inputs)} inputs.')
    state = self._ToState(inputs[0] if p.nested_map_fprop else inputs)
    leaves = state.Flatten()
    if any(x is None for x in leaves):
      self._Fail('inputs must be tensors; got None.')
    bd = p.batch_dim
    batches = {x.shape[bd] if x.shape.rank and x.shape.rank > bd else -1
               for x in leaves}
    if len(batches) != 1 or None in batches or -1 in batches:
      self._Fail(f'every input needs the same static batch dim at batch_dim='
                 f'{bd}; got shapes {[x.shape.as_list() for x in leaves]}.')
    batch = batches.pop()
    m, size = self.MicroBatching(batch)

    # Specs of the micro-batch states: the input, then each cell's output.
    dtype = p.state_dtype or leaves[0].dtype
    in_specs = state.Transform(lambda x: tf.TensorSpec(
        shapes.AsShape(x.shape).WithDim(bd, size).ToTensorShape(), dtype))
    cell_thetas = [_StripSeed(th) for th in self.CellThetas(theta)]
    init_states = []
    for i in range(self.NumCells()):
      meta = self.CellFPropMeta(
          i, *self._FromState(in_specs.Transform(
              lambda spec: shapes.Shape(spec.shape))))
      out_shapes = (meta.out_shapes[0] if p.nested_map_fprop else
                    tuple(meta.out_shapes))
      in_specs = self._ToState(_ShapesToSpecs(out_shapes, dtype))
      for spec in in_specs.Flatten():
        if not spec.shape.is_fully_defined():
          self._Fail(f'cell {i} outputs shape {spec.shape.as_list()} per '
                     'micro-batch; the pipeline needs fully defined shapes.')
      with cell_program.Device(self.CellDevice(i)):
        init_states.append(in_specs.Transform(
            lambda spec: tf.zeros(spec.shape, spec.dtype)))

    with cell_program.Device(self._devices[0]):
      parts = [tf.split(tf.cast(x, dtype), m, axis=bd) if m > 1 else
               [tf.cast(x, dtype)] for x in leaves]
      mb_inputs = [state.Pack([x[j] for x in parts]) for j in range(m)]

    def _CellFn(i):
      def _Fn(th, state_prev, cell_inputs):
        del state_prev   # A cell sees each micro-batch independently.
        return self._ToState(self.CellFProp(i, th,
                                            *self._FromState(cell_inputs)))
      return _Fn

    acc, _ = stacked_recurrent.StackedRecurrent(
        [self.CellDevice(i) for i in range(self.NumCells())],
        [_CellFn(i) for i in range(self.NumCells())], cell_thetas,
        init_states, mb_inputs, step_seed=theta.get(base_layer.STEP_SEED_KEY),
        remat=p.remat, backward_window=p.backward_window, name=self.path)
    with cell_program.Device(self.CellDevice(self.NumCells() - 1)):
      out = acc[0].Pack([
          tf.concat(parts, axis=bd) if m > 1 else parts[0]
          for parts in zip(*[a.Flatten() for a in acc])])
    outs = self._FromState(out)
    if p.nested_map_fprop:
      return outs[0]
    return outs[0] if len(outs) == 1 else outs
