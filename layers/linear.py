"""Dense layers: an affine projection and a stack of them (feed-forward net).

Shapes: inputs [..., input_dim] with any number of leading dims; N below is
the product of the leading dims (e.g. batch * time).
"""
import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import cost
from cadence.framework import op_cost
from cadence.framework import shapes
from cadence.framework import validation
from cadence.layers import activations
from cadence.layers import dropout

WeightInit = base_layer.WeightInit
WeightParams = base_layer.WeightParams


def Project(x, w, b=None, act_fn=None):
  """act_fn(x @ w + b) on the last dim of x, as one 2-D matmul.

  A 2-D MatMul, then BiasAdd, then the activation, before the reshape back:
  grappler fuses the three into one kernel on CPU, and the gradients are a
  plain MatMul and BiasAddGrad (cheaper than tensordot's or einsum's,
  which transpose operands and reduce the bias gradient with a Sum).

  Args:
    x: [..., in]; w: [in, out]; b: None or [out]; act_fn: None or an
      element-wise function.

  Returns:
    [..., out].
  """
  rows = x if x.shape.rank == 2 else tf.reshape(x, [-1, w.shape[0]])
  y = tf.matmul(rows, w)
  if b is not None:
    y = tf.nn.bias_add(y, b)
  if act_fn is not None:
    y = act_fn(y)
  if x.shape.rank == 2:
    return y
  lead = x.shape[:-1]
  if lead.is_fully_defined():
    return tf.reshape(y, lead.as_list() + [w.shape[1]])
  return tf.reshape(y, tf.concat([tf.shape(x)[:-1], [w.shape[1]]], 0))


def _CheckLastDim(cls, p, shape, field='input_dim'):
  want = p.Get(field)
  if shape.rank == 0 or (shape[-1] is not None and shape[-1] != want):
    raise ValueError(
        f"{cls.__name__} '{p.name}': inputs shape {list(shape)} must end in "
        f'{field}={want}.')


