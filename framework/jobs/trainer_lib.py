"""What `trainer.py` runs: devices, params, the job, and exit codes.

`Main(options)` takes the parsed command line as a `TrainerOptions` and
returns the process exit code:

  0  done; also a trainer stopped by SIGTERM or SIGINT after checkpointing
     the step it was in (one log line says so; framework/train/preemption.py),
     and an evaler or decoder stopped by one;
  2  a user error: unknown --model, a bad override key or value, bad params,
     missing or empty input files, an unknown --job, a logdir that cannot
     be written, checkpoints none of which can be read, a logdir another
     trainer is writing (framework/train/logdir_lock.py), a logdir whose
     checkpoints hold another model (framework/train/checkpoint_match.py),
     a training step whose memory estimate exceeds the device's or host's
     memory (framework/jobs/memory_check.py). One readable message on
     stderr, no traceback; the last three leave the logdir as it was;
  3  training stopped: too many consecutive skipped steps or non-finite
     weights (the message names the last good checkpoint);
  4  the run cannot go on, and nothing is lost: a checkpoint could not be
     written (disk full, quota, permission; the message names the path and
     the OS error, and the previous checkpoint stays the latest), or a
     peer host of a multi-host job failed; rerun the same command (on
     every host) to resume from the latest checkpoint; with parameter
     servers, a task the chief needs failed: restart it, then the chief.
A second SIGTERM/SIGINT ends the process at once, killed by that signal
(143 or 130 in a shell).

The set-up runs in a fixed order: devices, the cluster and the strategy
first (framework/distribute/distribution.py; TensorFlow allows logical devices
and MultiWorkerMirroredStrategy only before any op runs), then the params
(registry, file override, text override, --max_steps), the logdir's writer
lock (trainer jobs on the chief: one writer per logdir), the checks that
read only (the memory estimate, the logdir's checkpoints against the
model, both from the model built without weights), then `params.txt` (a
different one already there is kept as params.txt.<UTC time>:
framework/jobs/params_file.py), one copy of the task per local replica and
the job's programs; any user error up to there exits with 2. Then the
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
from cadence.framework.distribute import distribution
from cadence.framework.jobs import command_line
from cadence.framework.jobs import export
from cadence.framework.jobs import graph_optimizer
from cadence.framework.jobs import inspect_lib
from cadence.framework.jobs import inspect_pipeline
from cadence.framework.jobs import memory_check
from cadence.framework.jobs import params_file
from cadence.framework.jobs import planner
from cadence.framework import model_registry
from cadence.framework.train import checkpoint_files
from cadence.framework.train import checkpoint_match
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

# What a multi-host step raises when a peer host dies or drops off.
_PEER_ERRORS = (tf.errors.UnavailableError, tf.errors.AbortedError,
                tf.errors.CancelledError, tf.errors.DeadlineExceededError)

MODES = command_line.MODES
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
  worker_gpus: int = 0
  steps_per_loop: int = 0
  cluster_spec: str = ''
  task_type: str = ''
  task_index: int = 0
  peak_tflops: float = 0.0
  device_memory_gib: float = 0.0
  eval_timeout_s: float = 0.0
  start_time: float = None
  tpu: str = ''
  tpu_zone: str = ''
  tpu_project: str = ''
  xla: bool = False
  graph_optimizer: bool = True    # Grappler on the job's steps.
  export_dir: str = ''            # --mode=export (framework/jobs/export.py)
  checkpoint: str = ''
  export_batch_size: int = None
  export_max_len: int = None
  plan: command_line.PlanOptions = dataclasses.field(   # --mode=plan
      default_factory=command_line.PlanOptions)


# --- params -------------------------------------------------------------------


def _Message(e):
  return e.args[0] if isinstance(e, KeyError) and e.args else str(e)


_PARAMS_ERRORS = (AttributeError, KeyError, ValueError, TypeError, IndexError)


ParseOverride = command_line.ParseOverride


def _SetPairs(params, pairs, source):
  """Sets 'key=value' pairs; a value that is not a Python literal (e.g. a
  bare path) is taken as a string when the param holds a string or None."""
  for key, value in pairs:
    try:
      params.FromText(f'{key} : {value}')
      continue
    except _PARAMS_ERRORS as e:
      error = e
    if 'cannot parse the value' in str(error):
      try:
        current = params.Get(key)
      except _PARAMS_ERRORS as e:
        error = e
      else:
        if isinstance(current, str) or current is None:
          params.Set(**{key: value})
          continue
    message = _Message(error)
    message = message[len('line 1: '):] if message.startswith(
        'line 1: ') else message
    raise UserError(f'{source}: {message}') from None


def _SetText(params, text, source):
  try:
    params.FromText(text)
  except _PARAMS_ERRORS as e:
    raise UserError(f'{source}: {_Message(e)}') from None


def LoadParams(options, dataset):
  """The model params of `options.model` for `dataset`, overrides applied."""
  if not options.model:
    raise UserError('--model is required: a registered experiment key, e.g. '
                    'synthetic.linear_regression.RegressionTiny.')
  try:
    params = model_registry.GetParams(options.model, dataset)
  except KeyError as e:
    raise UserError(_Message(e)) from None
  if options.model_params_file_override:
    path = options.model_params_file_override
    if not tf.io.gfile.exists(path):
      raise UserError(f'--model_params_file_override: no file {path!r}.')
    with tf.io.gfile.GFile(path, 'rb') as f:
      data = f.read()
    _SetText(params, command_line.ParamsFileText(path, data),
             f'--model_params_file_override {path}')
  if options.model_params_override:
    pairs = ParseOverride(options.model_params_override)
    if pairs is None:
      _SetText(params, options.model_params_override,
               '--model_params_override')
    else:
      _SetPairs(params, pairs, '--model_params_override')
  if options.max_steps is not None:
    params.task.train.max_steps = options.max_steps
  return params


def ParamsText(params):
  """`params.ToText()`, or the lenient `str(params)` when a value has no
  text form (e.g. a lambda)."""
  try:
    return params.ToText()
  except ValueError:
    return str(params)


def WriteParams(params, path):
  """Writes the params text to `path`; returns the text. A different file
  already there is kept (params_file.Write), in one log line."""
  text = ParamsText(params)
  tf.io.gfile.makedirs(os.path.dirname(path))
  kept = params_file.Write(path, text)
  if kept:
    logging.warning('%s', kept)
  return text


def InferenceParams(params):
  """A copy of the model params whose task runs with is_inference=True."""
  params = params.Copy()
  params.task.is_inference = True
  return params


# --- logs ---------------------------------------------------------------------


_TF_DIR = os.path.dirname(os.path.abspath(tf.__file__)) + os.sep


class TensorFlowInfoFilter(py_logging.Filter):
  """Drops TensorFlow's own INFO and DEBUG records; keeps its warnings.

  TensorFlow's records come through its 'tensorflow' logger and, from
  modules that use absl logging directly, through absl's logger: e.g. the
  checkpoint saver's 'Sharding callback duration: 117 microseconds' at
  every save. A record is TensorFlow's when its logger is 'tensorflow' or
  its source file lies in the tensorflow package. With absl's
  --verbosity=1 (debug) every record passes. One warning goes too: that
  the checkpoint saver's function retraces, which TensorFlow does on
  purpose at every save of variables spread over several tasks (parameter
  servers; tensorflow/python/checkpoint/functional_saver.py).

  Example:
    logging.get_absl_logger().addFilter(TensorFlowInfoFilter())
  """

  def filter(self, record):
    if logging.get_verbosity() >= logging.DEBUG:
      return True
    if record.levelno >= py_logging.WARNING:
      message = record.getMessage()
      return not ('tf_function_save' in message and 'retracing' in message)
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
  """--worker_split_size, else the experiment's WORKER_SPLIT_SIZE, else 1."""
  if options.worker_split_size is not None:
    return options.worker_split_size
  if not options.model:
    return 1
  try:
    cls = model_registry.GetClass(options.model)
  except KeyError as e:
    raise UserError(_Message(e)) from None
  return getattr(cls, 'WORKER_SPLIT_SIZE', 1)


