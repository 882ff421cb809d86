"""The train program: its compiled loop of steps, the Python loop, checkpoints.

`TrainProgram` owns the training state (learner, global step, input
position, skip counters, EMA) and its checkpoints. Its compiled unit is a
*loop* of train steps: one `tf.function` runs up to `n` steps in a
`tf.while_loop` (n = the steps to the next summary, log line or checkpoint),
so Python runs once per interval instead of once per step. Each step:

  batch = next(iterator)
  seed  = step_seed.MakeStepSeed(global_step, random_seed)
  strategy.run: metrics = task.FPropTower(WithStepSeed(theta, seed), batch)
                learner.ApplyGradients(...)  (skipped if non-finite)
  global_step += 1; input_position += 1; EMA update unless skipped

The loop stops early once `max_consecutive_skips` steps in a row were
skipped; `Run` then raises `TrainingStopped` without saving, so the latest
checkpoint stays the last good one. It also stops after the step in
progress when the preemption watcher's stop flag is set (SIGTERM/SIGINT,
framework/preemption.py; the loop runs in the watcher's worker thread so
the signal is handled at once); `Run` then saves a checkpoint at that step
and raises `Preempted`. Everything runs under the given
`tf.distribute` strategy: variables are created in its scope, the replica
step goes through `strategy.run` and the metrics are reduced across
replicas, so a MirroredStrategy plugs in unchanged.

The Python loop (`Run`) restores the latest readable checkpoint, runs the
compiled loop from boundary to boundary, and at each boundary writes the
train summaries, logs a progress line and saves a checkpoint (then calls
the `on_checkpoint` callbacks, e.g. the in-process eval). When the run ends
for good (max_steps reached or already passed, or `TrainingStopped`) it
marks the train folder final, so evalers and decoders know the last
checkpoint (framework/checkpoint_files.py). What those summaries
and lines hold (rates, FLOPs, MFU) is framework/train_report.py; the eval
and decode programs are framework/eval_programs.py.
"""
import os
import time

from absl import logging
import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import checkpointer as checkpointer_lib
from cadence.framework import preemption
from cadence.framework import step_seed
from cadence.framework import summary_utils
from cadence.framework import train_report
from cadence.framework.nested_map import NestedMap


class TrainingStopped(RuntimeError):
  """Training cannot go on (too many skipped steps, non-finite weights)."""


class Preempted(Exception):
  """Training stopped on request (a signal) after checkpointing its step."""


def _Reduce(strategy, op, value):
  return strategy.reduce(op, value, axis=None)


def _FirstLeaf(batch):
  return NestedMap(batch).Flatten()[0]


