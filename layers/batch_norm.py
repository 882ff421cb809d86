"""Batch normalisation with moving statistics that micro-batching keeps right.

Ioffe & Szegedy, 2015, "Batch Normalization: Accelerating Deep Network
Training by Reducing Internal Covariate Shift", arXiv:1502.03167.

A pipeline cell is a pure function of theta (layers/gpipe.py): it may not
assign variables, and its backward re-runs it. So normalisation and the
moving-average update are two separate calls:

  1. `FPropStats(theta, x)` (pure) normalises x with its own batch
     statistics in training and returns them beside the output: `stats`
     [2, dim] = (mean, variance) over every axis but the last. A layer made
     of BatchNormLayers (a `BatchStatsLayer`) returns its children's stats
     in a NestedMap keyed by child name (layers/resnet.py). Inside a pipeline each micro-batch is
     one call, so each micro-batch normalises with its own statistics; the
     cell passes its stats on as extra outputs with a batch dim of 1, and
     the pipeline concatenates them over micro-batches in order:
     [num_micro_batches, 2, dim] (layers/gpipe_resnet.py).
  2. `UpdateMovingStats(stats)` (after the pipeline, outside any cell)
     takes those [M, 2, dim] stats and applies the moving-average update
     once per micro-batch, in micro-batch order:
       moving <- decay * moving + (1 - decay) * stats[j],  j = 0 .. M-1.
     The unpipelined model run on the M micro-batches one after another
     ends with exactly the same moving statistics.

In inference (`is_inference`) FPropStats normalises with the moving
statistics read from theta and returns stats None.

The moving statistics are non-trainable variables declared with
`aggregation=MEAN`: under data parallelism each replica updates its copy
from its own batch and the trainer averages the copies after every step
(framework/train/replicas.py), so the replicas agree (the mean of their
averages; each replica's batch variance is its own, as in unsynchronised
batch norm). The variance is the biased
one (divided by the number of examples), in training and in the update.
Statistics are computed in float32 (float64 with a float64 fprop_dtype).
"""
import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import cost
from cadence.framework import op_cost
from cadence.framework import shapes
from cadence.framework import validation

WeightInit = base_layer.WeightInit
WeightParams = base_layer.WeightParams


def MovingAverages(mean, variance, stats, decay):
  """The moving (mean, variance) after one update per row of `stats`.

  Args:
    mean: [dim], the moving mean before.
    variance: [dim], the moving variance before.
    stats: [M, 2, dim], per micro-batch (mean, variance), in order.
    decay: float in [0, 1).

  Returns:
    (mean [dim], variance [dim]) after M updates.
  """
  for j in range(stats.shape[0]):
    mean = decay * mean + (1.0 - decay) * stats[j, 0]
    variance = decay * variance + (1.0 - decay) * stats[j, 1]
  return mean, variance


class BatchStatsLayer(base_layer.BaseLayer):
  """Base of layers made of BatchNormLayers (see the module docstring).

  A subclass implements `FPropStats(theta, *inputs) -> (outputs, stats)`,
  stats a NestedMap child name -> that child's stats (None in inference).
  `FProp` returns the outputs alone; `UpdateMovingStats(stats)` (leaves
  with a leading micro-batch dim) calls each named child's.
  """

  def FPropStats(self, theta, *inputs):
    raise NotImplementedError(
        f'{type(self).__name__} must implement FPropStats(theta, ...).')

  def FProp(self, theta, *inputs):
    """FPropStats' outputs alone (the statistics are dropped)."""
    return self.FPropStats(theta, *inputs)[0]

  @classmethod
  def StatsShapes(cls, p):
    """The shapes of FPropStats' stats in training: a shapes.Shape, or a
    NestedMap child name -> its StatsShapes (what a pipeline carries per
    micro-batch, layers/gpipe_units.py)."""
    raise NotImplementedError(f'{cls.__name__} must declare StatsShapes(p).')

  def UpdateMovingStats(self, stats):
    """Applies FPropStats' stats, leaves [micro_batches, ...], to the
    children they name; once per training step, outside any cell."""
    for name, child_stats in (stats or {}).items():
      if child_stats is not None:
        self.children[name].UpdateMovingStats(child_stats)


