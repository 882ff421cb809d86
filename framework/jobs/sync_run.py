"""The run of --mode=sync (sync_mode.py): train, evaluate or decode --job.

What every task of a job refuses before its devices are set up is
`CheckBeforeDevices` (the job against the distribution option, and a
trainer job's params; no TensorFlow op). Then `Run`, once the devices are
set up (trainer_lib.Main), in a fixed order: the memory estimate of a
training step from the params alone (nothing built, so a step too big is
refused before it allocates), whether the logdir can be written, the job
built (sync_jobs.py: the learner, the input; built, they write nothing),
the logdir's checkpoints against the model built; any user error up to
there exits with 2 and leaves the logdir as it was (a fresh one is not
created). Only then the logdir's writer lock (trainer jobs on the chief:
one writer per logdir; framework/train/logdir_lock.py) and `params.txt`
(a different one already there is kept as params.txt.<UTC time>:
framework/jobs/params_file.py). Then the job runs, SIGTERM/SIGINT
stopping it cleanly (framework/train/preemption.py), and its failures
come out as exit codes 3 and 4 (exit_codes.py). A job that already
finished builds nothing: one line says so, exit 0.
"""
import os
import time

from absl import logging
import tensorflow as tf

from cadence.framework import cost
from cadence.framework.distribute import distribution
from cadence.framework.jobs import checkpoint_fit
from cadence.framework.jobs import exit_codes
from cadence.framework.jobs import graph_optimizer
from cadence.framework.jobs import inspect_lib
from cadence.framework.jobs import job_flag
from cadence.framework.jobs import memory_check
from cadence.framework.jobs import run_params
from cadence.framework.jobs import sync_jobs
from cadence.framework.jobs import user_error
from cadence.framework.train import checkpoint_files
from cadence.framework.train import checkpointer
from cadence.framework.train import logdir_lock
from cadence.framework.train import preemption
from cadence.framework.train import programs
from cadence.framework.train import xla_step

UserError = user_error.UserError
Fail = exit_codes.Fail

# What a multi-host step raises when a peer host dies or drops off.
_PEER_ERRORS = (tf.errors.UnavailableError, tf.errors.AbortedError,
                tf.errors.CancelledError, tf.errors.DeadlineExceededError)


def CheckBeforeDevices(options, setup_cls):
  """What every task of a --mode=sync job refuses before its distribution
  option (`setup_cls`) is created, and so before it waits for its peers or
  serves them: a task that only serves (a parameter server) builds
  nothing, and a chief that refused after it connected left them serving.
  The job against the option (CheckJob: --job, --xla) and, for a trainer
  job, the experiment's params: loaded (run_params.LoadParams), checked
  alone as a build checks them (inspect_lib.CheckParamsAlone) and against
  what the option's train program runs (its CheckParams). So every task
  given the same command refuses with the same line. Runs no TensorFlow
  op (the devices are set up after it).

  Returns:
    The job's params (its dataset's; Train for a trainer job).

  Raises:
    UserError, ValueError: as the params and the option say.
  """
  kind, dataset = job_flag.ParseJob(options.job)
  try:
    setup_cls.CheckJob(options.job, trains=dataset is None, xla=options.xla)
  except distribution.SetupError as e:
    raise UserError(str(e)) from None
  params = run_params.LoadParams(options, dataset or 'Train')
  if kind in job_flag.TRAINS:
    inspect_lib.CheckParamsAlone(params)
    setup_cls.CheckParams(params)
  return params


def _CheckWritable(logdir, sub):
  """Raises UserError unless the job can write its folders, `logdir/sub`
  and an existing `logdir/train`, creating nothing: a probe file is
  written (and removed) in each folder or, where it does not exist yet, in
  its nearest existing parent (a remote folder is made, as its store has
  no folders to make)."""
  folders = [os.path.join(logdir, sub) if sub else logdir]
  train_dir = os.path.join(logdir, 'train')
  if not sub and tf.io.gfile.exists(train_dir):
    folders.append(train_dir)
  for folder in folders:
    where = folder
    if '://' in folder:
      tf.io.gfile.makedirs(folder)
    elif os.path.exists(folder) and not os.path.isdir(folder):
      raise UserError(f'--logdir: cannot write in {folder}: {folder} is not '
                      'a directory.')
    else:
      while not os.path.isdir(where) and os.path.dirname(where) != where:
        where = os.path.dirname(where)
    probe = os.path.join(where, f'.write_test.{os.getpid()}')
    try:
      with tf.io.gfile.GFile(probe, 'w') as f:
        f.write('ok')
      tf.io.gfile.remove(probe)
    except (tf.errors.OpError, OSError) as e:
      raise UserError(f'--logdir: cannot write in {folder}: '
                      f'{checkpoint_files.ErrorLine(e)}.') from None


