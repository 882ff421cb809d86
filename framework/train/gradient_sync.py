"""How a run's replicas stay one model: its gradient-sync scheme.

Each replica of a synchronous step computes its gradients on its own copy
of the task (runners.SyncRunner.Forward); a *gradient-sync scheme* turns
them into every copy's update and keeps the copies equal. A run has one,
chosen once from the task's params and the replica count R (all hosts'),
when its runner is built (`Create`):

  none              R = 1: the one copy applies its own gradients;
  stage_all_reduce  the replicas' gradients mean-reduced stage by stage on
                    the stages' own devices (replicas.StageAllReduce, by
                    train.allreduce's mode), every copy updated alike;
  sharded_state     the same all-reduce, then each replica updates its
                    shard of the weights and optimizer slots and the new
                    weights are all-gathered (learner.shard_optimizer_state;
                    framework/train/sharded_update.py), bit for bit the
                    stage_all_reduce step.

`train.gradient_sync` names it: 'auto' (the default) is none for one
replica, else sharded_state with learner.shard_optimizer_state, else
stage_all_reduce; a registered name runs that scheme on several replicas
(one replica has nothing to sync, whatever the name).

A scheme is a `GradientSync` subclass registered under its NAME
(`Register`), so a new one (ZeRO-2's reduce-scatter, say) is a class and
its registration in a module of its own, chosen by its name;
tests/framework/train/gradient_sync_addition_test.py adds one. The
interface:

  NAME            its train.gradient_sync spelling;
  SHARDED_STATE   True: it updates sharded optimizer slots, False: whole
                  ones (learner.shard_optimizer_state must agree, checked
                  from the params), None: either;
  CheckParams(train_p, owner)
                  classmethod: what it refuses of the train params, from
                  the params alone (before anything is built);
  __init__(state, strategy, cluster, num_workers)
                  once, when the runner is built; a ValueError naming the
                  params path for what it cannot run on these replicas;
  Describe()      the start-up line's words for it ('' for none);
  ReplicaGradients(grads, learner)
                  in the replica context: the replica's gradients as it
                  hands them over (default: as computed);
  Apply(step, grads, loss)
                  in the cross-replica context: every copy updated from
                  the replicas' gradients (per trained variable, in
                  learner.trainable order, what `strategy.run` returned)
                  and losses; returns the first copy's learner stats
                  (grad_norm, skipped, learning_rate), the same on every
                  copy (they skip together);
  Combine(synced, sent, before)
                  in the cross-replica context, after every step: the
                  copies of `synced` variables (those a layer updates
                  itself, ON_WRITE: counters, moving statistics) given
                  their combined value, as their aggregation says;
  BeforeSave()    eagerly, on every host, before a checkpoint: what the
                  save reads first (ON_READ copies combined, sharded slots
                  gathered).

Combine and BeforeSave have nothing to do for one copy; over several, a
scheme of a task with such variables overrides them (StageAllReduceSync's
combine them stage by stage, and a subclass of it keeps that).

Example:
  sync = Create(state, strategy, cluster)   # the runner's, once
  per_replica = strategy.run(replica_step, args=(batch, step))
  stats = sync.Apply(step, per_replica.grads, per_replica.loss)
"""
import tensorflow as tf

from cadence.framework import cluster as cluster_lib
from cadence.framework.nested_map import NestedMap
from cadence.framework import validation
from cadence.framework.train import replicas
from cadence.framework.train import sharded_update

AUTO = 'auto'   # train.gradient_sync's default: chosen from the layout.
_SCHEMES = {}   # NAME: the GradientSync subclass, in registration order.


