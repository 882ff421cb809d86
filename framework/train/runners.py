"""How a train program's steps run: the runner a distribution option supplies.

A train program (framework/train/programs.py) is three parts: the train state
(framework/train/train_state.py), a *runner* that runs one step on a
strategy, and the loop around it (boundaries, summaries, checkpoints,
preemption). The runner is the public seam where distribution options
differ. Its interface:

  TaskCopies(strategy, num_workers)
                      classmethod: the task copies a host builds (one per
                      local replica; one where the strategy mirrors a task);
  Shards(task, strategy, num_workers, worker_index)
                      classmethod: (R, this host's first shard) of sharded
                      optimizer state (learner.shard_optimizer_state); a
                      runner that cannot shard it says why in NO_SHARDS,
                      and the knob is refused with that line;
  CheckParams(task_params)
                      classmethod: that refusal from the params alone,
                      which a distribution option runs on every task before
                      any builds (option.Setup.CheckParams);
  Batches(start)      this host's batches from step `start`;
  Iterator(dataset, start)
                      the compiled loop's iterator over them;
  Forward(batch, step, replica, local=0)
                      forward and backward of one task copy: the unit
                      --xla compiles (`forwards[local]`);
  Step(iterator)      one step in the cross-replica context, traced inside
                      the compiled loop; returns `TrainState.CountStep`'s
                      summable stats;
  StopTensor()        the agreed stop flag, read inside the compiled loop;
  Call(loop, iterator, num_steps, keys)
                      runs the compiled loop once: {stat: float} by the
                      stats' dotted `keys`, plus 'consecutive' and 'stop';
  CombineOnRead()     before a checkpoint: the ON_READ variables' copies
                      combined;
  static_shapes       whether the step is compiled whole (its shapes are
                      checked before the first step);
  num_step_devices    the devices one step runs on (the utilisation's).

`SyncRunner` is synchronous data parallelism over tf.distribute (the
`local` and `multi_worker` options):

  batch = next(iterator)                  one per local replica
  seed  = step_seed.MakeStepSeed(global_step, random_seed)
  strategy.run (each replica r, on its copy of the task):
        metrics = task_r.FPropTower(WithStepSeed(theta_r, seed_r), batch_r)
        grads_r = learner_r.ComputeGradients(...)
  grads = all-reduced stage by stage (framework/train/replicas.py)
  every learner_r.ApplyGradients(grads)   the same update, the same skip

(with learner.shard_optimizer_state: each copy updates its shard of the
all-reduced gradients, the weights all-gathered: sharded_update.py)

(one replica: no all-reduce; replica r > 0 draws its dropout with
MicroBatchSeed(seed, r)). An option whose step runs differently derives
from it and overrides what differs: tpu_programs.TpuRunner (the whole step
replicated), ps_programs.PsRunner (steps scheduled on parameter-server
workers).

Example:
  program = programs.TrainProgram(tasks, '/tmp/run', strategy,
                                  runner=runners.SyncRunner)
  runner = program.runner
  stats = program.RunSteps(runner.Iterator(runner.Batches(0), 0), 10)
"""
import functools

from absl import logging
import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import cluster as cluster_lib
from cadence.framework.nested_map import NestedMap
from cadence.framework import step_seed
from cadence.framework import validation
from cadence.framework.train import replicas
from cadence.framework.train import sharded_update
from cadence.framework.train import train_report
from cadence.framework.train import xla_step


def _Reduce(strategy, op, value):
  """`value` (per replica) reduced over the replicas by `op`."""
  return strategy.reduce(op, value, axis=None)


def ReplicaBatches(host_batches, num_local):
  """`host_batches` (each of num_local x batch_size rows) cut into
  consecutive per-replica batches, one element each, in the order
  tf.distribute hands them to the local replicas."""
  if num_local == 1:
    return host_batches
  return host_batches.map(lambda batch: NestedMap(batch).Transform(
      lambda x: tf.stack(tf.split(x, num_local)))).unbatch()