def ConfigureDevices(options):
  """Sets up devices and the strategy (before any TF op); returns the
  `distribution.Setup`."""
  try:
    tf_config = distribution.ReadTfConfig(
        options.cluster_spec, options.task_type, options.task_index)
    return distribution.Create(
        run_locally=options.run_locally,
        worker_replicas=options.worker_replicas,
        worker_split_size=WorkerSplitSize(options),
        worker_gpus=options.worker_gpus, tf_config=tf_config,
        tpu=options.tpu, tpu_zone=options.tpu_zone,
        tpu_project=options.tpu_project)
  except distribution.SetupError as e:
    raise UserError(str(e)) from None


# --- jobs ---------------------------------------------------------------------


_ParseJob = command_line.ParseJob


def _HasDataset(options, dataset):
  return hasattr(model_registry.GetClass(options.model), dataset)


class _TrainerJob:
  """trainer / trainer_and_evaler: the train program (+ in-process eval).

  The train program is the distribution option's (`setup.TrainProgram`:
  e.g. one copy of the task per local replica, or with parameter servers
  the chief's program with the one task on them); the in-process eval and
  the final decode run on the chief, on replica 0's devices, with replica
  0's (EMA) weights.
  """

  def __init__(self, options, params, setup, with_eval, watcher, lock=None):
    self._lock = lock   # The logdir's writer lock, released by Run.
    on_checkpoint = []
    self._decode = None
    with_eval = with_eval and setup.is_chief
    if with_eval and _HasDataset(options, 'Dev'):
      dev = InferenceParams(LoadParams(options, 'Dev'))
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
    _LogBuilt(self._program.tasks, start)

  def Run(self):
    try:
      step = self._program.Run()
      if self._decode is not None:
        logging.info('Decoding Dev with the final weights (step %d)...',
                     step)
        self._decode.Run(step, self._program.EmaTheta())
    finally:
      if self._lock is not None:
        self._lock.Release()


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
    if (kind == 'trainer_and_evaler' and _HasDataset(options, 'Dev') and
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
  if not tf.io.gfile.exists(state):
    return None
  with tf.io.gfile.GFile(state) as f:
    text = f.read().strip()
  mark = checkpoint_files.ReadFinalMark(os.path.join(options.logdir, 'train'))
  final = max_steps if mark is None or mark['step'] is None else min(
      max_steps, mark['step'])
  if not text or int(text) < final:
    return None
  why = (f'max_steps {max_steps}' if final == max_steps else
         f"the trainer's final checkpoint, {mark['reason']}")
  return (f'The {options.job} job is finished: it handled every checkpoint '
          f'up to step {text} ({why}, {state}); nothing to do.')


class _CheckpointJob:
  """evaler_<dataset> / decoder_<dataset>: a program per new checkpoint."""

  def __init__(self, options, params, setup, kind, dataset, watcher):
    self._watcher = watcher
    self._timeout = options.eval_timeout_s or None
    with setup.cluster.WithReplica(0):
      task = InferenceParams(params).Instantiate().task
    self._state = eval_programs.CheckpointState(
        task, os.path.join(options.logdir, 'train'))
    program_cls = (eval_programs.EvalProgram if kind == 'evaler' else
                   eval_programs.DecodeProgram)
    self._program = program_cls(task, dataset, options.logdir)
    self._train_dir = os.path.join(options.logdir, 'train')
    self._max_steps = params.task.train.max_steps

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
  """Raises UserError unless the job can write its folders: `logdir/sub`
  (created: params.txt goes there next) and an existing `logdir/train`."""
  folders = [os.path.join(logdir, sub) if sub else logdir]
  train_dir = os.path.join(logdir, 'train')
  if not sub and tf.io.gfile.exists(train_dir):
    folders.append(train_dir)
  for folder in folders:
    probe = os.path.join(folder, f'.write_test.{os.getpid()}')
    try:
      tf.io.gfile.makedirs(folder)
      with tf.io.gfile.GFile(probe, 'w') as f:
        f.write('ok')
      tf.io.gfile.remove(probe)
    except (tf.errors.OpError, OSError) as e:
      raise UserError(f'--logdir: cannot write in {folder}: '
                      f'{checkpoint_files.ErrorLine(e)}.') from None


def _WriterLock(options, params, setup, kind):
  """The logdir's writer lock (logdir_lock) of a trainer job on the chief,
  the one host that writes; None for readers (evaler, decoder), the other
  hosts, and a finished run in a logdir it cannot write."""
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
    if _Finished(options, params, kind, ''):
      return None   # Nothing to write; _BuildJob says it is finished.
    _CheckWritable(options.logdir, '')   # Says why, as for other jobs.
    raise UserError(f'--logdir: cannot write the lock file in '
                    f'{options.logdir}: {e}.') from None


def _OtherModel(options, params):
  """How the logdir's params.txt (the params its checkpoints were trained
  with) differs from this run's: the experiment, else the task's first
  differing keys; '' when it cannot say."""
  text = params_file.Read(os.path.join(options.logdir, 'params.txt'))
  if text is None:
    return ''
  ours = ParamsText(params)
  diffs = params_file.Differences(text, ours)
  if any(d[0] in ('name', 'task.cls') for d in diffs):
    def _Model(pairs):   # "'lm' (LanguageModel)"
      cls = pairs.get('task.cls', '').rpartition('.')[2].rstrip("')")
      return f"{pairs.get('name', '?')} ({cls or '?'})"
    return (f' Its params.txt is of the model '
            f'{_Model(params_file.Pairs(text))}, this run\'s is '
            f'{_Model(params_file.Pairs(ours))}.')
  model = [d for d in diffs if d[0].startswith('task.') and
           not d[0].startswith(('task.train.', 'task.eval.',
                                'task.is_inference'))]
  if model:
    return (" Its params.txt differs from this run's in " +
            params_file.DescribeDifferences(model) + '.')
  return ''


def _CheckCheckpointFits(options, params, task, paths):
  """Raises UserError unless the newest readable of `paths` (checkpoints of
  logdir/train) holds the model variables of `task` (same paths, shapes
  and dtypes). A damaged checkpoint is left to the restore, which says
  so."""
  for path in reversed(paths):
    try:
      saved = checkpoint_match.SavedVariables(path)
      break
    except checkpoint_files.READ_ERRORS:
      continue
  else:
    return
  mismatch = checkpoint_match.Mismatch(saved, checkpoint_match.ModelVariables(
      checkpointer.TaskVariables(task)))
  if mismatch:
    raise UserError(
        f'--logdir {options.logdir} holds checkpoints of another model: '
        f'{path} does not fit --model={options.model}: {mismatch}.'
        f'{_OtherModel(options, params)} Use a new --logdir, or the model '
        'and overrides that wrote it; nothing was changed.')


def _CheckBeforeWriting(options, params, setup, kind):
  """The checks that read only, before the job writes anything: the memory
  estimate of a training step (trainer jobs; memory_check) and the
  logdir's checkpoints against the model. Both need the model's
  variables: it is built without weights (inspect_lib.BuildSymbolically).

  Raises:
    UserError: the step does not fit, or the checkpoints hold another
      model.
  """
  start = time.perf_counter()
  trainer = kind in ('trainer', 'trainer_and_evaler')
  paths = checkpointer.ListCheckpoints(
      os.path.join(options.logdir, 'train'), when_missing=True)
  if not trainer and not paths:
    return
  model, _ = inspect_lib.BuildSymbolically(
      params if trainer else InferenceParams(params))
  verdict = None
  if trainer and (options.device_memory_gib or setup.runs_steps):
    device = tf.DeviceSpec.from_string(setup.cluster.devices[0])
    verdict = memory_check.Check(
        model.task, device.device_type or 'CPU', setup.num_local_replicas,
        options.device_memory_gib)
  if verdict is not None and not verdict.fits:
    batch = getattr(params.input, 'batch_size', None)
    batch = f'input.batch_size ({batch}), ' if batch else ''
    raise UserError(
        f'--model={options.model}: a training step does not fit in memory: '
        f'{verdict.text}. Lower {batch}the model size or the micro-batch '
        'size (more micro-batches, remat); --mode=inspect_model prints the '
        'estimate per stage.')
  _CheckCheckpointFits(options, params, model.task, paths)
  checked = ([f'memory {verdict.text}'] if verdict else []) + (
      [f'{os.path.basename(paths[-1])} holds this model'] if paths else [])
  if checked:
    logging.info('Checked before writing (%.1f s): %s.',
                 time.perf_counter() - start, '; '.join(checked))


def _BuildJob(options, setup, watcher):
  """The job of `options`, or a message (str) when it already finished."""
  kind, dataset = _ParseJob(options.job)
  params = LoadParams(options, dataset or 'Train')
  if not options.logdir:
    raise UserError('--logdir is required for --mode=sync.')
  sub = '' if dataset is None else (
      f"{'eval' if kind == 'evaler' else kind}_{dataset.lower()}")
  setup.CheckJob(options.job, trains=dataset is None, xla=options.xla)
  if setup.serves:
    logging.info('%s', setup)
    return _ServerJob(options, params, setup, kind, watcher)
  lock = _WriterLock(options, params, setup, kind)
  try:
    job = _BuildLocalJob(options, params, setup, kind, dataset, sub,
                         watcher, lock)
  except BaseException:
    if lock is not None:
      lock.Release()
    raise
  if isinstance(job, str) and lock is not None:
    lock.Release()
  return job


def _BuildLocalJob(options, params, setup, kind, dataset, sub, watcher,
                   lock):
  """_BuildJob's job past the writer lock (`lock`, or None), which the
  trainer job releases when it ends."""
  finished = _Finished(options, params, kind, sub)
  if finished:
    return finished
  logging.info('%s', setup)
  _CheckBeforeWriting(options, params, setup, kind)
  _CheckWritable(options.logdir, sub)
  path = os.path.join(options.logdir, sub, 'params.txt')
  if setup.is_chief:
    try:
      WriteParams(params, path)
    except (tf.errors.OpError, OSError) as e:
      raise UserError(f'--logdir: cannot write {path}: '
                      f'{checkpoint_files.ErrorLine(e)}.') from None
    logging.info('Model %s, job %s; params written to %s.', options.model,
                 options.job, path)
  if kind in ('trainer', 'trainer_and_evaler'):
    return _TrainerJob(options, params, setup,
                       with_eval=kind == 'trainer_and_evaler', watcher=watcher,
                       lock=lock)
  return _CheckpointJob(options, params, setup, kind, dataset, watcher)


def _InspectPipeline(options):
  """Profiles one training step and prints (and writes) its timeline."""
  params = LoadParams(options, 'Train')
  try:
    timeline, memory = inspect_pipeline.InspectPipeline(
        params, options.logdir or None)
  except inspect_pipeline.NoPipelineError as e:
    raise UserError(f'--mode=inspect_pipeline: {e}') from None
  sys.stdout.write(timeline.Report() + memory)
  if options.logdir:
    sys.stdout.write(f'Chart and summary: '
                     f'{os.path.join(options.logdir, "inspect_pipeline")}\n')
  sys.stdout.flush()


def _Export(options):
  """--mode=export: the SavedModel of a checkpoint (framework/jobs/export.py).
  Reads the params of Dev (the decoder's data) if the experiment has it."""
  params = LoadParams(options, 'Train')
  if _HasDataset(options, 'Dev'):
    params = LoadParams(options, 'Dev')
  try:
    path, step = export.Export(
        params, options.logdir, options.export_dir, options.checkpoint,
        options.export_batch_size, options.export_max_len)
  except export.ExportError as e:
    raise UserError(str(e)) from None
  sys.stdout.write(f'Exported step {step} to {path}\n')


def _Inspect(options, setup):
  logging.info('%s', setup)
  if options.mode == 'export':
    return _Export(options)
  if options.mode == 'inspect_pipeline':
    return _InspectPipeline(options)
  if options.mode == 'plan':   # framework/jobs/planner.py
    return planner.Run(options, LoadParams(options, 'Train'))
  params = LoadParams(options, 'Train')
  text = ParamsText(params) if not options.logdir else WriteParams(
      params, os.path.join(options.logdir, 'params.txt'))
  if options.mode == 'inspect_params':
    sys.stdout.write(text)
  else:
    sys.stdout.write(inspect_lib.ModelReport(params,
                                             options.device_memory_gib))
  sys.stdout.flush()


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
    setup = ConfigureDevices(options)
    if options.mode != 'sync':
      with setup.cluster:
        _Inspect(options, setup)
      return EXIT_OK
  except (UserError, ValueError) as e:
    return _SetupError(e)
  # From here on SIGTERM/SIGINT stop the job cleanly (handlers restored on
  # return); the hosts of a multi-host job agree on the step to stop at
  # (the distribution option's agreement).
  agreement = setup.Agreement()
  with setup.cluster, graph_optimizer.Scope(options.graph_optimizer), \
      preemption.Watcher(agreement=agreement) as watcher:
    try:
      job = _BuildJob(options, setup, watcher)
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