def Register(sync_cls):
  """Adds a GradientSync subclass to the registry under its NAME; returns
  it, so it can decorate the class.

  Raises:
    ValueError: no NAME, 'auto', or a NAME another class has.
  """
  name = sync_cls.NAME
  if not name or name == AUTO:
    raise ValueError(f'{sync_cls.__name__}: a gradient-sync scheme needs a '
                     f"NAME other than {AUTO!r}.")
  if name in _SCHEMES and _SCHEMES[name] is not sync_cls:
    raise ValueError(f'train.gradient_sync={name!r} is registered already '
                     f'(by {_SCHEMES[name].__name__}).')
  _SCHEMES[name] = sync_cls
  return sync_cls


def Unregister(name):
  """Removes scheme `name` (a test's own, when it is done)."""
  _SCHEMES.pop(name, None)


def Names():
  """The registered schemes' NAMEs, in registration order."""
  return tuple(_SCHEMES)


def CheckParams(train_p, owner):
  """Checks train.gradient_sync from the params alone: a registered name or
  'auto', and what the named scheme refuses (its CheckParams).

  Args:
    train_p: a task's `train` params.
    owner: the task for messages (validation.Owner of its params, e.g.
      "LanguageModel 'lm' (params 'task')").

  Returns:
    The name.

  Raises:
    ValueError: naming `owner`, train.gradient_sync, its value and the
      rule.
  """
  name = validation.CheckOneOf(owner, 'train.gradient_sync',
                               train_p.gradient_sync, (AUTO,) + Names())
  if name != AUTO:
    _SCHEMES[name].CheckParams(train_p, owner)
  return name


def Choose(train_p, num_replicas, owner):
  """The scheme class of a run of `num_replicas` replicas (every host's);
  see the module docstring. `owner` names the task in messages."""
  name = CheckParams(train_p, owner)
  if num_replicas == 1:
    return NoSync
  if name == AUTO:
    return (ShardedStateSync if train_p.learner.shard_optimizer_state else
            StageAllReduceSync)
  return _SCHEMES[name]


def Create(state, strategy, cluster, num_workers=1):
  """The run's scheme, chosen once from the task's params and the replicas
  (`state`'s task copies on each of `num_workers` hosts), built.

  Raises:
    ValueError: a name or layout the scheme refuses, naming the params.
  """
  task = state.task
  sync_cls = Choose(task.params.train, len(state.tasks) * num_workers,
                    validation.Owner(task))
  return sync_cls(state, strategy, cluster, num_workers)


def MeanLoss(strategy, loss):
  """The replicas' mean of `loss` (per replica), in the cross-replica
  context: what a skip reads, the same on every copy."""
  return strategy.reduce(tf.distribute.ReduceOp.MEAN, loss, axis=None)


def OnDevice(grad, device):
  """`grad` as a dense op on `device`: the output of a function call
  reports the caller's device, and tf.distribute batches (and packs) an
  all-reduce only when the values say they share devices. A sparse
  gradient (an embedding's IndexedSlices) is summed into its dense form
  first, as the optimizer reads it: tf.distribute would all-gather its
  rows, and their sum would then round in another order than the sharded
  step's dense shards (sharded_update.py), so sharded and unsharded runs
  would drift apart."""
  with tf.device(device):
    return tf.identity(tf.convert_to_tensor(grad))


