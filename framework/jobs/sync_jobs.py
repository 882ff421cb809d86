"""What each --job of --mode=sync runs, once it is built.

  TrainerJob     trainer / trainer_and_evaler: the distribution option's
                 train program; with trainer_and_evaler, an eval of Dev
                 after each checkpoint and a decode of Dev with the final
                 weights, on the chief.
  CheckpointJob  evaler_<dataset> / decoder_<dataset>: a program per new
                 checkpoint of logdir/train, until the one at max_steps.
  ServerJob      a task that only serves (parameter-server training).
  Finished       the one line of a job that already finished, read from
                 the logdir's state files alone.

Each is built by sync_run.BuildJob (after every check) and has `Run()`.
"""
import os
import time

from absl import logging
import tensorflow as tf

from cadence.framework import base_model
from cadence.framework.jobs import job_flag
from cadence.framework.jobs import run_params
from cadence.framework.jobs import user_error
from cadence.framework.train import checkpoint_files
from cadence.framework.train import checkpointer
from cadence.framework.train import eval_programs
from cadence.framework.train import xla_step

UserError = user_error.UserError


class TrainerJob:
  """trainer / trainer_and_evaler: the train program (+ in-process eval).

  The train program is the distribution option's (`setup.TrainProgram`:
  e.g. one copy of the task per local replica, or with parameter servers
  the chief's program with the one task on them); the in-process eval and
  the final decode run on the chief, on replica 0's devices, with replica
  0's (EMA) weights.
  """

  def __init__(self, options, params, setup, with_eval, watcher):
    self.lock = None   # The logdir's writer lock (sync_run.BuildJob), released by Run.
    on_checkpoint = []
    self._decode = None
    with_eval = with_eval and setup.is_chief
    if with_eval and run_params.HasDataset(options, 'Dev'):
      dev = run_params.InferenceParams(run_params.LoadParams(options, 'Dev'))
      with setup.cluster.WithReplica(0):
        eval_task = dev.Instantiate().task
      self._eval = eval_programs.EvalProgram(eval_task, 'Dev', options.logdir)
      on_checkpoint.append(
          lambda step: self._eval.Run(step, self._program.EmaTheta()))
      # A local run ends by decoding Dev once with the final weights, so one
      # command shows training, eval and samples. It reads the eval's Dev.
      if _ImplementsDecode(type(eval_task)):
        self._decode = eval_programs.DecodeProgram(
            eval_task, 'Dev', options.logdir,
            input_generator=self._eval.input_generator)
    elif with_eval:
      logging.warning('%s defines no Dev() dataset: training without eval.',
                      options.model)
    peak = options.peak_tflops * 1e12 if options.peak_tflops else None
    start = time.perf_counter()
    self._program = setup.TrainProgram(
        params, options.logdir, xla=options.xla, peak_flops=peak,
        on_checkpoint=on_checkpoint, start_time=options.start_time,
        steps_per_loop=options.steps_per_loop, watcher=watcher)
    try:   # Before anything is written.
      self._program.CheckShapes()
    except xla_step.StaticShapeError as e:
      raise UserError(str(e)) from None
    _LogBuilt(self._program.tasks, start)

  @property
  def task(self):
    """The task trained (replica 0's copy)."""
    return self._program.tasks[0]

  def Run(self):
    try:
      step = self._program.Run()
      if self._decode is not None:
        logging.info('Decoding Dev with the final weights (step %d)...',
                     step)
        self._decode.Run(step, self._program.EmaTheta())
    finally:
      if self.lock is not None:
        self.lock.Release()


def _LogBuilt(tasks, start):
  variables = checkpointer.TaskVariables(tasks[0]).values()
  logging.info('Built the model: %d variables, %s parameters (%.1f s)%s.',
               len(variables),
               f'{sum(v.shape.num_elements() for v in variables):,}',
               time.perf_counter() - start,
               f', one copy per replica x {len(tasks)}' if len(tasks) > 1
               else '')


