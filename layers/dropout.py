"""Dropout with stateless, step-seeded masks (Srivastava et al., 2014).

The mask is drawn with `tf.random.stateless_uniform` from `OpSeed(theta)`,
which folds the step seed carried in theta with the layer's path. Running
FProp twice with the same step seed gives the same mask, so a rematerialised
backward pass (Recurrent, the pipeline) sees exactly the forward's dropout;
micro-batches get distinct masks through `step_seed.MicroBatchSeed`.
"""
import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import cost
from cadence.framework import op_cost
from cadence.framework import shapes
from cadence.framework import validation

# FLOPs per element when dropout is active: one uniform draw, one compare,
# one multiply by the scaled mask.
_FLOPS_PER_ELEMENT = 3


class DropoutLayer(base_layer.BaseLayer):
  """Inverted dropout: keeps each element with `keep_prob`, scales by 1/keep.

  Identity when `is_inference` is True or `keep_prob` is 1.0 (then theta
  needs no step seed).

  Example:
    p = DropoutLayer.Params().Set(name='drop', keep_prob=0.9)
    layer = p.Instantiate()
    theta = base_layer.WithStepSeed(layer.theta, step_seed.MakeStepSeed(7))
    y = layer.FProp(theta, tf.ones([2, 5, 8]))   # [2, 5, 8]
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('keep_prob', 1.0, 'Probability of keeping an element, in '
             '(0, 1]; 1.0 makes the layer the identity.')
    p.Define('noise_shape_broadcast_dims', None, 'Optional list of input '
             'dims (negative allowed) along which one mask value is shared, '
             'e.g. [1] drops whole time steps of [batch, time, dim].')
    return p

  def __init__(self, params):
    super().__init__(params)
    self.CheckParams(self.params, validation.Owner(self))

  @classmethod
  def CheckParams(cls, p, owner):
    super().CheckParams(p, owner)
    validation.CheckNumber(owner, 'keep_prob', p.keep_prob, 0, 1,
                           low_open=True)
    dims = p.noise_shape_broadcast_dims
    if dims is not None and (not isinstance(dims, (list, tuple)) or
                             not all(validation.IsInt(d) for d in dims)):
      raise validation.Error(owner, 'noise_shape_broadcast_dims', dims,
                             'must be None or a list of ints (input dims, '
                             'negative allowed).')

  @classmethod
  def _IsIdentity(cls, p):
    return p.is_inference or p.keep_prob == 1.0

  def _NoiseShape(self, inputs):
    dims = self.params.noise_shape_broadcast_dims
    shape = tf.shape(inputs)
    if not dims:
      return shape
    rank = inputs.shape.rank
    if rank is None:
      raise ValueError(
          f"DropoutLayer '{self.path}': noise_shape_broadcast_dims needs "
          'inputs of known rank.')
    for d in dims:
      if not -rank <= d < rank:
        raise ValueError(
            f"DropoutLayer '{self.path}': noise_shape_broadcast_dims has dim "
            f'{d}, out of range for inputs of rank {rank}.')
    bcast = {d % rank for d in dims}
    return tf.stack([1 if i in bcast else shape[i] for i in range(rank)])

  def FProp(self, theta, inputs):
    """Applies dropout.

    Args:
      theta: this layer's theta; must carry a step seed in training mode
        (`base_layer.WithStepSeed`) unless keep_prob is 1.0.
      inputs: a floating tensor of any shape.

    Returns:
      A tensor of the input shape, in fprop_dtype.
    """
    p = self.params
    inputs = self.CastToFPropDtype(inputs)
    if self._IsIdentity(p):
      return inputs
    seed = self.OpSeed(theta)
    noise = tf.random.stateless_uniform(self._NoiseShape(inputs), seed=seed)
    keep = tf.cast(noise < p.keep_prob, inputs.dtype)
    return inputs * (keep * tf.cast(1.0 / p.keep_prob, inputs.dtype))

  @classmethod
  def FPropMeta(cls, p, inputs):
    """Shapes and FLOPs.

    FLOPs: 0 when the layer is the identity, else 3 * num_elements (one
    uniform draw, one compare, one multiply per element); None when a dim
    is unknown. out_shapes: (inputs shape,). Bytes (held to the real
    gradient by tests/layers/layer_contract_test.py): act the scaled mask,
    one tensor of the input's size in fprop_dtype (0 for the identity;
    with noise_shape_broadcast_dims cost.Complete's default); nothing for
    act_weights and residuals (no weight).
    """
    cls.CheckParams(p, validation.Owner(p))
    shape = shapes.AsShape(inputs)
    flops = 0 if cls._IsIdentity(p) else shapes.Mul(
        _FLOPS_PER_ELEMENT, shape.num_elements())
    ops = None if flops is None else () if not flops else (
        # The uniform draw (float32), the mask and the scaled product.
        op_cost.Elementwise(shape.num_elements(), 4, _FLOPS_PER_ELEMENT,
                            reads=2, streams=2),)
    act = None
    if not p.noise_shape_broadcast_dims:
      act = 0 if cls._IsIdentity(p) else shapes.Mul(
          base_layer.FPropDtype(p).size, shape.num_elements())
    return cost.Cost(flops=flops, out_shapes=(shape,), ops=ops, act=act,
                     act_weights=0, residuals=0)
