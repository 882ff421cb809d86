"""What `trainer.py` runs: devices, params, the job, and exit codes.

`Main(options)` takes the parsed command line as a `TrainerOptions` and
returns the process exit code:

  0  done; also a trainer stopped by SIGTERM or SIGINT after checkpointing
     the step it was in (one log line says so; framework/train/preemption.py),
     and an evaler or decoder stopped by one;
  2  a user error: unknown --model, a bad override key or value, bad params,
     missing or empty input files, an unknown --job, a logdir that cannot
     be written, checkpoints none of which can be read. One readable
     message on stderr, no traceback;
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
(registry, file override, text override, --max_steps), then `params.txt`,
one copy of the task per local replica and the job's programs; any user
error up to there exits with 2. Then the
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
import difflib
import logging as py_logging
import os
import sys
import time

from absl import logging
import tensorflow as tf

from cadence.framework import base_input_generator
from cadence.framework import base_model
from cadence.framework.distribute import coordinated_exit
from cadence.framework.distribute import distribution
from cadence.framework.distribute import ps_programs
from cadence.framework.distribute import tpu_programs
from cadence.framework.jobs import inspect_lib
from cadence.framework.jobs import inspect_pipeline
from cadence.framework import model_registry
from cadence.framework.train import checkpoint_files
from cadence.framework.train import checkpointer
from cadence.framework.train import eval_programs
from cadence.framework.train import preemption
from cadence.framework.train import programs
from cadence.framework.train import replicas
from cadence.framework.train import xla_step

EXIT_OK = 0
EXIT_USER_ERROR = 2
EXIT_TRAINING_STOPPED = 3
# Exit code 4: a failed save or a failed peer host (see the docstring).
EXIT_SAVE_FAILED = 4
EXIT_PEER_FAILED = 4

# What a multi-host step raises when a peer host dies or drops off.
_PEER_ERRORS = (tf.errors.UnavailableError, tf.errors.AbortedError,
                tf.errors.CancelledError, tf.errors.DeadlineExceededError)

MODES = ('sync', 'inspect_params', 'inspect_model', 'inspect_pipeline')
_JOB_FORMS = ('trainer', 'trainer_and_evaler', 'evaler_<dataset>',
              'decoder_<dataset>')


class UserError(Exception):
  """A mistake in the command line or the params; exits with code 2."""


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


# --- params -------------------------------------------------------------------


def _Message(e):
  return e.args[0] if isinstance(e, KeyError) and e.args else str(e)


_PARAMS_ERRORS = (AttributeError, KeyError, ValueError, TypeError, IndexError)


def ParseOverride(text):
  """`--model_params_override` as a list of (key, value text) pairs, or None.

  Returns None for Params text ('key : value' lines, as in params.txt), and
  the pairs of ';'-separated 'key=value' items otherwise.
  """
  if ' : ' in text or '\n' in text:
    return None
  pairs = []
  for item in [s.strip() for s in text.split(';') if s.strip()]:
    key, sep, value = item.partition('=')
    if not sep or not key.strip():
      raise UserError(f"--model_params_override: {item!r} is not "
                      "'key=value' (items are separated by ';').")
    pairs.append((key.strip(), value.strip()))
  return pairs


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
    with tf.io.gfile.GFile(path) as f:
      _SetText(params, f.read(), f'--model_params_file_override {path}')
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
  """Writes the params text to `path`; returns the text."""
  text = ParamsText(params)
  tf.io.gfile.makedirs(os.path.dirname(path))
  with tf.io.gfile.GFile(path, 'w') as f:
    f.write(text)
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


def _ParseJob(job):
  """'evaler_dev' -> ('evaler', 'Dev'); 'trainer' -> ('trainer', None)."""
  if job in ('trainer', 'trainer_and_evaler'):
    return job, None
  kind, _, dataset = job.partition('_')
  names = {d.lower(): d for d in model_registry.DATASETS}
  if kind in ('evaler', 'decoder') and dataset.lower() in names:
    return kind, names[dataset.lower()]
  known = ['trainer', 'trainer_and_evaler'] + [
      f'{k}_{d.lower()}' for k in ('evaler', 'decoder') for d in names]
  close = difflib.get_close_matches(job, known, n=2, cutoff=0.6)
  hint = f' Did you mean {" or ".join(map(repr, close))}?' if close else ''
  raise UserError(f'--job={job!r} is not one of {", ".join(_JOB_FORMS)} '
                  f'(datasets: {", ".join(model_registry.DATASETS)}).{hint}')


def _HasDataset(options, dataset):
  return hasattr(model_registry.GetClass(options.model), dataset)


class _TrainerJob:
  """trainer / trainer_and_evaler: the train program (+ in-process eval).

  One copy of the task per local replica (replicas.BuildReplicas); the
  in-process eval and the final decode run on the chief, on replica 0's
  devices, with replica 0's (EMA) weights. With parameter servers the
  chief's program builds the one task on them (ps_programs.PsTrainProgram).
  """

  def __init__(self, options, params, setup, with_eval, watcher):
    start = time.perf_counter()
    tasks = None
    if options.xla and setup.num_ps:
      raise UserError('--xla with parameter servers: the coordinator '
                      'dispatches uncompiled steps; drop --xla or the "ps" '
                      'job.')
    if not setup.num_ps and not setup.tpu:
      tasks = replicas.BuildReplicas(params, setup.cluster)
      _LogBuilt(tasks, start, options.device_memory_gib)
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
    common = dict(peak_flops=peak, on_checkpoint=on_checkpoint,
                  start_time=options.start_time, cluster=setup.cluster,
                  steps_per_loop=options.steps_per_loop, watcher=watcher)
    if setup.tpu:
      self._program = tpu_programs.TpuTrainProgram(
          params, options.logdir, setup.strategy, xla=options.xla, **common)
      _LogBuilt([self._program.task], start, options.device_memory_gib)
    elif tasks is None:
      self._program = ps_programs.PsTrainProgram(
          params, options.logdir, setup.strategy,
          num_workers=setup.num_workers, num_ps=setup.num_ps, **common)
      _LogBuilt([self._program.task], start, options.device_memory_gib)
    else:
      self._program = programs.TrainProgram(
          tasks, options.logdir, setup.strategy,
          num_workers=setup.num_workers, worker_index=setup.worker_index,
          xla=options.xla, **common)

  def Run(self):
    step = self._program.Run()
    if self._decode is not None:
      logging.info('Decoding Dev with the final weights (step %d)...', step)
      self._decode.Run(step, self._program.EmaTheta())


def _LogBuilt(tasks, start, device_memory_gib):
  variables = checkpointer.TaskVariables(tasks[0]).values()
  logging.info('Built the model: %d variables, %s parameters (%.1f s)%s.',
               len(variables),
               f'{sum(v.shape.num_elements() for v in variables):,}',
               time.perf_counter() - start,
               f', one copy per replica x {len(tasks)}' if len(tasks) > 1
               else '')


class _ServerJob:
  """A 'worker' or 'ps' task of parameter-server training: serves the
  chief's coordinator until the run is finished (as the trainer's
  'nothing to do' check says) and the chief has exited."""

  def __init__(self, options, params, setup, kind, watcher):
    self._finished = lambda: _Finished(options, params, kind, '')
    self._setup = setup
    self._watcher = watcher

  def Run(self):
    ps_programs.Serve(self._setup, self._finished,
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


def _BuildJob(options, setup, watcher):
  """The job of `options`, or a message (str) when it already finished."""
  kind, dataset = _ParseJob(options.job)
  params = LoadParams(options, dataset or 'Train')
  if not options.logdir:
    raise UserError('--logdir is required for --mode=sync.')
  sub = '' if dataset is None else (
      f"{'eval' if kind == 'evaler' else kind}_{dataset.lower()}")
  if setup.num_ps and dataset is not None:
    raise UserError(
        f'--job={options.job} with parameter servers (TF_CONFIG with a "ps" '
        'job): the cluster runs --job=trainer or trainer_and_evaler; run '
        'evaler and decoder jobs without TF_CONFIG.')
  if setup.server is not None:
    logging.info('%s', setup)
    return _ServerJob(options, params, setup, kind, watcher)
  finished = _Finished(options, params, kind, sub)
  if finished:
    return finished
  _CheckWritable(options.logdir, sub)
  logging.info('%s', setup)
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
                       with_eval=kind == 'trainer_and_evaler', watcher=watcher)
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


def _Inspect(options, setup):
  logging.info('%s', setup)
  if options.mode == 'inspect_pipeline':
    return _InspectPipeline(options)
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
  peer failed."""
  lines = [l.strip() for l in str(e).splitlines() if l.strip() and
           not l.strip().startswith(('Graph execution error', 'Detected',
                                     'File ', 'Traceback', '[['))]
  first = lines[0] if lines else type(e).__name__
  latest = checkpointer.ListCheckpoints(os.path.join(options.logdir,
                                                     'train'))
  latest = latest[-1] if latest else 'none'
  if setup.num_ps:
    return ('a task of this parameter-server cluster failed or left '
            f'({type(e).__name__}: {first[:200]}); the chief stops, the other '
            f'tasks keep serving. The latest checkpoint is {latest}: restart '
            'the failed task, then the chief, to resume from it.')
  return (f'a peer host of this {setup.num_workers}-host job failed or left '
          f'({type(e).__name__}: {first[:200]}); this host stops. The latest '
          f'checkpoint is {latest}: rerun the same command on every host to '
          'resume from it.')


