"""Which parameter server holds each variable: least loaded, or round robin.

TF2's ParameterServerStrategy places the variables created in its scope on
the parameter servers in turn (round robin), whatever their sizes: a model
whose variables alternate big and small puts every big one on the same
server. Tensorpack's policy is greedy instead: each new variable goes to the
server holding the fewest bytes so far (ties: the lowest index), which keeps
any two servers' bytes within the size of the largest variable.

`PsPlacement(strategy, policy)` applies a policy to the variables created
inside its `Scope()` (a `tf.variable_creator_scope`, entered inside
`strategy.scope()`) and counts the bytes each server gets:

  'least_loaded'  the greedy policy. The strategy honours colocation, not
                  `tf.device`, so the variable is created colocated with an
                  *anchor* of the chosen server: a scalar placed there
                  first, one per server (the `colocate_with` creator
                  argument, which `strategy.extended.colocate_vars_with`
                  passes too).
  'round_robin'   the strategy's own placement; only the bytes are counted.

A variable created beside another (an optimizer slot or an EMA copy, see
`cluster.BesideVariable`) stays on that variable's server under both
policies and counts there; the greedy choice is made for the model's
variables, in the order the layers create them, and slots follow.

Example:
  with strategy.scope():
    placement = PsPlacement(strategy, 'least_loaded', num_ps=2)
    with placement.Scope():
      task = model_params.Instantiate().task
  logging.info('%s', placement.Report())
  # least_loaded placement on 2 parameter servers: ps 0 4,160 bytes (3
  # variables), ps 1 4,100 bytes (2 variables); largest variable 4,096 bytes
"""
import tensorflow as tf

from cadence.framework import base_model

# Declared beside the knob `train.ps_placement`, which every task checks.
POLICIES = base_model.PS_PLACEMENTS


def PsIndex(var):
  """The index of the 'ps' task holding `var`, or None if it is not on one."""
  spec = tf.DeviceSpec.from_string(var.device)
  return spec.task if spec.job == 'ps' else None


def VariableBytes(var):
  return var.shape.num_elements() * var.dtype.size


class PsPlacement:
  """Places new variables on parameter servers; see the module docstring.

  Args:
    strategy: a tf.distribute.experimental.ParameterServerStrategy; create
      the placement inside its scope.
    policy: one of POLICIES.
    num_ps: the number of parameter servers (the TF_CONFIG's 'ps' tasks).
  """

  def __init__(self, strategy, policy, num_ps):
    if policy not in POLICIES:
      raise ValueError(f'PsPlacement: policy={policy!r} must be one of '
                       f'{", ".join(POLICIES)}.')
    self._strategy = strategy
    self._policy = policy
    self._num_ps = num_ps
    self.bytes = [0] * num_ps      # Bytes placed on each server so far.
    self.counts = [0] * num_ps     # Variables placed on each server.
    self.largest = 0               # The largest variable placed, in bytes.
    self._anchors = [None] * num_ps
    if policy == 'least_loaded':
      self._MakeAnchors()

  def _MakeAnchors(self):
    """One scalar per server, by the strategy's round robin (which visits
    every server within num_ps variables)."""
    with self._strategy.scope():
      for _ in range(2 * self._num_ps):
        if all(a is not None for a in self._anchors):
          return
        anchor = tf.Variable(0, trainable=False, name='ps_anchor')
        index = PsIndex(anchor)
        if index is not None and self._anchors[index] is None:
          self._anchors[index] = anchor
    missing = [i for i, a in enumerate(self._anchors) if a is None]
    if missing:
      raise RuntimeError(f'PsPlacement: the strategy placed no variable on '
                         f'parameter server(s) {missing}.')

  @property
  def policy(self):
    return self._policy

  def Scope(self):
    """The variable creator scope that places (and counts) new variables."""
    return tf.variable_creator_scope(self._Create)

  def _Create(self, next_creator, **kwargs):
    if 'colocate_with' not in kwargs and self._policy == 'least_loaded':
      target = min(range(self._num_ps), key=lambda i: (self.bytes[i], i))
      kwargs['colocate_with'] = self._anchors[target]
    var = next_creator(**kwargs)
    index = PsIndex(var)
    if index is not None:
      size = VariableBytes(var)
      self.bytes[index] += size
      self.counts[index] += 1
      self.largest = max(self.largest, size)
    return var

  def Report(self):
    """One line: the policy and the bytes and variables on each server."""
    servers = ', '.join(f'ps {i} {b:,} bytes ({n} variables)' for i, (b, n)
                        in enumerate(zip(self.bytes, self.counts)))
    return (f'{self._policy} placement on {self._num_ps} parameter '
            f'server(s): {servers}; largest variable {self.largest:,} '
            'bytes.')