class GradientSync:
  """A run's gradient-sync scheme; see the module docstring.

  Args:
    state: the program's train_state.TrainState (its task copies and
      learners, one per local replica).
    strategy: the tf.distribute strategy running the replicas.
    cluster: the Cluster the replicas were built on.
    num_workers: hosts training together.
  """

  NAME = None
  SHARDED_STATE = False

  @classmethod
  def CheckParams(cls, train_p, owner):
    """Refuses learner.shard_optimizer_state against SHARDED_STATE."""
    shard = bool(train_p.learner.shard_optimizer_state)
    if cls.SHARDED_STATE is not None and cls.SHARDED_STATE != shard:
      slots = 'updates sharded' if cls.SHARDED_STATE else 'keeps whole'
      raise validation.Error(
          owner, 'train.gradient_sync', cls.NAME,
          f'{slots} optimizer slots, and train.learner.'
          f'shard_optimizer_state={shard}: set shard_optimizer_state='
          f"{not shard}, or gradient_sync='auto'.")

  def __init__(self, state, strategy, cluster, num_workers=1):
    self.state = state
    self.strategy = strategy
    self.cluster = cluster
    self.num_workers = num_workers
    self.num_replicas = len(state.tasks) * num_workers

  def Describe(self):
    """What the start-up line says of the gradients ('': nothing)."""
    return f'synced by {self.NAME}.'

  def ReplicaGradients(self, grads, learner):
    """In the replica context: `grads` (learner.trainable order) as the
    replica hands them to Apply."""
    del learner
    return grads

  def Apply(self, step, grads, loss):
    """Updates every copy; returns the first copy's learner stats."""
    raise NotImplementedError(f'{type(self).__name__} has no Apply.')

  def Combine(self, synced, sent, before):
    """Gives every copy of `synced` ([(path, variable)]) their combined
    value, from what each replica `sent` (replicas.ReplicaValues) and the
    common values `before` the step."""
    del sent, before
    if synced:
      raise self._Uncombined(synced)

  def BeforeSave(self):
    """Eagerly, on every host, before a checkpoint."""
    if self.state.on_read:
      raise self._Uncombined(self.state.on_read)

  def _Uncombined(self, synced):
    return NotImplementedError(
        f'train.gradient_sync={self.NAME!r}: {type(self).__name__} does not '
        'combine the copies of the variables a layer updates itself '
        f'({", ".join(p for p, _ in synced)}); override Combine and '
        'BeforeSave, or subclass StageAllReduceSync, which combines them '
        'stage by stage.')


@Register
class NoSync(GradientSync):
  """One replica: its copy applies its own gradients."""

  NAME = 'none'
  SHARDED_STATE = None   # One copy: its slots are whole either way.

  def __init__(self, state, strategy, cluster, num_workers=1):
    super().__init__(state, strategy, cluster, num_workers)
    if self.num_replicas != 1:
      raise validation.Error(
          validation.Owner(state.task), 'train.gradient_sync', self.NAME,
          f"leaves {self.num_replicas} replicas apart; use 'auto' (or "
          'another scheme) with several replicas.')

  def Describe(self):
    return ''

  def Apply(self, step, grads, loss):
    learner = self.state.learner
    return learner.ApplyGradients(
        step, learner.trainable_vars.Pack(grads), loss=loss)

  def Combine(self, synced, sent, before):
    del synced, sent, before   # One copy: nothing to combine.

  def BeforeSave(self):
    pass


