"""What `trainer.py` runs: devices, params, the job, and exit codes.

`Main(options)` takes the parsed command line as a `TrainerOptions` and
returns the process exit code:

  0  done; also a trainer stopped by SIGTERM or SIGINT after checkpointing
     the step it was in (one log line says so; framework/train/preemption.py),
     an evaler or decoder stopped by one, and a task of a TF_CONFIG job
     stopped by one while it waited for its peers, before building
     anything (one log line; framework/distribute/peer_wait.py);
  2  a user error: unknown --model, a bad override key or value, bad params,
     missing or empty input files, an unknown --job, a logdir that cannot
     be written, checkpoints none of which can be read, a logdir another
     trainer is writing (framework/train/logdir_lock.py), a logdir whose
     checkpoints hold another model (framework/train/checkpoint_match.py),
     a training step whose memory estimate exceeds the device's or host's
     memory (framework/jobs/memory_check.py), a peer host of a TF_CONFIG
     job that never accepted a connection within --peer_timeout_s
     (framework/distribute/peer_wait.py). One readable message on
     stderr, no traceback; the last four leave the logdir as it was;
  3  training stopped: too many consecutive skipped steps or non-finite
     weights (the message names the last good checkpoint);
  4  the run cannot go on, and nothing is lost: a checkpoint could not be
     written (disk full, quota, permission; the message names the path and
     the OS error, and the previous checkpoint stays the latest), or a
     peer host of a multi-host job failed; rerun the same command (on
     every host) to resume from the latest checkpoint; with parameter
     servers, a task the chief needs failed: restart it, then the chief;
     also --mode=export stopped by SIGTERM or SIGINT (its partial folder
     removed, nothing written: rerun it).
A second SIGTERM/SIGINT ends the process at once, killed by that signal
(143 or 130 in a shell).

The set-up runs in a fixed order. First what every task of a job refuses
before its distribution option is created (`CheckBeforeDevices`, no
TensorFlow op): the job against the option (--job, --xla) and, for a
trainer job, the params (registry, file override, text override,
--max_steps), checked as a build checks them, without building, and
against the option's train program; so the tasks of a cluster that only
serve refuse what the chief refuses, before any waits for or serves
another. Then devices, the cluster and the strategy
(framework/distribute/distribution.py; TensorFlow allows logical devices
and MultiWorkerMirroredStrategy only before any op runs), the memory estimate
of a training step from the params alone (the task's pipeline plan:
nothing built, so a step too big is refused before it allocates), whether
the logdir can be written, one copy of the task per local replica and the
job's programs (the learner, the input: built, they write nothing), the
logdir's checkpoints against the model built; any user error up to there
exits with 2 and leaves the logdir as it was (a fresh one is not created).
Only then the logdir's writer lock (trainer jobs on the chief: one writer
per logdir; framework/train/logdir_lock.py) and `params.txt` (a different
one already there is kept as params.txt.<UTC time>:
framework/jobs/params_file.py). Then the
job runs: `trainer`, `trainer_and_evaler` (eval on Dev after each
checkpoint, in process, and a decode of Dev with the final weights),
`evaler_<dataset>` or `decoder_<dataset>` (each new checkpoint of
`logdir/train`, until the one at max_steps).

A job that already finished (a checkpoint at max_steps in `logdir/train`,
and for trainer_and_evaler its final decode written; for an evaler or
decoder, every checkpoint up to max_steps handled) builds nothing: it logs
one line saying so and exits 0, leaving the logdir as it was.

Logs: TensorFlow's own INFO records (e.g. the checkpoint saver's timings at
every save) are dropped (`TensorFlowInfoFilter`; --verbosity=1 keeps them),
and its warnings go through absl's handler once.
"""
import dataclasses
import logging as py_logging
import os
import sys
import time

from absl import logging
import tensorflow as tf

from cadence.framework import base_input_generator
from cadence.framework import base_model
from cadence.framework import cost
from cadence.framework.distribute import distribution
from cadence.framework.jobs import checkpoint_fit
from cadence.framework.jobs import command_line
from cadence.framework.jobs import graph_optimizer
from cadence.framework.jobs import inspect_lib
from cadence.framework.jobs import memory_check
from cadence.framework.jobs import mode_registry
from cadence.framework.jobs import run_params
from cadence.framework import model_registry
from cadence.framework.train import checkpoint_files
from cadence.framework.train import checkpointer
from cadence.framework.train import eval_programs
from cadence.framework.train import logdir_lock
from cadence.framework.train import preemption
from cadence.framework.train import programs
from cadence.framework.train import xla_step

