"""The train program: its compiled loop of steps, the Python loop, checkpoints.

`TrainProgram` owns the training state (one learner per replica copy of the
task, global step, input position, skip counters, EMA) and its
checkpoints. Its compiled unit is a *loop* of train steps: one `tf.function`
runs up to `n` steps in a `tf.while_loop` (n = the steps to the next
summary, log line or checkpoint, at most --steps_per_loop), so Python runs
once per interval instead of once per step. Each step:

  batch = next(iterator)                  one per local replica
  seed  = step_seed.MakeStepSeed(global_step, random_seed)
  strategy.run (each replica r, on its copy of the task):
        metrics = task_r.FPropTower(WithStepSeed(theta_r, seed_r), batch_r)
        grads_r = learner_r.ComputeGradients(...)
  grads = all-reduced stage by stage (framework/train/replicas.py)
  every learner_r.ApplyGradients(grads)   the same update, the same skip
  global_step += 1; input_position += 1; EMA update unless skipped

(one replica: no all-reduce; replica r > 0 draws its dropout with
MicroBatchSeed(seed, r)). With `xla=True` (--xla) each replica's forward
and backward (`_Forward`) is one XLA program (`jit_compile`), and the
program's static shapes are checked before the first step
(framework/train/xla_step.py); on a TPU the whole step is replicated instead
(framework/distribute/tpu_programs.py). The loop stops early once
`max_consecutive_skips` steps in a row were skipped; `Run` then raises
`TrainingStopped` without saving, so the latest checkpoint stays the last good
one. It also stops after the step in progress when the preemption watcher's stop
flag is set (SIGTERM/SIGINT, framework/train/preemption.py; the loop runs in the
watcher's worker thread so the signal is handled at once; on several hosts the
hosts agree on the step); `Run` then saves a checkpoint at that step and raises
`Preempted`. A checkpoint holds replica 0's copy; after a restore every
copy is set from it. On several hosts (MultiWorkerMirroredStrategy) host 0
writes checkpoints and summaries; every host reads the same checkpoints.

The Python loop (`Run`) restores the latest readable checkpoint, runs the
compiled loop from boundary to boundary, and at each boundary writes the
train summaries, logs a progress line and saves a checkpoint (then calls
the `on_checkpoint` callbacks, e.g. the in-process eval). Slow steps also
get a progress line every `train.log_interval_secs` seconds: a chunk of
steps is cut short to end in time for it, at the last chunk's rate
(framework/train/progress_timer.py); fast ones are not cut. When the run ends
for good (max_steps reached or already passed, or `TrainingStopped`) it
marks the train folder final, so evalers and decoders know the last
checkpoint (framework/train/checkpoint_files.py). What those summaries
and lines hold (rates, FLOPs, MFU) is framework/train/train_report.py; the eval
and decode programs are framework/train/eval_programs.py.
"""
import functools
import os
import time

from absl import logging
import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import cluster as cluster_lib
from cadence.framework.nested_map import NestedMap
from cadence.framework import step_seed
from cadence.framework.train import checkpointer as checkpointer_lib
from cadence.framework.train import preemption
from cadence.framework.train import progress_timer
from cadence.framework.train import replicas
from cadence.framework.train import summary_utils
from cadence.framework.train import train_report
from cadence.framework.train import xla_step


class TrainingStopped(RuntimeError):
  """Training cannot go on (too many skipped steps, non-finite weights)."""


class Preempted(Exception):
  """Training stopped on request (a signal) after checkpointing its step."""


def _Reduce(strategy, op, value):
  return strategy.reduce(op, value, axis=None)


def _FirstLeaf(batch):
  return NestedMap(batch).Flatten()[0]


def _OnDevice(grad, device):
  """`grad` (a tensor or IndexedSlices) as an op on `device`: the output of
  a function call reports the caller's device, and tf.distribute batches
  (and packs) an all-reduce only when the values say they share devices."""
  with tf.device(device):
    if isinstance(grad, tf.IndexedSlices):
      return tf.IndexedSlices(tf.identity(grad.values),
                              tf.identity(grad.indices), grad.dense_shape)
    return tf.identity(grad)


