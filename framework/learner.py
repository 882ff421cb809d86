"""Learner: gradients, clipping, skipping bad steps, L2, and the update.

A `Learner` owns which variables train (trainable, matched by the path
filters), the optimizer and the learning-rate schedule. One train step is

  with tf.GradientTape() as tape:
    loss = ...
  grads = learner.ComputeGradients(tape, loss)     # NestedMap like vars
  stats = learner.ApplyGradients(step, grads, loss=loss)

(or `stats = learner.Apply(step, tape, loss)`). `ApplyGradients` computes the
global gradient norm, skips the update (leaving every variable and optimizer
slot bit-identical) when the norm or the loss is not finite or the norm is
above `grad_norm_to_clip_to_zero`, else clips to
`clip_gradient_norm_to_value` and applies the optimizer with learning rate
`learning_rate * lr_schedule.Value(step)`.

Distribution (framework/train/replicas.py): each replica's copy of the task has
its own learner. `ComputeGradients` returns the replica's own gradients;
the train program all-reduces them across replicas (MEAN: each replica's
loss is the mean over its own examples) and gives every copy's
`ApplyGradients` the same reduced gradients and the same skip decision, so
the copies stay equal.
"""
import difflib
import re

import tensorflow as tf

from cadence.framework import hyperparams
from cadence.framework import lr_schedule as lr_schedule_lib
from cadence.framework.nested_map import NestedMap
from cadence.framework import optimizer as optimizer_lib
from cadence.framework import validation

_NOT_TRAINED = object()  # Marks leaves of var_map that do not train.


def _Kinds(module, base):
  """{name: class} of the public subclasses of `base` in `module`, in the
  order the module defines them (e.g. SGD, Momentum, Adam, Adafactor)."""
  return {name: obj for name, obj in vars(module).items()
          if isinstance(obj, type) and issubclass(obj, base) and
          obj is not base and not name.startswith('_')}


def _CheckKind(owner, field, params, module, base):
  """Raises a ValueError unless `params` (the learner's `field`) are the
  InstantiableParams of a subclass of `base`; names the classes of
  `module` there are, and the one meant when a class name was given as a
  str (e.g. optimizer.cls='adam')."""
  kinds = _Kinds(module, base)
  what = f'one of {", ".join(kinds)} ({module.__name__})'
  if not isinstance(params, hyperparams.InstantiableParams):
    raise validation.Error(owner, field, params, f'must be the Params() of '
                           f'{what}.')
  cls = params.cls
  if isinstance(cls, type) and issubclass(cls, base):
    return
  hint = ''
  if isinstance(cls, str):
    by_lower = {name.lower(): name for name in kinds}
    close = difflib.get_close_matches(cls.rpartition('.')[2].lower(),
                                      list(by_lower), n=1, cutoff=0.6)
    if close:
      hint = (f" Did you mean type('{module.__name__}."
              f"{by_lower[close[0]]}') (a class, not a str)?")
  raise validation.Error(owner, f'{field}.cls', cls,
                         f'must be {what}.{hint}')


def _Regex(owner, field, pattern):
  """re.compile(pattern), None for None; a ValueError naming `owner` and
  `field` for a pattern that does not compile."""
  if pattern is None:
    return None
  try:
    return re.compile(pattern)
  except (re.error, TypeError) as e:
    raise validation.Error(owner, field, pattern,
                           f'is not a valid regex: {e}') from None


def SquaredSum(grad, dtype=tf.float64):
  """The sum of squares of `grad`'s dense value, accumulated in `dtype`.

  An IndexedSlices' rows of one index are summed first
  (tf.linalg.global_norm squares each row on its own, which is not the
  gradient's norm when an embedding row is gathered more than once),
  without densifying it. Accumulated in float64, the sum does not depend
  on how the gradient is cut (whole, or into the shards of sharded
  optimizer state): another order moves its float64 bits, not the float32
  norm clipping reads, so sharded and unsharded runs clip alike.
  """
  if isinstance(grad, tf.IndexedSlices):
    unique, position = tf.unique(grad.indices)
    grad = tf.math.unsorted_segment_sum(grad.values, position,
                                        tf.size(unique))
  return tf.reduce_sum(tf.square(tf.cast(grad, dtype)))


