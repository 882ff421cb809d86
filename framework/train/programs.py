"""The train program: the train state, a step runner, and the loop around them.

`TrainProgram` composes three parts:

  the state     framework/train/train_state.py: one learner per replica copy
                of the task, global step, input position, skip counters,
                EMA; what a checkpoint holds;
  the step      a runner (framework/train/runners.py): how one step runs on
                the strategy (forward, backward, all-reduce, apply; the unit
                --xla compiles), supplied by the distribution option
                (`runners.SyncRunner` by default; tpu_programs.TpuRunner,
                ps_programs.PsRunner);
  the loop      here: the compiled loop of steps, its boundaries, summaries,
                checkpoints and preemption.

Its compiled unit is a *loop* of train steps: one `tf.function` runs up to
`n` steps (the runner's `Step`) in a `tf.while_loop` (n = the steps to the
next summary, log line or checkpoint, at most --steps_per_loop), so Python
runs once per interval instead of once per step. With `xla=True` (--xla)
each replica's forward and backward is one XLA program (`jit_compile`), and
the program's static shapes are checked before the first step
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
compiled loop from boundary to boundary (`RunSteps`), and at each boundary
writes the train summaries, logs a progress line and saves a checkpoint
(then calls the `on_checkpoint` callbacks, e.g. the in-process eval). Slow
steps also get a progress line every `train.log_interval_secs` seconds: a
chunk of steps is cut short to end in time for it, at the last chunk's rate
(framework/train/progress_timer.py); fast ones are not cut. When the run ends
for good (max_steps reached or already passed, or `TrainingStopped`) it
marks the train folder final, so evalers and decoders know the last
checkpoint (framework/train/checkpoint_files.py). What those summaries
and lines hold (rates, FLOPs, MFU) is framework/train/train_report.py; the eval
and decode programs are framework/train/eval_programs.py.
"""
import os
import time

from absl import logging
import tensorflow as tf

from cadence.framework import cluster as cluster_lib
from cadence.framework.train import checkpointer as checkpointer_lib
from cadence.framework.train import preemption
from cadence.framework.train import progress_timer
from cadence.framework.train import runners
from cadence.framework.train import summary_utils
from cadence.framework.train import train_report
from cadence.framework.train import train_state
from cadence.framework.train import xla_step


class TrainingStopped(RuntimeError):
  """Training cannot go on (too many skipped steps, non-finite weights)."""


class Preempted(Exception):
  """Training stopped on request (a signal) after checkpointing its step."""