class TrainProgram:
  """Trains one task; see the module docstring.

  Args:
    tasks: the task, or one task per local replica of `strategy`
      (`replicas.BuildReplicas`), each on its model split.
    logdir: the experiment's logdir; checkpoints and summaries go to
      `logdir/train`.
    strategy: a tf.distribute strategy (default: the default strategy).
    peak_flops: one device's peak FLOP/s for the utilisation summary (mfu
      divides by it x `train_report.NumStepDevices`, the devices a step
      runs on); None measures it once with a matmul probe.
    on_checkpoint: callables `fn(step)` run after each checkpoint save.
    start_time: `time.time()` at process start, for the first-step log.
    cluster: the Cluster the replicas were built on (default: the current
      one); it says which device holds which pipeline stage.
    num_workers: hosts training together (MultiWorkerMirroredStrategy).
    worker_index: this host's index among them; host 0 (the chief) writes
      checkpoints and summaries.
    steps_per_loop: at most this many steps per call of the compiled loop
      (0: up to the next summary, log or checkpoint boundary).
    watcher: a `preemption.Watcher` whose stop flag ends training after
      the step in progress (default: one that no signal sets).
    xla: compile each replica's forward and backward pass with XLA
      (`tf.function(jit_compile=True)`); one replica's devices must then be
      one device (or one TPU replica's logical cores).
    clock: () -> seconds, the loop's clock for its rates and the progress
      lines by time (default `time.perf_counter`; tests pass a fake one).

  Example:
    tasks = replicas.BuildReplicas(model_params, cluster)
    TrainProgram(tasks, '/tmp/run', strategy).Run()
  """

  def __init__(self, tasks, logdir, strategy=None, peak_flops=None,
               on_checkpoint=(), start_time=None, cluster=None, num_workers=1,
               worker_index=0, steps_per_loop=0, watcher=None, xla=False,
               clock=None):
    self._watcher = watcher or preemption.Watcher(signals=())
    self._clock = clock or time.perf_counter
    self._tasks = list(tasks) if isinstance(tasks, (list, tuple)) else [tasks]
    task = self._task = self._tasks[0]
    self._p = task.params.train
    self._strategy = strategy or tf.distribute.get_strategy()
    self._cluster = cluster or cluster_lib.Cluster.Current()
    self._num_workers = num_workers
    self._is_chief = worker_index == 0
    self._steps_per_loop = steps_per_loop
    # Several hosts call the loop with the same step counts (its
    # collectives, the agreed stop flag read at each call): their own
    # clocks would cut it differently, so they log by steps only.
    self._timer = progress_timer.ProgressTimer(
        self._p.log_interval_secs if num_workers == 1 else 0)
    local = self._TaskCopies(num_workers)
    if len(self._tasks) != local:
      raise ValueError(
          f'TrainProgram: got {len(self._tasks)} task copies for the '
          f'strategy\'s {local} local replica(s); build one per replica '
          '(replicas.BuildReplicas).')
    self._peak_flops = peak_flops
    self._num_devices = train_report.NumStepDevices(self._strategy)
    self._on_checkpoint = list(on_checkpoint)
    self._start_time = start_time
    self._train_dir = os.path.join(logdir, 'train')
    if task.params.input is None:
      raise ValueError(f"TrainProgram: task '{task.path}' has no input "
                       'params; build it from model_registry.GetParams(key, '
                       "'Train') (SingleTaskModel sets task.input).")
    input_p = task.params.input.Copy()
    if num_workers > 1:  # Each host reads its own share of the batches.
      input_p.Set(num_input_shards=num_workers, input_shard_index=worker_index)
    self._input = input_p.Instantiate()
    # One learner (optimizer slots beside the variables) per replica copy.
    self._learners = [t.InstantiateLearner() for t in self._tasks]
    for learner in self._learners:
      learner.Build()
    self._learner = self._learners[0]
    # Variables the replicas update themselves (counters, moving statistics)
    # and combine after every step (ON_WRITE) or before reads (ON_READ).
    self._on_write = replicas.SyncedVariables(task, on_read=False)
    self._on_read = replicas.SyncedVariables(task, on_read=True)
    self._reducer = None
    if local * num_workers > 1:
      device_type = tf.DeviceSpec.from_string(
          self._cluster.devices[0]).device_type
      replicas.CheckAllReduce(self._p.allreduce,
                              self._p.allreduce_bytes_per_pack, num_workers,
                              device_type, f"{task.path}'s train")
      self._reducer = replicas.StageAllReduce(
          self._cluster, self._tasks,
          [k for k, _ in self._learner.trainable + self._on_write +
           self._on_read],
          self._p.allreduce, self._p.allreduce_bytes_per_pack, num_workers,
          strategy=self._strategy)
      logging.info('%d replica(s) (%d on this host) x %d stage(s); '
                   'gradients all-reduced by %s stage by stage (%s bytes a '
                   'stage).', local * num_workers, local,
                   self._cluster.num_devices_per_split, self._reducer.mode,
                   ', '.join(f'{b:,}' for b in self._reducer.stage_bytes))
    # Plain variables, updated in the cross-replica context of each step.
    self._global_step = self._Counter('global_step')
    self._input_position = self._Counter('input_position')
    self._skipped_total = self._Counter('skipped_steps')
    self._consecutive = self._Counter('consecutive_skips')
    self._ema = None
    if self._p.ema_decay:
      self._ema = {}
      for path, v in self._learner.trainable:
        with cluster_lib.BesideVariable(v):
          self._ema[path] = tf.Variable(v.read_value(), trainable=False,
                                        name='ema')
    objects = dict(model=checkpointer_lib.KeyedVariables(
        checkpointer_lib.TaskVariables(task)),
                   optimizer=self._learner.checkpointables,
                   global_step=self._global_step,
                   input_position=self._input_position,
                   skipped_steps=self._skipped_total)
    if self._ema is not None:
      objects['ema'] = checkpointer_lib.KeyedVariables(
          checkpointer_lib.TaskVariables(task, self._ema))
    # Every host restores from logdir/train; the chief alone writes there.
    self._checkpointer = checkpointer_lib.Checkpointer(
        self._train_dir, objects, max_to_keep=self._p.save_max_to_keep,
        writer=self._is_chief)
    self._writer = (summary_utils.SummaryWriter(self._train_dir)
                    if self._is_chief else summary_utils.NullWriter())
    # ON_READ variables: their value at the last combine, beside them.
    self._on_read_base = []
    for _, var in self._on_read:
      with cluster_lib.BesideVariable(var):
        self._on_read_base.append(tf.Variable(var.read_value(),
                                              trainable=False))
    self._combine_on_read = tf.function(self._CombineOnRead, autograph=False)
    self._train_loop = tf.function(self._TrainLoop, autograph=False)
    self._static_shapes = xla  # CheckShapes, before the first step.
    self._shapes_checked = False
    if xla:
      xla_step.CheckOneDevice(self._cluster, f"{task.path}'s train")
    # Per task copy: its forward and backward, compiled as one XLA program.
    self._forwards = [
        tf.function(functools.partial(self._Forward, local=local),
                    jit_compile=True, autograph=False) if xla else
        functools.partial(self._Forward, local=local)
        for local in range(len(self._tasks))]
    self._stat_keys = []  # Names of the loop's stats, set when it traces.
    self._iterator = None  # Run's input iterator, kept (see Run).

  def CheckShapes(self):
    """With --xla or on a TPU (a compiled step), checks once that the
    input's batches and every tensor of the forward pass have static
    shapes; the trainer asks before it writes anything, Run before the
    first step.

    Raises:
      xla_step.StaticShapeError: naming the first tensor that has none.
    """
    if self._static_shapes and not self._shapes_checked:
      xla_step.CheckStepShapes(self._task,
                               self._ReplicaBatches(0).element_spec)
      self._shapes_checked = True

  def _TaskCopies(self, num_workers):
    """The task copies this host needs: one per local replica."""
    return self._strategy.num_replicas_in_sync // num_workers

  @staticmethod
  def _Counter(name):
    return tf.Variable(tf.constant(0, tf.int64), trainable=False, name=name)

  # --- properties ------------------------------------------------------------

  @property
  def task(self):
    return self._task

  @property
  def tasks(self):
    """The task copies this program trains, one per local replica (one
    for a program whose strategy mirrors one task's variables)."""
    return list(self._tasks)

  @property
  def learner(self):
    return self._learner

  @property
  def global_step(self):
    return int(self._global_step.numpy())

  @property
  def checkpointer(self):
    return self._checkpointer

  def EmaTheta(self):
    """The task's theta with the EMA variables in place of the trained ones
    (the plain theta when EMA is off)."""
    theta = self._task.theta
    if self._ema is None:
      return theta
    ema = self._ema
    return theta.Pack([ema.get(k, v) for k, v in theta.FlattenItems()])

  # --- the compiled loop -----------------------------------------------------

  def _Forward(self, batch, step, replica, local=0):
    """Forward and backward of task copy `local` as replica `replica` (an
    int, or a scalar tensor): its loss, gradients (a list in
    `learner.trainable` order), summable metrics and examples.

    The unit that --xla compiles (`self._forwards[local]`).
    """
    task, learner = self._tasks[local], self._learners[local]
    seed = step_seed.MakeStepSeed(step, task.params.random_seed or 0)
    if self._strategy.num_replicas_in_sync > 1:  # Each replica its own masks.
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

  def _ReplicaStep(self, batch, step):
    """Forward and backward on one replica: its loss, metrics, gradients,
    and what it sends to combine its synced variables."""
    ctx = tf.distribute.get_replica_context()
    replica = tf.get_static_value(ctx.replica_id_in_sync_group)
    local = replica % len(self._tasks)
    learner = self._learners[local]
    on_write = self._ReplicaSynced(local, self._on_write)
    before = [v.read_value() for v in on_write]
    out = self._forwards[local](batch, step, replica)
    out.grads = [_OnDevice(g, v.device) if self._reducer else g
                 for g, (_, v) in zip(out.grads, learner.trainable)]
    out.synced_before = before
    out.synced = replicas.ReplicaValues(on_write, before, replica)
    return out

  def _ReplicaSynced(self, local, synced):
    """Replica `local`'s copies of the variables of `synced` (path, var)."""
    variables = dict(self._tasks[local].vars.FlattenItems())
    return [variables[path] for path, _ in synced]

  def _Combine(self, synced, per_replica_sent, per_replica_before):
    """Gives every copy of `synced` variables their combined value."""
    if not synced or self._reducer is None:
      return
    combined = replicas.CombineCopies(
        self._strategy, self._reducer, [p for p, _ in synced],
        [v.aggregation for _, v in synced], per_replica_sent,
        per_replica_before)
    for local, values in enumerate(combined):
      for var, value in zip(self._ReplicaSynced(local, synced), values):
        with tf.device(var.device):
          var.assign(value)

  def _CombineOnRead(self):
    """Combines the ON_READ variables' copies (before they are read)."""

    def _Send():
      ctx = tf.distribute.get_replica_context()
      replica = tf.get_static_value(ctx.replica_id_in_sync_group)
      local = replica % len(self._tasks)
      before = [b.read_value() for b in self._on_read_base]
      return NestedMap(
          before=before,
          sent=replicas.ReplicaValues(
              self._ReplicaSynced(local, self._on_read), before, replica))

    per_replica = self._strategy.run(_Send)
    self._Combine(self._on_read, per_replica.sent, per_replica.before)
    for base, (_, var) in zip(self._on_read_base, self._on_read):
      with tf.device(base.device):
        base.assign(var)

  def _Apply(self, step, per_replica):
    """All-reduces the replicas' gradients and updates every copy alike.

    Returns:
      The first copy's learner stats (grad_norm, skipped, learning_rate):
      the same on every copy, which all apply the same gradients and skip
      together (on the replicas' mean loss).
    """
    s = self._strategy
    if self._reducer is None:
      grads = [per_replica.grads]
      loss = per_replica.loss
    else:
      grads = self._reducer.Mean(
          s, per_replica.grads, [k for k, _ in self._learner.trainable])
      loss = _Reduce(s, tf.distribute.ReduceOp.MEAN, per_replica.loss)
    stats = None
    for learner, replica_grads in zip(self._learners, grads):
      replica_stats = learner.ApplyGradients(
          step, learner.trainable_vars.Pack(replica_grads), loss=loss,
          skip=None if stats is None else stats.skipped)
      stats = stats or replica_stats
    return stats

  def _Step(self, iterator):
    """One step in cross-replica context; returns summable float stats."""
    step = self._global_step.read_value()
    per_replica = self._strategy.run(self._ReplicaStep,
                                     args=(next(iterator), step))
    stats = self._Apply(step, per_replica)
    self._Combine(self._on_write, per_replica.synced,
                  per_replica.synced_before)
    s = self._strategy
    Sum = tf.distribute.ReduceOp.SUM
    return self._StepDone(stats, _Reduce(s, Sum, per_replica.examples),
                          per_replica.metrics.Transform(
                              lambda x: _Reduce(s, Sum, x)))

  def _StepDone(self, stats, examples, metrics):
    """Counts the step (global step, input position, skips, EMA) after the
    update; returns its summable float stats.

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
    self._global_step.assign_add(1)
    self._input_position.assign_add(1)
    skipped_i = tf.cast(skipped, tf.int64)
    self._skipped_total.assign_add(skipped_i)
    self._consecutive.assign((self._consecutive + 1) * skipped_i)
    if self._ema is not None:
      self._UpdateEma(skipped)
    return out

  def _UpdateEma(self, skipped):
    # The decay warms up as (1 + n) / (10 + n) over the first updates.
    n = tf.cast(self._global_step - self._skipped_total, tf.float32)
    decay = tf.minimum(float(self._p.ema_decay), (1.0 + n) / (10.0 + n))
    keep = tf.where(skipped, 1.0, decay)
    for path, v in self._learner.trainable:
      ema = self._ema[path]
      with tf.device(ema.device):
        ema.assign(keep * ema + (1.0 - keep) * tf.cast(v, ema.dtype))

  def _TrainLoop(self, iterator, num_steps):
    """Runs up to `num_steps` steps (fewer if too many are skipped, or if
    the watcher's agreed stop flag is set: it is read before the first step
    and after each).

    The step is traced once, as the body of a tf.while_loop. Its stats
    travel as one flat float32 vector, summed over the steps (the learning
    rate: the last value); their dotted names, known once the task's
    metrics are traced, are kept in `self._stat_keys`.

    Returns:
      (stats vector [num stats] (empty if no step ran), consecutive skips,
      the agreed stop flag).
    """
    limit = tf.constant(self._p.max_consecutive_skips, tf.int64)

    def _Cond(i, acc, stop):
      del acc
      return tf.logical_and(
          tf.logical_and(i < num_steps, self._consecutive < limit),
          tf.logical_not(stop))

    def _Body(i, acc, unused_stop):
      items = self._Step(iterator).FlattenItems()
      self._stat_keys = [k for k, _ in items]
      flat = tf.stack([tf.cast(v, tf.float32) for _, v in items])
      keep = tf.constant([0.0 if k == 'learning_rate' else 1.0
                          for k, _ in items])
      acc = tf.cond(tf.size(acc) > 0, lambda: acc * keep + flat,
                    lambda: flat)
      return i + 1, acc, self._StopTensor()

    _, acc, stop = tf.while_loop(
        _Cond, _Body,
        (tf.constant(0), tf.zeros([0]), self._StopTensor()),
        shape_invariants=(tf.TensorShape([]), tf.TensorShape([None]),
                          tf.TensorShape([])))
    return acc, self._consecutive.read_value(), stop

  def _StopTensor(self):
    """In the compiled loop: the agreed stop flag (a bool scalar)."""
    return self._watcher.StopTensor()

  def _RunLoop(self, iterator, num_steps):
    """Calls the compiled loop (in the watcher's worker thread); returns
    {stat name: float}, plus 'consecutive' and 'stop'."""
    flat, consecutive, stop = self._watcher.Call(
        self._train_loop, iterator, tf.constant(num_steps, tf.int32))
    flat = flat.numpy()
    values = flat if flat.size else [0.0] * len(self._stat_keys)
    out = dict(zip(self._stat_keys, (float(v) for v in values)))
    out['consecutive'] = int(consecutive.numpy())
    out['stop'] = bool(stop.numpy())
    return out

  # --- the Python loop -------------------------------------------------------

  def _ReplicaBatches(self, start):
    """This host's batches from step `start`, one element per local replica.

    The input (this host's shard, see __init__) makes host batches of
    local replicas x batch_size rows; each is cut into consecutive
    per-replica batches, which tf.distribute hands to the local replicas in
    order. So R replicas train on exactly the rows one replica would with
    R x batch_size, and resuming at a step is exact.
    """
    local = len(self._tasks)
    dataset = self._input.Dataset(start_batch=start, num_replicas=local)
    if local == 1:
      return dataset
    return dataset.map(lambda batch: NestedMap(batch).Transform(
        lambda x: tf.stack(tf.split(x, local)))).unbatch()

  def _Iterator(self, dataset, start):
    """The compiled loop's iterator over `dataset` (`_ReplicaBatches(start)`)
    for the strategy's replicas."""
    del start  # Unused: `dataset` starts there.
    return iter(self._strategy.distribute_datasets_from_function(
        lambda unused_ctx: dataset))

  def StepRunner(self, dataset=None):
    """run(n) -> seconds a step: n steps of the compiled train loop, as
    `Run` takes them but without checkpoints, summaries or logs (the
    planner's calibration and the benchmarks time the trainer's own step
    with it). The steps train: the weights and the global step move.

    Args:
      dataset: this host's batches, one element per local replica (default:
        the input's, from the current input position).
    """
    if dataset is None:
      dataset = self._ReplicaBatches(int(self._input_position.numpy()))
    iterator = self._Iterator(dataset, 0)

    def _Run(num_steps):
      start = time.perf_counter()
      self._RunLoop(iterator, num_steps)
      return (time.perf_counter() - start) / num_steps
    return _Run

  def _NextBoundary(self, step):
    p = self._p
    nxt = p.max_steps
    for interval in (p.summary_interval_steps, p.log_interval_steps,
                     p.save_interval_steps):
      nxt = min(nxt, (step // interval + 1) * interval)
    if self._steps_per_loop:
      nxt = min(nxt, step + self._steps_per_loop)
    return nxt

  def _Save(self, step, callbacks=True):
    if self._on_read and self._reducer is not None:
      self._combine_on_read()   # Every host: it all-reduces.
    if not self._is_chief:  # The chief writes the job's checkpoints.
      if callbacks:
        for fn in self._on_checkpoint:
          fn(step)
      return None
    path = self._checkpointer.Save(step)
    if path is None:
      self._checkpointer.MarkFinal('non-finite weights')
      raise TrainingStopped(
          f'Training stopped at step {step}: the weights are NaN or Inf, so '
          'no checkpoint was written. The latest good checkpoint is '
          f'{self._checkpointer.latest_checkpoint}. Lower the learning rate '
          'or enable clipping (train.learner.clip_gradient_norm_to_value).')
    logging.info('Saved checkpoint %s', path)
    for fn in self._on_checkpoint if callbacks else ():
      fn(step)
    return path

  def _Restore(self):
    step = self._checkpointer.Restore()
    if step is None:
      logging.info('No checkpoint in %s; training from step 0.',
                   self._train_dir)
    else:
      logging.info('Restored %s: global step %d, input position %d.',
                   self._checkpointer.latest_checkpoint, self.global_step,
                   int(self._input_position.numpy()))
      # The checkpoint holds one copy: every replica starts from it.
      replicas.CopyFromFirst(self._tasks, self._learners)
    self._consecutive.assign(0)

  def _StopForSkips(self, step):
    n = self._p.max_consecutive_skips
    latest = self._checkpointer.latest_checkpoint
    where = (f'{latest} (step {checkpointer_lib.StepOf(latest)})' if latest
             else 'none (no checkpoint was written before)')
    self._checkpointer.MarkFinal(f'{n} consecutive skipped steps')
    return TrainingStopped(
        f'Training stopped at step {step}: {n} consecutive steps were '
        'skipped because their loss or gradient norm was NaN/Inf (or above '
        f'grad_norm_to_clip_to_zero); train.max_consecutive_skips={n}. The '
        f'last good checkpoint is {where}; nothing was saved after it. '
        'Lower the learning rate, clip gradients or check the input data, '
        'then rerun the same command to resume from it.')

  def _Summaries(self, window, now, example_flops, learning_rate):
    peak = (self._peak_flops * self._num_devices if self._peak_flops else
            None)
    return train_report.Scalars(
        window, now, example_flops=example_flops, peak_flops=peak,
        learning_rate=learning_rate,
        skipped_steps_total=int(self._skipped_total.numpy()))

  def _FirstStep(self, iterator):
    """Runs the first loop call (one step, compiling the loop); logs it."""
    logging.info('Compiling the train step (tracing the model, then '
                 'optimising its graph); the first step runs with it...')
    start = self._clock()
    out = self._RunLoop(iterator, 1)
    since = (None if self._start_time is None else
             time.time() - self._start_time)
    if out.get('steps'):  # None ran if a stop came first.
      logging.info('%s', train_report.FirstStepLine(
          self.global_step, train_report.LoopLoss(out),
          self._clock() - start, since))
    return out

  def _Preempted(self, step):
    """Checkpoints `step` (unless it is the latest); returns `Preempted`."""
    latest = self._checkpointer.latest_checkpoint
    if latest and checkpointer_lib.StepOf(latest) == step:
      saved = f'its checkpoint {latest} was already written'
    elif step == 0:
      saved = 'nothing to save before the first step'
    else:
      path = self._Save(step, callbacks=False)
      saved = (f'saved {path}' if path else
               f'the chief host saved its checkpoint of step {step}')
    reason = self._watcher.requested or 'a stop on another worker'
    return Preempted(f'Stopped by {reason} at step {step}: {saved}. Rerun the '
                     'same command to resume from it.')

  def _MeasurePeakFlops(self):
    self._peak_flops = train_report.MeasurePeakFlops()
    logging.info('Peak %.3g FLOP/s per device (a float32 matmul probe) x %d '
                 'device(s) for the model FLOPs utilisation.',
                 self._peak_flops, self._num_devices)

  def Run(self):
    """Trains to `train.max_steps`, resuming from the latest checkpoint.

    Returns:
      The final global step.

    Raises:
      TrainingStopped: too many consecutive skipped steps, or non-finite
        weights at a checkpoint.
      Preempted: the watcher's stop flag was set; the step reached is
        checkpointed.
      checkpointer_lib.SaveError: a checkpoint could not be written.
      checkpointer_lib.UnreadableError: no checkpoint can be read.
    """
    p = self._p
    self._Restore()
    step = self.global_step
    if step >= p.max_steps:
      logging.info('Global step %d >= max_steps %d: nothing to train.', step,
                   p.max_steps)
      self._checkpointer.MarkFinal(f'global step {step} >= max_steps '
                                   f'{p.max_steps}')
      return step
    self._checkpointer.ClearFinal()
    start = int(self._input_position.numpy())
    dataset = self._ReplicaBatches(start)
    self.CheckShapes()
    flops = train_report.TrainFlopsPerExample(
        self._task, dataset, self._input.GlobalBatchSize())
    # The program owns its input iterator: freeing it stops tf.data's
    # threads, seconds of work on a loaded machine that a trainer about to
    # exit need not do (framework/jobs/process_exit.py).
    iterator = self._iterator = self._Iterator(dataset, start)
    summary_window, log_window = train_report.Window(), train_report.Window()
    first = True
    while step < p.max_steps:
      begin = self._clock()
      if first:
        out = self._FirstStep(iterator)
      else:  # To the next boundary, or fewer to log in time.
        out = self._RunLoop(iterator, self._timer.Steps(
            begin, self._NextBoundary(step) - step))
      now = self._clock()
      self._timer.Ran(int(out.get('steps', 0)), now - begin)
      step = self.global_step
      stopping = out['stop'] and step < p.max_steps
      if stopping and not out.get('steps'):  # Stopped before its first step.
        raise self._Preempted(step)
      if first:
        if (flops and self._peak_flops is None and step < p.max_steps and
            not stopping):
          self._MeasurePeakFlops()  # Once, outside the timed windows.
        now = self._clock()
        summary_window.Reset(now)
        log_window.Reset(now)
        self._timer.Logged(now)   # The first step's line.
        first = False
      else:
        summary_window.Add(out)
        log_window.Add(out)
      if out['consecutive'] >= p.max_consecutive_skips:
        self._writer.WriteScalars(step, self._Summaries(
            summary_window, now, None, out['learning_rate']))
        self._writer.Flush()
        raise self._StopForSkips(step)
      if (step % p.summary_interval_steps == 0 or step >= p.max_steps or
          stopping):
        if summary_window.steps:
          self._writer.WriteScalars(step, self._Summaries(
              summary_window, now, flops, out['learning_rate']))
        summary_window.Reset(self._clock())
      if (step % p.log_interval_steps == 0 or step >= p.max_steps or
          stopping or self._timer.Due(now)) and log_window.steps:
        logging.info('%s', train_report.ProgressLine(step, p.max_steps,
                                                     log_window, now))
        log_window.Reset(self._clock())
        self._timer.Logged(now)
      if step % p.save_interval_steps == 0 or step >= p.max_steps:
        self._writer.Flush()
        self._Save(step)
        summary_window.start += self._clock() - now
        log_window.start += self._clock() - now
      if stopping:
        self._writer.Flush()
        raise self._Preempted(step)
    self._writer.Flush()
    self._checkpointer.MarkFinal(f'max_steps {p.max_steps} reached')
    logging.info('Training finished at step %d.', step)
    return step