class TrainProgram:
  """Trains one task; see the module docstring.

  Args:
    task: the BaseTask, built under `strategy.scope()`.
    logdir: the experiment's logdir; checkpoints and summaries go to
      `logdir/train`.
    strategy: a tf.distribute strategy (default: the default strategy).
    peak_flops: one device's peak FLOP/s for the utilisation summary (mfu
      divides by it x `train_report.NumStepDevices`, the devices a step
      runs on); None measures it once with a matmul probe.
    on_checkpoint: callables `fn(step)` run after each checkpoint save.
    start_time: `time.time()` at process start, for the first-step log.
    watcher: a `preemption.Watcher` whose stop flag ends training after
      the step in progress (default: one that no signal sets).

  Example:
    with strategy.scope():
      task = task_params.Instantiate()
    TrainProgram(task, '/tmp/run', strategy).Run()
  """

  def __init__(self, task, logdir, strategy=None, peak_flops=None,
               on_checkpoint=(), start_time=None, watcher=None):
    self._watcher = watcher or preemption.Watcher(signals=())
    self._task = task
    self._p = task.params.train
    self._strategy = strategy or tf.distribute.get_strategy()
    self._peak_flops = peak_flops
    self._num_devices = train_report.NumStepDevices(self._strategy)
    self._on_checkpoint = list(on_checkpoint)
    self._start_time = start_time
    self._train_dir = os.path.join(logdir, 'train')
    if task.params.input is None:
      raise ValueError(f"TrainProgram: task '{task.path}' has no input "
                       'params; build it from model_registry.GetParams(key, '
                       "'Train') (SingleTaskModel sets task.input).")
    self._input = task.params.input.Instantiate()
    with self._strategy.scope():
      self._learner = task.InstantiateLearner()
      self._learner.Build()
      self._global_step = self._Counter('global_step')
      self._input_position = self._Counter('input_position')
      self._skipped_total = self._Counter('skipped_steps')
      self._consecutive = self._Counter('consecutive_skips')
      self._ema = None
      if self._p.ema_decay:
        self._ema = {path: tf.Variable(v.read_value(), trainable=False,
                                       name='ema')
                     for path, v in self._learner.trainable}
    objects = dict(model=checkpointer_lib.KeyedVariables(
        checkpointer_lib.TaskVariables(task)),
                   optimizer=self._learner.checkpointables,
                   global_step=self._global_step,
                   input_position=self._input_position,
                   skipped_steps=self._skipped_total)
    if self._ema is not None:
      objects['ema'] = checkpointer_lib.KeyedVariables(
          checkpointer_lib.TaskVariables(task, self._ema))
    self._checkpointer = checkpointer_lib.Checkpointer(
        self._train_dir, objects, max_to_keep=self._p.save_max_to_keep)
    self._writer = summary_utils.SummaryWriter(self._train_dir)
    self._train_loop = tf.function(self._TrainLoop, autograph=False)
    self._stat_keys = []  # Names of the loop's stats, set when it traces.

  def _Counter(self, name):
    return tf.Variable(tf.constant(0, tf.int64), trainable=False, name=name,
                       aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)

  # --- properties ------------------------------------------------------------

  @property
  def task(self):
    return self._task

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

  def _ReplicaStep(self, batch, step):
    """One step on one replica: forward, backward, update."""
    seed = step_seed.MakeStepSeed(step, self._task.params.random_seed or 0)
    ctx = tf.distribute.get_replica_context()
    if ctx.num_replicas_in_sync > 1:
      seed = step_seed.MicroBatchSeed(seed, ctx.replica_id_in_sync_group)
    theta = base_layer.WithStepSeed(self._task.theta, seed)
    with tf.GradientTape() as tape:
      metrics, _ = self._task.FPropTower(theta, batch)
      loss = metrics.loss[0]
      if self._p.debug_nan_steps:
        poison = tf.reduce_any(tf.equal(
            step, tf.constant(self._p.debug_nan_steps, tf.int64)))
        loss *= tf.where(poison, tf.constant(float('nan'), loss.dtype),
                         tf.constant(1.0, loss.dtype))
    grads = self._learner.ComputeGradients(tape, loss)
    stats = self._learner.ApplyGradients(step, grads, loss=loss)
    out = NestedMap(
        grad_norm=tf.cast(stats.grad_norm, tf.float32),
        skipped=tf.cast(stats.skipped, tf.float32),
        learning_rate=tf.cast(stats.learning_rate, tf.float32),
        examples=tf.cast(tf.shape(_FirstLeaf(batch))[0], tf.float32),
        metrics=NestedMap({k: NestedMap(
            vw=tf.cast(v, tf.float32) * tf.cast(w, tf.float32),
            w=tf.cast(w, tf.float32)) for k, (v, w) in metrics.items()}))
    return out

  def _Step(self, iterator):
    """One step in cross-replica context; returns summable float stats."""
    step = self._global_step.read_value()
    per_replica = self._strategy.run(self._ReplicaStep,
                                     args=(next(iterator), step))
    s = self._strategy
    Sum, Mean = tf.distribute.ReduceOp.SUM, tf.distribute.ReduceOp.MEAN
    skipped = _Reduce(s, Sum, per_replica.skipped) > 0
    ok = 1.0 - tf.cast(skipped, tf.float32)

    def _Kept(x):  # Skipped steps do not count in the averages.
      return tf.where(skipped, tf.zeros_like(x), x)

    out = NestedMap(
        steps=tf.constant(1.0),
        ok_steps=ok,
        skipped_steps=1.0 - ok,
        grad_norm=_Kept(_Reduce(s, Mean, per_replica.grad_norm)),
        learning_rate=_Reduce(s, Mean, per_replica.learning_rate),
        examples=_Reduce(s, Sum, per_replica.examples),
        metrics=per_replica.metrics.Transform(
            lambda x: _Kept(_Reduce(s, Sum, x))))
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
      return i + 1, acc, self._watcher.StopTensor()

    _, acc, stop = tf.while_loop(
        _Cond, _Body,
        (tf.constant(0), tf.zeros([0]), self._watcher.StopTensor()),
        shape_invariants=(tf.TensorShape([]), tf.TensorShape([None]),
                          tf.TensorShape([])))
    return acc, self._consecutive.read_value(), stop

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

  def _NextBoundary(self, step):
    p = self._p
    nxt = p.max_steps
    for interval in (p.summary_interval_steps, p.log_interval_steps,
                     p.save_interval_steps):
      nxt = min(nxt, (step // interval + 1) * interval)
    return nxt

  def _Save(self, step, callbacks=True):
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
    start = time.perf_counter()
    out = self._RunLoop(iterator, 1)
    since = (None if self._start_time is None else
             time.time() - self._start_time)
    if out.get('steps'):  # None ran if a stop came first.
      logging.info('%s', train_report.FirstStepLine(
          self.global_step, train_report.LoopLoss(out),
          time.perf_counter() - start, since))
    return out

  def _Preempted(self, step):
    """Checkpoints `step` (unless it is the latest); returns `Preempted`."""
    latest = self._checkpointer.latest_checkpoint
    if latest and checkpointer_lib.StepOf(latest) == step:
      saved = f'its checkpoint {latest} was already written'
    elif step == 0:
      saved = 'nothing to save before the first step'
    else:
      saved = f'saved {self._Save(step, callbacks=False)}'
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
    dataset = self._input.Dataset(
        start_batch=int(self._input_position.numpy()),
        num_replicas=self._strategy.num_replicas_in_sync)
    flops = train_report.TrainFlopsPerExample(
        self._task, dataset, self._input.GlobalBatchSize())
    iterator = iter(self._strategy.experimental_distribute_dataset(dataset))
    summary_window, log_window = train_report.Window(), train_report.Window()
    first = True
    while step < p.max_steps:
      if first:
        out = self._FirstStep(iterator)
      else:
        out = self._RunLoop(iterator, self._NextBoundary(step) - step)
      step = self.global_step
      stopping = out['stop'] and step < p.max_steps
      if stopping and not out.get('steps'):  # Stopped before its first step.
        raise self._Preempted(step)
      now = time.perf_counter()
      if first:
        if (flops and self._peak_flops is None and step < p.max_steps and
            not stopping):
          self._MeasurePeakFlops()  # Once, outside the timed windows.
        now = time.perf_counter()
        summary_window.Reset(now)
        log_window.Reset(now)
        first = False
      else:
        summary_window.Add(out)
        log_window.Add(out)
      if out['consecutive'] >= p.max_consecutive_skips:
        self._writer.WriteScalars(step, self._Summaries(
            summary_window, now, None, out['learning_rate']))
        self._writer.Flush()
        raise self._StopForSkips(step)
      if (step % p.summary_interval_steps == 0 or step == p.max_steps or
          stopping):
        if summary_window.steps:
          self._writer.WriteScalars(step, self._Summaries(
              summary_window, now, flops, out['learning_rate']))
        summary_window.Reset(time.perf_counter())
      if (step % p.log_interval_steps == 0 or step == p.max_steps or
          stopping) and log_window.steps:
        logging.info('%s', train_report.ProgressLine(step, p.max_steps,
                                                     log_window, now))
        log_window.Reset(time.perf_counter())
      if step % p.save_interval_steps == 0 or step == p.max_steps:
        self._writer.Flush()
        self._Save(step)
        summary_window.start += time.perf_counter() - now
        log_window.start += time.perf_counter() - now
      if stopping:
        self._writer.Flush()
        raise self._Preempted(step)
    self._writer.Flush()
    self._checkpointer.MarkFinal(f'max_steps {p.max_steps} reached')
    logging.info('Training finished at step %d.', step)
    return step
