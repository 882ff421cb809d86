"""Cadence trainer: train, evaluate or decode a registered experiment.

  cadence-trainer --model=synthetic.linear_regression.RegressionTiny \
      --logdir=/tmp/reg
  python -m cadence.trainer --model=my_pkg.my_module.MyExp --logdir=/tmp/my
  python trainer.py --model=... --logdir=... --job=evaler_dev

`cadence-trainer` is the installed command (setup.py's console script,
`ConsoleMain`); `python -m cadence.trainer` runs the same from any folder,
and `python trainer.py` from a checkout. --model is a short key of
Cadence's own experiments (`params/`) or the full dotted path of a
registered class in the user's own package (framework/model_registry.py).

The flags are defined here, each from its one declaration: the common
flags' in framework/jobs/trainer_options.py (with their checks), each
mode's own in its module (framework/jobs/mode_registry.py; e.g.
`--plan_*` in framework/jobs/plan_mode.py), and so are each distribution
option's own (framework/distribute/distribution.py; e.g. `--tpu*` in
framework/distribute/tpu_option.py, `--worker_gpus` in local.py,
`--peer_timeout_s` in multi_worker.py). Everything else lives in
`framework/jobs/trainer_lib.py` (set-up, logs, the mode run),
`framework/jobs/sync_run.py` (the default mode's jobs),
`framework/train/programs.py` (the train loop) and
`framework/train/eval_programs.py` (eval and decode). Exit codes: 0 done (also
for a run that had already finished, and for a SIGTERM/SIGINT that stopped it
after checkpointing its step, or while a multi-host job waited for its peers:
one line says so), 2 a user error (one message on stderr; also an unwritable
logdir, no readable checkpoint, or a peer host that never accepted a
connection within --peer_timeout_s), 3 training stopped
(too many skipped steps or non-finite weights), 4 a checkpoint could not be
written (the message names the path and the OS error; also an export stopped
by SIGTERM/SIGINT: nothing written, rerun it). A second SIGTERM/SIGINT
ends the process at once (killed by the signal). The process ends as soon as
the job is done (framework/jobs/process_exit.py); the hosts of a multi-host
job wait for each other first (framework/distribute/coordinated_exit.py).

The flags are checked before TensorFlow is imported
(`framework/jobs/command_line.py`: every value, the experiment key, the
job, the cluster), so a typo is answered in well under a second; an absl
flag error (unknown flag, unparsable value) exits 2 as well, naming the
closest flag. TensorFlow's own C++ log lines are hidden unless --tf_log
(`framework/jobs/tf_log.py`).
"""
import os
import sys
import time

_START_TIME = time.time()

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags  # pylint: disable=g-import-not-at-top

# None imports TensorFlow: the flags are checked before it loads.
from cadence.framework.distribute import distribution  # pylint: disable=g-import-not-at-top
from cadence.framework.jobs import command_line  # pylint: disable=g-import-not-at-top
from cadence.framework.jobs import install_check  # pylint: disable=g-import-not-at-top
from cadence.framework.jobs import mode_registry  # pylint: disable=g-import-not-at-top
from cadence.framework.jobs import process_exit  # pylint: disable=g-import-not-at-top
from cadence.framework.jobs import tf_log  # pylint: disable=g-import-not-at-top
from cadence.framework.jobs import trainer_options  # pylint: disable=g-import-not-at-top

# The common flags, each declared once with its check
# (framework/jobs/trainer_options.py): --model, --logdir, --mode, --job,
# --run_locally, the overrides, the devices, --xla...
trainer_options.DefineFlags(flags)
for _name in trainer_options.FlagNames():
  flags.declare_key_flag(_name)
mode_registry.DefineFlags(flags)   # Each mode's own, from its FLAGS.
# Each distribution option's own (--tpu, --worker_gpus, --peer_timeout_s...),
# from its FLAGS; listed by --help with the flags above.
distribution.DefineFlags(flags)
for _name in distribution.FlagNames():
  flags.declare_key_flag(_name)
flags.DEFINE_bool('tf_log', False, 'Show TensorFlow\'s and gRPC\'s own C++ '
                  'log lines (oneDNN, CPU features, tf.data, gRPC); hidden '
                  'by default (framework/jobs/tf_log.py).')

FLAGS = flags.FLAGS


def ParseFlags(argv):
  """absl's parsing of `argv`; a flag error exits 2 with one `Error:` line
  (an unknown flag names the closest ones, a bad value the rule, a repeated
  flag its values)."""
  repeated = command_line.RepeatedFlagLine(argv, FLAGS)
  if repeated:
    sys.stderr.write(f'Error: {repeated}\n')
    sys.exit(command_line.EXIT_USER_ERROR)
  try:
    return FLAGS(argv)
  except flags.Error as e:
    sys.stderr.write(f'Error: {command_line.FlagErrorLine(e, FLAGS)}\n')
    sys.exit(command_line.EXIT_USER_ERROR)


def main(argv):
  if len(argv) > 1:
    sys.stderr.write(f'Error: unexpected arguments {argv[1:]}\n')
    return command_line.EXIT_USER_ERROR
  try:
    command_line.Check(FLAGS)
    install_check.CheckOneTensorFlow()
  except command_line.UserError as e:
    sys.stderr.write(f'Error: {e}\n')
    return command_line.EXIT_USER_ERROR
  # TensorFlow loads only now, its C++ log levels set first.
  tf_log.Configure(FLAGS.tf_log)
  mode = mode_registry.Get(FLAGS.mode)
  for name, value in mode.Environment(
      mode_registry.FlagsOf(type(mode), FLAGS)).items():
    os.environ.setdefault(name, value)   # Read as TensorFlow loads.
  with tf_log.QuietImport(FLAGS.tf_log):
    from cadence.framework.jobs import trainer_lib  # pylint: disable=g-import-not-at-top
  options = trainer_options.FromFlags(FLAGS, start_time=_START_TIME)
  return trainer_lib.Main(options)


def _MainThenExit(argv):
  """`main`, then the process ends as soon as the job's output is written,
  without the interpreter's teardown (framework/jobs/process_exit.py); tests
  call `main` in process instead."""
  process_exit.Exit(main(argv))


def ConsoleMain():
  """The `cadence-trainer` command (setup.py's console script).

  It finds the user's package where `python -m cadence.trainer` does: in
  the current folder first (Python puts a script's own folder there, the
  venv's bin/), so `--model=my_pkg.my_module.MyExp` finds
  ./my_pkg/my_module.py; not under `python -P` or PYTHONSAFEPATH, as
  with `python -m`.
  """
  if not getattr(sys.flags, 'safe_path', False):   # Python 3.11+.
    sys.path.insert(0, os.getcwd())
  app.run(_MainThenExit, flags_parser=ParseFlags)


if __name__ == '__main__':
  app.run(_MainThenExit, flags_parser=ParseFlags)
