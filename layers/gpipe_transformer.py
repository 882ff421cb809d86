"""GPipeTransformerStack: a Transformer stack pipelined over a model split.

The stack of `num_layers` Transformer layers (plus an optional final
LayerNorm) is cut into `splits` cells of consecutive layers; the cells run
as a GPipe pipeline (layers/gpipe.py) over micro-batches of the batch.

It is a `transformer.TransformerStack` (same params, children, weights and
function) that owns a `PipeliningLayer` child, `pipeline`, built from
`pipeline_tpl`: the pipeline's settings (micro-batches, remat, backward
window, ...) are declared there once, and the pipeline gives each cell its
device and runs the cells (`PipeliningLayer.FPropCells`).

Weight layout: the layers are children `x_layers[0..L-1]` and `final_ln` of
the stack itself, whatever the partition, so variable paths are
'<name>.x_layers[i]....' and '<name>.final_ln....' for every `splits`: a
checkpoint (or the weights) of splits=1 loads unchanged into splits=2 or 4,
and the initial values are equal too (they are seeded by path). Only the
device a layer's variables live on changes with the partition.

Example:
  tpl = transformer.TransformerLayer.Params().Set(
      input_dim=256, hidden_dim=1024, num_heads=4)
  p = GPipeTransformerStack.Params().Set(
      name='stack', num_layers=8, transformer_tpl=tpl, splits=2)
  p.pipeline_tpl.num_micro_batches = 4
  with cluster:                                  # 2 devices per split
    stack = p.Instantiate()
  out = stack.FProp(theta, inputs, paddings)     # [b, t, 256]
"""
import functools

import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import shapes
from cadence.framework import validation
from cadence.layers import gpipe
from cadence.layers import transformer

NestedMap = gpipe.NestedMap


