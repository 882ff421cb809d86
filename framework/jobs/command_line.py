"""The trainer's command line, checked before TensorFlow loads.

`trainer.py` parses its flags with absl, then `Check`s every value here
before it imports TensorFlow (seconds, 16-30 s on a loaded machine), so a
misspelt flag, experiment or job, a missing --logdir, a bad number, a bad
override or a bad cluster come back at once as one line:

  Error: --steps_per_loop=-1 must be an int >= 0 (0: up to the next
  summary, log or checkpoint).

`trainer_lib.Main` runs the same `Check` on the `TrainerOptions` it is
given, so Python callers get the same answers. The experiment key is
checked against the keys the params files register (`model_registry.
CheckKey`: their source is read, nothing imported); everything that needs
the experiment's params is checked later, by the layers and input
generators, with the params path.

`FlagErrorLine` turns absl's own parse errors (an unknown flag, a value
absl cannot parse, an enum value) into one such line, with the closest
flag or value. This module imports no TensorFlow.

Example:
  try:
    command_line.Check(FLAGS)
  except command_line.UserError as e:
    sys.stderr.write(f'Error: {e}\\n')
"""
import dataclasses
import difflib
import math
import os
import re

from cadence.framework import model_registry
from cadence.framework.distribute import tf_config
from cadence.framework.planning import hardware
from cadence.framework.train import logdir_lock

EXIT_USER_ERROR = 2
MODES = ('sync', 'inspect_params', 'inspect_model', 'inspect_pipeline',
         'export', 'plan')
RUN_LOCALLY = ('cpu', 'gpu')
_JOB_FORMS = ('trainer', 'trainer_and_evaler', 'evaler_<dataset>',
              'decoder_<dataset>')

# Integer flags: (name, lowest value, None allowed, what the value means).
_INT_FLAGS = (
    ('max_steps', 0, True, 'overrides task.train.max_steps'),
    ('worker_replicas', 1, False, 'data-parallel replicas on this host'),
    ('worker_split_size', 1, True, 'devices per replica'),
    ('worker_gpus', 0, False, 'GPUs to use; 0: all visible'),
    ('steps_per_loop', 0, False, '0: up to the next summary, log or '
     'checkpoint'),
    ('task_index', 0, False, "this host's index in its --cluster_spec job"),
    ('export_batch_size', 1, True, '--mode=export: a static batch size'),
    ('export_max_len', 2, True, '--mode=export: a static sequence length'),
)
# Number flags (>= 0, finite): (name, what the value means).
_NUMBER_FLAGS = (
    ('eval_timeout_s', 'seconds without a new checkpoint; 0: no timeout'),
    ('peak_tflops', 'TFLOP/s of one device; 0: measure it'),
    ('device_memory_gib', 'GiB of memory per device; 0: no check'),
    ('peer_timeout_s', 'seconds to wait for the peer hosts of a TF_CONFIG '
     'job; 0: no limit'),
)


class UserError(Exception):
  """A mistake in the command line or the params; exits with code 2."""


@dataclasses.dataclass
class PlanOptions:
  """The --plan_* flags of --mode=plan (framework/planning/planner.py)."""
  cluster: str = 'cpu'    # --plan_cluster (framework/planning/hardware.py)
  measure: bool = False   # --plan_measure: time the layers on this host
  top: int = 10           # --plan_top: layouts in the table
  apply: str = ''         # --plan_apply: write the best plan's overrides
  explain: int = 1        # --plan_explain: the plan whose timeline is drawn

  @classmethod
  def Of(cls, options):
    """The PlanOptions of absl's FLAGS or of a TrainerOptions."""
    if hasattr(options, 'plan_cluster'):
      return cls(options.plan_cluster, options.plan_measure,
                 options.plan_top, options.plan_apply, options.plan_explain)
    return getattr(options, 'plan', None) or cls()


def _CheckPlan(options):
  """The --plan_* flags: only with --mode=plan, each value by its rule."""
  plan = PlanOptions.Of(options)
  if options.mode != 'plan':
    given = [f'--plan_{f.name}' for f in dataclasses.fields(plan)
             if getattr(plan, f.name) != f.default]
    if given:
      raise UserError(f'{", ".join(given)} need(s) --mode=plan (now '
                      f'--mode={options.mode}).')
    return
  try:
    hardware.Parse(plan.cluster)
  except hardware.SpecError as e:
    raise UserError(str(e)) from None
  for name, value in (('top', plan.top), ('explain', plan.explain)):
    if not (_IsInt(value) and value >= 1):
      raise UserError(f'--plan_{name}={value!r} must be an int >= 1.')
  if not isinstance(plan.measure, bool):
    raise UserError(f'--plan_measure={plan.measure!r} must be True or '
                    'False.')
  if plan.apply and _IsLocal(plan.apply):
    folder = os.path.dirname(os.path.abspath(plan.apply))
    if os.path.isdir(plan.apply) or not os.path.isdir(folder):
      raise UserError(f'--plan_apply={plan.apply!r} must be a file path in '
                      'an existing folder (the best plan\'s overrides are '
                      'written there as Params text).')