def _FirstLeaf(batch):
  return NestedMap(batch).Flatten()[0]


def _OnDevice(grad, device):
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


class SyncRunner:
  """Synchronous replicas on a tf.distribute strategy; see the module
  docstring.

  Args:
    state: the program's train_state.TrainState.
    strategy: the tf.distribute strategy.
    cluster: the Cluster the replicas were built on.
    input_generator: this host's input generator (its shard).
    num_workers: hosts training together.
    steps_per_loop: at most this many steps per call of the loop (0: no
      limit).
    watcher: the program's preemption.Watcher.
    xla: compile each copy's forward and backward with XLA.
  """

  # Why a runner cannot shard optimizer state (its rule for refusing
  # learner.shard_optimizer_state), or None: it can.
  NO_SHARDS = None

  def __init__(self, state, strategy, cluster, input_generator,
               num_workers=1, steps_per_loop=0, watcher=None, xla=False):
    self.state = state
    self.strategy = strategy
    self.cluster = cluster
    self.input_generator = input_generator
    self.num_workers = num_workers
    self.steps_per_loop = steps_per_loop
    self.watcher = watcher
    self.static_shapes = xla
    self.num_step_devices = train_report.NumStepDevices(strategy)
    task = state.task
    self._p = task.params.train
    self.reducer = None
    self.sharded = None
    local = len(state.tasks)
    if local * num_workers > 1:
      device_type = tf.DeviceSpec.from_string(cluster.devices[0]).device_type
      replicas.CheckAllReduce(self._p.allreduce,
                              self._p.allreduce_bytes_per_pack, num_workers,
                              device_type, f"{task.path}'s train")
      if state.sharded and self._p.allreduce in ('one_device',
                                                 'hierarchical_copy'):
        raise validation.Error(
            f"{task.path}'s train", 'allreduce', self._p.allreduce,
            'cannot gather shards: learner.shard_optimizer_state gathers '
            'the updated weights with collectives (auto, ring or nccl).')
      self.reducer = replicas.StageAllReduce(
          cluster, state.tasks,
          [k for k, _ in state.learner.trainable + state.on_write +
           state.on_read],
          self._p.allreduce, self._p.allreduce_bytes_per_pack, num_workers,
          strategy=strategy)
      if state.sharded:
        self.sharded = sharded_update.ShardedUpdate(
            state, strategy, cluster, self._p.allreduce_bytes_per_pack,
            self.reducer.mode)
      logging.info('%d replica(s) (%d on this host) x %d stage(s); '
                   'gradients %s by %s stage by stage (%s bytes a '
                   'stage).', local * num_workers, local,
                   cluster.num_devices_per_split,
                   'all-reduced, optimizer state sharded,' if
                   self.sharded else 'all-reduced', self.reducer.mode,
                   ', '.join(f'{b:,}' for b in self.reducer.stage_bytes))
    # ON_READ variables: their value at the last combine, beside them.
    self._on_read_base = []
    for _, var in state.on_read:
      with cluster_lib.BesideVariable(var):
        self._on_read_base.append(tf.Variable(var.read_value(),
                                              trainable=False))
    self._combine_on_read = tf.function(self._CombineOnRead, autograph=False)
    if xla:
      xla_step.CheckOneDevice(cluster, f"{task.path}'s train")
    # Per task copy: its forward and backward, compiled as one XLA program.
    self.forwards = [
        tf.function(functools.partial(self.Forward, local=local),
                    jit_compile=True, autograph=False) if xla else
        functools.partial(self.Forward, local=local)
        for local in range(local)]

  @classmethod
  def TaskCopies(cls, strategy, num_workers):
    """The task copies a host needs: one per local replica."""
    return strategy.num_replicas_in_sync // num_workers

  @classmethod
  def CheckParams(cls, task_params, path=None):
    """Refuses what this runner cannot run of a task's params, from the
    params alone: learner.shard_optimizer_state where it cannot shard
    (NO_SHARDS). The line names the task by `path` (default: its params'
    name, the path of a task built from them).

    Raises:
      ValueError: naming the task's learner, the knob and NO_SHARDS.
    """
    if task_params.train.learner.shard_optimizer_state and cls.NO_SHARDS:
      raise validation.Error(f"{path or task_params.name}'s train.learner",
                             'shard_optimizer_state', True, cls.NO_SHARDS)

  @classmethod
  def Shards(cls, task, strategy, num_workers, worker_index):
    """(R, first shard) of the train state's optimizer slots: every
    replica of every host holds one shard with the learner's
    shard_optimizer_state, else (1, 0); a runner that cannot shard refuses
    it (CheckParams)."""
    if not task.params.train.learner.shard_optimizer_state:
      return 1, 0
    cls.CheckParams(task.params, task.path)
    return (sharded_update.NumShards(strategy),
            worker_index * cls.TaskCopies(strategy, num_workers))

  # --- the input ---------------------------------------------------------------

  def Batches(self, start):
    """This host's batches from step `start`, one element per local replica.

    The input (this host's shard) makes host batches of local replicas x
    batch_size rows; each is cut into consecutive per-replica batches,
    which tf.distribute hands to the local replicas in order. So R replicas
    train on exactly the rows one replica would with R x batch_size, and
    resuming at a step is exact.
    """
    local = len(self.state.tasks)
    return ReplicaBatches(self.input_generator.Dataset(
        start_batch=start, num_replicas=local), local)

  def Iterator(self, dataset, start):
    """The compiled loop's iterator over `dataset` (`Batches(start)`) for
    the strategy's replicas."""
    del start  # Unused: `dataset` starts there.
    return iter(self.strategy.distribute_datasets_from_function(
        lambda unused_ctx: dataset))

  # --- the step ----------------------------------------------------------------

  def Forward(self, batch, step, replica, local=0):
    """Forward and backward of task copy `local` as replica `replica` (an
    int, or a scalar tensor): its loss, gradients (a list in
    `learner.trainable` order), summable metrics and examples."""
    task, learner = self.state.tasks[local], self.state.learners[local]
    seed = step_seed.MakeStepSeed(step, task.params.random_seed or 0)
    if self.strategy.num_replicas_in_sync > 1:  # Each replica its own masks.
      seed = step_seed.MicroBatchSeed(seed, replica)
    theta = base_layer.WithStepSeed(task.theta, seed)
    with tf.GradientTape() as tape:
      metrics, _ = task.FPropTower(theta, batch)
      loss = metrics.loss[0]
      if self._p.debug_nan_steps:
        poison = tf.reduce_any(tf.equal(
            step, tf.constant(self._p.debug_nan_steps, tf.int64)))
        loss *= tf.where(poison, tf.constant(float('nan'), loss.dtype),
                         tf.constant(1.0, loss.dtype))
    grads = learner.ComputeGradients(tape, loss)
    return NestedMap(
        grads=grads.Flatten(),
        loss=tf.cast(loss, tf.float32),
        examples=tf.cast(tf.shape(_FirstLeaf(batch))[0], tf.float32),
        metrics=NestedMap({k: NestedMap(
            vw=tf.cast(v, tf.float32) * tf.cast(w, tf.float32),
            w=tf.cast(w, tf.float32)) for k, (v, w) in metrics.items()}))

  def Step(self, iterator):
    """One step in cross-replica context; returns summable float stats."""
    state = self.state
    step = state.global_step.read_value()
    per_replica = self.strategy.run(self._ReplicaStep,
                                    args=(next(iterator), step))
    stats = self._Apply(step, per_replica)
    self._Combine(state.on_write, per_replica.synced,
                  per_replica.synced_before)
    s, total = self.strategy, tf.distribute.ReduceOp.SUM
    return state.CountStep(stats, _Reduce(s, total, per_replica.examples),
                           per_replica.metrics.Transform(
                               lambda x: _Reduce(s, total, x)))

  def _ReplicaStep(self, batch, step):
    """Forward and backward on one replica: its loss, metrics, gradients,
    and what it sends to combine its synced variables."""
    ctx = tf.distribute.get_replica_context()
    replica = tf.get_static_value(ctx.replica_id_in_sync_group)
    local = replica % len(self.state.tasks)
    learner = self.state.learners[local]
    on_write = self.state.CopyVariables(local, self.state.on_write)
    before = [v.read_value() for v in on_write]
    out = self.forwards[local](batch, step, replica)
    out.grads = [_OnDevice(g, v.device) if self.reducer else g
                 for g, (_, v) in zip(out.grads, learner.trainable)]
    out.synced_before = before
    out.synced = replicas.ReplicaValues(on_write, before, replica)
    return out

  def _Apply(self, step, per_replica):
    """All-reduces the replicas' gradients and updates every copy alike.

    Returns:
      The first copy's learner stats (grad_norm, skipped, learning_rate):
      the same on every copy, which all apply the same gradients and skip
      together (on the replicas' mean loss).
    """
    s, learners = self.strategy, self.state.learners
    if self.sharded is not None:
      return self.sharded.Apply(
          step, self.reducer.Mean(s, per_replica.grads,
                                  [k for k, _ in learners[0].trainable]),
          _Reduce(s, tf.distribute.ReduceOp.MEAN, per_replica.loss))
    if self.reducer is None:
      grads = [per_replica.grads]
      loss = per_replica.loss
    else:
      grads = self.reducer.Mean(
          s, per_replica.grads, [k for k, _ in learners[0].trainable])
      loss = _Reduce(s, tf.distribute.ReduceOp.MEAN, per_replica.loss)
    stats = None
    for learner, replica_grads in zip(learners, grads):
      replica_stats = learner.ApplyGradients(
          step, learner.trainable_vars.Pack(replica_grads), loss=loss,
          skip=None if stats is None else stats.skipped)
      stats = stats or replica_stats
    return stats

  def _Combine(self, synced, per_replica_sent, per_replica_before):
    """Gives every copy of `synced` variables their combined value."""
    if not synced or self.reducer is None:
      return
    combined = replicas.CombineCopies(
        self.strategy, self.reducer, [p for p, _ in synced],
        [v.aggregation for _, v in synced], per_replica_sent,
        per_replica_before)
    for local, values in enumerate(combined):
      for var, value in zip(self.state.CopyVariables(local, synced), values):
        with tf.device(var.device):
          var.assign(value)

  def CombineOnRead(self):
    """Before a checkpoint, on every host: combines the ON_READ
    variables' copies (it all-reduces; nothing with one copy) and gathers
    sharded slots for the chief's save (several hosts)."""
    if self.state.on_read and self.reducer is not None:
      self._combine_on_read()
    if self.sharded is not None:
      self.sharded.GatherForSave()

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
    self._Combine(state.on_read, per_replica.sent, per_replica.before)
    for base, (_, var) in zip(self._on_read_base, state.on_read):
      with tf.device(base.device):
        base.assign(var)

  # --- the loop's calls --------------------------------------------------------

  def StopTensor(self):
    """In the compiled loop: the agreed stop flag (a bool scalar)."""
    return self.watcher.StopTensor()

  def Call(self, loop, iterator, num_steps, keys):
    """Calls the compiled loop `loop(iterator, num_steps)` (in the
    watcher's worker thread); returns {stat name: float} by `keys`, plus
    'consecutive' and 'stop'."""
    flat, consecutive, stop = self.watcher.Call(
        loop, iterator, tf.constant(num_steps, tf.int32))
    flat = flat.numpy()
    values = flat if flat.size else [0.0] * len(keys)
    out = dict(zip(keys, (float(v) for v in values)))
    out['consecutive'] = int(consecutive.numpy())
    out['stop'] = bool(stop.numpy())
    return out