class ProjectionLayer(base_layer.BaseLayer):
  """y = activation(x @ w + b), on the last dim of x.

  Variables: `w` [input_dim, output_dim] (init: params_init) and, if
  has_bias, `b` [output_dim] (init: zeros).

  Example:
    p = ProjectionLayer.Params().Set(name='proj', input_dim=8, output_dim=4,
                                     activation='RELU')
    layer = p.Instantiate()
    y = layer(tf.ones([2, 5, 8]))   # [2, 5, 4]
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('input_dim', 0, 'Depth of the input, an int > 0.')
    p.Define('output_dim', 0, 'Depth of the output, an int > 0.')
    p.Define('has_bias', True, 'Whether to add a bias `b` [output_dim].')
    p.Define('activation', 'NONE', 'Activation name (layers/activations.py), '
             'e.g. NONE, RELU, GELU.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CheckParams(p, validation.Owner(self))
    self._act_fn = activations.GetFn(p.activation)
    self.CreateVariable('w', WeightParams([p.input_dim, p.output_dim]))
    if p.has_bias:
      self.CreateVariable(
          'b', WeightParams([p.output_dim], init=WeightInit.Constant(0.0)))

  @classmethod
  def CheckParams(cls, p, owner):
    super().CheckParams(p, owner)
    validation.CheckInt(owner, 'input_dim', p.input_dim)
    validation.CheckInt(owner, 'output_dim', p.output_dim)
    validation.CheckBool(owner, 'has_bias', p.has_bias)
    activations.CheckName(owner, 'activation', p.activation)

  def FProp(self, theta, inputs):
    """Projects the last dim.

    Args:
      theta: NestedMap with `w` (and `b` if has_bias).
      inputs: [..., input_dim] floating tensor.

    Returns:
      [..., output_dim] in fprop_dtype.
    """
    p = self.params
    inputs = self.CastToFPropDtype(inputs)
    w = self.CastToFPropDtype(theta.w)
    b = self.CastToFPropDtype(theta.b) if p.has_bias else None
    return Project(inputs, w, b, self._act_fn)        # [..., output_dim]

  @classmethod
  def FPropMeta(cls, p, inputs):
    """Shapes and FLOPs.

    FLOPs = 2*N*input_dim*output_dim (matmul) + N*output_dim (bias, if any)
    + N*output_dim*FlopsPerElement(activation); None if N is unknown.
    out_shapes: ([..., output_dim],). ops: the product, the bias and the
    activation.
    """
    cls.CheckParams(p, validation.Owner(p))
    shape = shapes.AsShape(inputs)
    _CheckLastDim(cls, p, shape)
    n = shapes.Mul(*shape[:-1])
    per_row = (2 * p.input_dim * p.output_dim +
               (p.output_dim if p.has_bias else 0) +
               p.output_dim * activations.FlopsPerElement(p.activation))
    ops = None
    if n is not None:
      size, out = base_layer.FPropDtype(p).size, n * p.output_dim
      ops = [op_cost.MatMul(1, n, p.input_dim, p.output_dim, size)]
      if p.has_bias:
        ops.append(op_cost.Elementwise(out, size, reads=2))
      if activations.FlopsPerElement(p.activation):
        ops.append(op_cost.Elementwise(
            out, size, activations.FlopsPerElement(p.activation)))
    return cost.Cost(flops=shapes.Mul(n, per_row),
                     out_shapes=(shape[:-1] + (p.output_dim,),), ops=ops)


def _PerLayer(value, num_layers):
  if isinstance(value, (list, tuple)):
    return list(value)
  return [value] * num_layers


class FeedForwardNet(base_layer.BaseLayer):
  """A stack of ProjectionLayers with dropout between consecutive layers.

  Layer i maps hidden_layer_dims[i-1] (input_dim for i = 0) to
  hidden_layer_dims[i] with activation[i]. A string `activation` applies to
  every layer, the last included; pass a list (e.g. ['RELU', 'NONE']) for a
  transformer-style feed-forward block. Dropout (keep_prob = 1 -
  dropout_prob) follows every layer but the last.

  Children: `fc` (list of ProjectionLayer), `dropout` (list of DropoutLayer,
  one fewer than `fc`; each has its own path, hence its own masks).

  Example:
    p = FeedForwardNet.Params().Set(name='ffn', input_dim=8,
                                    hidden_layer_dims=[32, 8],
                                    activation=['RELU', 'NONE'],
                                    dropout_prob=0.1)
    layer = p.Instantiate()
    theta = base_layer.WithStepSeed(layer.theta, step_seed.MakeStepSeed(0))
    y = layer.FProp(theta, tf.ones([2, 5, 8]))   # [2, 5, 8]
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('input_dim', 0, 'Depth of the input, an int > 0.')
    p.Define('hidden_layer_dims', [], 'Output depth of each layer, a '
             'non-empty list of ints > 0; the last is the output depth.')
    p.Define('activation', 'RELU', 'Activation name for every layer, or a '
             'list of names, one per layer.')
    p.Define('has_bias', True, 'Whether each layer has a bias.')
    p.Define('dropout_prob', 0.0, 'Dropout probability between layers, in '
             '[0, 1).')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CheckParams(p, validation.Owner(self))
    dims = p.hidden_layer_dims
    acts = _PerLayer(p.activation, len(dims))
    in_dims = [p.input_dim] + list(dims[:-1])
    self.CreateChildren('fc', [
        ProjectionLayer.Params().Set(input_dim=i, output_dim=o,
                                     has_bias=p.has_bias, activation=a)
        for i, o, a in zip(in_dims, dims, acts)])
    self.CreateChildren('dropout', [
        dropout.DropoutLayer.Params().Set(keep_prob=1.0 - p.dropout_prob)
        for _ in range(len(dims) - 1)])

  @classmethod
  def CheckParams(cls, p, owner):
    super().CheckParams(p, owner)
    validation.CheckInt(owner, 'input_dim', p.input_dim)
    dims = p.hidden_layer_dims
    if not isinstance(dims, (list, tuple)) or not dims:
      raise validation.Error(owner, 'hidden_layer_dims', dims,
                             'must be a non-empty list of ints >= 1.')
    for i, d in enumerate(dims):
      validation.CheckInt(owner, f'hidden_layer_dims[{i}]', d)
    acts = _PerLayer(p.activation, len(dims))
    if len(acts) != len(dims):
      raise validation.Error(
          owner, 'activation', p.activation,
          f'has {len(acts)} entries but hidden_layer_dims has {len(dims)}; '
          'give one per layer or a single string.')
    for i, a in enumerate(acts):
      activations.CheckName(owner, f'activation[{i}]', a)
    validation.CheckBool(owner, 'has_bias', p.has_bias)
    validation.CheckProb(owner, 'dropout_prob', p.dropout_prob)

  def FProp(self, theta, inputs):
    """Runs the stack.

    Args:
      theta: NestedMap with `fc` and `dropout` lists; needs a step seed in
        training when dropout_prob > 0.
      inputs: [..., input_dim].

    Returns:
      [..., hidden_layer_dims[-1]] in fprop_dtype.
    """
    fc = self.children.fc
    drop = self.children.dropout
    x = inputs
    for i, layer in enumerate(fc):
      x = layer.FProp(theta.fc[i], x)
      if i < len(drop):
        x = drop[i].FProp(theta.dropout[i], x)
    return x

  @classmethod
  def FPropMeta(cls, p, inputs):
    """Shapes and FLOPs: the sum of the ProjectionLayers' and DropoutLayers'.

    out_shapes: ([..., hidden_layer_dims[-1]],). The other fields: the
    cost.Chain of their complete records (FPropCost). The projections'
    bytes are cost.Complete's defaults, which count a tensor between two
    layers twice: an over-estimate of act and act_weights, and residuals
    leave out the output gradients. Measured (tests/layers/
    layer_contract_test.py: [2, 8] -> 16 RELU -> 8, dropout 0.1): act 512
    stated, 448 kept; act_weights 384, 192; residuals 384, 512 read.
    """
    cls.CheckParams(p, validation.Owner(p))
    shape = shapes.AsShape(inputs)
    _CheckLastDim(cls, p, shape)
    dims = list(p.hidden_layer_dims)
    acts = _PerLayer(p.activation, len(dims))
    in_dims = [p.input_dim] + dims[:-1]
    drop_p = base_layer.InheritParams(p, dropout.DropoutLayer.Params().Set(
        keep_prob=1.0 - p.dropout_prob, is_inference=p.is_inference))
    records = []
    for i, (d_in, d_out, act) in enumerate(zip(in_dims, dims, acts)):
      fc_p = base_layer.InheritParams(p, ProjectionLayer.Params().Set(
          name=f'fc{i}', input_dim=d_in, output_dim=d_out,
          has_bias=p.has_bias, activation=act))
      records.append(base_layer.FPropCost(fc_p, shape))
      shape = records[-1].out_shapes[0]
      if i < len(dims) - 1:
        records.append(base_layer.FPropCost(drop_p, shape))
    return cost.Chain(records)
