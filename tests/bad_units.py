"""Layers of a user's own whose FPropMeta or FProp breaks the contract.

Each is the README's ResidualMlp (params/examples/pipelined_mlp.py: x +
relu(x w1) w2, [batch, dim] -> [batch, dim]) with one thing wrong, for the
tests of the test kit (tests/framework/testing/, tests/layers/
gpipe_stack_test.py) and of the trainer's bad inputs
(tests/trainer_bad_inputs_test.py runs the experiments at the end, the
README's pipelined MLP with one bad unit or knob, as
--model=cadence.tests.bad_units.WrongShapeMlp, or puts a unit in it by
an override: task.net_tpl.units[1].cls=type('cadence.tests.bad_units.
WrongShape')).

`StatedMlp` is the correct one that states every figure; the others break
one rule each.
"""
import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import cost
from cadence.framework import model_registry
from cadence.framework import shapes
from cadence.params.examples import pipelined_mlp


class StatedMlp(pipelined_mlp.ResidualMlp):
  """ResidualMlp stating its memory too: its backward keeps x [n, d] and
  relu's output [n, 4d] (the inputs of the two products; relu's gradient
  reads its output); a deferred W reads those and the two products' output
  gradients, [n, 4d] and [n, d]."""

  @classmethod
  def FPropMeta(cls, p, x):
    x = shapes.AsShape(x)
    rows = shapes.Mul(*x[:-1])
    kept = shapes.Mul(4, rows, 5 * p.dim)   # float32 x and relu's output.
    return super().FPropMeta(p, x).Replace(
        act=kept, act_weights=kept, residuals=shapes.Mul(2, kept))


class FlopsOnlyMlp(pipelined_mlp.ResidualMlp):
  """ResidualMlp stating its FLOPs and shapes alone, as many a user's layer
  does: its memory figures are cost.Complete's defaults."""

  @classmethod
  def FPropMeta(cls, p, x):
    meta = super().FPropMeta(p, x)
    return cost.Cost(flops=meta.flops, out_shapes=meta.out_shapes)


class PlainNumber(pipelined_mlp.ResidualMlp):
  """FPropMeta returns its FLOPs alone, not a cost record."""

  @classmethod
  def FPropMeta(cls, p, x):
    return super().FPropMeta(p, x).flops


class WrongShape(pipelined_mlp.ResidualMlp):
  """FPropMeta states [..., 2 dim]; FProp gives [..., dim]."""

  @classmethod
  def FPropMeta(cls, p, x):
    meta = super().FPropMeta(p, x)
    return meta.Replace(out_shapes=(shapes.AsShape(x).WithDim(-1,
                                                              2 * p.dim),))


class WrongBatch(pipelined_mlp.ResidualMlp):
  """FPropMeta states twice the batch, which no layer after it checks."""

  @classmethod
  def FPropMeta(cls, p, x):
    x = shapes.AsShape(x)
    return super().FPropMeta(p, x).Replace(
        out_shapes=(x.WithDim(0, shapes.Mul(2, x[0])),))


class WrongFlops(StatedMlp):
  """FPropMeta counts one of the two products."""

  @classmethod
  def FPropMeta(cls, p, x):
    meta = super().FPropMeta(p, x)
    return meta.Replace(flops=meta.flops // 2)


class WrongAct(StatedMlp):
  """FPropMeta's act leaves out relu's output."""

  @classmethod
  def FPropMeta(cls, p, x):
    meta = super().FPropMeta(p, x)
    return meta.Replace(act=shapes.Mul(4, shapes.AsShape(x).num_elements()))


class UnusedVariable(StatedMlp):
  """A trainable variable FProp never reads: it gets no gradient."""

  def __init__(self, params):
    super().__init__(params)
    self.CreateVariable('scale', base_layer.WeightParams([self.params.dim]))


class StatefulDropout(StatedMlp):
  """Dropout from tf.random.uniform (stateful): a re-run differs."""

  def FProp(self, theta, x):
    y = super().FProp(theta, x)
    return y * tf.cast(tf.random.uniform(tf.shape(y)) > 0.5, y.dtype)


class BatchCentred(StatedMlp):
  """Subtracts the batch's mean: each micro-batch's own mean in a
  pipeline, so a pipelined step differs from the unpipelined one."""

  def FProp(self, theta, x):
    return super().FProp(theta, x - tf.reduce_mean(x, 0, keepdims=True))


# Experiments of a user's own: the README's pipelined MLP with one bad unit
# or knob each, run by tests/trainer_bad_inputs_test.py as
# --model=cadence.tests.bad_units.<Class>.


class _OneBadUnit(pipelined_mlp.PipelinedMlp):
  """PipelinedMlp with units[1] of class BAD_UNIT."""

  BAD_UNIT = None

  def Task(self):
    p = super().Task()
    p.net_tpl.units[1] = self.BAD_UNIT.Params().Set(dim=self.INPUT_DIM)
    return p


@model_registry.RegisterSingleTaskModel
class PlainNumberMlp(_OneBadUnit):
  """units[1]'s FPropMeta returns a number."""
  BAD_UNIT = PlainNumber


@model_registry.RegisterSingleTaskModel
class WrongShapeMlp(_OneBadUnit):
  """units[1]'s FPropMeta states [..., 2 dim]."""
  BAD_UNIT = WrongShape


@model_registry.RegisterSingleTaskModel
class ExampleRankMlp(pipelined_mlp.PipelinedMlp):
  """example_shape [8, 1] for inputs [batch, 8]."""

  def Task(self):
    p = super().Task()
    p.net_tpl.example_shape = [self.INPUT_DIM, 1]
    return p


@model_registry.RegisterSingleTaskModel
class LayerClassMlp(pipelined_mlp.PipelinedMlp):
  """units[2] is the class ResidualMlp, not its Params()."""

  def Task(self):
    p = super().Task()
    p.net_tpl.units[2] = pipelined_mlp.ResidualMlp
    return p
