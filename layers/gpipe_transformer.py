"""GPipeTransformerStack: a Transformer stack pipelined over a model split.

The stack of `num_layers` GPipeTransformerLayers (plus an optional final
LayerNorm) is cut into `splits` cells of consecutive layers; the cells run
as a GPipe pipeline (layers/gpipe.py) over micro-batches of the batch.

Weight layout: the layers are children `x_layers[0..L-1]` and `final_ln` of
the stack itself, whatever the partition, so variable paths are
'<name>.x_layers[i]....' and '<name>.final_ln....' for every `splits`: a
checkpoint (or the weights) of splits=1 loads unchanged into splits=2 or 4,
and the initial values are equal too (they are seeded by path). The layout
and the function are those of `transformer.TransformerStack` with the same
`transformer_tpl` and `final_layer_norm`. Only the device a layer's
variables live on changes with the partition.

Example:
  tpl = transformer.GPipeTransformerLayer.Params().Set(
      input_dim=256, hidden_dim=1024, num_heads=4)
  p = GPipeTransformerStack.Params().Set(
      name='stack', num_layers=8, transformer_tpl=tpl, splits=2,
      num_micro_batches=4)
  with cluster:                                  # 2 devices per split
    stack = p.Instantiate()
  out, paddings = stack.FProp(theta, inputs, paddings)  # [b, t, 256], [b, t]
"""
import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import shapes
from cadence.layers import gpipe
from cadence.layers import transformer

NestedMap = gpipe.NestedMap


