"""Eval and decode programs, and the evaler/decoder's checkpoint loop.

Both programs run a task built with `is_inference=True` over a fresh pass
of one dataset (`eval.samples_per_summary` / `eval.decoder_samples`
examples, or the whole non-repeating dataset when 0) with a theta given per
call. The evaler reads whole batches (its metrics are sums over batches)
and reports `num_samples`, the real examples it averaged over (rows that
only fill up a last batch are not counted:
`base_input_generator.RealExamples`); the decoder decodes whole batches but
keeps exactly `decoder_samples` rows, so its metrics and its output lines
cover the same examples. The theta is the
trainer's own variables (trainer_and_evaler), the EMA variables, or the
variables an evaler job restored from a checkpoint. Each run writes
its summaries at the checkpoint's global step into
`logdir/eval_<dataset>` or `logdir/decoder_<dataset>`; the decoder also
writes its text output to `decoder_<dataset>/decoder_out-<step>.txt`.

Programs of one dataset can share its input generator (`input_generator`),
so the trainer's in-process eval and final decode read Dev once. The first
`Run` of a program traces and compiles its step and says so in the log.

`RunOnCheckpoints` is the evaler's outer loop: it waits for checkpoints in
`logdir/train` and handles each new one once, in order, until the one at
`max_steps`, or the run's final one when the trainer marked its run ended
earlier (framework/train/checkpoint_files.py), or until a timeout without a new
checkpoint. An unreadable checkpoint is skipped with a warning: only the
trainer moves damaged files aside.
"""
import math
import os
import time

from absl import logging
import numpy as np
import tensorflow as tf

from cadence.framework import base_input_generator
from cadence.framework import base_layer
from cadence.framework.nested_map import NestedMap
from cadence.framework import step_seed
from cadence.framework.train import checkpoint_files
from cadence.framework.train import checkpointer as checkpointer_lib
from cadence.framework.train import summary_utils


def _NumBatches(generator, samples, num_replicas, field):
  """Batches to read for `samples` examples; None means the whole dataset."""
  if samples:
    return math.ceil(samples / generator.GlobalBatchSize(num_replicas))
  if generator.params.repeat:
    raise ValueError(
        f'eval.{field}=0 asks for the whole dataset, but its input repeats '
        f'forever (input.repeat=True); set input.repeat=False or '
        f'eval.{field} > 0.')
  return None


class _InferenceProgram:
  """What the eval and decode programs share: input, writer, strategy.

  Args:
    task: the task, built with is_inference=True (its params.input is the
      dataset's).
    dataset_name: 'Dev', 'Test', ...: names the output folder.
    logdir: the experiment's logdir.
    strategy: a tf.distribute strategy (default: the default strategy).
    input_generator: the generator of `task.params.input`, if one is
      already built (e.g. shared by an eval and a decode program); default:
      built here.
  """

  _SUBDIR = ''
  _SAMPLES_FIELD = ''
  _WHAT = ''

  def __init__(self, task, dataset_name, logdir, strategy=None,
               input_generator=None):
    self._task = task
    self._strategy = strategy or tf.distribute.get_strategy()
    self._input = input_generator or task.params.input.Instantiate()
    self._dataset_name = dataset_name
    self._dir = os.path.join(logdir, f'{self._SUBDIR}_{dataset_name.lower()}')
    self._writer = summary_utils.SummaryWriter(self._dir)
    self._samples = task.params.eval.Get(self._SAMPLES_FIELD)
    self._num_batches = _NumBatches(
        self._input, self._samples, self._strategy.num_replicas_in_sync,
        self._SAMPLES_FIELD)

  @property
  def logdir(self):
    """The folder this program writes to."""
    return self._dir

  @property
  def input_generator(self):
    """The input generator this program reads (to share with another)."""
    return self._input

  def _LogFirstRun(self, step_fn, step):
    if not step_fn.experimental_get_tracing_count():
      logging.info('%s %s at step %d: compiling the %s step first...',
                   self._WHAT, self._dataset_name, step, self._SUBDIR)

  def _Batches(self):
    dataset = self._input.Dataset(
        num_replicas=self._strategy.num_replicas_in_sync)
    if self._num_batches is not None:
      dataset = dataset.take(self._num_batches)
    return self._strategy.experimental_distribute_dataset(dataset)

  def _Theta(self, theta, step):
    seed = step_seed.MakeStepSeed(step, self._task.params.random_seed or 0)
    return base_layer.WithStepSeed(theta, seed)


