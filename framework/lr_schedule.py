"""Learning-rate schedules: a float32 multiplier as a function of the step.

The learner's learning rate at step `s` is
`learner.learning_rate * schedule.Value(s)`. `Value` takes a Python int or an
integer/float tensor, returns a float32 scalar tensor, and has no Python side
effects, so it can run inside a `tf.function` with a changing step tensor
without retracing.

Example:
  sched = PiecewiseConstantSchedule.Params().Set(
      boundaries=[100, 200], values=[1.0, 0.1, 0.01]).Instantiate()
  sched.Value(150)  # 0.1
"""
import math

import tensorflow as tf

from cadence.framework import hyperparams
from cadence.framework import validation


def _Step(step):
  """The step as a float32 scalar tensor."""
  return tf.cast(tf.convert_to_tensor(step), tf.float32)


class BaseSchedule:
  """A schedule built from Params; subclasses define `Value(step)`."""

  @classmethod
  def Params(cls):
    return hyperparams.InstantiableParams(cls)

  def __init__(self, params):
    self._params = params.Copy().Freeze() if not params.IsFrozen() else params

  @property
  def params(self):
    return self._params

  def Value(self, step):
    """Returns the float32 scalar multiplier at `step` (int or tensor)."""
    raise NotImplementedError(f'{type(self).__name__}.Value')


class ConstantSchedule(BaseSchedule):
  """`value` at every step.

  Example:
    ConstantSchedule.Params().Set(value=0.5).Instantiate().Value(7)  # 0.5
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('value', 1.0, 'The constant multiplier, a float.')
    return p

  def Value(self, step):
    del step  # Unused.
    return tf.constant(self.params.value, tf.float32)


class PiecewiseConstantSchedule(BaseSchedule):
  """`values[i]` for `boundaries[i-1] <= step < boundaries[i]`.

  `values[0]` applies before `boundaries[0]` and `values[-1]` from
  `boundaries[-1]` on, so there is one more value than boundaries.

  Example:
    s = PiecewiseConstantSchedule.Params().Set(
        boundaries=[10], values=[1.0, 0.1]).Instantiate()
    s.Value(9), s.Value(10)  # 1.0, 0.1
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('boundaries', [], 'Strictly increasing steps (ints) at which '
             'the value changes.')
    p.Define('values', [1.0], 'The multipliers: len(boundaries) + 1 floats.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    boundaries, values = list(p.boundaries), list(p.values)
    if len(values) != len(boundaries) + 1:
      raise ValueError(
          f'{type(self).__name__}: got {len(values)} values for '
          f'{len(boundaries)} boundaries; need len(values) == '
          f'len(boundaries) + 1 = {len(boundaries) + 1} '
          f'(boundaries={boundaries!r}, values={values!r})')
    if any(b1 >= b2 for b1, b2 in zip(boundaries, boundaries[1:])):
      raise validation.Error(validation.Owner(self), 'boundaries', boundaries,
                             'must be strictly increasing.')
    self._boundaries = tf.constant(boundaries or [0], tf.float32)
    self._values = tf.constant(values, tf.float32)

  def Value(self, step):
    if not self.params.boundaries:
      return self._values[0]
    index = tf.reduce_sum(
        tf.cast(_Step(step) >= self._boundaries, tf.int32))
    return tf.gather(self._values, index)


class LinearRampupSchedule(BaseSchedule):
  """Linear from `start` at step 0 to `peak` at `warmup_steps`, then `peak`.

  Example:
    s = LinearRampupSchedule.Params().Set(warmup_steps=4).Instantiate()
    s.Value(1), s.Value(4), s.Value(100)  # 0.25, 1.0, 1.0
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('warmup_steps', 1000, 'Steps to go from start to peak, an int '
             '>= 0 (0: peak from step 0).')
    p.Define('start', 0.0, 'The multiplier at step 0, a float.')
    p.Define('peak', 1.0, 'The multiplier from warmup_steps on, a float.')
    return p

  def __init__(self, params):
    super().__init__(params)
    validation.CheckNumber(validation.Owner(self), 'warmup_steps',
                           self.params.warmup_steps, low=0)

  def Value(self, step):
    p = self.params
    if p.warmup_steps == 0:
      return tf.constant(p.peak, tf.float32)
    frac = tf.minimum(_Step(step) / float(p.warmup_steps), 1.0)
    return p.start + (p.peak - p.start) * frac


class TransformerSchedule(BaseSchedule):
  """The rsqrt schedule of "Attention Is All You Need" (Vaswani et al. 2017).

  `model_dim**-0.5 * min((s + 1) * w**-1.5, (s + 1)**-0.5)` with
  `w = warmup_steps * worker_replicas`: linear warm-up to the peak at step
  `w - 1`, then decay as the inverse square root of the step.

  Example:
    s = TransformerSchedule.Params().Set(
        model_dim=512, warmup_steps=4000).Instantiate()
    s.Value(3999)  # 512**-0.5 * 4000**-0.5, the peak
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('model_dim', 512, 'The model width that scales the schedule, '
             'an int > 0.')
    p.Define('warmup_steps', 4000, 'Warm-up steps, an int > 0.')
    p.Define('worker_replicas', 1, 'Data-parallel replicas; scales '
             'warmup_steps, an int > 0.')
    return p

  def __init__(self, params):
    super().__init__(params)
    for field in ('model_dim', 'warmup_steps', 'worker_replicas'):
      validation.CheckNumber(validation.Owner(self), field,
                             self.params.Get(field), low=0, low_open=True)

  def Value(self, step):
    p = self.params
    warmup = float(p.warmup_steps * p.worker_replicas)
    s = _Step(step) + 1.0
    return p.model_dim**-0.5 * tf.minimum(s * warmup**-1.5, tf.math.rsqrt(s))


class CosineSchedule(BaseSchedule):
  """Linear warm-up to `initial_value`, then cosine decay to `final_value`.

  For `s < warmup_steps`: `initial_value * s / warmup_steps`. Then
  `final + (initial - final) * (1 + cos(pi * t)) / 2` with
  `t = min(s - warmup_steps, total - warmup_steps) / (total - warmup_steps)`,
  so the value stays `final_value` after `total_steps`.

  Example:
    s = CosineSchedule.Params().Set(total_steps=100).Instantiate()
    s.Value(50)  # 0.5
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('initial_value', 1.0, 'The multiplier after warm-up, a float.')
    p.Define('total_steps', 10000, 'Step at which final_value is reached, an '
             'int > warmup_steps.')
    p.Define('final_value', 0.0, 'The multiplier from total_steps on, a '
             'float.')
    p.Define('warmup_steps', 0, 'Linear warm-up steps from 0, an int >= 0.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    owner = validation.Owner(self)
    validation.CheckNumber(owner, 'warmup_steps', p.warmup_steps, low=0)
    if p.total_steps <= p.warmup_steps:
      raise validation.Error(owner, 'total_steps', p.total_steps,
                             f'must be > warmup_steps={p.warmup_steps}.')

  def Value(self, step):
    p = self.params
    s = _Step(step)
    decay_steps = float(p.total_steps - p.warmup_steps)
    t = tf.clip_by_value(s - p.warmup_steps, 0.0, decay_steps) / decay_steps
    cosine = p.final_value + (p.initial_value - p.final_value) * 0.5 * (
        1.0 + tf.cos(math.pi * t))
    if p.warmup_steps == 0:
      return cosine
    warm = p.initial_value * s / float(p.warmup_steps)
    return tf.where(s < p.warmup_steps, warm, cosine)
