"""GPipeTransformerStack: a Transformer stack pipelined over a model split.

The stack of `num_layers` Transformer layers (plus an optional final
LayerNorm) is cut into `splits` cells of consecutive layers; the cells run
as a GPipe pipeline (layers/gpipe.py) over micro-batches of the batch.

It is a `transformer.TransformerStack` (same params, children, weights and
function) whose units (layers/gpipe_units.py) are its layers, the final
norm with the last: `UnitsPipeline` cuts them by `splits`, owns the
`PipeliningLayer` child `pipeline` built from `pipeline_tpl` (the
pipeline's settings, declared there once), places each layer on its
stage's device and runs the stages. FPropMeta gives the stack's plan
(framework/pipeline/plan.py), which the memory estimate, inspect and the
planner read.

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
import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import validation
from cadence.layers import gpipe
from cadence.layers import gpipe_units
from cadence.layers import transformer

NestedMap = gpipe.NestedMap


class GPipeTransformerStack(gpipe_units.UnitsPipeline,
                            transformer.TransformerStack):
  """Pipelined pre-LN Transformer stack; see the module docstring.

  FProp(theta, inputs [batch, time, dim], paddings [batch, time]) returns
  outputs [batch, time, dim], as TransformerStack. Stage c holds layers
  [b_c, b_{c+1}) on the pipeline's device for stage c; the last one also
  applies `final_ln`.
  """

  ITEM = 'layer'

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('splits', 1, 'The cut into stages: an int S (S stages of '
             'near-equal size; S = K v on K devices with v stages per '
             'device), or a list of S-1 increasing layer indices '
             '[b_1, ..., b_{S-1}] where stages 1.. start (stage s has '
             'layers b_s .. b_{s+1}-1, with b_0 = 0 and b_S = L).')
    p.Define('pipeline_tpl', gpipe.PipeliningLayer.Params(), 'The '
             'pipeline\'s settings (num_micro_batches, micro_batch_size, '
             'schedule, remat, backward_window, state_dtype); cell_tpl and '
             'before_tpl stay empty: the stack gives the pipeline its '
             'cells.')
    return p

  @classmethod
  def Units(cls, p):
    """Layer i of the stack; the final norm runs with the last. (Stack
    params without a pipeline have them too: the LM's unpipelined plan.)"""
    units = [gpipe_units.Unit(f'layer{i}', [gpipe_units.Layer(
        f'x_layers[{i}]', p.transformer_tpl)]) for i in range(p.num_layers)]
    if p.final_layer_norm:
      units[-1].layers.append(gpipe_units.Layer(
          'final_ln', cls.FinalLnParams(p), carried=False))
    return units

  @classmethod
  def NumCarried(cls, p):
    """The paddings go to every layer, unchanged."""
    del p
    return 1

  @classmethod
  def SplitsRule(cls, p, num_units):
    return f'must be in [1, num_layers={num_units}]; each cell needs a layer.'

  @classmethod
  def CheckParams(cls, p, owner):
    cls.CheckStackParams(p, owner)

  @classmethod
  def CheckStackParams(cls, p, owner):
    super().CheckStackParams(p, owner)
    pipe = p.pipeline_tpl
    if not (isinstance(pipe, base_layer.hyperparams.InstantiableParams) and
            issubclass(pipe.cls, gpipe.PipeliningLayer)):
      raise validation.Error(owner, 'pipeline_tpl', getattr(pipe, 'cls', pipe),
                             'must be a PipeliningLayer.Params().')
    cls.Bounds(p)
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
    self.BuildUnits()
    devices = [self.UnitDevice(u) for u in range(self.params.num_layers)]
    super()._CreateLayers(layer_devices=devices, final_ln_device=devices[-1])

  @tf.autograph.experimental.do_not_convert
  def FPropLoss(self, theta, inputs, paddings, loss, side_inputs):
    """The stack, then `loss` on each micro-batch, as the schedule needs.

    How a task trains the stack with any schedule
    (`PipeliningLayer.FPropLoss`): the loss of micro-batch j runs on the
    last stage's device right after the stack, inside the pipeline when
    the schedule needs it (1F1B), after it otherwise (GPipe).

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
    return self.FPropLossStats(theta, inputs, paddings, loss=loss,
                               side_inputs=side_inputs)[0]