class EvalProgram(_InferenceProgram):
  """Averages the task's metrics over a dataset for one checkpoint.

  Example:
    program = EvalProgram(eval_task, 'Dev', '/tmp/run')
    program.Run(step=100, theta=train_task.theta)  # {'loss': 0.02, ...}
  """

  _SUBDIR = 'eval'
  _SAMPLES_FIELD = 'samples_per_summary'
  _WHAT = 'Evaluating'

  def __init__(self, task, dataset_name, logdir, strategy=None,
               input_generator=None):
    super().__init__(task, dataset_name, logdir, strategy, input_generator)
    self._eval_step = tf.function(self._EvalStep, autograph=False)

  def _ReplicaEval(self, theta, batch):
    metrics, _ = self._task.FPropTower(theta, batch)
    out = NestedMap({k: NestedMap(vw=tf.cast(v, tf.float32) *
                                  tf.cast(w, tf.float32),
                                  w=tf.cast(w, tf.float32))
                     for k, (v, w) in metrics.items()})
    # Examples, not rows: rows that only fill up a last batch are padding.
    out.num_samples = tf.reduce_sum(tf.cast(
        base_input_generator.RealExamples(batch), tf.float32))
    return out

  def _EvalStep(self, theta, batch):
    per_replica = self._strategy.run(self._ReplicaEval, args=(theta, batch))
    return tf.nest.map_structure(
        lambda x: self._strategy.reduce(tf.distribute.ReduceOp.SUM, x,
                                        axis=None), per_replica)

  def Run(self, step, theta):
    """Evaluates with `theta` and writes the averages at `step`.

    Returns:
      dict metric name -> weighted average (plus `num_samples`).
    """
    self._LogFirstRun(self._eval_step, step)
    start = time.perf_counter()
    theta = self._Theta(theta, step)
    sums = None
    for batch in self._Batches():
      out = self._eval_step(theta, batch)
      out = tf.nest.map_structure(lambda x: float(x.numpy()), out)
      sums = out if sums is None else tf.nest.map_structure(
          lambda a, b: a + b, sums, out)
    if sums is None:
      raise ValueError(f'Evaluation of {self._input!r} read no batch; the '
                       'dataset is empty.')
    results = {k: (v.vw / v.w if v.w else float('nan'))
               for k, v in sums.items() if k != 'num_samples'}
    results['num_samples'] = sums.num_samples
    self._writer.WriteScalars(step, results)
    self._writer.Flush()
    logging.info('Eval %s at step %d (%d samples, %.2f s): %s',
                 os.path.basename(self._dir), step, int(sums.num_samples),
                 time.perf_counter() - start,
                 '  '.join(f'{k} {v:.6g}' for k, v in sorted(results.items())
                           if k != 'num_samples'))
    return results


class DecodeProgram(_InferenceProgram):
  """Decodes a dataset for one checkpoint: metrics, summaries, a text file.

  Example:
    program = DecodeProgram(eval_task, 'Test', '/tmp/run')
    program.Run(step=100, theta=eval_task.theta)
  """

  _SUBDIR = 'decoder'
  _SAMPLES_FIELD = 'decoder_samples'
  _WHAT = 'Decoding'

  def __init__(self, task, dataset_name, logdir, strategy=None,
               input_generator=None):
    super().__init__(task, dataset_name, logdir, strategy, input_generator)
    self._decode_step = tf.function(self._DecodeStep, autograph=False)

  def _DecodeStep(self, theta, batch):
    per_replica = self._strategy.run(
        lambda t, b: NestedMap(self._task.Decode(t, b)), args=(theta, batch))
    return tf.nest.map_structure(
        lambda x: tf.concat(self._strategy.experimental_local_results(x), 0)
        if x.shape.rank else self._strategy.experimental_local_results(x)[0],
        per_replica)

  def Run(self, step, theta):
    """Decodes with `theta`; writes metrics and the output file at `step`.

    Returns:
      dict decoder metric name -> value.
    """
    self._LogFirstRun(self._decode_step, step)
    start = time.perf_counter()
    theta = self._Theta(theta, step)
    metrics = self._task.CreateDecoderMetrics()
    lines = []
    left = self._samples or None   # Examples still to decode (None: all).
    for batch in self._Batches():
      out = self._decode_step(theta, batch)
      out = tf.nest.map_structure(lambda x: np.asarray(x), out)
      if left is not None:  # The metrics and the lines see the same rows.
        out = tf.nest.map_structure(lambda x: x[:left] if x.ndim else x, out)
        left -= len(next(x for x in tf.nest.flatten(out) if x.ndim))
      lines.extend(self._task.PostProcessDecodeOut(out, metrics))
    path = os.path.join(self._dir, f'decoder_out-{int(step):08d}.txt')
    tf.io.gfile.makedirs(self._dir)
    with tf.io.gfile.GFile(path, 'w') as f:
      f.write(''.join(f'{line}\n' for line in lines))
    results = {k: m.value for k, m in metrics.items()}
    self._writer.WriteScalars(step, results)
    if lines:
      self._writer.WriteText(step, 'decoder_out',
                             '\n\n'.join(lines[:10]))
    self._writer.Flush()
    logging.info('Decoded %d examples at step %d into %s (%.2f s): %s',
                 len(lines), step, path, time.perf_counter() - start,
                 '  '.join(f'{k} {v:.6g}' for k, v in sorted(results.items())))
    return results


