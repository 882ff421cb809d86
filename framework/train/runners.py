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
                      classmethod: that refusal (and the gradient sync's,
                      train.gradient_sync) from the params alone, which a
                      distribution option runs on every task before any
                      builds (option.Setup.CheckParams);
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
                      combined (the gradient sync's BeforeSave);
  static_shapes       whether the step is compiled whole (its shapes are
                      checked before the first step);
  num_step_devices    the devices one step runs on (the utilisation's);
  sync                the run's gradient-sync scheme (a
                      gradient_sync.GradientSync), chosen when it is built.

`SyncRunner` is synchronous data parallelism over tf.distribute (the
`local` and `multi_worker` options):

  batch = next(iterator)                  one per local replica
  seed  = step_seed.MakeStepSeed(global_step, random_seed)
  strategy.run (each replica r, on its copy of the task):
        metrics = task_r.FPropTower(WithStepSeed(theta_r, seed_r), batch_r)
        grads_r = sync.ReplicaGradients(learner_r.ComputeGradients(...))
  stats = sync.Apply(step, grads, loss)   every copy's update, the same
  sync.Combine(ON_WRITE variables)        every copy's combined value

`sync` is the run's gradient-sync scheme (framework/train/gradient_sync.py),
chosen once from the params and the replica count: none (one replica),
stage_all_reduce (framework/train/replicas.py), sharded_state
(sharded_update.py), or a registered one. With several replicas, replica r
draws its dropout with MicroBatchSeed(seed, r). An option whose step runs
differently derives from it and overrides what differs:
tpu_programs.TpuRunner (the whole step replicated), ps_programs.PsRunner
(steps scheduled on parameter-server workers).

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
from cadence.framework.nested_map import NestedMap
from cadence.framework import step_seed
from cadence.framework import validation
from cadence.framework.train import gradient_sync
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
    local = len(state.tasks)
    # The gradient sync, chosen once from the params and the replicas.
    self.sync = gradient_sync.Create(state, strategy, cluster, num_workers)
    words = self.sync.Describe()
    if words:
      logging.info('%d replica(s) (%d on this host) x %d stage(s); '
                   'gradients %s', local * num_workers, local,
                   cluster.num_devices_per_split, words)
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
    (NO_SHARDS), and a train.gradient_sync that names no registered
    scheme or that its scheme refuses (gradient_sync.CheckParams). The
    line names the task by `path` (default: its params' name, the path of
    a task built from them).

    Raises:
      ValueError: naming the task's train params, the knob and the rule.
    """
    path = path or task_params.name
    if task_params.train.learner.shard_optimizer_state and cls.NO_SHARDS:
      raise validation.Error(f"{path}'s train.learner",
                             'shard_optimizer_state', True, cls.NO_SHARDS)
    gradient_sync.CheckParams(task_params.train,
                              validation.Owner(task_params, path))

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
    stats = self.sync.Apply(step, per_replica.grads, per_replica.loss)
    self.sync.Combine(state.on_write, per_replica.synced,
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
    out.grads = self.sync.ReplicaGradients(out.grads, learner)
    out.synced_before = before
    out.synced = replicas.ReplicaValues(on_write, before, replica)
    return out

  def CombineOnRead(self):
    """Before a checkpoint, on every host: what the save reads first, by
    the gradient sync (GradientSync.BeforeSave): the ON_READ variables'
    copies combined (nothing with one copy), sharded slots gathered for
    the chief's save (several hosts)."""
    self.sync.BeforeSave()

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