def _SetupError(e):
  """The exit code of an error while setting up (a UserError, or params
  validation and input files: ValueError, InputError), its line printed."""
  if isinstance(e, UserError):
    return _Fail(EXIT_USER_ERROR, str(e))
  kind = ('Input' if isinstance(e, base_input_generator.InputError) else
          'Bad params')
  return _Fail(EXIT_USER_ERROR, f'{kind}: {e}')


def _Done(options, setup):
  """EXIT_OK; on several hosts (MultiWorkerMirroredStrategy), once every
  host finished too, and on host 0 once the others left
  (framework/distribute/coordinated_exit.py)."""
  if setup.num_workers > 1 and not setup.num_ps:
    logging.info('Done; waiting for the other host(s) of this %d-host job '
                 'to finish too before exiting.', setup.num_workers)
    try:
      coordinated_exit.FinishTogether(setup)
    except tf.errors.OpError as e:
      return _Fail(EXIT_PEER_FAILED, _PeerFailed(options, setup, e))
  return EXIT_OK


def Main(options):
  """Runs the trainer for `options`; returns the exit code."""
  ConfigureLogging()
  try:
    setup = ConfigureDevices(options)
    if options.mode not in MODES:
      raise UserError(f'--mode={options.mode!r} is not one of '
                      f'{", ".join(MODES)}.')
    memory = options.device_memory_gib
    if isinstance(memory, bool) or not isinstance(memory, (int, float)) or (
        not memory >= 0):
      raise UserError(f'--device_memory_gib={memory!r} must be a number >= '
                      '0 (GiB of memory per device; 0: no check).')
    if options.mode != 'sync':
      with setup.cluster:
        _Inspect(options, setup)
      return EXIT_OK
  except (UserError, ValueError) as e:
    return _SetupError(e)
  # From here on SIGTERM/SIGINT stop the job cleanly (handlers restored on
  # return); the hosts of a multi-host job agree on the step to stop at.
  # (Parameter-server workers do not stop by themselves: the chief does.)
  agreement = (preemption.AllReduceAgreement(setup.strategy)
               if setup.num_workers > 1 and not setup.num_ps else None)
  with setup.cluster, preemption.Watcher(agreement=agreement) as watcher:
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
      if setup.num_workers == 1 and not setup.num_ps:
        raise
      return _Fail(EXIT_PEER_FAILED, _PeerFailed(options, setup, e))
  # Outside the watcher: a signal now ends a host that has done its part.
  return _Done(options, setup)