EXIT_OK = 0
EXIT_USER_ERROR = command_line.EXIT_USER_ERROR
EXIT_TRAINING_STOPPED = 3
# Exit code 4: a failed save or a failed peer host (see the docstring).
EXIT_SAVE_FAILED = 4
EXIT_PEER_FAILED = 4
EXIT_STOPPED = 4   # A mode other than sync stopped by a signal, nothing written.

# What a multi-host step raises when a peer host dies or drops off.
_PEER_ERRORS = (tf.errors.UnavailableError, tf.errors.AbortedError,
                tf.errors.CancelledError, tf.errors.DeadlineExceededError)

# A mistake in the command line or the params; exits with code 2.
UserError = command_line.UserError


@dataclasses.dataclass
class TrainerOptions:
  """The trainer's command line, as plain values (see trainer.py's flags)."""
  model: str = ''
  logdir: str = ''
  mode: str = 'sync'
  job: str = 'trainer_and_evaler'
  run_locally: str = 'cpu'
  model_params_override: str = ''
  model_params_file_override: str = ''
  max_steps: int = None
  worker_replicas: int = 1
  worker_split_size: int = None   # None: the experiment's WORKER_SPLIT_SIZE.
  steps_per_loop: int = 0
  cluster_spec: str = ''
  task_type: str = ''
  task_index: int = 0
  peak_tflops: float = 0.0
  device_memory_gib: float = 0.0
  eval_timeout_s: float = 0.0
  start_time: float = None
  xla: bool = False
  graph_optimizer: bool = True    # Grappler on the job's steps.
  # {flag name: value} of the modes' own flags (mode_registry.FlagValues;
  # e.g. 'export_dir', 'plan_cluster'); a flag not given has its default.
  mode_flags: dict = dataclasses.field(default_factory=dict)
  # {flag name: value} of the distribution options' own flags
  # (distribution.FlagValues; e.g. 'tpu', 'worker_gpus', 'peer_timeout_s');
  # a flag not given has its default.
  option_flags: dict = dataclasses.field(default_factory=dict)


# --- logs ---------------------------------------------------------------------


_TF_DIR = os.path.dirname(os.path.abspath(tf.__file__)) + os.sep
# Functions whose tf.function retracing warnings TensorFlowInfoFilter drops
# (names as the warning gives them): each is traced once per object.
_BY_DESIGN_RETRACES = ('.tf_function_save ', 'TrainProgram._TrainLoop ')


class TensorFlowInfoFilter(py_logging.Filter):
  """Drops TensorFlow's own INFO and DEBUG records; keeps its warnings.

  TensorFlow's records come through its 'tensorflow' logger and, from
  modules that use absl logging directly, through absl's logger: e.g. the
  checkpoint saver's 'Sharding callback duration: 117 microseconds' at
  every save. A record is TensorFlow's when its logger is 'tensorflow' or
  its source file lies in the tensorflow package. With absl's
  --verbosity=1 (debug) every record passes. Two warnings go too, that a
  function retraces where it does so by design (`_BY_DESIGN_RETRACES`):
  the checkpoint saver's, which TensorFlow retraces on purpose at every
  save of variables spread over several tasks (parameter servers;
  tensorflow/python/checkpoint/functional_saver.py), and the train loop's
  (`TrainProgram._TrainLoop`), traced once by each program: `--mode=plan
  --plan_measure` builds one program per calibration layout, and TF's
  detector counts the traces of every function of the same code.

  Example:
    logging.get_absl_logger().addFilter(TensorFlowInfoFilter())
  """

  def filter(self, record):
    if logging.get_verbosity() >= logging.DEBUG:
      return True
    if record.levelno >= py_logging.WARNING:
      message = record.getMessage()
      return not ('triggered tf.function retracing' in message and
                  any(f in message for f in _BY_DESIGN_RETRACES))
    return not (record.name.split('.')[0] == 'tensorflow' or
                record.pathname.startswith(_TF_DIR))


def ConfigureLogging():
  """Filters TensorFlow's INFO records and prints its warnings once.

  The filter goes on the 'tensorflow' and absl loggers. TensorFlow gives
  its logger a stderr handler of its own when it is imported before absl
  installs its handler on the root logger (as in trainer.py), so each of
  its warnings was printed twice; with a root handler in place,
  TensorFlow's records go to that one only. Idempotent.
  """
  tf_logger = tf.get_logger()
  for logger in (tf_logger, logging.get_absl_logger()):
    if not any(isinstance(f, TensorFlowInfoFilter) for f in logger.filters):
      logger.addFilter(TensorFlowInfoFilter())
  if py_logging.getLogger().handlers:
    for handler in list(tf_logger.handlers):
      tf_logger.removeHandler(handler)


# --- devices ------------------------------------------------------------------


