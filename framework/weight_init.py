"""Weight initialisers and variable specs for `BaseLayer.CreateVariable`.

An initialiser is a small `Params` (`method`, `scale`), so it prints in
`params.txt` and round-trips through `--model_params_override`. Values are
drawn with stateless random ops seeded by (random_seed, variable path): the
same experiment builds the same weights in every process.

Fans, for a variable of shape [d0, ..., dn-1]:
  fan_in  = d0 * ... * dn-2 (rank >= 2), d0 (rank 1), 1 (scalar)
  fan_out = dn-1 (rank >= 2), d0 (rank 1), 1 (scalar)
A conv filter [h, w, in, out] therefore has fan_in = h*w*in.

Example:
  wp = WeightParams([512, 2048], WeightInit.Xavier(1.0))
  value = InitialValue(wp, seed=(1234, PathHash('lm.ffn.w')))
"""
import math

import tensorflow as tf

from cadence.framework import hyperparams
from cadence.framework import validation

_METHODS = ('constant', 'gaussian', 'uniform', 'truncated_gaussian', 'xavier',
            'gaussian_sqrt_dim', 'uniform_sqrt_dim', 'gaussian_sqrt_fanout')


def _Init(method, scale):
  p = hyperparams.Params()
  p.Define('method', method, f'One of {", ".join(_METHODS)}.')
  p.Define('scale', float(scale), 'Scale: the value, stddev or limit factor.')
  return p


class WeightInit:
  """Factory of initialiser params; see the module docstring for fans."""

  @staticmethod
  def Constant(scale=0.0):
    """Every element equals `scale`."""
    return _Init('constant', scale)

  @staticmethod
  def Gaussian(scale=1.0):
    """Normal with stddev `scale`."""
    return _Init('gaussian', scale)

  @staticmethod
  def Uniform(scale=1.0):
    """Uniform in [-scale, scale)."""
    return _Init('uniform', scale)

  @staticmethod
  def TruncatedGaussian(scale=1.0):
    """Normal with stddev `scale`, redrawn beyond two stddevs."""
    return _Init('truncated_gaussian', scale)

  @staticmethod
  def Xavier(scale=1.0):
    """Uniform in +-scale*sqrt(6 / (fan_in + fan_out)) (Glorot)."""
    return _Init('xavier', scale)

  @staticmethod
  def GaussianSqrtDim(scale=1.0):
    """Normal with stddev scale / sqrt(fan_in)."""
    return _Init('gaussian_sqrt_dim', scale)

  @staticmethod
  def UniformSqrtDim(scale=1.0):
    """Uniform in +-scale / sqrt(fan_in)."""
    return _Init('uniform_sqrt_dim', scale)

  @staticmethod
  def GaussianSqrtFanOut(scale=1.0):
    """Normal with stddev scale / sqrt(fan_out)."""
    return _Init('gaussian_sqrt_fanout', scale)


def CheckInit(owner, field, init):
  """Raises a ValueError naming `owner` and `field` (e.g. 'params_init')
  unless `init` is WeightInit params: a `method` of the known ones and a
  number `scale`. Returns `init`.

  Example:
    CheckInit("ProjectionLayer 'fc'", 'params_init', WeightInit.Xavier(1.0))
  """
  if not (isinstance(init, hyperparams.Params) and 'method' in init and
          'scale' in init):
    raise validation.Error(owner, field, init, 'must be WeightInit params '
                           '(method and scale), e.g. WeightInit.Xavier(1.0).')
  validation.CheckOneOf(owner, f'{field}.method', init.method, _METHODS)
  if not validation.IsNumber(init.scale):
    raise validation.Error(owner, f'{field}.scale', init.scale,
                           'must be a number.')
  return init


def WeightParams(shape, init=None, dtype=None, trainable=True,
                 aggregation=tf.VariableAggregation.NONE,
                 synchronization=tf.VariableSynchronization.AUTO):
  """Describes one variable for `BaseLayer.CreateVariable`.

  Args:
    shape: list of ints, the variable's shape.
    init: a `WeightInit` params; None means the layer's `params_init`.
    dtype: the variable's dtype; None means the layer's `dtype`.
    trainable: whether the learner updates it.
    aggregation: for a variable the replicas update themselves (a counter,
      moving statistics), how their copies combine
      (framework/train/replicas.py): NONE (they are not combined), MEAN, SUM (of
      the replicas' increments) or ONLY_FIRST_REPLICA. Trained variables need
      NONE: the learner keeps them equal.
    synchronization: when the copies are combined: ON_WRITE (AUTO) after
      every step, ON_READ only before they are read (a checkpoint, an eval).
  """
  p = hyperparams.Params()
  p.Define('shape', list(shape), 'The variable shape, a list of ints.')
  p.Define('init', init, 'WeightInit params; None: the layer params_init.')
  p.Define('dtype', dtype, 'Variable dtype; None: the layer dtype.')
  p.Define('trainable', trainable, 'Whether the learner updates it.')
  p.Define('aggregation', aggregation, 'tf.VariableAggregation of the '
           "replicas' copies (for variables the replicas update).")
  p.Define('synchronization', synchronization, 'tf.VariableSynchronization: '
           'ON_WRITE/AUTO (every step) or ON_READ (before reads).')
  return p


def Fans(shape):
  """Returns (fan_in, fan_out) of a variable shape (module docstring)."""
  shape = list(shape)
  if not shape:
    return 1, 1
  if len(shape) == 1:
    return shape[0], shape[0]
  return math.prod(shape[:-1]), shape[-1]


def InitialValue(init, shape, dtype, seed):
  """Draws the initial value of a variable.

  Args:
    init: WeightInit params.
    shape: list of ints.
    dtype: a floating tf.DType (integer dtypes only allow 'constant').
    seed: a pair of ints for the stateless random ops.

  Returns:
    A tensor of `shape` and `dtype`.
  """
  method, scale = init.method, init.scale
  if method not in _METHODS:
    raise ValueError(
        f'WeightInit method {method!r} is unknown; expected one of '
        f'{", ".join(_METHODS)}.')
  if method == 'constant':
    return tf.fill(shape, tf.cast(scale, dtype))
  if not dtype.is_floating:
    raise ValueError(
        f'WeightInit {method!r} needs a floating dtype; got {dtype.name}. '
        'Use WeightInit.Constant for integer variables.')
  fan_in, fan_out = Fans(shape)
  seed = tf.constant(seed, tf.int64)
  # Draw in float32 and cast, so bfloat16 variables get the same numbers.
  if method == 'gaussian':
    value = tf.random.stateless_normal(shape, seed, stddev=scale)
  elif method == 'truncated_gaussian':
    value = tf.random.stateless_truncated_normal(shape, seed, stddev=scale)
  elif method == 'gaussian_sqrt_dim':
    value = tf.random.stateless_normal(
        shape, seed, stddev=scale / math.sqrt(max(fan_in, 1)))
  elif method == 'gaussian_sqrt_fanout':
    value = tf.random.stateless_normal(
        shape, seed, stddev=scale / math.sqrt(max(fan_out, 1)))
  else:
    if method == 'uniform':
      limit = scale
    elif method == 'uniform_sqrt_dim':
      limit = scale / math.sqrt(max(fan_in, 1))
    else:  # xavier
      limit = scale * math.sqrt(6.0 / max(fan_in + fan_out, 1))
    value = tf.random.stateless_uniform(
        shape, seed, minval=-limit, maxval=limit)
  return tf.cast(value, dtype)