def _Hint(value, choices, form=repr):
  """' Did you mean X?' for the closest of `choices` (written by `form`;
  case ignored), or ''."""
  by_lower = {str(c).lower(): c for c in choices}
  close = difflib.get_close_matches(str(value).lower(), list(by_lower), n=2,
                                    cutoff=0.6)
  return (f' Did you mean {" or ".join(form(by_lower[c]) for c in close)}?'
          if close else '')


def _NotOneOf(flag, value, choices):
  """The message of an enum flag's bad value."""
  return (f'--{flag}={value!r} is not one of {", ".join(choices)}.'
          f'{_Hint(value, choices)}')


def _IsInt(value):
  return isinstance(value, int) and not isinstance(value, bool)


def _IsNumber(value):
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def ParseJob(job):
  """'evaler_dev' -> ('evaler', 'Dev'); 'trainer' -> ('trainer', None).

  Raises:
    UserError: not a job form, naming the closest job.
  """
  if job in ('trainer', 'trainer_and_evaler'):
    return job, None
  kind, _, dataset = str(job).partition('_')
  names = {d.lower(): d for d in model_registry.DATASETS}
  if kind in ('evaler', 'decoder') and dataset.lower() in names:
    return kind, names[dataset.lower()]
  known = ['trainer', 'trainer_and_evaler'] + [
      f'{k}_{d.lower()}' for k in ('evaler', 'decoder') for d in names]
  close = difflib.get_close_matches(str(job), known, n=2, cutoff=0.6)
  hint = f' Did you mean {" or ".join(map(repr, close))}?' if close else ''
  raise UserError(f'--job={job!r} is not one of {", ".join(_JOB_FORMS)} '
                  f'(datasets: {", ".join(model_registry.DATASETS)}).{hint}')