class BatchNormLayer(BatchStatsLayer):
  """y = (x - mean) / sqrt(var + epsilon) * gamma + beta over the last dim.

  Variables: `beta` [dim] (init 0), `gamma` [dim] (init 1), and the
  non-trainable `moving_mean` [dim] (init 0) and `moving_variance` [dim]
  (init 1), aggregation MEAN. See the module docstring for how training
  statistics and the moving averages work under micro-batches.

  Example:
    bn = BatchNormLayer.Params().Set(name='bn', dim=8).Instantiate()
    y, stats = bn.FPropStats(bn.theta, tf.random.normal([4, 5, 5, 8]))
    bn.UpdateMovingStats(stats[tf.newaxis])     # stats [1, 2, 8]
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('dim', 0, 'Depth of the normalised (last) dim, an int > 0.')
    p.Define('decay', 0.9, 'Moving-average decay per (micro-)batch, in '
             '[0, 1).')
    p.Define('epsilon', 1e-5, 'Added to the variance before the inverse '
             'square root, a number > 0.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CheckParams(p, validation.Owner(self))
    d = p.dim
    self.CreateVariable('beta', WeightParams([d], WeightInit.Constant(0.0)))
    self.CreateVariable('gamma', WeightParams([d], WeightInit.Constant(1.0)))
    for name, value in (('moving_mean', 0.0), ('moving_variance', 1.0)):
      self.CreateVariable(name, WeightParams(
          [d], WeightInit.Constant(value), trainable=False,
          aggregation=tf.VariableAggregation.MEAN))

  @classmethod
  def CheckParams(cls, p, owner):
    super().CheckParams(p, owner)
    validation.CheckInt(owner, 'dim', p.dim)
    validation.CheckNumber(owner, 'decay', p.decay, 0, 1, high_open=True)
    validation.CheckNumber(owner, 'epsilon', p.epsilon, low=0, low_open=True)

  def _ComputeDtype(self):
    return base_layer.AccumulationDtype(self.fprop_dtype)

  @classmethod
  def StatsShapes(cls, p):
    """[2, dim]: the batch's mean and variance."""
    return shapes.Shape([2, p.dim])

  def FPropStats(self, theta, inputs):
    """Normalises; returns the batch statistics too (training).

    Args:
      theta: NestedMap with `beta`, `gamma`, `moving_mean`,
        `moving_variance`, each [dim].
      inputs: [..., dim].

    Returns:
      (outputs [..., dim] in fprop_dtype, stats [2, dim] = (mean, variance)
      of the inputs over all but the last axis in the compute dtype; None
      with is_inference).
    """
    p = self.params
    dtype = self._ComputeDtype()
    x = tf.cast(inputs, dtype)
    if p.is_inference:
      mean = tf.cast(theta.moving_mean, dtype)
      variance = tf.cast(theta.moving_variance, dtype)
      stats = None
    else:
      axes = list(range(x.shape.rank - 1))
      mean, variance = tf.nn.moments(x, axes)                 # [dim] each
      stats = tf.stack([mean, variance])                      # [2, dim]
    scale = tf.math.rsqrt(variance + p.epsilon) * tf.cast(theta.gamma, dtype)
    out = (x - mean) * scale + tf.cast(theta.beta, dtype)
    return tf.cast(out, self.fprop_dtype), stats

  def UpdateMovingStats(self, stats):
    """Assigns the moving averages after one update per micro-batch.

    Call it outside the pipeline (and outside any pure cell), once per
    training step.

    Args:
      stats: [M, 2, dim], FPropStats' stats of micro-batches 0..M-1.

    Returns:
      The assign ops (a list; in eager mode they ran already).
    """
    p = self.params
    if stats.shape.rank != 3 or stats.shape[1:] != [2, p.dim]:
      raise ValueError(f'{validation.Owner(self)}: stats shape '
                       f'{stats.shape.as_list()} must be [micro_batches, 2, '
                       f'{p.dim}].')
    mean_var, var_var = self.vars.moving_mean, self.vars.moving_variance
    mean, variance = MovingAverages(
        tf.cast(mean_var, stats.dtype), tf.cast(var_var, stats.dtype), stats,
        p.decay)
    with tf.device(mean_var.device):
      return [mean_var.assign(tf.cast(mean, mean_var.dtype)),
              var_var.assign(tf.cast(variance, var_var.dtype))]

  @classmethod
  def FPropMeta(cls, p, inputs):
    """Shapes and FLOPs.

    With N elements per channel (the product of the leading dims):
    training: N * dim * 7 + 3 * dim (the mean's sum, centring, square, the
    variance's sum, centring again, the scale and the shift per element;
    the divisions by N and rsqrt per channel); inference: N * dim * 3 +
    2 * dim. None if N is unknown. ops: a norm over the elements and the
    per-channel arithmetic. Bytes (float32, float64 for float64; held to
    the real gradient by tests/layers/layer_contract_test.py): act the
    input and the normalised input the backward reads and three
    per-channel vectors (the mean, the variance's inverse square root and
    the channel sums of the gradient); act_weights the normalised input
    (the scale's product reads it); residuals it and two per-channel
    vectors (what the scale's and shift's deferred gradients read).
    """
    cls.CheckParams(p, validation.Owner(p))
    shape = shapes.AsShape(inputs)
    if shape.rank is None or shape.rank < 2 or shape[-1] not in (None, p.dim):
      raise ValueError(
          f"{cls.__name__} '{p.name}': inputs shape {list(shape)} must be "
          f'[..., {p.dim}] of rank >= 2.')
    n = shapes.Mul(*shape[:-1])
    per_element, per_channel = (3, 2) if p.is_inference else (7, 3)
    size = 8 if tf.as_dtype(p.fprop_dtype or p.dtype) == tf.float64 else 4
    elements = shape.num_elements()
    ops = None if elements is None else [
        op_cost.Norm(elements, size, per_element),
        op_cost.Elementwise(p.dim, size, per_channel)]
    return cost.Cost(
        flops=shapes.Add(shapes.Mul(n, p.dim * per_element),
                         per_channel * p.dim),
        out_shapes=(shape,),
        act=shapes.Mul(size, shapes.Add(shapes.Mul(2, elements),
                                        3 * p.dim)),
        act_weights=shapes.Mul(size, elements),
        residuals=shapes.Mul(size, shapes.Add(elements, 2 * p.dim)),
        ops=ops)