class TrainProgram:
  """Trains one task; see the module docstring.

  Args:
    tasks: the task, or one task per local replica of `strategy`
      (`replicas.BuildReplicas`), each on its model split.
    logdir: the experiment's logdir; checkpoints and summaries go to
      `logdir/train`.
    strategy: a tf.distribute strategy (default: the default strategy).
    peak_flops: one device's peak FLOP/s for the utilisation summary (mfu
      divides by it x the runner's `num_step_devices`, the devices a step
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
    runner: the step's runner class (framework/train/runners.py; default
      `runners.SyncRunner`).
    runner_args: a dict of the runner's own arguments beyond SyncRunner's
      (e.g. ps_programs.PsRunner's coordinator).

  Example:
    tasks = replicas.BuildReplicas(model_params, cluster)
    TrainProgram(tasks, '/tmp/run', strategy).Run()
  """

  def __init__(self, tasks, logdir, strategy=None, peak_flops=None,
               on_checkpoint=(), start_time=None, cluster=None, num_workers=1,
               worker_index=0, steps_per_loop=0, watcher=None, xla=False,
               clock=None, runner=runners.SyncRunner, runner_args=None):
    watcher = self._watcher = watcher or preemption.Watcher(signals=())
    self._clock = clock or time.perf_counter
    tasks = list(tasks) if isinstance(tasks, (list, tuple)) else [tasks]
    task = tasks[0]
    self._p = task.params.train
    strategy = strategy or tf.distribute.get_strategy()
    cluster = cluster or cluster_lib.Cluster.Current()
    self._is_chief = worker_index == 0
    # Several hosts call the loop with the same step counts (its
    # collectives, the agreed stop flag read at each call): their own
    # clocks would cut it differently, so they log by steps only.
    self._timer = progress_timer.ProgressTimer(
        self._p.log_interval_secs if num_workers == 1 else 0)
    local = runner.TaskCopies(strategy, num_workers)
    if len(tasks) != local:
      raise ValueError(
          f'TrainProgram: got {len(tasks)} task copies for the '
          f'strategy\'s {local} local replica(s); build one per replica '
          '(replicas.BuildReplicas).')
    self._peak_flops = peak_flops
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
    self.input_generator = input_p.Instantiate()
    self.state = train_state.TrainState(
        tasks, *runner.Shards(task, strategy, num_workers, worker_index))
    # Every host restores from logdir/train; the chief alone writes there.
    self._checkpointer = checkpointer_lib.Checkpointer(
        self._train_dir, self.state.CheckpointObjects(),
        max_to_keep=self._p.save_max_to_keep, writer=self._is_chief)
    self._writer = (summary_utils.SummaryWriter(self._train_dir)
                    if self._is_chief else summary_utils.NullWriter())
    self.runner = runner(self.state, strategy=strategy, cluster=cluster,
                         input_generator=self.input_generator,
                         num_workers=num_workers,
                         steps_per_loop=steps_per_loop, watcher=watcher,
                         xla=xla, **(runner_args or {}))
    self._num_devices = self.runner.num_step_devices
    self.train_loop = tf.function(self._TrainLoop, autograph=False)
    self._shapes_checked = False
    self._steps_per_loop = steps_per_loop
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
    if self.runner.static_shapes and not self._shapes_checked:
      xla_step.CheckStepShapes(self.task,
                               self.runner.Batches(0).element_spec)
      self._shapes_checked = True

  # --- properties ------------------------------------------------------------

  @property
  def task(self):
    return self.state.task

  @property
  def tasks(self):
    """The task copies this program trains, one per local replica (one
    for a program whose strategy mirrors one task's variables)."""
    return list(self.state.tasks)

  @property
  def learner(self):
    return self.state.learner

  @property
  def global_step(self):
    return int(self.state.global_step.numpy())

  @property
  def checkpointer(self):
    return self._checkpointer

  def EmaTheta(self):
    """The task's theta with the EMA variables in place of the trained ones
    (the plain theta when EMA is off)."""
    return self.state.EmaTheta()

  # --- the compiled loop -----------------------------------------------------

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
    consecutive, runner = self.state.consecutive, self.runner

    def _Cond(i, acc, stop):
      del acc
      return tf.logical_and(
          tf.logical_and(i < num_steps, consecutive < limit),
          tf.logical_not(stop))

    def _Body(i, acc, unused_stop):
      items = runner.Step(iterator).FlattenItems()
      self._stat_keys[:] = [k for k, _ in items]   # The runner's `keys`.
      flat = tf.stack([tf.cast(v, tf.float32) for _, v in items])
      keep = tf.constant([0.0 if k == 'learning_rate' else 1.0
                          for k, _ in items])
      acc = tf.cond(tf.size(acc) > 0, lambda: acc * keep + flat,
                    lambda: flat)
      return i + 1, acc, runner.StopTensor()

    _, acc, stop = tf.while_loop(
        _Cond, _Body,
        (tf.constant(0), tf.zeros([0]), runner.StopTensor()),
        shape_invariants=(tf.TensorShape([]), tf.TensorShape([None]),
                          tf.TensorShape([])))
    return acc, consecutive.read_value(), stop

  def RunSteps(self, iterator, num_steps):
    """One call of the compiled loop: up to `num_steps` steps on `iterator`
    (the runner's `Iterator`); returns {stat name: float} (summed over the
    steps; the learning rate the last one's), plus 'consecutive' (skips in
    a row) and 'stop' (the agreed stop flag)."""
    return self.runner.Call(self.train_loop, iterator, num_steps,
                            self._stat_keys)

  # --- the Python loop -------------------------------------------------------

  def Iterator(self, dataset=None):
    """The compiled loop's iterator over `dataset` (this host's batches,
    one element per local replica; default: the input's, from the current
    input position)."""
    start = int(self.state.input_position.numpy())
    if dataset is None:
      dataset = self.runner.Batches(start)
    return self.runner.Iterator(dataset, start)

  def StepRunner(self, dataset=None):
    """run(n) -> seconds a step: n steps of the compiled train loop, as
    `Run` takes them but without checkpoints, summaries or logs (the
    planner's calibration and the benchmarks time the trainer's own step
    with it). The steps train: the weights and the global step move.

    Args:
      dataset: this host's batches, one element per local replica (default:
        the input's, from the current input position).
    """
    iterator = self.Iterator(dataset)

    def _Run(num_steps):
      start = time.perf_counter()
      self.RunSteps(iterator, num_steps)
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
    self.runner.CombineOnRead()
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
                   int(self.state.input_position.numpy()))
      # The checkpoint holds one copy: every replica starts from it.
      self.state.CopyFromFirst()
    self.state.consecutive.assign(0)

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
        skipped_steps_total=int(self.state.skipped_total.numpy()))

  def _FirstStep(self, iterator):
    """Runs the first loop call (one step, compiling the loop); logs it."""
    logging.info('Compiling the train step (tracing the model, then '
                 'optimising its graph); the first step runs with it...')
    start = self._clock()
    out = self.RunSteps(iterator, 1)
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
    start = int(self.state.input_position.numpy())
    dataset = self.runner.Batches(start)
    self.CheckShapes()
    flops = train_report.TrainFlopsPerExample(
        self.task, dataset, self.input_generator.GlobalBatchSize())
    # The program owns its input iterator: freeing it stops tf.data's
    # threads, seconds of work on a loaded machine that a trainer about to
    # exit need not do (framework/jobs/process_exit.py).
    iterator = self._iterator = self.runner.Iterator(dataset, start)
    summary_window, log_window = train_report.Window(), train_report.Window()
    first = True
    while step < p.max_steps:
      begin = self._clock()
      if first:
        out = self._FirstStep(iterator)
      else:  # To the next boundary, or fewer to log in time.
        out = self.RunSteps(iterator, self._timer.Steps(
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