@Register
class StageAllReduceSync(GradientSync):
  """The replicas' gradients mean-reduced stage by stage
  (replicas.StageAllReduce); every copy applies the mean alike. The copies
  of variables a layer updates itself are combined by the same reducer."""

  NAME = 'stage_all_reduce'
  WHAT = 'all-reduced'   # The start-up line's verb.

  def __init__(self, state, strategy, cluster, num_workers=1):
    super().__init__(state, strategy, cluster, num_workers)
    self._p = state.task.params.train
    self._CheckAllReduce(
        tf.DeviceSpec.from_string(cluster.devices[0]).device_type,
        f"{state.task.path}'s train")
    self._trained = [k for k, _ in state.learner.trainable]
    self.reducer = replicas.StageAllReduce(
        cluster, state.tasks,
        self._trained + [k for k, _ in state.on_write + state.on_read],
        self._p.allreduce, self._p.allreduce_bytes_per_pack, num_workers,
        strategy=strategy)
    # ON_READ variables: their value at the last combine, beside them.
    self._on_read_base = []
    for _, var in state.on_read:
      with cluster_lib.BesideVariable(var):
        self._on_read_base.append(tf.Variable(var.read_value(),
                                              trainable=False))
    self._combine_on_read = tf.function(self._CombineOnRead, autograph=False)

  def _CheckAllReduce(self, device_type, where):
    """Raises ValueError if this machine cannot run train.allreduce."""
    replicas.CheckAllReduce(self._p.allreduce,
                            self._p.allreduce_bytes_per_pack,
                            self.num_workers, device_type, where)

  def Describe(self):
    return (f'{self.WHAT} by {self.reducer.mode} stage by stage '
            f'({", ".join(f"{b:,}" for b in self.reducer.stage_bytes)} '
            'bytes a stage).')

  def ReplicaGradients(self, grads, learner):
    return [OnDevice(g, v.device)
            for g, (_, v) in zip(grads, learner.trainable)]

  def Apply(self, step, grads, loss):
    means = self.reducer.Mean(self.strategy, grads, self._trained)
    loss = MeanLoss(self.strategy, loss)
    stats = None
    for learner, mean in zip(self.state.learners, means):
      copy_stats = learner.ApplyGradients(
          step, learner.trainable_vars.Pack(mean), loss=loss,
          skip=None if stats is None else stats.skipped)
      stats = stats or copy_stats
    return stats

  def Combine(self, synced, sent, before):
    if not synced:
      return
    combined = replicas.CombineCopies(
        self.strategy, self.reducer, [p for p, _ in synced],
        [v.aggregation for _, v in synced], sent, before)
    for local, values in enumerate(combined):
      for var, value in zip(self.state.CopyVariables(local, synced), values):
        with tf.device(var.device):
          var.assign(value)

  def BeforeSave(self):
    """Combines the ON_READ variables' copies (it all-reduces)."""
    if self.state.on_read:
      self._combine_on_read()

  def _CombineOnRead(self):
    state = self.state

    def _Send():
      ctx = tf.distribute.get_replica_context()
      replica = tf.get_static_value(ctx.replica_id_in_sync_group)
      local = replica % len(state.tasks)
      before = [b.read_value() for b in self._on_read_base]
      return NestedMap(
          before=before,
          sent=replicas.ReplicaValues(
              state.CopyVariables(local, state.on_read), before, replica))

    per_replica = self.strategy.run(_Send)
    self.Combine(state.on_read, per_replica.sent, per_replica.before)
    for base, (_, var) in zip(self._on_read_base, state.on_read):
      with tf.device(base.device):
        base.assign(var)


@Register
class ShardedStateSync(StageAllReduceSync):
  """The stage all-reduce, then each replica's shard of the update and the
  new weights all-gathered (sharded_update.ShardedUpdate)."""

  NAME = 'sharded_state'
  SHARDED_STATE = True
  WHAT = 'all-reduced, optimizer state sharded,'

  def __init__(self, state, strategy, cluster, num_workers=1):
    super().__init__(state, strategy, cluster, num_workers)
    if not state.sharded:
      raise ValueError(
          f"{state.task.path}'s train: gradient_sync={self.NAME!r} needs a "
          'train state built sharded (runner.Shards: R > 1 with '
          'learner.shard_optimizer_state).')
    self._update = sharded_update.ShardedUpdate(
        state, strategy, cluster, self._p.allreduce_bytes_per_pack,
        self.reducer.mode)

  def _CheckAllReduce(self, device_type, where):
    super()._CheckAllReduce(device_type, where)
    if self._p.allreduce in ('one_device', 'hierarchical_copy'):
      raise validation.Error(
          where, 'allreduce', self._p.allreduce,
          'cannot gather shards: learner.shard_optimizer_state gathers '
          'the updated weights with collectives (auto, ring or nccl).')

  def Apply(self, step, grads, loss):
    means = self.reducer.Mean(self.strategy, grads, self._trained)
    return self._update.Apply(step, means, MeanLoss(self.strategy, loss))

  def BeforeSave(self):
    """Combines the ON_READ copies, and gathers the sharded slots for the
    chief's save (several hosts)."""
    super().BeforeSave()
    self._update.GatherForSave()