def _WriterLock(options, setup, kind):
  """The logdir's writer lock (logdir_lock) of a trainer job on the chief,
  the one host that writes; None for readers (evaler, decoder) and the
  other hosts. Taken once every check passed, right before the first
  write (it creates a fresh logdir)."""
  if kind not in job_flag.TRAINS or not setup.is_chief:
    return None
  if '://' in options.logdir:   # gs://...: no OS lock there.
    logging.warning('--logdir %s is not a local folder: no writer lock; make '
                    'sure no other trainer writes there.', options.logdir)
    return None
  try:
    return logdir_lock.WriterLock(options.logdir)
  except logdir_lock.HeldError as e:
    raise UserError(str(e)) from None
  except OSError as e:
    raise UserError(f'--logdir: cannot write the lock file in '
                    f'{options.logdir}: {e}.') from None


def _CheckCheckpointFits(options, params, task, paths):
  """Raises UserError unless the newest readable of `paths` (checkpoints
  of logdir/train) holds the model variables of `task`
  (checkpoint_fit.Mismatch)."""
  line = checkpoint_fit.Mismatch(options.logdir, options.model, params, task,
                                 paths)
  if line:
    raise UserError(f'{line} Use a new --logdir, or the model and overrides '
                    'that wrote it; nothing was changed.')


def _CheckMemory(options, params, setup):
  """The memory estimate of a training step (memory_check.CheckParams),
  from the params alone: before anything is built, so that a step too big
  for the memory is refused without allocating it.

  Returns:
    The Verdict, or None (no estimate or no limit).

  Raises:
    UserError: the step does not fit.
  """
  if not (options.device_memory_gib or setup.runs_steps):
    return None
  device = tf.DeviceSpec.from_string(setup.cluster.devices[0])
  verdict = memory_check.CheckParams(
      params, setup.cluster.DevicesInModelSplit(0),
      device.device_type or 'CPU', setup.num_local_replicas,
      options.device_memory_gib, num_replicas=setup.num_replicas,
      devices_from=setup.cluster.split_size_from)
  if verdict is not None and not verdict.fits:
    batch = getattr(params.input, 'batch_size', None)
    batch = f'input.batch_size ({batch}), ' if batch else ''
    raise UserError(
        f'--model={options.model}: a training step does not fit in memory: '
        f'{verdict.text}. Lower {batch}the model size or the micro-batch '
        'size (more micro-batches, remat); --mode=inspect_model prints the '
        'estimate per stage.')
  return verdict


def BuildJob(options, params, setup, watcher):
  """The job of `options` with its `params` (CheckBeforeDevices: they and
  the job are checked already, on every task), or a message (str) when it
  already finished.

  Every check runs before anything is written: the params, the model built
  without weights (memory, the logdir's checkpoints), whether the logdir
  can be written, then the job's programs (the learner, the input), which
  write nothing when built. Only then the writer lock (which makes a fresh
  logdir) and params.txt.
  """
  kind, dataset = job_flag.ParseJob(options.job)
  sub = '' if dataset is None else (
      f"{'eval' if kind == 'evaler' else kind}_{dataset.lower()}")
  if setup.serves:
    logging.info('%s', setup)
    return sync_jobs.ServerJob(options, params, setup, kind, watcher)
  finished = sync_jobs.Finished(options, params, kind, sub)
  if finished:
    return finished
  logging.info('%s', setup)
  start = time.perf_counter()
  trains = kind in job_flag.TRAINS
  verdict = _CheckMemory(options, params, setup) if trains else None
  _CheckWritable(options.logdir, sub)
  if trains:
    job = sync_jobs.TrainerJob(options, params, setup,
                      with_eval=kind == 'trainer_and_evaler', watcher=watcher)
  else:
    job = sync_jobs.CheckpointJob(options, params, setup, kind, dataset, watcher)
  # The model is built once: its checkpoints are checked against it.
  paths = checkpointer.ListCheckpoints(
      os.path.join(options.logdir, 'train'), when_missing=True)
  _CheckCheckpointFits(options, params, job.task, paths)
  checked = ([f'memory {verdict.text}'] if verdict else []) + (
      [f'{os.path.basename(paths[-1])} holds this model'] if paths else [])
  if checked:
    logging.info('Checked before writing (%.1f s with the build): %s.',
                 time.perf_counter() - start, '; '.join(checked))
  lock = _WriterLock(options, setup, kind)
  try:
    _WriteRunParams(options, params, setup, sub)
  except BaseException:
    if lock is not None:
      lock.Release()
    raise
  if lock is not None:
    job.lock = lock
  return job


