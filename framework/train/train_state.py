"""The train state: what a train program updates and checkpoints.

`TrainState` holds, for the task copies of one host (one per local
replica, `replicas.BuildReplicas`):

  learners        one per copy (optimizer slots beside its variables);
  counters        global_step, input_position, skipped_steps (total) and
                  consecutive_skips, plain int64 variables updated in the
                  cross-replica context of each step;
  ema             {path: variable} of the trained variables' moving average
                  (train.ema_decay), or None;
  on_write, on_read
                  [(path, variable)] the replicas update themselves
                  (counters, moving statistics) and combine after every
                  step (ON_WRITE) or before they are read (ON_READ).

It knows nothing of how a step runs (framework/train/runners.py) or of the
loop around it (framework/train/programs.py): it counts a finished step
(`CountStep`) and says what a checkpoint holds (`CheckpointObjects`).
Variables are created where the caller's scope puts them (a strategy's, a
parameter-server placement's).

Example:
  state = TrainState(replicas.BuildReplicas(model_params, cluster))
  state.global_step.numpy()          # 0
  objects = state.CheckpointObjects()
"""
import tensorflow as tf

from cadence.framework import cluster as cluster_lib
from cadence.framework.nested_map import NestedMap
from cadence.framework.train import checkpointer as checkpointer_lib
from cadence.framework.train import replicas
from cadence.framework.train import sharded_update


def _Counter(name):
  return tf.Variable(tf.constant(0, tf.int64), trainable=False, name=name)


class TrainState:
  """The learners, counters, EMA and synced variables of one host's task
  copies; see the module docstring.

  Args:
    tasks: the task copies, one per local replica (a list, >= 1).
    num_shards: R, the replicas of every host: with the learner's
      shard_optimizer_state and R > 1, copy r holds shard first_shard + r
      of R of every slot (framework/train/sharded_update.py).
    first_shard: the first local copy's shard (host index x local copies).
  """

  def __init__(self, tasks, num_shards=1, first_shard=0):
    self.tasks = list(tasks)
    self.task = self.tasks[0]
    self._p = self.task.params.train
    self.learners = [t.InstantiateLearner() for t in self.tasks]
    self.sharded = bool(num_shards > 1 and self.learners[0].params
                        .shard_optimizer_state)
    self.num_shards = num_shards if self.sharded else 1
    self.first_shard = first_shard if self.sharded else 0
    for r, learner in enumerate(self.learners):
      learner.Build(self.num_shards, self.first_shard + r)
    self.learner = self.learners[0]
    # What a checkpoint holds of sharded learners: whole slots.
    self.sharded_state = sharded_update.ShardedOptimizerState(
        self.learners, self.first_shard, self.num_shards) if (
            self.sharded) else None
    self.on_write = replicas.SyncedVariables(self.task, on_read=False)
    self.on_read = replicas.SyncedVariables(self.task, on_read=True)
    self.global_step = _Counter('global_step')
    self.input_position = _Counter('input_position')
    self.skipped_total = _Counter('skipped_steps')
    self.consecutive = _Counter('consecutive_skips')
    self.ema = None
    if self._p.ema_decay:
      self.ema = {}
      for path, v in self.learner.trainable:
        with cluster_lib.BesideVariable(v):
          self.ema[path] = tf.Variable(v.read_value(), trainable=False,
                                       name='ema')

  def CheckpointObjects(self):
    """{name: trackable} a checkpoint holds: the first copy's variables
    keyed by path, its optimizer state, the counters and the EMA."""
    objects = dict(model=checkpointer_lib.KeyedVariables(
        checkpointer_lib.TaskVariables(self.task)),
                   optimizer=self.sharded_state or
                   self.learner.checkpointables,
                   global_step=self.global_step,
                   input_position=self.input_position,
                   skipped_steps=self.skipped_total)
    if self.ema is not None:
      objects['ema'] = checkpointer_lib.KeyedVariables(
          checkpointer_lib.TaskVariables(self.task, self.ema))
    return objects

  def CopyFromFirst(self):
    """Sets every copy's variables and optimizer state to the first's (a
    checkpoint holds one copy; sharded slots are restored into every
    copy's shard already)."""
    replicas.CopyFromFirst(self.tasks, self.learners,
                           slots=not self.sharded)

  def CopyVariables(self, local, synced):
    """Copy `local`'s variables of `synced` ([(path, variable)])."""
    variables = dict(self.tasks[local].vars.FlattenItems())
    return [variables[path] for path, _ in synced]

  def EmaTheta(self):
    """The first copy's theta with the EMA variables in place of the
    trained ones (the plain theta when EMA is off)."""
    theta = self.task.theta
    if self.ema is None:
      return theta
    ema = self.ema
    return theta.Pack([ema.get(k, v) for k, v in theta.FlattenItems()])

  def CountStep(self, stats, examples, metrics):
    """Counts a step after its update (global step, input position, skips,
    EMA); returns its summable float stats.

    Args:
      stats: the learner's stats (grad_norm, skipped, learning_rate).
      examples: examples of the step, summed over replicas.
      metrics: NestedMap of {vw, w} per metric, summed over replicas.
    """
    skipped = tf.cast(stats.skipped, tf.bool)
    ok = 1.0 - tf.cast(skipped, tf.float32)

    def _Kept(x):  # Skipped steps do not count in the averages.
      return tf.where(skipped, tf.zeros_like(x), x)

    out = NestedMap(
        steps=tf.constant(1.0),
        ok_steps=ok,
        skipped_steps=1.0 - ok,
        grad_norm=_Kept(tf.cast(stats.grad_norm, tf.float32)),
        learning_rate=tf.cast(stats.learning_rate, tf.float32),
        examples=examples,
        metrics=metrics.Transform(_Kept))
    self.global_step.assign_add(1)
    self.input_position.assign_add(1)
    skipped_i = tf.cast(skipped, tf.int64)
    self.skipped_total.assign_add(skipped_i)
    self.consecutive.assign((self.consecutive + 1) * skipped_i)
    if self.ema is not None:
      self._UpdateEma(skipped)
    return out

  def _UpdateEma(self, skipped):
    # The decay warms up as (1 + n) / (10 + n) over the first updates.
    n = tf.cast(self.global_step - self.skipped_total, tf.float32)
    decay = tf.minimum(float(self._p.ema_decay), (1.0 + n) / (10.0 + n))
    keep = tf.where(skipped, 1.0, decay)
    for path, v in self.learner.trainable:
      ema = self.ema[path]
      with tf.device(ema.device):
        ema.assign(keep * ema + (1.0 - keep) * tf.cast(v, ema.dtype))
