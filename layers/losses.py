"""Losses as layers: what a task runs after its network, declared as a
layer so that a pipelined model's plan costs and times it (layers/
gpipe_units.py `Ends`).

Example:
  loss = SquaredErrorLoss.Params().Set(name='loss').Instantiate()
  out = loss.FProp(loss.theta, predictions, targets)  # [b, 1], [b]
  out.loss, out.abs_error, out.examples, out.squared_error
"""
import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import cost
from cadence.framework import op_cost
from cadence.framework import shapes
from cadence.framework import validation

NestedMap = base_layer.NestedMap


class SquaredErrorLoss(base_layer.BaseLayer):
  """Squared and absolute errors of predictions [b, 1] against targets [b],
  in float32; no variables.

  FProp returns NestedMap(loss: the sum of the squared errors, abs_error:
  the sum of the absolute errors, examples: b, squared_error: [b]).
  """

  def FProp(self, theta, predictions, targets):
    """predictions [b, 1], targets [b] -> the sums; see the class."""
    del theta   # No variables.
    err = (tf.squeeze(tf.cast(predictions, tf.float32), -1) -
           tf.cast(targets, tf.float32))                          # [b]
    return NestedMap(loss=tf.reduce_sum(tf.square(err)),
                     abs_error=tf.reduce_sum(tf.abs(err)),
                     examples=tf.cast(tf.size(err), tf.float32),
                     squared_error=tf.square(err))

  @classmethod
  def FPropMeta(cls, p, predictions, targets):
    """A subtract, a square and its sum, an absolute value and its sum per
    example: 4 FLOPs a row, element-wise. out_shapes: (NestedMap,) of
    FProp's outputs. Bytes: its backward reads the errors (act); kept
    without a weight product (act_weights, 'selective' remat) they are the
    errors and their squares' input, twice that (measured by
    tests/layers/layer_contract_test.py)."""
    cls.CheckParams(p, validation.Owner(p))
    rows = shapes.AsShape(targets)
    if shapes.AsShape(predictions).rank != 2:
      raise validation.Error(validation.Owner(p), 'predictions',
                             list(shapes.AsShape(predictions)),
                             'must be [batch, 1].')
    scalar = shapes.Shape([])
    n = rows.num_elements()
    err = shapes.Mul(4, n)   # float32
    return cost.Cost(flops=shapes.Mul(n, 4),
                     out_shapes=(NestedMap(loss=scalar, abs_error=scalar,
                                           examples=scalar,
                                           squared_error=rows),),
                     ops=None if n is None else (
                         op_cost.Elementwise(n, 4, flops_per_element=4,
                                             reads=2),),
                     act=err, act_weights=shapes.Mul(2, err), residuals=0)
