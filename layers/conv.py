"""2-D convolution, pooling and flattening on NHWC images.

Images are [batch, height, width, channels]. Output spatial sizes follow
TensorFlow's rules (see `ConvOutputSize`).
"""

import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import cost
from cadence.framework import op_cost
from cadence.framework import shapes
from cadence.framework import validation
from cadence.layers import activations

WeightInit = base_layer.WeightInit
WeightParams = base_layer.WeightParams

_PADDINGS = ('SAME', 'VALID')
_POOLING_TYPES = ('MAX', 'AVG')


def ConvOutputSize(size, window, stride, padding):
  """One output spatial size, exactly as TensorFlow computes it.

  SAME: ceil(size / stride). VALID: ceil((size - window + 1) / stride).

  Args:
    size: int or None (unknown), the input size along one axis.
    window: int, the filter or pooling window size along that axis.
    stride: int.
    padding: 'SAME' or 'VALID'.

  Returns:
    The output size, or None if `size` is None.

  Raises:
    ValueError: VALID padding with size < window.
  """
  if size is None:
    return None
  if padding == 'SAME':
    return -(-size // stride)
  if size < window:
    raise ValueError(f'VALID padding needs input size >= window; got size '
                     f'{size} < window {window}.')
  return (size - window) // stride + 1


def _CheckImageShape(cls, p, shape, channels):
  if shape.rank != 4 or shape[-1] not in (None, channels):
    raise ValueError(
        f"{cls.__name__} '{p.name}': inputs shape {list(shape)} must be "
        f'[batch, height, width, {channels}] (NHWC).')


def _OutImageShape(cls, p, shape, window, stride, channels_out):
  try:
    h = ConvOutputSize(shape[1], window[0], stride[0], p.padding)
    w = ConvOutputSize(shape[2], window[1], stride[1], p.padding)
  except ValueError as e:
    raise ValueError(f"{cls.__name__} '{p.name}': inputs shape "
                     f'{list(shape)}: {e}') from None
  return shapes.Shape([shape[0], h, w, channels_out])


class Conv2DLayer(base_layer.BaseLayer):
  """y = activation(conv2d(x, w) + b) on NHWC images.

  Variables: `w` [h, w, in, out] (init: params_init; fan_in = h*w*in) and,
  if has_bias, `b` [out] (init: zeros).

  Example:
    p = Conv2DLayer.Params().Set(name='conv', filter_shape=[3, 3, 3, 16],
                                 filter_stride=[2, 2], padding='SAME',
                                 activation='RELU')
    layer = p.Instantiate()
    y = layer(tf.ones([8, 32, 32, 3]))   # [8, 16, 16, 16]
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('filter_shape', [3, 3, 1, 1], 'Filter shape [height, width, '
             'in_channels, out_channels].')
    p.Define('filter_stride', [1, 1], 'Strides [height, width].')
    p.Define('padding', 'SAME', "'SAME' or 'VALID', as in tf.nn.conv2d.")
    p.Define('has_bias', True, 'Whether to add a bias `b` [out_channels].')
    p.Define('activation', 'NONE', 'Activation name (layers/activations.py).')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CheckParams(p, validation.Owner(self))
    self._act_fn = activations.GetFn(p.activation)
    self.CreateVariable('w', WeightParams(list(p.filter_shape)))
    if p.has_bias:
      self.CreateVariable('b', WeightParams([p.filter_shape[3]],
                                            init=WeightInit.Constant(0.0)))

  @classmethod
  def CheckParams(cls, p, owner):
    super().CheckParams(p, owner)
    validation.CheckIntList(owner, 'filter_shape', p.filter_shape, 4)
    validation.CheckIntList(owner, 'filter_stride', p.filter_stride, 2)
    validation.CheckOneOf(owner, 'padding', p.padding, _PADDINGS)
    validation.CheckBool(owner, 'has_bias', p.has_bias)
    activations.CheckName(owner, 'activation', p.activation)

  def FProp(self, theta, inputs):
    """Convolves.

    Args:
      theta: NestedMap with `w` (and `b`).
      inputs: [batch, height, width, in_channels].

    Returns:
      [batch, out_height, out_width, out_channels] in fprop_dtype.
    """
    p = self.params
    x = self.CastToFPropDtype(inputs)
    y = tf.nn.conv2d(x, self.CastToFPropDtype(theta.w),
                     strides=[1] + list(p.filter_stride) + [1],
                     padding=p.padding)
    if p.has_bias:
      y = tf.nn.bias_add(y, self.CastToFPropDtype(theta.b))
    return self._act_fn(y)

  @classmethod
  def FPropMeta(cls, p, inputs):
    """Shapes and FLOPs.

    With output [b, oh, ow, out] and filter [kh, kw, in, out]:
      flops = b*oh*ow*out * (2*kh*kw*in + bias + FlopsPerElement(activation))
    where bias = 1 if has_bias. Every output counts a full window, also at
    SAME-padded borders (the zero taps are computed). None if b, or a spatial
    dim, is unknown. ops: the convolution as the product it is ([b oh ow,
    kh kw in] x [kh kw in, out]), the bias and the activation.
    """
    cls.CheckParams(p, validation.Owner(p))
    shape = shapes.AsShape(inputs)
    kh, kw, cin, cout = p.filter_shape
    _CheckImageShape(cls, p, shape, cin)
    out = _OutImageShape(cls, p, shape, (kh, kw), p.filter_stride, cout)
    act_flops = activations.FlopsPerElement(p.activation)
    per_output = (2 * kh * kw * cin + (1 if p.has_bias else 0) + act_flops)
    ops, n = None, out.num_elements()
    if n is not None:
      size = base_layer.FPropDtype(p).size
      ops = [op_cost.MatMul(1, n // cout, kh * kw * cin, cout, size)]
      if p.has_bias:
        ops.append(op_cost.Elementwise(n, size, reads=2))
      if act_flops:
        ops.append(op_cost.Elementwise(n, size, act_flops))
    return cost.Cost(flops=shapes.Mul(n, per_output), out_shapes=(out,),
                     ops=ops)


class PoolingLayer(base_layer.BaseLayer):
  """Max or average pooling over height and width of NHWC images.

  AVG with SAME padding averages over the in-image elements only (as
  tf.nn.avg_pool2d does).

  Example:
    p = PoolingLayer.Params().Set(name='pool', window_shape=[2, 2],
                                  window_stride=[2, 2], pooling_type='MAX')
    y = p.Instantiate()(tf.ones([8, 32, 32, 16]))   # [8, 16, 16, 16]
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('window_shape', [2, 2], 'Window [height, width].')
    p.Define('window_stride', [2, 2], 'Strides [height, width].')
    p.Define('pooling_type', 'MAX', "'MAX' or 'AVG'.")
    p.Define('padding', 'VALID', "'SAME' or 'VALID', as in tf.nn.max_pool2d.")
    return p

  def __init__(self, params):
    super().__init__(params)
    self.CheckParams(self.params, validation.Owner(self))

  @classmethod
  def CheckParams(cls, p, owner):
    super().CheckParams(p, owner)
    validation.CheckIntList(owner, 'window_shape', p.window_shape, 2)
    validation.CheckIntList(owner, 'window_stride', p.window_stride, 2)
    validation.CheckOneOf(owner, 'pooling_type', p.pooling_type,
                          _POOLING_TYPES)
    validation.CheckOneOf(owner, 'padding', p.padding, _PADDINGS)

  def FProp(self, theta, inputs):
    """Pools.

    Args:
      theta: unused (no variables).
      inputs: [batch, height, width, channels].

    Returns:
      [batch, out_height, out_width, channels] in fprop_dtype.
    """
    del theta
    p = self.params
    pool = tf.nn.max_pool2d if p.pooling_type == 'MAX' else tf.nn.avg_pool2d
    return pool(self.CastToFPropDtype(inputs), ksize=list(p.window_shape),
                strides=list(p.window_stride), padding=p.padding)

  @classmethod
  def FPropMeta(cls, p, inputs):
    """Shapes and FLOPs.

    With output [b, oh, ow, c] and window [kh, kw]:
      flops = b*oh*ow*c * kh*kw        (MAX: compares; AVG: adds)
            + b*oh*ow*c                (AVG only: the division)
    A full window is counted also at SAME-padded borders. None if a dim
    is unknown. ops: an element-wise reduction. The bytes are
    cost.Complete's defaults (the input and the output), exact for MAX's
    act and over the real figures otherwise: AVG's gradient keeps
    nothing; act_weights keeps the input alone, and no deferred W reads
    anything (no weight). Measured (tests/layers/layer_contract_test.py,
    MAX 2x2 on [2, 6, 6, 3]): act 1,080 stated and kept; act_weights
    1,080, 864; residuals 1,080, 0.
    """
    cls.CheckParams(p, validation.Owner(p))
    shape = shapes.AsShape(inputs)
    _CheckImageShape(cls, p, shape, shape[-1] if shape.rank else None)
    kh, kw = p.window_shape
    out = _OutImageShape(cls, p, shape, (kh, kw), p.window_stride, shape[-1])
    per_output = kh * kw + (1 if p.pooling_type == 'AVG' else 0)
    return cost.Cost(flops=shapes.Mul(out.num_elements(), per_output),
                     out_shapes=(out,),
                     ops=_ReduceOps(p, out.num_elements(), per_output))


class FlattenLayer(base_layer.BaseLayer):
  """[batch, d1, ..., dn] -> [batch, d1 * ... * dn].

  Example:
    y = FlattenLayer.Params().Set(name='flat').Instantiate()(
        tf.ones([8, 4, 4, 16]))   # [8, 256]
  """

  def FProp(self, theta, inputs):
    """Flattens all but the first dim; works with an unknown batch.

    Args:
      theta: unused (no variables).
      inputs: [batch, ...] of rank >= 1.

    Returns:
      [batch, prod(other dims)] in fprop_dtype.
    """
    del theta
    x = self.CastToFPropDtype(inputs)
    batch = x.shape[0] if x.shape[0] is not None else tf.shape(x)[0]
    inner = shapes.Mul(*x.shape.as_list()[1:])
    return tf.reshape(x, [batch, -1 if inner is None else inner])

  @classmethod
  def FPropMeta(cls, p, inputs):
    """flops = 0; out_shapes = ([batch, prod(other dims) or None],); no
    bytes kept (a reshape: its gradient reads nothing)."""
    shape = shapes.AsShape(inputs)
    if shape.rank < 1:
      raise ValueError(f"FlattenLayer '{p.name}': inputs shape "
                       f'{list(shape)} must have rank >= 1.')
    return cost.Cost(flops=0, out_shapes=(
        shapes.Shape([shape[0], shapes.Mul(*shape[1:])]),), ops=(), act=0,
                     act_weights=0, residuals=0)


class GlobalPoolingLayer(base_layer.BaseLayer):
  """Average or max over height and width: [b, h, w, c] -> [b, c].

  Example:
    p = GlobalPoolingLayer.Params().Set(name='gap')
    y = p.Instantiate()(tf.ones([8, 7, 7, 512]))   # [8, 512]
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('pooling_type', 'AVG', "'AVG' or 'MAX'.")
    return p

  def __init__(self, params):
    super().__init__(params)
    self.CheckParams(self.params, validation.Owner(self))

  @classmethod
  def CheckParams(cls, p, owner):
    super().CheckParams(p, owner)
    validation.CheckOneOf(owner, 'pooling_type', p.pooling_type,
                          _POOLING_TYPES)

  def FProp(self, theta, inputs):
    """Pools.

    Args:
      theta: unused (no variables).
      inputs: [batch, height, width, channels].

    Returns:
      [batch, channels] in fprop_dtype.
    """
    del theta
    reduce = (tf.reduce_mean if self.params.pooling_type == 'AVG' else
              tf.reduce_max)
    return reduce(self.CastToFPropDtype(inputs), axis=[1, 2])

  @classmethod
  def FPropMeta(cls, p, inputs):
    """flops = b*h*w*c (adds or compares) + b*c (AVG: the division);
    ops an element-wise reduction. The bytes are cost.Complete's defaults
    (the input and the output): MAX's act, over the real figures
    otherwise (AVG keeps nothing; no weight). Measured (tests/layers/
    layer_contract_test.py, AVG on [2, 3, 3, 4]): act, act_weights and
    residuals 320 stated, 0 kept."""
    cls.CheckParams(p, validation.Owner(p))
    shape = shapes.AsShape(inputs)
    _CheckImageShape(cls, p, shape, shape[-1] if shape.rank else None)
    out = shapes.Shape([shape[0], shape[3]])
    flops = shape.num_elements()
    if p.pooling_type == 'AVG':
      flops = shapes.Add(flops, out.num_elements())
    per_output = None if flops is None else flops // max(
        out.num_elements(), 1)
    return cost.Cost(flops=flops, out_shapes=(out,),
                     ops=_ReduceOps(p, out.num_elements(), per_output))


def _ReduceOps(p, outputs, per_output):
  """A pooling's ops: one element-wise reduction of `per_output` FLOPs for
  each of `outputs` (None if unknown): no product."""
  if outputs is None or per_output is None:
    return None
  return [op_cost.Elementwise(outputs, base_layer.FPropDtype(p).size,
                              per_output, reads=per_output)]