class ServerJob:
  """A task that only serves (`setup.serves`: a 'worker' or 'ps' task of
  parameter-server training), until the run is finished (as the trainer's
  'nothing to do' check says) and the chief has exited."""

  def __init__(self, options, params, setup, kind, watcher):
    self._finished = lambda: Finished(options, params, kind, '')
    self._setup = setup
    self._watcher = watcher

  def Run(self):
    self._setup.Serve(self._finished,
                      should_stop=lambda: self._watcher.requested)


def _ImplementsDecode(task_cls):
  return task_cls.Decode is not base_model.BaseTask.Decode


def Finished(options, params, kind, sub):
  """The one-line message of a job that already finished, or None.

  Reads only the logdir's state files: trainer jobs, the latest checkpoint
  (and for trainer_and_evaler the final decode's output, when Dev is
  decoded); evaler/decoder jobs, their `last_step.txt` and the trainer's
  final mark. A finished trainer writes the final mark if it is missing
  (max_steps lowered below the latest checkpoint), so evalers stop there.
  """
  max_steps = params.task.train.max_steps
  if kind in job_flag.TRAINS:
    train_dir = os.path.join(options.logdir, 'train')
    paths = checkpointer.ListCheckpoints(train_dir)
    step = checkpointer.StepOf(paths[-1]) if paths else None
    if step is None or step < max_steps:
      return None
    if (kind == 'trainer_and_evaler' and
        run_params.HasDataset(options, 'Dev') and
        _ImplementsDecode(params.task.cls) and not tf.io.gfile.exists(
            os.path.join(options.logdir, 'decoder_dev',
                         f'decoder_out-{step:08d}.txt'))):
      return None   # Stopped before its final decode: resume to decode.
    mark = checkpoint_files.ReadFinalMark(train_dir)
    if mark is None or mark['step'] != step:
      try:
        checkpoint_files.WriteFinalMark(
            train_dir, step, f'global step {step} >= max_steps {max_steps}')
      except (tf.errors.OpError, OSError) as e:
        logging.warning('Could not mark the run in %s finished: %s',
                        train_dir, checkpoint_files.ErrorLine(e))
    return (f'The run is finished: {train_dir} holds the checkpoint of step '
            f'{step} (max_steps {max_steps}); nothing to do. Raise '
            '--max_steps to train on, or use a new --logdir to start over.')
  state = os.path.join(options.logdir, sub, 'last_step.txt')
  last = eval_programs.ReadLastStep(state)
  if last < 0:
    return None
  mark = checkpoint_files.ReadFinalMark(os.path.join(options.logdir, 'train'))
  final = max_steps if mark is None or mark['step'] is None else min(
      max_steps, mark['step'])
  if last < final:
    return None
  why = (f'max_steps {max_steps}' if final == max_steps else
         f"the trainer's final checkpoint, {mark['reason']}")
  return (f'The {options.job} job is finished: it handled every checkpoint '
          f'up to step {last} ({why}, {state}); nothing to do.')


class CheckpointJob:
  """evaler_<dataset> / decoder_<dataset>: a program per new checkpoint."""

  def __init__(self, options, params, setup, kind, dataset, watcher):
    self._watcher = watcher
    self._timeout = options.eval_timeout_s or None
    with setup.cluster.WithReplica(0):
      task = run_params.InferenceParams(params).Instantiate().task
    self._state = eval_programs.CheckpointState(
        task, os.path.join(options.logdir, 'train'))
    program_cls = (eval_programs.EvalProgram if kind == 'evaler' else
                   eval_programs.DecodeProgram)
    self._program = program_cls(task, dataset, options.logdir)
    self._train_dir = os.path.join(options.logdir, 'train')
    self._max_steps = params.task.train.max_steps
    self.task = task

  def _Handle(self, path):
    step = self._state.Restore(path)
    self._program.Run(step, self._state.Theta())

  def Run(self):
    logging.info('Waiting for checkpoints in %s (until step %d).',
                 self._train_dir, self._max_steps)
    eval_programs.RunOnCheckpoints(
        self._train_dir, self._Handle, self._max_steps,
        os.path.join(self._program.logdir, 'last_step.txt'),
        timeout_secs=self._timeout,
        should_stop=lambda: self._watcher.requested)