def ParseOverride(text):
  """`--model_params_override` as a list of (key, value text) pairs, or None.

  Returns None for Params text ('key : value' lines, as in params.txt), and
  the pairs of ';'-separated 'key=value' items otherwise.

  Raises:
    UserError: an item that is not 'key=value'.
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


def _IsLocal(path):
  return '://' not in path


def _CheckParamsFile(path):
  """A local --model_params_file_override must be a readable text file
  (a remote one is read, and checked, with the params)."""
  if not _IsLocal(path):
    return
  flag = f'--model_params_file_override={path!r}'
  if not os.path.exists(path):
    raise UserError(f'{flag}: no such file.')
  if not os.path.isfile(path):
    raise UserError(f'{flag} is not a file (a Params text file, '
                    "'key : value' lines as in params.txt).")
  try:
    with open(path, 'rb') as f:
      ParamsFileText(path, f.read())
  except OSError as e:
    raise UserError(f'{flag}: cannot read it: {e.strerror or e}.') from None


def ParamsFileText(path, data):
  """The text of the --model_params_file_override `path`, from its bytes.

  Raises:
    UserError: the bytes are not UTF-8 text (e.g. a binary file).
  """
  try:
    return data.decode('utf-8')
  except UnicodeDecodeError as e:
    raise UserError(f'--model_params_file_override={path!r} is not UTF-8 '
                    f'text (byte {e.start}: {e.reason}); it must hold '
                    "Params text, 'key : value' lines as in params.txt."
                    ) from None


def _CheckNumbers(options):
  for name, low, none_ok, meaning in _INT_FLAGS:
    value = getattr(options, name)
    if (value is None and none_ok) or (_IsInt(value) and value >= low):
      continue
    rule = f'must be {"None or " if none_ok else ""}an int >= {low}'
    raise UserError(f'--{name}={value!r} {rule} ({meaning}).')
  for name, meaning in _NUMBER_FLAGS:
    value = getattr(options, name)
    if not (_IsNumber(value) and value >= 0 and math.isfinite(value)):
      raise UserError(f'--{name}={value!r} must be a number >= 0 '
                      f'({meaning}).')


def Check(options):
  """Checks every value of the trainer's command line; no TensorFlow.

  Args:
    options: the flags (absl's FLAGS) or a `trainer_lib.TrainerOptions`:
      anything with the trainer's flags as attributes.

  Raises:
    UserError: one line naming the flag, the value and the rule.
  """
  if options.mode not in MODES:
    raise UserError(_NotOneOf('mode', options.mode, MODES))
  if not options.model:
    raise UserError('--model is required: a registered experiment key, e.g. '
                    'synthetic.linear_regression.RegressionTiny.')
  try:
    model_registry.CheckKey(options.model)
  except KeyError as e:
    raise UserError(e.args[0]) from None
  if options.mode == 'sync':
    ParseJob(options.job)
    if not options.logdir:
      raise UserError('--logdir is required for --mode=sync.')
  if options.mode == 'export' and not options.logdir:
    raise UserError('--logdir is required for --mode=export: the run whose '
                    'checkpoint is exported.')
  if options.logdir and _IsLocal(options.logdir) and os.path.exists(
      options.logdir) and not os.path.isdir(options.logdir):
    raise UserError(f'--logdir={options.logdir!r} is a file; it must be a '
                    'folder (made if missing).')
  if options.run_locally not in RUN_LOCALLY:
    raise UserError(_NotOneOf('run_locally', options.run_locally,
                              RUN_LOCALLY))
  _CheckNumbers(options)
  _CheckPlan(options)
  for name in ('xla', 'graph_optimizer'):
    if not isinstance(getattr(options, name), bool):
      raise UserError(f'--{name}={getattr(options, name)!r} must be True or '
                      'False.')
  for name in ('tpu_zone', 'tpu_project'):
    if getattr(options, name) and not options.tpu:
      raise UserError(f'--{name}={getattr(options, name)!r} needs --tpu '
                      "(the TPU's name); without --tpu the run is local.")
  if options.model_params_file_override:
    _CheckParamsFile(options.model_params_file_override)
  if options.model_params_override:
    ParseOverride(options.model_params_override)
  try:
    config = tf_config.Read(options.cluster_spec, options.task_type,
                            options.task_index)
  except tf_config.ConfigError as e:
    raise UserError(str(e)) from None
  _CheckLogdirFree(options, config)


def _IsChief(config):
  """Whether this host writes the logdir: the only host, the 'chief', or
  worker 0 of a cluster without one."""
  if config is None:
    return True
  task = config['task']
  return task['type'] == 'chief' or (
      task['type'] == 'worker' and task.get('index', 0) == 0 and
      'chief' not in config['cluster'])


def _CheckLogdirFree(options, config):
  """A trainer job's logdir held by another live trainer (its writer lock,
  framework/train/logdir_lock.py), answered before TensorFlow loads; the
  lock itself is taken later, before the first write."""
  if (options.mode != 'sync' or not options.logdir or
      not _IsLocal(options.logdir) or not _IsChief(config) or
      ParseJob(options.job)[0] not in ('trainer', 'trainer_and_evaler')):
    return
  try:
    logdir_lock.CheckFree(options.logdir)
  except logdir_lock.HeldError as e:
    raise UserError(str(e)) from None


def RepeatedFlagLine(argv, flag_values):
  """One line naming a flag that `argv` gives more than once, or None.

  absl keeps the last value of a repeated flag and drops the others without
  a word (`--model_params_override` given twice trained the first one's
  values away), so the trainer refuses a repeat, before parsing. A bool
  flag and its `--no` form count as one flag; arguments after `--` are not
  flags.

  Args:
    argv: the command line, argv[0] the program.
    flag_values: the `FlagValues` to parse it with (absl's FLAGS).
  """
  given = {}
  for arg in argv[1:]:
    if arg == '--':
      break
    if not arg.startswith('-') or arg == '-':
      continue
    name = arg.lstrip('-').split('=', 1)[0]
    if name not in flag_values and name.startswith('no') and (
        name[2:] in flag_values and
        flag_values[name[2:]].parser.flag_type() == 'bool'):
      name = name[2:]
    if name in flag_values and len(name) > 1:
      given.setdefault(name, []).append(arg)
  for name, args in given.items():
    if len(args) > 1:
      join = (" (join its items with ';' into one value)"
              if name == 'model_params_override' else '')
      return (f'--{name} is given {len(args)} times ({", ".join(args)}); '
              f'absl would keep only the last. Give it once{join}.')
  return None


_ILLEGAL_VALUE = re.compile(r'^flag --([\w.-]+)=(.*?): (.*)$', re.S)
_MISSING_VALUE = re.compile(r'^Missing value for flag (-+[\w.-]+)')


def FlagErrorLine(error, flag_values):
  """One line for an absl flag parse error, with the closest flag or value.

  Args:
    error: an `absl.flags.Error` raised while parsing.
    flag_values: the `FlagValues` parsed (absl's FLAGS).

  Returns:
    The message, without the 'Error: ' prefix.
  """
  name = getattr(error, 'flagname', None)
  if name is not None:   # UnrecognizedFlagError.
    arg = getattr(error, 'flagvalue', '') or f'--{name}'
    names = [n for n in flag_values if len(n) > 1]
    names += [f'no{n}' for n in names
              if flag_values[n].parser.flag_type() == 'bool']
    return f'{arg}: unknown flag.{_Hint(name, names, "--{}".format)}'
  m = _MISSING_VALUE.match(str(error))
  if m:
    return f'{m.group(1)} needs a value: {m.group(1)}=<value>.'
  m = _ILLEGAL_VALUE.match(str(error))
  if not m or m.group(1) not in flag_values:
    return str(error)
  flag, value, reason = m.group(1), m.group(2), m.group(3)
  parser = flag_values[flag].parser
  choices = getattr(parser, 'enum_values', None)
  if choices:
    return _NotOneOf(flag, value, choices)
  kind = parser.flag_type()
  rule = {'int': 'an int', 'float': 'a number',
          'bool': 'true or false'}.get(kind)
  if rule and re.search(r'invalid literal|could not convert|Non-boolean',
                        reason):
    return f'--{flag}={value!r} must be {rule}.'
  return f'--{flag}={value!r}: {reason}'