class GPipeTransformerStack(gpipe.PipeliningLayer):
  """Pipelined pre-LN Transformer stack; see the module docstring.

  FProp(theta, inputs [batch, time, dim], paddings [batch, time]) returns
  (outputs [batch, time, dim], paddings). Cell c holds layers
  [b_c, b_{c+1}) and runs on device c % D of the model split; the last cell
  also applies `final_ln`.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('num_layers', 1, 'Number of Transformer layers L, an int >= 1.')
    p.Define('transformer_tpl', transformer.GPipeTransformerLayer.Params(),
             'Params of each layer, a GPipeTransformerLayer.')
    p.Define('final_layer_norm', True, 'Whether the last cell normalises '
             'the output with a copy of transformer_tpl.ln_tpl.')
    p.Define('splits', 1, 'The partition into cells: an int K (K cells of '
             'near-equal size), or a list of K-1 increasing layer indices '
             '[b_1, ..., b_{K-1}] where cells 1.. start (cell c has layers '
             'b_c .. b_{c+1}-1, with b_0 = 0 and b_K = L).')
    return p

  @classmethod
  def Boundaries(cls, p):
    """The K + 1 layer boundaries [0, b_1, ..., L] that `splits` defines."""
    n, splits = p.num_layers, p.splits
    where = f"{cls.__name__} '{p.name}'"
    if isinstance(splits, bool):
      splits = None
    if isinstance(splits, int):
      if not 1 <= splits <= n:
        raise ValueError(f'{where}: splits={splits} must be in [1, '
                         f'num_layers={n}]; each cell needs a layer.')
      return gpipe.BalancedPartition([1] * n, splits)
    if isinstance(splits, (list, tuple)):
      bounds = [0] + list(splits) + [n]
      if all(isinstance(b, int) and not isinstance(b, bool) for b in splits
             ) and all(a < b for a, b in zip(bounds, bounds[1:])):
        return bounds
    raise ValueError(
        f'{where}: splits={p.splits!r} must be an int K in [1, {n}] or a list '
        f'of increasing layer indices in (0, {n}), e.g. [{n // 2}].')

  def _CreateLayers(self):
    p = self.params
    if p.cell_tpl or p.before_tpl:
      raise ValueError(f"{type(self).__name__} '{self.path}': cell_tpl and "
                       'before_tpl must stay empty; the cells are built from '
                       'num_layers, transformer_tpl and splits.')
    if (isinstance(p.num_layers, bool) or not isinstance(p.num_layers, int)
        or p.num_layers < 1):
      raise ValueError(f"{type(self).__name__} '{self.path}': num_layers="
                       f'{p.num_layers!r} must be an int >= 1.')
    if not issubclass(p.transformer_tpl.cls,
                      transformer.GPipeTransformerLayer):
      raise ValueError(
          f"{type(self).__name__} '{self.path}': transformer_tpl is a "
          f'{p.transformer_tpl.cls.__name__}; it must be a '
          'GPipeTransformerLayer (cells pass (inputs, paddings) on).')
    self._bounds = self.Boundaries(p)
    for c in range(self.NumCells()):
      for i in range(self._bounds[c], self._bounds[c + 1]):
        self._child_devices[f'{self.path}.x_layers[{i}]'] = self.CellDevice(c)
    self._child_devices[f'{self.path}.final_ln'] = self.CellDevice(
        self.NumCells() - 1)
    self.CreateChildren('x_layers', [p.transformer_tpl] * p.num_layers)
    if p.final_layer_norm:
      self.CreateChild('final_ln', self._FinalLnParams(p))

  @staticmethod
  def _FinalLnParams(p):
    tpl = p.transformer_tpl
    return tpl.ln_tpl.Copy().Set(name='final_ln', input_dim=tpl.input_dim)

  @property
  def boundaries(self):
    """[0, b_1, ..., L]: cell c has layers boundaries[c]..boundaries[c+1]-1."""
    return list(self._bounds)

  def NumCells(self):
    return len(self._bounds) - 1

  def _IsLast(self, c):
    return c == self.NumCells() - 1 and self.params.final_layer_norm

  def CellThetas(self, theta):
    thetas = []
    for c in range(self.NumCells()):
      th = NestedMap(
          x_layers=theta.x_layers[self._bounds[c]:self._bounds[c + 1]])
      if self._IsLast(c):
        th.final_ln = theta.final_ln
      thetas.append(th)
    return thetas

  def CellFProp(self, c, theta, inputs, paddings):
    layers = self.children.x_layers[self._bounds[c]:self._bounds[c + 1]]
    for layer, th in zip(layers, theta.x_layers):
      inputs, paddings = layer.FProp(th, inputs, paddings)
    if self._IsLast(c):
      inputs = self.children.final_ln.FProp(theta.final_ln, inputs)
    return inputs, paddings

  def CellFPropMeta(self, c, inputs, paddings):
    p = self.params
    layer_p = base_layer.InheritParams(p, p.transformer_tpl)
    n = self._bounds[c + 1] - self._bounds[c]
    flops = shapes.Mul(n, layer_p.cls.FPropMeta(layer_p, inputs,
                                                paddings).flops)
    if self._IsLast(c):
      ln = base_layer.InheritParams(p, self._FinalLnParams(p))
      flops = shapes.Add(flops, ln.cls.FPropMeta(ln, inputs).flops)
    return NestedMap(flops=flops, out_shapes=(shapes.AsShape(inputs),
                                              shapes.AsShape(paddings)))

  @tf.autograph.experimental.do_not_convert
  def FProp(self, theta, inputs, paddings):
    """(outputs [batch, time, dim], paddings [batch, time]); pipelined."""
    return super().FProp(theta, inputs, paddings)

  @classmethod
  def FPropMeta(cls, p, inputs, paddings):
    """L layers' flops (+ final norm); out_shapes (inputs, paddings)."""
    layer_p = base_layer.InheritParams(p, p.transformer_tpl)
    flops = shapes.Mul(p.num_layers,
                       layer_p.cls.FPropMeta(layer_p, inputs, paddings).flops)
    if p.final_layer_norm:
      ln = base_layer.InheritParams(p, cls._FinalLnParams(p))
      flops = shapes.Add(flops, ln.cls.FPropMeta(ln, inputs).flops)
    return NestedMap(flops=flops, out_shapes=(shapes.AsShape(inputs),
                                              shapes.AsShape(paddings)))
