"""What `trainer.py` runs: logs, devices, the mode, and exit codes.

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

The set-up runs in a fixed order, the same for every mode
(mode_registry.py): every flag checked (command_line.Check: the common
flags, the distribution options', the mode's own; no TensorFlow op); the
distribution option chosen (`ChooseDevices`, not created); what every
task of the job refuses before its option is created (the mode's
CheckBeforeDevices, no TensorFlow op: for sync, the job against the
option and a trainer job's params, so the tasks of a cluster that only
serve refuse what the chief refuses, before any waits for or serves
another); then devices, the cluster and the strategy
(framework/distribute/distribution.py; TensorFlow allows logical devices
and MultiWorkerMirroredStrategy only before any op runs); then the mode's
Run, in the cluster. The sync mode's run (the job built, checked, its
logdir locked and params.txt written, then run; a job that already
finished builds nothing, logs one line saying so and exits 0, leaving the
logdir as it was) is framework/jobs/sync_run.py; what each --job runs,
sync_jobs.py.

Logs: TensorFlow's own INFO records (e.g. the checkpoint saver's timings at
every save) are dropped (`TensorFlowInfoFilter`; --verbosity=1 keeps them),
and its warnings go through absl's handler once.
"""
import logging as py_logging
import os

from absl import logging
import tensorflow as tf

from cadence.framework import model_registry
from cadence.framework.distribute import distribution
from cadence.framework.jobs import command_line
from cadence.framework.jobs import exit_codes
from cadence.framework.jobs import mode_registry
from cadence.framework.jobs import run_params
from cadence.framework.jobs import trainer_options

EXIT_OK = exit_codes.EXIT_OK
EXIT_USER_ERROR = exit_codes.EXIT_USER_ERROR
EXIT_TRAINING_STOPPED = exit_codes.EXIT_TRAINING_STOPPED
EXIT_SAVE_FAILED = exit_codes.EXIT_SAVE_FAILED
EXIT_PEER_FAILED = exit_codes.EXIT_PEER_FAILED
EXIT_STOPPED = exit_codes.EXIT_STOPPED

# A mistake in the command line or the params; exits with code 2.
UserError = command_line.UserError
# The trainer's command line as plain values (trainer_options.py).
TrainerOptions = trainer_options.TrainerOptions


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


def Main(options):
  """Runs the trainer for `options` (a TrainerOptions) in the mode it
  names; returns the exit code."""
  ConfigureLogging()
  try:
    command_line.Check(options)   # Every flag, before any TF op.
    mode = mode_registry.Get(options.mode)
    flags = mode_registry.FlagsOf(type(mode), options)
    setup_cls, option_flags = ChooseDevices(options)
    params = mode.CheckBeforeDevices(options, flags, setup_cls)
    setup = CreateDevices(setup_cls, option_flags)
  except (UserError, ValueError) as e:
    return exit_codes.SetupFailure(e)
  except distribution.Stopped as e:   # A signal while waiting for peers.
    logging.warning('%s', e)
    return EXIT_OK
  context = mode_registry.Context(options, flags, setup, params)
  with setup.cluster:
    if mode.REPORTS_ITS_RUN:
      return _RunCode(mode.Run(context))
    logging.info('%s', setup)
    try:
      return _RunCode(mode.Run(context))
    except (UserError, ValueError) as e:
      return exit_codes.SetupFailure(e)
    except mode_registry.Stopped as e:
      return exit_codes.Fail(EXIT_STOPPED, str(e))


def _RunCode(code):
  """The exit code of a mode's Run (None: EXIT_OK)."""
  return EXIT_OK if code is None else code
