"""Normalisation over the last dim: LayerNorm (Ba et al., 2016) and RMSNorm
(Zhang & Sennrich, 2019).

Statistics are computed in float32 (float64 if fprop_dtype is float64), so a
bfloat16 model does not lose the mean/variance to rounding; the output is
cast back to fprop_dtype. N below is the product of the leading dims.
"""
import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import cost
from cadence.framework import op_cost
from cadence.framework import shapes
from cadence.framework import validation

WeightInit = base_layer.WeightInit
WeightParams = base_layer.WeightParams


def _CheckParams(p, owner):
  validation.CheckInt(owner, 'input_dim', p.input_dim)
  validation.CheckNumber(owner, 'epsilon', p.epsilon, low=0, low_open=True)


def _Meta(cls, p, inputs, flops_per_element, flops_per_row):
  """The cost.Cost: FLOPs, out_shapes and act: the normalised input and
  the [..., 1] inverse deviations, in the compute dtype (float32, or
  float64; float32 for bfloat16 too), that the backward reads;
  act_weights: the input alone, in fprop_dtype (remat_policy 'weights'
  recomputes the norm from it); residuals (what a deferred W reads):
  the normalised input and the output gradient, both in the compute dtype,
  for the scale's gradient."""
  cls.CheckParams(p, validation.Owner(p))
  shape = shapes.AsShape(inputs)
  if shape.rank == 0 or (shape[-1] is not None and shape[-1] != p.input_dim):
    raise ValueError(
        f"{cls.__name__} '{p.name}': inputs shape {list(shape)} must end in "
        f'input_dim={p.input_dim}.')
  n = shapes.Mul(*shape[:-1])
  flops = shapes.Mul(
      n, flops_per_element * p.input_dim + flops_per_row)
  dtype = base_layer.FPropDtype(p)
  size = base_layer.AccumulationDtype(dtype).size
  elements = shape.num_elements()
  return cost.Cost(flops=flops, out_shapes=(shape,),
                   act=shapes.Mul(size, shapes.Add(elements, n)),
                   act_weights=shapes.Mul(dtype.size, elements),
                   residuals=shapes.Mul(2 * size, elements),
                   ops=None if elements is None else (op_cost.Norm(
                       elements, size)._replace(flops=flops),))


def _ComputeDtype(layer):
  return base_layer.AccumulationDtype(layer.fprop_dtype)


def _RowSum(x):
  """Sums [..., d] over every dim but the last: [d]."""
  return tf.reduce_sum(tf.reshape(x, [-1, x.shape[-1]]), 0)


def _LayerNorm(x, scale, bias, epsilon):
  """(x - mean) * rsqrt(var + epsilon) * scale + bias over the last dim,
  with a hand-written backward.

  The backward keeps only the normalised x and the [..., 1] inverse
  deviations (autodiff keeps the centred x too) and runs in a third of the
  ops: with g = dy * scale, dx = r * (g - mean(g) - n * mean(g * n)).

  Args:
    x: [..., d]; scale, bias: [d]; epsilon: a Python float.

  Returns:
    [..., d], x's dtype.
  """

  @tf.custom_gradient
  def _Fn(x, scale, bias):
    mean = tf.reduce_mean(x, axis=-1, keepdims=True)          # [..., 1]
    centred = x - mean
    var = tf.reduce_mean(tf.square(centred), axis=-1, keepdims=True)
    r = tf.math.rsqrt(var + epsilon)                          # [..., 1]
    normed = centred * r

    def _Grad(dy):
      g = dy * scale
      dx = r * (g - tf.reduce_mean(g, axis=-1, keepdims=True) -
                normed * tf.reduce_mean(g * normed, axis=-1, keepdims=True))
      return dx, _RowSum(dy * normed), _RowSum(dy)

    return normed * scale + bias, _Grad

  return _Fn(x, scale, bias)


def _RmsNorm(x, scale, epsilon):
  """x * rsqrt(mean(x^2) + epsilon) * scale over the last dim, with a
  hand-written backward that keeps only the normalised x and the [..., 1]
  inverse root mean squares: with g = dy * scale,
  dx = r * (g - n * mean(g * n)).

  Args:
    x: [..., d]; scale: [d]; epsilon: a Python float.

  Returns:
    [..., d], x's dtype.
  """

  @tf.custom_gradient
  def _Fn(x, scale):
    r = tf.math.rsqrt(tf.reduce_mean(tf.square(x), axis=-1, keepdims=True) +
                      epsilon)                                # [..., 1]
    normed = x * r

    def _Grad(dy):
      g = dy * scale
      dx = r * (g - normed * tf.reduce_mean(g * normed, axis=-1,
                                            keepdims=True))
      return dx, _RowSum(dy * normed)

    return normed * scale, _Grad

  return _Fn(x, scale)


