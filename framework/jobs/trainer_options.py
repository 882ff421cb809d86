"""The trainer's common flags, each declared once, and a run's options.

A common flag (one every mode reads, or sync's --job: not a mode's own,
not a distribution option's own) is one field of `CommonFlags`, a
`Flag(default, help, check=...)` (framework/distribute/flag_fields.py, as
the modes' and the options' own flags are). From that one declaration
come:

  the absl flag      `DefineFlags(flags)` in trainer.py;
  its check          `CheckValues(options)`, before TensorFlow loads
                     (command_line.Check): an enum's value among its
                     choices, a bool a bool, then the field's `check`
                     (one line naming the flag, the value and the rule);
  the option         a field of `TrainerOptions` (a CommonFlags, plus what
                     the command line adds: the start time and the modes'
                     and the options' own flags), made from absl's parsed
                     FLAGS by `FromFlags`.

A new common flag is one field here. No TensorFlow.

Example:
  options = TrainerOptions(model='synthetic.linear_regression.RegressionTiny',
                           logdir='/tmp/reg', max_steps=20)
  CheckValues(options)   # Raises UserError on a bad value.
"""
import dataclasses
import os

from cadence.framework import model_registry
from cadence.framework.distribute import distribution
from cadence.framework.distribute import flag_fields
from cadence.framework.jobs import mode_registry
from cadence.framework.jobs import params_overrides
from cadence.framework.jobs import user_error

Flag = flag_fields.Flag
UserError = user_error.UserError
RUN_LOCALLY = ('cpu', 'gpu')
MODEL_REQUIRED = ('--model is required: a registered experiment key, e.g. '
                  'synthetic.linear_regression.RegressionTiny, or the full '
                  'path of one of yours, my_pkg.my_module.MyExp.')
_IntCheck = user_error.IntCheck
_NumberCheck = user_error.NumberCheck


def CheckModel(name, key):
  """The check of --model (`name`): given, and a registered experiment's
  key (model_registry.CheckKey: the user's module is read, not imported)."""
  del name
  if not key:
    raise UserError(MODEL_REQUIRED)
  try:
    model_registry.CheckKey(key)
  except KeyError as e:
    raise UserError(e.args[0]) from None


def _CheckLogdir(name, logdir):
  """A local --logdir that exists must be a folder (made if missing)."""
  if logdir and user_error.IsLocal(logdir) and os.path.exists(
      logdir) and not os.path.isdir(logdir):
    raise UserError(f'--{name}={logdir!r} is a file; it must be a folder '
                    '(made if missing).')


def _ModeHelp():
  return '; '.join(f'{name}: {mode_registry.Get(name).HELP}'
                   for name in mode_registry.Names()) + '.'