def _WriteRunParams(options, params, setup, sub):
  """params.txt of the job (the chief writes it), in logdir/sub."""
  path = os.path.join(options.logdir, sub, 'params.txt')
  if not setup.is_chief:
    return
  try:
    run_params.WriteParams(params, path)
  except (tf.errors.OpError, OSError) as e:
    raise UserError(f'--logdir: cannot write {path}: '
                    f'{checkpoint_files.ErrorLine(e)}.') from None
  logging.info('Model %s, job %s; params written to %s.', options.model,
               options.job, path)


def _PeerFailed(options, setup, e):
  """The one line of a multi-host job (or a parameter-server cluster) whose
  peer failed, or None for a job without peers."""
  lines = [l.strip() for l in str(e).splitlines() if l.strip() and
           not l.strip().startswith(('Graph execution error', 'Detected',
                                     'File ', 'Traceback', '[['))]
  first = lines[0] if lines else type(e).__name__
  latest = checkpointer.ListCheckpoints(os.path.join(options.logdir,
                                                     'train'))
  latest = latest[-1] if latest else 'none'
  return setup.PeerFailed(f'{type(e).__name__}: {first[:200]}', latest)


def _Done(options, setup):
  """EXIT_OK, once the job's other hosts finished too where it has some
  (the distribution option's `FinishTogether`)."""
  try:
    setup.FinishTogether()
  except tf.errors.OpError as e:
    return Fail(exit_codes.EXIT_PEER_FAILED, _PeerFailed(options, setup, e))
  return exit_codes.EXIT_OK


def Run(context):
  """Runs the job of `context` (a mode_registry.Context whose params are
  CheckBeforeDevices'); returns the exit code."""
  options, setup = context.options, context.setup
  # From here on SIGTERM/SIGINT stop the job cleanly (handlers restored on
  # return); the hosts of a multi-host job agree on the step to stop at
  # (the distribution option's agreement).
  agreement = setup.Agreement()
  with graph_optimizer.Scope(options.graph_optimizer), \
      preemption.Watcher(agreement=agreement) as watcher:
    try:
      job = BuildJob(options, context.params, setup, watcher)
    except (UserError, ValueError) as e:
      return exit_codes.SetupFailure(e)
    if isinstance(job, str):
      logging.info('%s', job)
      job = None
    try:
      if job is not None:
        job.Run()
    except programs.Preempted as e:
      logging.info('%s', e)
    except programs.TrainingStopped as e:
      return Fail(exit_codes.EXIT_TRAINING_STOPPED, str(e))
    except xla_step.StaticShapeError as e:  # Checked before the first step.
      return Fail(exit_codes.EXIT_USER_ERROR, str(e))
    except cost.ContractError as e:   # A unit's shapes, at the first trace.
      return Fail(exit_codes.EXIT_USER_ERROR, f'Bad params: {e}')
    except checkpointer.UnreadableError as e:
      return Fail(exit_codes.EXIT_USER_ERROR, str(e))
    except checkpointer.SaveError as e:
      return Fail(exit_codes.EXIT_SAVE_FAILED, str(e))
    except _PEER_ERRORS as e:
      message = _PeerFailed(options, setup, e)
      if message is None:
        raise
      return Fail(exit_codes.EXIT_PEER_FAILED, message)
  # Outside the watcher: a signal now ends a host that has done its part.
  return _Done(options, setup)