def _NormParams(p):
  p.Define('input_dim', 0, 'Depth of the normalised (last) dim, an int > 0.')
  p.Define('epsilon', 1e-6, 'Added to the variance (mean square for RMSNorm) '
           'before the inverse square root, a number > 0.')
  return p


class LayerNorm(base_layer.BaseLayer):
  """y = (x - mean) / sqrt(var + epsilon) * scale + bias, over the last dim.

  Variables: `scale` [input_dim] (init 1), `bias` [input_dim] (init 0).

  Example:
    layer = LayerNorm.Params().Set(name='ln', input_dim=8).Instantiate()
    y = layer(tf.random.normal([2, 5, 8]))   # [2, 5, 8]
  """

  @classmethod
  def Params(cls):
    return _NormParams(super().Params())

  @classmethod
  def CheckParams(cls, p, owner):
    super().CheckParams(p, owner)
    _CheckParams(p, owner)

  def __init__(self, params):
    super().__init__(params)
    self.CheckParams(self.params, validation.Owner(self))
    d = self.params.input_dim
    self.CreateVariable('scale', WeightParams([d], WeightInit.Constant(1.0)))
    self.CreateVariable('bias', WeightParams([d], WeightInit.Constant(0.0)))

  def FProp(self, theta, inputs):
    """Normalises.

    Args:
      theta: NestedMap with `scale` and `bias`, each [input_dim].
      inputs: [..., input_dim].

    Returns:
      [..., input_dim] in fprop_dtype.
    """
    dtype = _ComputeDtype(self)
    out = _LayerNorm(tf.cast(inputs, dtype), tf.cast(theta.scale, dtype),
                       tf.cast(theta.bias, dtype), self.params.epsilon)
    return tf.cast(out, self.fprop_dtype)

  @classmethod
  def FPropMeta(cls, p, inputs):
    """Shapes and FLOPs.

    FLOPs = N * (7 * input_dim + 3): per element the mean's sum, centring,
    square, the variance's sum, normalising multiply, scale and bias; per
    row the two divisions by input_dim and rsqrt(var + eps) (counted 1).
    None if N is unknown. out_shapes: (inputs shape,). act: the
    normalised inputs (float32) the backward reads.
    """
    return _Meta(cls, p, inputs, 7, 3)


class RMSNorm(base_layer.BaseLayer):
  """y = x / sqrt(mean(x^2) + epsilon) * scale, over the last dim.

  Variable: `scale` [input_dim] (init 1). No centring, no bias.

  Example:
    layer = RMSNorm.Params().Set(name='rms', input_dim=8).Instantiate()
    y = layer(tf.random.normal([2, 5, 8]))   # [2, 5, 8]
  """

  @classmethod
  def Params(cls):
    return _NormParams(super().Params())

  @classmethod
  def CheckParams(cls, p, owner):
    super().CheckParams(p, owner)
    _CheckParams(p, owner)

  def __init__(self, params):
    super().__init__(params)
    self.CheckParams(self.params, validation.Owner(self))
    d = self.params.input_dim
    self.CreateVariable('scale', WeightParams([d], WeightInit.Constant(1.0)))

  def FProp(self, theta, inputs):
    """Normalises.

    Args:
      theta: NestedMap with `scale` [input_dim].
      inputs: [..., input_dim].

    Returns:
      [..., input_dim] in fprop_dtype.
    """
    dtype = _ComputeDtype(self)
    out = _RmsNorm(tf.cast(inputs, dtype), tf.cast(theta.scale, dtype),
                     self.params.epsilon)
    return tf.cast(out, self.fprop_dtype)

  @classmethod
  def FPropMeta(cls, p, inputs):
    """Shapes and FLOPs.

    FLOPs = N * (4 * input_dim + 2): per element square, sum, normalising
    multiply and scale; per row the division by input_dim and rsqrt(ms +
    eps) (counted 1). None if N is unknown. out_shapes: (inputs shape,).
    """
    return _Meta(cls, p, inputs, 4, 2)