@dataclasses.dataclass
class CommonFlags:
  """The trainer's common flags (see the module docstring); --job is
  sync's, and checked by it (sync_mode.py)."""
  model: str = Flag(
      '', "Registered experiment: a short key of Cadence's own, e.g. "
      'synthetic.linear_regression.RegressionTiny, or the full path of one '
      'of yours, my_pkg.my_module.MyExp.', check=CheckModel)
  logdir: str = Flag('', 'Folder of checkpoints, summaries and params.txt.',
                     check=_CheckLogdir)
  mode: str = Flag('sync', _ModeHelp, choices=mode_registry.Names)
  job: str = Flag('trainer_and_evaler', 'trainer, trainer_and_evaler '
                  '(train, and eval Dev after each checkpoint), '
                  'evaler_<dataset> or decoder_<dataset> (dataset: train, '
                  'dev, test).')
  run_locally: str = Flag('cpu', 'Devices of this host to run on.',
                          choices=RUN_LOCALLY)
  model_params_override: str = Flag(
      '', "Params text ('key : value' lines) or ';'-separated key=value "
      'items.', check=params_overrides.CheckOverride)
  model_params_file_override: str = Flag(
      '', 'A file of Params text applied before --model_params_override.',
      check=params_overrides.CheckParamsFile)
  max_steps: int = Flag(None, 'Overrides task.train.max_steps.', 'integer',
                        check=_IntCheck(0, 'overrides task.train.max_steps',
                                        none_ok=True))
  worker_replicas: int = Flag(
      1, 'Data-parallel replicas on this host.',
      check=_IntCheck(1, 'data-parallel replicas on this host'))
  worker_split_size: int = Flag(
      None, "Devices per replica (its pipeline stages); default: the "
      "experiment's WORKER_SPLIT_SIZE. On cpu, worker_replicas x "
      'worker_split_size logical CPUs are created.', 'integer',
      check=_IntCheck(1, 'devices per replica', none_ok=True))
  steps_per_loop: int = Flag(
      0, 'At most this many train steps per call of the compiled loop (0: '
      'up to the next summary, log or checkpoint).',
      check=_IntCheck(0, '0: up to the next summary, log or checkpoint'))
  cluster_spec: str = Flag(
      '', "Several hosts, Lingvo's form: 'worker=host:port,host:port@ps="
      "host:port' (else $TF_CONFIG); with --task_type and --task_index.")
  task_type: str = Flag('worker', "This host's job in --cluster_spec.")
  task_index: int = Flag(
      0, "This host's index in its --cluster_spec job.",
      check=_IntCheck(0, "this host's index in its --cluster_spec job"))
  peak_tflops: float = Flag(
      0.0, 'Peak TFLOP/s of one device for the FLOPs utilisation summary '
      '(mfu divides by it x the devices a step runs on); 0 measures it '
      'once.', check=_NumberCheck('TFLOP/s of one device; 0: measure it'))
  device_memory_gib: float = Flag(
      0.0, 'Memory per device in GiB: the memory estimate per pipeline '
      "stage (inspect_model, and the trainer's start-up log) says whether "
      'each stage fits; 0: no check.',
      check=_NumberCheck('GiB of memory per device; 0: no check'))
  eval_timeout_s: float = Flag(
      0.0, 'evaler_<dataset>/decoder_<dataset>: stop after this many '
      'seconds without a new checkpoint (0: wait until max_steps or the end '
      'the trainer marks).', check=_NumberCheck(
          'seconds without a new checkpoint; 0: no timeout'))
  xla: bool = Flag(False, "Compile each replica's forward and backward pass "
                   'with XLA (tf.function(jit_compile=True)); needs static '
                   'shapes and --worker_split_size=1 off a TPU.')
  graph_optimizer: bool = Flag(
      True, "Run TensorFlow's graph optimiser (grappler) on the job's "
      "compiled steps; --nograph_optimizer compiles the Tiny LM's first "
      'step in about half the time, the steps computing the same, but they '
      'may run slower (framework/jobs/graph_optimizer.py).')


@dataclasses.dataclass
class TrainerOptions(CommonFlags):
  """The trainer's command line as plain values: the common flags (fields
  of CommonFlags, with their defaults), and:"""
  start_time: float = None   # time.time() when trainer.py started.
  # {flag name: value} of the modes' own flags (mode_registry.FlagValues;
  # e.g. 'export_dir', 'plan_cluster'); a flag not given has its default.
  mode_flags: dict = dataclasses.field(default_factory=dict)
  # {flag name: value} of the distribution options' own flags
  # (distribution.FlagValues; e.g. 'tpu', 'worker_gpus', 'peer_timeout_s');
  # a flag not given has its default.
  option_flags: dict = dataclasses.field(default_factory=dict)


def FlagNames():
  """The common flags' names, in their declaration order."""
  return flag_fields.Names(CommonFlags)


def DefineFlags(flags_module, flag_values=None):
  """Defines the common flags in absl (`flags_module`: absl's `flags`);
  their --mode's choices and help are the modes registered by then."""
  for f in dataclasses.fields(CommonFlags):
    flag_fields.Define(flags_module, f, f.name, flag_fields.HelpOf(f),
                       flag_values, module_name=__name__)


def FromFlags(flag_values, start_time=None):
  """The TrainerOptions of absl's parsed `flag_values` (or any object with
  the trainer's flags as attributes)."""
  return TrainerOptions(
      start_time=start_time,
      mode_flags=mode_registry.FlagValues(flag_values),
      option_flags=distribution.FlagValues(flag_values),
      **{name: getattr(flag_values, name) for name in FlagNames()})


def CheckValues(options):
  """Checks each common flag's value in `options` (absl's FLAGS, a
  TrainerOptions or any object with the flags as attributes), in their
  declaration order; no TensorFlow.

  Raises:
    UserError: one line naming the flag, the value and the rule.
  """
  for f in dataclasses.fields(CommonFlags):
    value = getattr(options, f.name)
    choices = flag_fields.ChoicesOf(f)
    if choices is not None and value not in choices:
      raise UserError(user_error.NotOneOf(f.name, value, choices))
    if f.metadata['kind'] == 'bool' and not isinstance(value, bool):
      raise UserError(f'--{f.name}={value!r} must be True or False.')
    if f.metadata['check'] is not None:
      f.metadata['check'](f.name, value)