class GPipeTransformerStack(gpipe.SplitCells,
                            transformer.TransformerStack):
  """Pipelined pre-LN Transformer stack; see the module docstring.

  FProp(theta, inputs [batch, time, dim], paddings [batch, time]) returns
  outputs [batch, time, dim], as TransformerStack. Cell c holds layers
  [b_c, b_{c+1}) and runs on the pipeline's device for cell c; the last
  cell also applies `final_ln`.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('splits', 1, 'The partition into cells: an int K (K cells of '
             'near-equal size), or a list of K-1 increasing layer indices '
             '[b_1, ..., b_{K-1}] where cells 1.. start (cell c has layers '
             'b_c .. b_{c+1}-1, with b_0 = 0 and b_K = L).')
    p.Define('pipeline_tpl', gpipe.PipeliningLayer.Params(), 'The '
             'pipeline\'s settings (num_micro_batches, micro_batch_size, '
             'schedule, remat, backward_window, state_dtype); cell_tpl and '
             'before_tpl stay empty: the stack gives the pipeline its '
             'cells.')
    return p

  @classmethod
  def Boundaries(cls, p):
    """The K + 1 layer boundaries [0, b_1, ..., L] that `splits` defines."""
    n = p.num_layers
    v = p.pipeline_tpl.stages_per_device
    return gpipe.SplitBoundaries(
        validation.Owner(p), gpipe.StageSplits(p.splits, p.pipeline_tpl),
        [1] * n, 'layer', f'must be in [1, num_layers={n}]'
        + (f' / stages_per_device={v}' if v > 1 else '')
        + '; each cell needs a layer.')

  @classmethod
  def CheckStackParams(cls, p, owner):
    super().CheckStackParams(p, owner)
    cls.Boundaries(p)
    pipe = p.pipeline_tpl
    if not (isinstance(pipe, base_layer.hyperparams.InstantiableParams) and
            issubclass(pipe.cls, gpipe.PipeliningLayer)):
      raise validation.Error(owner, 'pipeline_tpl', getattr(pipe, 'cls', pipe),
                             'must be a PipeliningLayer.Params().')
    for field in ('cell_tpl', 'before_tpl'):
      if pipe.Get(field):
        raise validation.Error(
            owner, f'pipeline_tpl.{field}', pipe.Get(field),
            'must stay empty: the stack builds the cells from num_layers, '
            'transformer_tpl and splits.')
    if pipe.nested_map_fprop or pipe.batch_dim != 0:
      raise validation.Error(
          owner, 'pipeline_tpl', f'nested_map_fprop={pipe.nested_map_fprop}, '
          f'batch_dim={pipe.batch_dim}', 'must keep nested_map_fprop=False '
          'and batch_dim=0: the stack is batch-major.')
    gpipe.PipeliningLayer.CheckParams(pipe, validation.Owner(pipe))

  def _CreateLayers(self):
    p = self.params
    self._bounds = self.Boundaries(p)
    pipe = self.CreateChild('pipeline', p.pipeline_tpl)
    pipe.CheckNumCells(self.num_cells)
    cell_devices = pipe.StageDevices(self.num_cells)
    devices = [cell_devices[c] for c in range(self.num_cells)
               for _ in range(self._bounds[c], self._bounds[c + 1])]
    super()._CreateLayers(layer_devices=devices,
                          final_ln_device=cell_devices[-1])

  @property
  def input_device(self):
    """The first cell's device (where a task puts what feeds the stack)."""
    return self.pipeline.CellDevice(0, self.num_cells)

  @property
  def output_device(self):
    """The last cell's device (where a task puts what reads the stack)."""
    return self.pipeline.CellDevice(self.num_cells - 1, self.num_cells)

  def _HasFinalLn(self, c):
    return c == self.num_cells - 1 and self.params.final_layer_norm

  def _CellFProp(self, c, theta, inputs, paddings):
    start, stop = self._bounds[c], self._bounds[c + 1]
    x = self.RunLayers(start, stop, theta.x_layers, inputs, paddings,
                       theta.get('final_ln'))
    return x, paddings

  def _CellMeta(self, c, inputs, paddings):
    p = self.params
    n = self._bounds[c + 1] - self._bounds[c]
    return NestedMap(
        flops=self.LayersFlops(p, inputs, n, self._HasFinalLn(c)),
        out_shapes=(shapes.AsShape(inputs), shapes.AsShape(paddings)))

  def _Cells(self, theta):
    cells = []
    for c in range(self.num_cells):
      th = NestedMap(
          x_layers=theta.x_layers[self._bounds[c]:self._bounds[c + 1]])
      if self._HasFinalLn(c):
        th.final_ln = theta.final_ln
      cells.append(gpipe.PipelineCell(
          fprop=functools.partial(self._CellFProp, c), theta=th,
          meta=functools.partial(self._CellMeta, c)))
    return cells

  @tf.autograph.experimental.do_not_convert
  def FProp(self, theta, inputs, paddings):
    """outputs [batch, time, dim] of inputs [b, t, dim], paddings [b, t]."""
    out, _ = self.pipeline.FPropCells(
        self._Cells(theta), inputs, paddings,
        step_seed=theta.get(base_layer.STEP_SEED_KEY))
    return out

  @tf.autograph.experimental.do_not_convert
  def FPropLoss(self, theta, inputs, paddings, loss, side_inputs):
    """The stack, then `loss` on each micro-batch, as the schedule needs.

    How a task trains the stack with any schedule
    (`PipeliningLayer.FPropLoss`): the loss of micro-batch j runs on the
    last cell's device right after the stack, inside the pipeline when the
    schedule needs it (1F1B), after it otherwise (GPipe).

    Args:
      theta: the stack's theta (its step seed seeds the micro-batches).
      inputs: [batch, time, dim]; paddings: [batch, time].
      loss: a gpipe.PipelineCell whose fprop(theta, outputs [mb, time,
        dim], side) returns a NestedMap with a scalar `loss` (the
        micro-batch's sum), other scalars (sums) and [mb, ...] tensors.
      side_inputs: NestedMap of [batch, ...] tensors (e.g. labels), cut
        into micro-batches; the loss's `side`.

    Returns:
      The loss's NestedMap: scalars summed over micro-batches, tensors
      concatenated; only `loss` has a gradient.
    """
    on_outputs = gpipe.PipelineCell(
        fprop=lambda th, outs, side: loss.fprop(th, outs[0], side),
        theta=loss.theta, meta=loss.meta)
    return self.pipeline.FPropLoss(
        self._Cells(theta), on_outputs, inputs, paddings,
        side_inputs=side_inputs,
        step_seed=theta.get(base_layer.STEP_SEED_KEY))

  @classmethod
  def CellFlops(cls, p, inputs):
    """Forward FLOPs of each cell on inputs [batch, time, dim], a list."""
    bounds = cls.Boundaries(p)
    last = len(bounds) - 2
    return [cls.LayersFlops(p, inputs, bounds[c + 1] - bounds[c],
                            c == last and p.final_layer_norm)
            for c in range(last + 1)]

  @classmethod
  def CellMemory(cls, p, inputs):
    """Per cell, NestedMap(act, act_weights, residuals, out, transient) in
    bytes on one micro-batch of inputs [micro_batch, time, dim]: what its
    backward reads (act_bytes), what it keeps with remat 'selective', what
    its W reads after a split B (residual_bytes), its outputs (the
    activations and the paddings passed on, in the pipeline's
    `StateDtype`) and half of one layer's act_bytes (the gradients in
    flight through a layer: its backward frees what it kept as the
    gradient passes; a device's peak measured about 0.55 of a layer's act
    above what it keeps, bench/planner_bench.py's memory table); see
    framework/pipeline/memory_estimate.py."""
    bounds = cls.Boundaries(p)
    last = len(bounds) - 2
    b, t, d = shapes.AsShape(inputs)
    pipe = base_layer.InheritParams(p, p.pipeline_tpl)
    size = pipe.cls.StateDtype(pipe, base_layer.FPropDtype(p)).size
    layer = base_layer.InheritParams(p, p.transformer_tpl)

    def _Bytes(c, policy):
      return cls.LayersActBytes(p, inputs, bounds[c + 1] - bounds[c],
                                c == last and p.final_layer_norm, policy)

    return [NestedMap(
        act=_Bytes(c, 'all'), act_weights=_Bytes(c, 'weights'),
        residuals=_Bytes(c, 'residuals'), out=b * t * (d + 1) * size,
        transient=layer.cls.ActBytes(layer, inputs) // 2)
            for c in range(last + 1)]

  @classmethod
  def FPropMeta(cls, p, inputs, paddings):
    """TransformerStack's; also checks the micro-batching of the batch."""
    gpipe.PipeliningLayer.CheckBatch(
        p.pipeline_tpl, (inputs, paddings),
        owner=validation.Owner(p.pipeline_tpl))
    return super().FPropMeta(p, inputs, paddings)
