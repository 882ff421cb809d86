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

The flags are defined here; each mode's own are declared once, in its
module, and defined here from it (framework/jobs/mode_registry.py; e.g.
`--plan_*` in framework/jobs/plan_mode.py), and so are each distribution
option's own (framework/distribute/distribution.py; e.g. `--tpu*` in
framework/distribute/tpu_option.py, `--worker_gpus` in local.py,
`--peer_timeout_s` in multi_worker.py). Everything else lives in
`framework/jobs/trainer_lib.py` (set-up, jobs, logs),
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

flags.DEFINE_string('model', '', 'Registered experiment: a short key of '
                    'Cadence\'s own, e.g. synthetic.linear_regression.'
                    'RegressionTiny, or the full path of one of yours, '
                    'my_pkg.my_module.MyExp.')
flags.DEFINE_string('logdir', '', 'Folder of checkpoints, summaries and '
                    'params.txt.')
flags.DEFINE_enum('mode', 'sync', list(mode_registry.Names()), '; '.join(
    f'{name}: {mode_registry.Get(name).HELP}'
    for name in mode_registry.Names()) + '.')
flags.DEFINE_string('job', 'trainer_and_evaler', 'trainer, '
                    'trainer_and_evaler (train, and eval Dev after each '
                    'checkpoint), evaler_<dataset> or decoder_<dataset> '
                    '(dataset: train, dev, test).')
flags.DEFINE_enum('run_locally', 'cpu', list(command_line.RUN_LOCALLY),
                  'Devices of this host to run on.')
flags.DEFINE_string('model_params_override', '', "Params text ('key : "
                    "value' lines) or ';'-separated key=value items.")
flags.DEFINE_string('model_params_file_override', '', 'A file of Params '
                    'text applied before --model_params_override.')
flags.DEFINE_integer('max_steps', None, 'Overrides task.train.max_steps.')
flags.DEFINE_integer('worker_replicas', 1, 'Data-parallel replicas on this '
                     'host.')
flags.DEFINE_integer('worker_split_size', None, 'Devices per replica (its '
                     'pipeline stages); default: the experiment\'s '
                     'WORKER_SPLIT_SIZE. On cpu, worker_replicas x '
                     'worker_split_size logical CPUs are created.')
flags.DEFINE_integer('steps_per_loop', 0, 'At most this many train steps per '
                     'call of the compiled loop (0: up to the next summary, '
                     'log or checkpoint).')
flags.DEFINE_string('cluster_spec', '', "Several hosts, Lingvo's form: "
                    "'worker=host:port,host:port@ps=host:port' (else "
                    '$TF_CONFIG); with --task_type and --task_index.')
flags.DEFINE_string('task_type', 'worker', 'This host\'s job in '
                    '--cluster_spec.')
flags.DEFINE_integer('task_index', 0, 'This host\'s index in its '
                     '--cluster_spec job.')
flags.DEFINE_float('eval_timeout_s', 0.0, 'evaler_<dataset>/decoder_'
                   '<dataset>: stop after this many seconds without a new '
                   'checkpoint (0: wait until max_steps or the end the '
                   'trainer marks).')
flags.DEFINE_float('peak_tflops', 0.0, 'Peak TFLOP/s of one device for the '
                   'FLOPs utilisation summary (mfu divides by it x the '
                   'devices a step runs on); 0 measures it once.')

flags.DEFINE_float('device_memory_gib', 0.0, 'Memory per device in GiB: the '
                   'memory estimate per pipeline stage (inspect_model, and '
                   'the trainer\'s start-up log) says whether each stage '
                   'fits; 0: no check.')

flags.DEFINE_bool('xla', False, 'Compile each replica\'s forward and '
                  'backward pass with XLA (tf.function(jit_compile=True)); '
                  'needs static shapes and --worker_split_size=1 off a TPU.')
flags.DEFINE_bool('graph_optimizer', True, 'Run TensorFlow\'s graph '
                  'optimiser (grappler) on the job\'s compiled steps; '
                  '--nograph_optimizer compiles the Tiny LM\'s first step '
                  'in about half the time, the steps computing the same, '
                  'but they may run slower '
                  '(framework/jobs/graph_optimizer.py).')

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
  options = trainer_lib.TrainerOptions(
      model=FLAGS.model, logdir=FLAGS.logdir, mode=FLAGS.mode, job=FLAGS.job,
      run_locally=FLAGS.run_locally,
      model_params_override=FLAGS.model_params_override,
      model_params_file_override=FLAGS.model_params_file_override,
      max_steps=FLAGS.max_steps, worker_replicas=FLAGS.worker_replicas,
      worker_split_size=FLAGS.worker_split_size,
      steps_per_loop=FLAGS.steps_per_loop,
      cluster_spec=FLAGS.cluster_spec, task_type=FLAGS.task_type,
      task_index=FLAGS.task_index, peak_tflops=FLAGS.peak_tflops,
      device_memory_gib=FLAGS.device_memory_gib,
      eval_timeout_s=FLAGS.eval_timeout_s, start_time=_START_TIME,
      xla=FLAGS.xla, graph_optimizer=FLAGS.graph_optimizer,
      mode_flags=mode_registry.FlagValues(FLAGS),
      option_flags=distribution.FlagValues(FLAGS))
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