def GlobalNorm(grads, dtype=tf.float64):
  """The float32 L2 norm of `grads` (tensors or IndexedSlices) taken
  together, their squares accumulated in `dtype` (SquaredSum; float32
  where the device has no float64, a TPU): what clipping and the skip
  read."""
  if not grads:
    return tf.constant(0.0, tf.float32)
  return tf.cast(tf.sqrt(tf.add_n([SquaredSum(g, dtype) for g in grads])),
                 tf.float32)


class Learner:
  """Turns a loss into variable updates.

  Example:
    p = Learner.Params().Set(learning_rate=0.1,
                             clip_gradient_norm_to_value=1.0)
    p.optimizer = optimizer.SGD.Params()
    learner = p.Instantiate(var_map=layer.vars)
    learner.Build()
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(layer(x))
    stats = learner.Apply(step, tape, loss)  # grad_norm, skipped, ...
  """

  @classmethod
  def Params(cls):
    p = hyperparams.InstantiableParams(cls)
    p.Define('name', 'learner', 'Name of the learner, used in messages.')
    p.Define('optimizer', optimizer_lib.Adam.Params(), 'Optimizer params.')
    p.Define('learning_rate', 1e-3, 'Base learning rate, a float >= 0; '
             'multiplied by lr_schedule.Value(step).')
    p.Define('lr_schedule', lr_schedule_lib.ConstantSchedule.Params(),
             'Learning-rate schedule params (a multiplier of learning_rate).')
    p.Define('clip_gradient_norm_to_value', 0.0, 'Scale the gradients so '
             'their global L2 norm is at most this, a float (0: off).')
    p.Define('grad_norm_to_clip_to_zero', 0.0, 'Skip the update when the '
             'global gradient norm exceeds this, a float (0: off).')
    p.Define('l2_regularizer_weight', 0.0, 'Adds weight * sum(v^2) / 2 over '
             'the trained variables to the loss, a float (0: off).')
    p.Define('bprop_variable_filter', None, 'Regex (re.search on the '
             'variable path) that a variable must match to train; None: '
             'all.')
    p.Define('bprop_variable_exclusion', None, 'Regex (re.search on the '
             'variable path); matching variables do not train. None: none.')
    p.Define('shard_optimizer_state', False, 'Shard the optimizer slots over '
             'the data-parallel replicas of each pipeline stage (ZeRO-1): '
             'each replica keeps and updates 1/R of every slot from the '
             'all-reduced gradients, and the updated weights are '
             'all-gathered (framework/train/sharded_update.py); the same '
             'training as unsharded, bit for bit. SGD, Momentum or Adam.')
    return p

  def __init__(self, params, var_map):
    """Builds the learner.

    Args:
      params: `Learner.Params()`.
      var_map: NestedMap of tf.Variables (e.g. a layer's `vars`); dotted
        `FlattenItems` keys are the paths the filters match.
    """
    self._params = params.Copy().Freeze()
    self.CheckParams(self._params, validation.Owner(self))
    p = self._params
    self._optimizer = p.optimizer.Instantiate()
    self._schedule = p.lr_schedule.Instantiate()
    keep_re = self._Compile('bprop_variable_filter')
    drop_re = self._Compile('bprop_variable_exclusion')
    seen = set()
    keep_paths = set()
    for path, var in var_map.FlattenItems():
      if not isinstance(var, tf.Variable) or not var.trainable:
        continue
      if keep_re and not keep_re.search(path):
        continue
      if drop_re and drop_re.search(path):
        continue
      if var.ref() in seen:  # A shared variable trains once.
        continue
      seen.add(var.ref())
      keep_paths.add(path)
    marked = var_map.Pack([v if path in keep_paths else _NOT_TRAINED
                           for path, v in var_map.FlattenItems()])
    self._var_map = marked.Filter(lambda v: v is not _NOT_TRAINED)
    self._trainable = self._var_map.FlattenItems()

  @classmethod
  def CheckParams(cls, p, owner):
    """Raises ValueError for a bad value of learner params `p`, from params
    alone; `owner` names them (validation.Owner). A task checks its
    learner's params when it is built (BaseTask), before anything reads
    them (the memory estimate instantiates the optimizer); __init__ again.
    """
    for field in ('learning_rate', 'clip_gradient_norm_to_value',
                  'grad_norm_to_clip_to_zero', 'l2_regularizer_weight'):
      validation.CheckNumber(owner, field, p.Get(field), low=0)
    _CheckKind(owner, 'optimizer', p.optimizer, optimizer_lib,
               optimizer_lib.BaseOptimizer)
    _CheckKind(owner, 'lr_schedule', p.lr_schedule, lr_schedule_lib,
               lr_schedule_lib.BaseSchedule)
    for field in ('bprop_variable_filter', 'bprop_variable_exclusion'):
      _Regex(owner, field, p.Get(field))
    validation.CheckBool(owner, 'shard_optimizer_state',
                         p.shard_optimizer_state)
    cls = p.optimizer.cls
    if p.shard_optimizer_state and not cls.ELEMENTWISE:
      raise validation.Error(
          owner, 'shard_optimizer_state', True,
          f'needs an optimizer that updates each element on its own (SGD, '
          f'Momentum or Adam); {cls.__name__} reads whole rows, columns or '
          'variables, which a shard does not hold.')

  def _Compile(self, field):
    return _Regex(validation.Owner(self), field, self._params.Get(field))

  @property
  def params(self):
    return self._params

  @property
  def optimizer(self):
    return self._optimizer

  @property
  def lr_schedule(self):
    return self._schedule

  @property
  def checkpointables(self):
    """The optimizer state to checkpoint (slots and update counter)."""
    return self._optimizer.checkpointables

  @property
  def trainable(self):
    """[(path, tf.Variable)] of the variables that train, in path order."""
    return list(self._trainable)

  @property
  def trainable_vars(self):
    """NestedMap of the trained variables (`vars` restricted to them)."""
    return self._var_map

  def Build(self, num_shards=1, shard_index=0):
    """Creates the optimizer slots; eagerly, before any tf.function traces,
    under `strategy.scope()` when distributed. With `num_shards` R > 1 (and
    shard_optimizer_state) the slots are this copy's shard `shard_index`
    of each (optimizer.BaseOptimizer.Build)."""
    self._optimizer.Build(self._trainable, num_shards=num_shards,
                          shard_index=shard_index)

  def LearningRate(self, step):
    """`learning_rate * lr_schedule.Value(step)`, a float32 scalar."""
    return self._params.learning_rate * self._schedule.Value(step)

  def L2Loss(self):
    """`l2_regularizer_weight * sum(v^2) / 2` over trained vars (float32)."""
    w = self._params.l2_regularizer_weight
    if not w or not self._trainable:
      return tf.constant(0.0, tf.float32)
    return w * tf.add_n([tf.nn.l2_loss(tf.cast(v, tf.float32))
                         for _, v in self._trainable])

  def ComputeGradients(self, tape, loss):
    """Gradients of `loss` + L2Loss() w.r.t. the trained variables.

    Args:
      tape: the tf.GradientTape that recorded `loss` (exited).
      loss: scalar loss tensor (this replica's mean loss when distributed).

    Returns:
      NestedMap like `trainable_vars`; variables unconnected to the loss get
      zeros. This replica's own gradients: not reduced across replicas.
    """
    variables = [v for _, v in self._trainable]
    grads = tape.gradient(
        loss, variables, unconnected_gradients=tf.UnconnectedGradients.ZERO)
    w = self._params.l2_regularizer_weight
    if w:
      grads = [g + tf.cast(w, g.dtype) * v for g, v in zip(grads, variables)]
    return self._var_map.Pack(grads)

  def ApplyGradients(self, step, grads, loss=None, skip=None,
                     norm_dtype=tf.float64):
    """Clips and applies `grads`, or skips the step; returns stats.

    Args:
      step: the global step, int or scalar tensor (for the schedule).
      grads: NestedMap from `ComputeGradients` (same keys as
        `trainable_vars`).
      loss: optional scalar loss; a non-finite loss also skips the step.
      skip: optional bool scalar: the skip decision, taken elsewhere (the
        first replica's), instead of this learner's own.
      norm_dtype: what the global norm's squares are summed in (GlobalNorm).

    Returns:
      NestedMap(grad_norm=float32 global norm before clipping,
      skipped=bool, learning_rate=float32).
    """
    got = [k for k, _ in grads.FlattenItems()]
    want = [k for k, _ in self._trainable]
    if got != want:
      raise ValueError(f'Learner {self._params.name!r}: gradient keys '
                       f'{got} do not match the trained variables {want}')
    grad_list = grads.Flatten()
    grad_norm = GlobalNorm(grad_list, norm_dtype)
    p = self._params
    skip = self._Skip(grad_norm, loss, skip)
    if p.clip_gradient_norm_to_value and grad_list:
      grad_list, _ = tf.clip_by_global_norm(
          grad_list, p.clip_gradient_norm_to_value, use_norm=grad_norm)
    lr = self.LearningRate(step)
    self._optimizer.Apply(
        lr, zip(grad_list, [v for _, v in self._trainable]), skip=skip)
    return NestedMap(grad_norm=grad_norm, skipped=skip, learning_rate=lr)

  def _Skip(self, grad_norm, loss, skip):
    """The skip decision: `skip` if given, else a non-finite norm or loss,
    or a norm above grad_norm_to_clip_to_zero."""
    if skip is not None:
      return skip
    skip = tf.logical_not(tf.math.is_finite(grad_norm))
    if loss is not None:
      skip = tf.logical_or(skip, tf.logical_not(
          tf.reduce_all(tf.math.is_finite(tf.cast(loss, tf.float32)))))
    limit = self._params.grad_norm_to_clip_to_zero
    if limit:
      skip = tf.logical_or(skip, grad_norm > limit)
    return skip

  def ShardStep(self, step, grad_norm, loss=None, skip=None):
    """What one step of this copy's shards shares (shard_optimizer_state):
    the skip, the clipping scale and the learning rate, from the global
    norm of the whole mean gradient (every replica's shards summed).
    `ApplyShard` then updates each variable's shards with it, and
    `FinishShards` counts the update.

    Args:
      step: the global step.
      grad_norm: the whole mean gradient's global norm.
      loss, skip: as ApplyGradients'.

    Returns:
      NestedMap(grad_norm, skipped, learning_rate) as ApplyGradients', and
      clip_scale (None without clipping).
    """
    p = self._params
    skip = self._Skip(grad_norm, loss, skip)
    scale = None
    if p.clip_gradient_norm_to_value:
      # tf.clip_by_global_norm's scale, from the whole gradient's norm.
      clip = p.clip_gradient_norm_to_value
      scale = clip * tf.minimum(1.0 / grad_norm, 1.0 / clip)
    return NestedMap(grad_norm=grad_norm, skipped=skip,
                     learning_rate=self.LearningRate(step), clip_scale=scale)

  def ApplyShard(self, shard_step, grad, weight, var):
    """Clips one variable's gradient shard as `shard_step` (ShardStep's)
    says and applies the optimizer to it, its weight shard and its slot
    shards (written); returns the new weight shard."""
    if shard_step.clip_scale is not None:
      grad = grad * tf.cast(shard_step.clip_scale, grad.dtype)
    return self._optimizer.ApplyShard(shard_step.learning_rate, grad, weight,
                                      var, shard_step.skipped)

  def FinishShards(self, shard_step):
    """After every variable's ApplyShard: counts the update (unless
    skipped)."""
    return self._optimizer.CountUpdate(shard_step.skipped)

  def Apply(self, step, tape, loss):
    """`ApplyGradients(step, ComputeGradients(tape, loss), loss)`."""
    return self.ApplyGradients(step, self.ComputeGradients(tape, loss),
                               loss=loss)