class CheckpointState:
  """What an evaler or decoder restores: model, EMA (if on), global step.

  Build it under the strategy's scope, from the inference task.

  Example:
    state = CheckpointState(task, '/tmp/run/train')
    step = state.Restore(path)
    program.Run(step, state.Theta())
  """

  def __init__(self, task, train_dir):
    self._task = task
    self._global_step = tf.Variable(tf.constant(0, tf.int64),
                                    trainable=False, name='global_step')
    objects = dict(model=checkpointer_lib.KeyedVariables(
        checkpointer_lib.TaskVariables(task)), global_step=self._global_step)
    self._ema = None
    if task.params.train.ema_decay:
      trainable = task.InstantiateLearner().trainable
      self._ema = {path: tf.Variable(tf.zeros_like(v), trainable=False,
                                     name='ema') for path, v in trainable}
      objects['ema'] = checkpointer_lib.KeyedVariables(
          checkpointer_lib.TaskVariables(task, self._ema))
    self._checkpointer = checkpointer_lib.Checkpointer(
        train_dir, objects, writer=False)

  def Restore(self, path):
    """Restores checkpoint `path`; returns its global step."""
    self._checkpointer.Restore(path, expect_partial=True)
    return int(self._global_step.numpy())

  def Theta(self):
    """The restored theta (EMA variables in place when EMA is on)."""
    theta = self._task.theta
    if self._ema is None:
      return theta
    return theta.Pack([self._ema.get(k, v) for k, v in theta.FlattenItems()])


def _Done(train_dir, last, max_steps):
  """Why the checkpoint loop is done after handling step `last`, or None.

  Read the final mark before listing checkpoints: the trainer writes it
  after its final checkpoint, so that one is then listed too.
  """
  if last >= max_steps:
    return f'handled the checkpoint of step {last} (max_steps {max_steps})'
  mark = checkpoint_files.ReadFinalMark(train_dir)
  if mark is not None and (mark['step'] is None or last >= mark['step']):
    final = ('wrote no checkpoint' if mark['step'] is None else
             f"its final checkpoint is step {mark['step']}")
    return f"the trainer's run ended ({mark['reason']}); {final}"
  return None


def ReadLastStep(state_path):
  """The last step an evaler or decoder handled, from its `state_path`
  (last_step.txt), or -1: none yet, or a file that holds no step (any
  bytes can be there; one warning, and the checkpoints are handled
  again)."""
  if not tf.io.gfile.exists(state_path):
    return -1
  try:
    with tf.io.gfile.GFile(state_path, 'rb') as f:
      return int(f.read().decode('ascii').strip() or -1)
  except (ValueError, UnicodeDecodeError, tf.errors.OpError, OSError) as e:
    logging.warning('%s holds no step (%s); handling every checkpoint from '
                    'the first.', state_path, type(e).__name__)
    return -1


# While no new checkpoint comes, a line at least this often.
WAIT_LOG_SECS = 30.0


def RunOnCheckpoints(train_dir, fn, max_steps, state_path,
                     poll_interval_secs=2.0, timeout_secs=None,
                     should_stop=None, clock=time.monotonic):
  """Calls `fn(path)` for each new checkpoint in `train_dir`, in order.

  Checkpoints are handled once each across restarts: the last handled step
  is kept in `state_path`. An unreadable checkpoint (damaged, or deleted
  meanwhile) is skipped with a warning. Returns, logging one line saying
  why, after the checkpoint at or beyond `max_steps`, after the final
  checkpoint of a run the trainer marked ended, after `timeout_secs`
  without a new checkpoint, or when `should_stop()` (e.g. a signal) says so.

  While it waits, a line every WAIT_LOG_SECS says since when and for what.

  Returns:
    The list of steps handled in this call.
  """
  last = ReadLastStep(state_path)
  handled = []
  waited_since = logged = clock()
  while True:
    done = _Done(train_dir, last, max_steps)
    if done is None and should_stop and should_stop():
      done = f'stopped by {should_stop()}; the last handled is step {last}'
    if done is None and timeout_secs is not None and (
        clock() - waited_since > timeout_secs):
      done = (f'no new checkpoint for {timeout_secs:g} s (the timeout); the '
              f'last handled is step {last}')
    if done:
      logging.info('Stopping: %s.', done)
      return handled
    new = [p for p in checkpointer_lib.ListCheckpoints(train_dir)
           if checkpointer_lib.StepOf(p) > last]
    for path in new:
      if should_stop and should_stop():
        break
      try:
        fn(path)
      except checkpointer_lib.UnreadableError as e:  # Damaged or deleted.
        logging.warning('Skipping %s, deleted or unreadable: %s', path, e)
      last = checkpointer_lib.StepOf(path)
      handled.append(last)
      tf.io.gfile.makedirs(os.path.dirname(state_path))
      with tf.io.gfile.GFile(state_path, 'w') as f:
        f.write(str(last))
      waited_since = logged = clock()
    if not new:
      if clock() - logged >= WAIT_LOG_SECS:
        logged = clock()
        logging.info(
            'Waiting for a checkpoint after step %d in %s (%.0f s so far; '
            'until step %d%s).', last, train_dir, logged - waited_since,
            max_steps, '' if timeout_secs is None else
            f' or {timeout_secs:g} s without one, --eval_timeout_s')
      time.sleep(poll_interval_secs)
