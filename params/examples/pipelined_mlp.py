"""Pipeline your own model: the README's example, as written there.

A residual MLP block of one's own (not a Transformer), six of them and a
projection to the target, cut into 2 pipeline stages on 2 logical CPUs
and trained with 1F1B on the synthetic regression data:

  python trainer.py --model=examples.pipelined_mlp.PipelinedMlp \
      --logdir=/tmp/my_pipeline

It runs through every tool of the house: --mode=inspect_model (memory per
stage), --mode=plan --plan_measure, --mode=inspect_pipeline, every
schedule (task.net_tpl.pipeline_tpl.schedule=zb_h1) and --mode=export.
"""
import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import cost
from cadence.framework import model_registry
from cadence.framework import shapes
from cadence.layers import gpipe_stack
from cadence.layers import linear
from cadence.params.synthetic import linear_regression


class ResidualMlp(base_layer.BaseLayer):
  """x + relu(x w1) w2: [batch, dim] -> [batch, dim]."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('dim', 8, 'Width of the input and output, an int.')
    return p

  def __init__(self, params):
    super().__init__(params)
    d = self.params.dim
    self.CreateVariable('w1', base_layer.WeightParams([d, 4 * d]))
    self.CreateVariable('w2', base_layer.WeightParams([4 * d, d]))

  def FProp(self, theta, x):
    return x + tf.nn.relu(x @ theta.w1) @ theta.w2

  @classmethod
  def FPropMeta(cls, p, x):
    # Two products: 2 x 2 x 4 d^2 FLOPs a row. The backward reads x and
    # relu(x w1), 5 d a row (act, the memory estimate's); a deferred W
    # reads those and the two products' output gradients (residuals).
    x = shapes.AsShape(x)
    x_bytes = shapes.Mul(4, x.num_elements())   # float32
    return cost.Cost(flops=shapes.Mul(16 * p.dim, x.num_elements()),
                     out_shapes=(x,), act=shapes.Mul(5, x_bytes),
                     residuals=shapes.Mul(10, x_bytes))


class FeatureEmbedding(base_layer.BaseLayer):
  """x w: [batch, input_dim] -> [batch, dim], the features embedded in the
  model's width; it runs before the pipeline, on the whole batch."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('input_dim', 8, 'Features of an example, an int.')
    p.Define('dim', 32, 'The model\'s width, an int.')
    return p

  def __init__(self, params):
    super().__init__(params)
    self.CreateVariable('w', base_layer.WeightParams(
        [self.params.input_dim, self.params.dim]))

  def FProp(self, theta, x):
    return x @ theta.w

  @classmethod
  def FPropMeta(cls, p, x):   # One product: 2 input_dim dim FLOPs a row.
    x = shapes.AsShape(x)
    rows = x.num_elements() // p.input_dim if x.num_elements() else None
    return cost.Cost(flops=shapes.Mul(2 * p.input_dim * p.dim, rows),
                     out_shapes=(x[:-1] + (p.dim,),))


@model_registry.RegisterSingleTaskModel
class PipelinedMlp(linear_regression.RegressionGPipeTiny):
  """Six ResidualMlp blocks and a projection, 2 stages x 4 micro-batches."""

  def Task(self):
    p = super().Task()
    blocks = [ResidualMlp.Params().Set(dim=self.INPUT_DIM) for _ in range(6)]
    head = linear.ProjectionLayer.Params().Set(input_dim=self.INPUT_DIM,
                                               output_dim=1)
    p.pipeline_tpl = None   # The stack holds its pipeline.
    p.net_tpl = gpipe_stack.GPipeStack.Params().Set(
        units=blocks + [head], splits=2, example_shape=[self.INPUT_DIM])
    p.net_tpl.pipeline_tpl.Set(num_micro_batches=4, schedule='1f1b')
    return p


@model_registry.RegisterSingleTaskModel
class EmbeddedMlp(PipelinedMlp):
  """The features embedded into a wider model first: its embedding of its
  own before the six blocks of width 32 (the stack's before_tpl)."""

  WIDTH = 32

  def Task(self):
    p = super().Task()
    d = self.WIDTH
    p.net_tpl.Set(
        before_tpl=[FeatureEmbedding.Params().Set(input_dim=self.INPUT_DIM,
                                                  dim=d)],
        units=[ResidualMlp.Params().Set(dim=d) for _ in range(6)] + [
            linear.ProjectionLayer.Params().Set(input_dim=d, output_dim=1)])
    return p