def WorkerSplitSize(options):
  """(--worker_split_size, else the experiment's WORKER_SPLIT_SIZE, else 1;
  where it came from, as layout errors name it: the flag as typed, the
  experiment's WORKER_SPLIT_SIZE or the flag's default, the cluster's
  split_size_from)."""
  if options.worker_split_size is not None:
    size = options.worker_split_size
    return size, f'--worker_split_size={size}'
  cls = None
  if options.model:
    try:
      cls = model_registry.GetClass(options.model)
    except KeyError as e:
      raise UserError(run_params.Message(e)) from None
  if not hasattr(cls, 'WORKER_SPLIT_SIZE'):
    return 1, 'the default --worker_split_size=1'
  size = cls.WORKER_SPLIT_SIZE
  return size, f"the experiment's WORKER_SPLIT_SIZE={size}"


def ChooseDevices(options):
  """(the distribution option that runs `options`, its Flags), chosen
  without creating it: no TensorFlow op (distribution.Option)."""
  try:
    tf_config = distribution.ReadTfConfig(
        options.cluster_spec, options.task_type, options.task_index)
    size, size_from = WorkerSplitSize(options)
    return distribution.Option(
        run_locally=options.run_locally,
        worker_replicas=options.worker_replicas, worker_split_size=size,
        worker_split_size_from=size_from, tf_config=tf_config,
        **options.option_flags)
  except distribution.SetupError as e:
    raise UserError(str(e)) from None


def CreateDevices(setup_cls, flags):
  """Sets up devices and the strategy of the option `setup_cls` for its
  `flags` (ChooseDevices; before any TF op); returns the Setup."""
  try:
    return setup_cls.Create(flags)
  except distribution.SetupError as e:
    raise UserError(str(e)) from None


