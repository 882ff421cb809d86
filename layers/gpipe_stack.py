"""GPipeStack: a pipeline of a user's own layers, one unit each.

The pipelined model for layers of one's own: `units` is a list of layer
params (any layer with FProp and FPropMeta, e.g. a residual MLP block), run
in order; `splits` cuts them into stages (of near-equal FLOPs on
`example_shape`, else of equal counts) and `pipeline_tpl` runs the stages
over micro-batches (layers/gpipe.py). It is the units contract
(layers/gpipe_units.py) with nothing more to declare, so the memory
estimate, `--mode=inspect_model`, `--mode=plan --plan_measure` and every
schedule work for it as for the built-in LM and ResNet.

Unit i is the child `units[i]` whatever the cut (its variables are
'<name>.units[i]....' for every `splits` and layout); a layer that is a
BatchStatsLayer (batch norm) runs under micro-batches as in the ResNet.

`before_tpl` is what runs before the units on the whole batch, on the first
stage's device, not cut into stages: the model's input layers (an
embedding of its features, say), the children `before[i]`. The plan knows
them (gpipe_units.Ends), so the memory estimate, inspect and --plan_measure
count and time them as the LM's embedding.

Example:
  block = MyBlock.Params().Set(dim=64)
  p = GPipeStack.Params().Set(name='stack', splits=2, example_shape=[64],
                              units=[block.Copy() for _ in range(8)])
  p.pipeline_tpl.Set(num_micro_batches=4, schedule='1f1b')
  with cluster:                       # 2 devices per split
    stack = p.Instantiate()
  y = stack.FProp(theta, x)           # x [batch, 64] -> [batch, 64]
"""
from cadence.framework import base_layer
from cadence.framework import hyperparams
from cadence.framework import shapes
from cadence.framework import validation
from cadence.layers import gpipe
from cadence.layers import gpipe_units


class GPipeStack(gpipe_units.UnitsPipeline, base_layer.BaseLayer):
  """A pipeline of `units`; see the module docstring.

  FProp(theta, *inputs) -> the last unit's outputs (each unit maps the
  previous one's outputs to its own); FPropLoss(theta, *inputs, loss=,
  side_inputs=) runs a per-micro-batch loss as the schedule needs.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('before_tpl', [], 'Layers run in order before the units on the '
             'whole batch, on the first stage\'s device (not cut into '
             'stages): a list of layer params; the children before[i]. The '
             'first takes the stack\'s inputs, the units the last one\'s '
             'outputs.')
    p.Define('units', [], 'The layers, in order: a list of layer params '
             '(each with FProp and FPropMeta); unit i is the child '
             'units[i].')
    p.Define('example_shape', None, 'One example\'s input shape without '
             'the batch dim (e.g. [64]), to cut `splits` stages of near-'
             'equal FLOPs; None: units of equal cost.')
    p.Define('splits', 1, 'The cut into stages: an int S (S near-equal '
             'stages; S = K v on K devices with v stages per device), or '
             'a list of S-1 increasing unit indices where stages 1.. '
             'start.')
    p.Define('pipeline_tpl', gpipe.PipeliningLayer.Params(), 'The '
             "pipeline's settings (num_micro_batches, schedule, remat, "
             '...), or None: the units run one after the other on the '
             'whole batch.')
    return p

  @classmethod
  def Units(cls, p):
    return [gpipe_units.Unit(f'unit{i}', [gpipe_units.Layer(
        f'units[{i}]', unit)]) for i, unit in enumerate(p.units)]

  @classmethod
  def PipelineEnds(cls, p):
    return gpipe_units.Ends(before=[
        gpipe_units.Layer(f'before[{i}]', layer, carried=False)
        for i, layer in enumerate(p.before_tpl)])

  @classmethod
  def ExampleShapes(cls, p):
    if p.example_shape is None:
      return None
    return (shapes.Shape([1] + list(p.example_shape)),)

  @classmethod
  def CheckParams(cls, p, owner):
    super().CheckParams(p, owner)
    if not (isinstance(p.units, (list, tuple)) and p.units):
      raise validation.Error(owner, 'units', p.units, 'must be a non-empty '
                             'list of layer params (Layer.Params()).')
    for i, unit in enumerate(p.units):
      _CheckLayer(p, 'units', i, unit)
    if not isinstance(p.before_tpl, (list, tuple)):
      raise validation.Error(owner, 'before_tpl', p.before_tpl, 'must be a '
                             'list of layer params (Layer.Params()).')
    for i, layer in enumerate(p.before_tpl):
      _CheckLayer(p, 'before_tpl', i, layer)
    if p.example_shape is not None:
      validation.CheckIntList(owner, 'example_shape', p.example_shape)
    pipe = p.pipeline_tpl
    gpipe_units.CheckPipelineTpl(owner, pipe, 'the stack')
    if pipe is not None:
      gpipe.PipeliningLayer.CheckParams(pipe, validation.Owner(pipe))
      cls.Bounds(p)

  @classmethod
  def FPropMeta(cls, p, *input_shapes):
    """UnitsPipeline's, once `example_shape` is checked against the
    inputs: one example of them (the costs that cut the stages are
    worked out on it)."""
    if p.example_shape is not None and input_shapes:
      example = validation.CheckIntList(validation.Owner(p), 'example_shape',
                                        p.example_shape)
      x = shapes.AsShape(input_shapes[0])
      if x.rank != len(example) + 1 or any(
          d is not None and d != e for d, e in zip(x[1:], example)):
        raise validation.FieldError(
            p, 'example_shape', p.example_shape,
            f'must be one example of the inputs [batch, ...]: {list(x[1:])} '
            f'(the inputs are {list(x)}).')
    return super().FPropMeta(p, *input_shapes)

  def __init__(self, params):
    super().__init__(params)
    self.CheckParams(self.params, validation.Owner(self))
    self.BuildUnits()
    self.CreateUnitChildren()
    self.CreateChildren('before', list(self.params.before_tpl),
                        devices=[self.input_device] * len(
                            self.params.before_tpl))


def _CheckLayer(p, field, i, unit):
  """Raises ValueError naming `field[i]` (units[2]) of stack params `p` by
  its params path unless `unit` is a layer's params."""
  if (isinstance(unit, hyperparams.InstantiableParams) and
      isinstance(unit.cls, type) and
      issubclass(unit.cls, base_layer.BaseLayer)):
    return
  if isinstance(unit, type) and issubclass(unit, base_layer.BaseLayer):
    rule = (f'is a layer class, not its params: pass '
            f'{unit.__name__}.Params() (set its fields with .Set(...)).')
  elif isinstance(unit, hyperparams.InstantiableParams):
    rule = (f'builds {validation.ShortRepr(unit.cls)}, not a layer: each '
            'unit must be a layer\'s Params() (a BaseLayer with FProp and '
            'FPropMeta).')
  else:
    rule = ('is not a layer\'s params: each unit must be a '
            'Layer.Params().')
  raise validation.FieldError(p, f'{field}[{i}]', unit, rule)