def ConfigureDevices(options):
  """Sets up devices and the strategy (before any TF op); returns the
  `distribution.Setup`."""
  return CreateDevices(*ChooseDevices(options))


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
    The job's params (its dataset's; Train for a trainer job), or None for
    another mode (which loads its own).

  Raises:
    UserError, ValueError: as the params and the option say.
  """
  if options.mode != 'sync':
    return None
  kind, dataset = _ParseJob(options.job)
  try:
    setup_cls.CheckJob(options.job, trains=dataset is None, xla=options.xla)
  except distribution.SetupError as e:
    raise UserError(str(e)) from None
  params = run_params.LoadParams(options, dataset or 'Train')
  if kind in ('trainer', 'trainer_and_evaler'):
    inspect_lib.CheckParamsAlone(params)
    setup_cls.CheckParams(params)
  return params


# --- jobs ---------------------------------------------------------------------


_ParseJob = command_line.ParseJob


class _TrainerJob:
  """trainer / trainer_and_evaler: the train program (+ in-process eval).

  The train program is the distribution option's (`setup.TrainProgram`:
  e.g. one copy of the task per local replica, or with parameter servers
  the chief's program with the one task on them); the in-process eval and
  the final decode run on the chief, on replica 0's devices, with replica
  0's (EMA) weights.
  """

  def __init__(self, options, params, setup, with_eval, watcher):
    self.lock = None   # The logdir's writer lock (_BuildJob), released by Run.
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


class _ServerJob:
  """A task that only serves (`setup.serves`: a 'worker' or 'ps' task of
  parameter-server training), until the run is finished (as the trainer's
  'nothing to do' check says) and the chief has exited."""

  def __init__(self, options, params, setup, kind, watcher):
    self._finished = lambda: _Finished(options, params, kind, '')
    self._setup = setup
    self._watcher = watcher

  def Run(self):
    self._setup.Serve(self._finished,
                      should_stop=lambda: self._watcher.requested)


def _ImplementsDecode(task_cls):
  return task_cls.Decode is not base_model.BaseTask.Decode


def _Finished(options, params, kind, sub):
  """The one-line message of a job that already finished, or None.

  Reads only the logdir's state files: trainer jobs, the latest checkpoint
  (and for trainer_and_evaler the final decode's output, when Dev is
  decoded); evaler/decoder jobs, their `last_step.txt` and the trainer's
  final mark. A finished trainer writes the final mark if it is missing
  (max_steps lowered below the latest checkpoint), so evalers stop there.
  """
  max_steps = params.task.train.max_steps
  if kind in ('trainer', 'trainer_and_evaler'):
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


class _CheckpointJob:
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
  if kind not in ('trainer', 'trainer_and_evaler') or not setup.is_chief:
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


def _BuildJob(options, params, setup, watcher):
  """The job of `options` with its `params` (CheckBeforeDevices: they and
  the job are checked already, on every task), or a message (str) when it
  already finished.

  Every check runs before anything is written: the params, the model built
  without weights (memory, the logdir's checkpoints), whether the logdir
  can be written, then the job's programs (the learner, the input), which
  write nothing when built. Only then the writer lock (which makes a fresh
  logdir) and params.txt.
  """
  kind, dataset = _ParseJob(options.job)
  if not options.logdir:
    raise UserError('--logdir is required for --mode=sync.')
  sub = '' if dataset is None else (
      f"{'eval' if kind == 'evaler' else kind}_{dataset.lower()}")
  if setup.serves:
    logging.info('%s', setup)
    return _ServerJob(options, params, setup, kind, watcher)
  finished = _Finished(options, params, kind, sub)
  if finished:
    return finished
  logging.info('%s', setup)
  start = time.perf_counter()
  trains = kind in ('trainer', 'trainer_and_evaler')
  verdict = _CheckMemory(options, params, setup) if trains else None
  _CheckWritable(options.logdir, sub)
  if trains:
    job = _TrainerJob(options, params, setup,
                      with_eval=kind == 'trainer_and_evaler', watcher=watcher)
  else:
    job = _CheckpointJob(options, params, setup, kind, dataset, watcher)
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


def _RunMode(options, setup):
  """A mode other than sync (mode_registry): its Run, with its flags."""
  logging.info('%s', setup)
  mode = mode_registry.Get(options.mode)
  mode.Run(mode_registry.Context(
      options, mode_registry.FlagsOf(type(mode), options), setup))


def _Fail(code, message):
  sys.stderr.write(f'Error: {message}\n')
  sys.stderr.flush()
  return code


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


def _SetupError(e):
  """The exit code of an error while setting up (a UserError, or params
  validation and input files: ValueError, InputError), its line printed."""
  if isinstance(e, (UserError, distribution.SetupError)):
    return _Fail(EXIT_USER_ERROR, str(e))
  kind = ('Input' if isinstance(e, base_input_generator.InputError) else
          'Bad params')
  return _Fail(EXIT_USER_ERROR, f'{kind}: {e}')


def _Done(options, setup):
  """EXIT_OK, once the job's other hosts finished too where it has some
  (the distribution option's `FinishTogether`)."""
  try:
    setup.FinishTogether()
  except tf.errors.OpError as e:
    return _Fail(EXIT_PEER_FAILED, _PeerFailed(options, setup, e))
  return EXIT_OK


def Main(options):
  """Runs the trainer for `options`; returns the exit code."""
  ConfigureLogging()
  try:
    command_line.Check(options)   # Every flag, before any TF op.
    setup_cls, flags = ChooseDevices(options)
    params = CheckBeforeDevices(options, setup_cls)   # On every task.
    setup = CreateDevices(setup_cls, flags)
    if options.mode != 'sync':
      with setup.cluster:
        _RunMode(options, setup)
      return EXIT_OK
  except (UserError, ValueError) as e:
    return _SetupError(e)
  except mode_registry.Stopped as e:
    return _Fail(EXIT_STOPPED, str(e))
  except distribution.Stopped as e:   # A signal while waiting for peers.
    logging.warning('%s', e)
    return EXIT_OK
  # From here on SIGTERM/SIGINT stop the job cleanly (handlers restored on
  # return); the hosts of a multi-host job agree on the step to stop at
  # (the distribution option's agreement).
  agreement = setup.Agreement()
  with setup.cluster, graph_optimizer.Scope(options.graph_optimizer), \
      preemption.Watcher(agreement=agreement) as watcher:
    try:
      job = _BuildJob(options, params, setup, watcher)
    except (UserError, ValueError) as e:
      return _SetupError(e)
    if isinstance(job, str):
      logging.info('%s', job)
      job = None
    try:
      if job is not None:
        job.Run()
    except programs.Preempted as e:
      logging.info('%s', e)
    except programs.TrainingStopped as e:
      return _Fail(EXIT_TRAINING_STOPPED, str(e))
    except xla_step.StaticShapeError as e:  # Checked before the first step.
      return _Fail(EXIT_USER_ERROR, str(e))
    except cost.ContractError as e:   # A unit's shapes, at the first trace.
      return _Fail(EXIT_USER_ERROR, f'Bad params: {e}')
    except checkpointer.UnreadableError as e:
      return _Fail(EXIT_USER_ERROR, str(e))
    except checkpointer.SaveError as e:
      return _Fail(EXIT_SAVE_FAILED, str(e))
    except _PEER_ERRORS as e:
      message = _PeerFailed(options, setup, e)
      if message is None:
        raise
      return _Fail(EXIT_PEER_FAILED, message)
  # Outside the watcher: a signal now ends a host that has done its part.
  return _Done(options, setup)
