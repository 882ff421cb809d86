"""The trainer's command line, checked before TensorFlow loads.

`trainer.py` parses its flags with absl, then `Check`s every value here
before it imports TensorFlow (seconds, 16-30 s on a loaded machine), so a
misspelt flag, experiment or job, a missing --logdir, a bad number, a bad
override or a bad cluster come back at once as one line:

  Error: --steps_per_loop=-1 must be an int >= 0 (0: up to the next
  summary, log or checkpoint).

`trainer_lib.Main` runs the same `Check` on the `TrainerOptions` it is
given, so Python callers get the same answers. The experiment key is
checked against the keys the params files register, or, for a full key
(`my_pkg.my_module.MyExp`), against the source of the user's module
(`model_registry.CheckKey`: the source is read, nothing imported; a module
that does not parse is named with its line); everything that needs
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
import math
import os
import re

from cadence.framework import model_registry
from cadence.framework.distribute import distribution
from cadence.framework.distribute import tf_config
from cadence.framework.jobs import mode_registry
from cadence.framework.jobs import modes
from cadence.framework.jobs import sync_mode
from cadence.framework.jobs import user_error
from cadence.framework.train import logdir_lock

EXIT_USER_ERROR = user_error.EXIT_USER_ERROR
UserError = user_error.UserError
MODES = modes.NAMES   # The built-in modes, in --mode's order.
# --job is sync's flag (sync_mode.py), checked with the others.
ParseJob = sync_mode.ParseJob
RUN_LOCALLY = ('cpu', 'gpu')
MODEL_REQUIRED = ('--model is required: a registered experiment key, e.g. '
                  'synthetic.linear_regression.RegressionTiny, or the full '
                  'path of one of yours, my_pkg.my_module.MyExp.')

# Integer flags: (name, lowest value, None allowed, what the value means).
_INT_FLAGS = (
    ('max_steps', 0, True, 'overrides task.train.max_steps'),
    ('worker_replicas', 1, False, 'data-parallel replicas on this host'),
    ('worker_split_size', 1, True, 'devices per replica'),
    ('steps_per_loop', 0, False, '0: up to the next summary, log or '
     'checkpoint'),
    ('task_index', 0, False, "this host's index in its --cluster_spec job"),
)
# Number flags (>= 0, finite): (name, what the value means).
_NUMBER_FLAGS = (
    ('eval_timeout_s', 'seconds without a new checkpoint; 0: no timeout'),
    ('peak_tflops', 'TFLOP/s of one device; 0: measure it'),
    ('device_memory_gib', 'GiB of memory per device; 0: no check'),
)


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


def _CheckParamsFile(path):
  """A local --model_params_file_override must be a readable text file
  (a remote one is read, and checked, with the params)."""
  if not user_error.IsLocal(path):
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
    user_error.CheckInt(name, getattr(options, name), low, none_ok, meaning)
  for name, meaning in _NUMBER_FLAGS:
    value = getattr(options, name)
    if not (user_error.IsNumber(value) and value >= 0 and math.isfinite(value)):
      raise UserError(f'--{name}={value!r} must be a number >= 0 '
                      f'({meaning}).')


def OptionFlags(options):
  """{flag name: value} of the distribution options' own flags in
  `options`: a TrainerOptions' `option_flags`, or the attributes of absl's
  FLAGS (or of any object with the trainer's flags)."""
  values = getattr(options, 'option_flags', None)
  return values if isinstance(values, dict) else distribution.FlagValues(
      options)


def Check(options):
  """Checks every value of the trainer's command line; no TensorFlow.

  Args:
    options: the flags (absl's FLAGS) or a `trainer_lib.TrainerOptions`:
      anything with the trainer's flags as attributes.

  Raises:
    UserError: one line naming the flag, the value and the rule.
  """
  if options.mode not in mode_registry.Names():
    raise UserError(user_error.NotOneOf('mode', options.mode,
                                        mode_registry.Names()))
  if not options.model:
    raise UserError(MODEL_REQUIRED)
  try:
    model_registry.CheckKey(options.model)
  except KeyError as e:
    raise UserError(e.args[0]) from None
  mode = mode_registry.Get(options.mode)
  mode.Check(options, mode_registry.FlagsOf(type(mode), options))
  if options.logdir and user_error.IsLocal(options.logdir) and os.path.exists(
      options.logdir) and not os.path.isdir(options.logdir):
    raise UserError(f'--logdir={options.logdir!r} is a file; it must be a '
                    'folder (made if missing).')
  if options.run_locally not in RUN_LOCALLY:
    raise UserError(user_error.NotOneOf('run_locally', options.run_locally,
                              RUN_LOCALLY))
  _CheckNumbers(options)
  try:   # Each distribution option's own (e.g. --tpu_zone needs --tpu).
    distribution.CheckFlags(OptionFlags(options))
  except distribution.SetupError as e:
    raise UserError(str(e)) from None
  mode_registry.CheckModeFlags(options)
  for name in ('xla', 'graph_optimizer'):
    if not isinstance(getattr(options, name), bool):
      raise UserError(f'--{name}={getattr(options, name)!r} must be True or '
                      'False.')
  if options.model_params_file_override:
    _CheckParamsFile(options.model_params_file_override)
  if options.model_params_override:
    ParseOverride(options.model_params_override)
  try:
    config = tf_config.Read(options.cluster_spec, options.task_type,
                            options.task_index)
  except tf_config.ConfigError as e:
    raise UserError(str(e)) from None
  _CheckOptionChosen(options, config)
  _CheckLogdirFree(options, config)


def _CheckOptionChosen(options, config):
  """An option's own flag given when that option does not run (e.g.
  --peer_timeout_s without TF_CONFIG): distribution.CheckChosenFlags,
  before TensorFlow loads. The experiment's WORKER_SPLIT_SIZE is read with
  its params, after TensorFlow: an unset --worker_split_size counts as 1
  here, and distribution.Create checks again with the experiment's."""
  try:
    distribution.CheckChosenFlags(distribution.Flags(
        run_locally=options.run_locally,
        worker_replicas=options.worker_replicas,
        worker_split_size=options.worker_split_size or 1, tf_config=config,
        **OptionFlags(options)))
  except distribution.SetupError as e:
    raise UserError(str(e)) from None


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
      not user_error.IsLocal(options.logdir) or not _IsChief(config) or
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
    return f'{arg}: unknown flag.{user_error.Hint(name, names, "--{}".format)}'
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
    return user_error.NotOneOf(flag, value, choices)
  kind = parser.flag_type()
  rule = {'int': 'an int', 'float': 'a number',
          'bool': 'true or false'}.get(kind)
  if rule and re.search(r'invalid literal|could not convert|Non-boolean',
                        reason):
    return f'--{flag}={value!r} must be {rule}.'
  return f'--{flag}={value!r}: {reason}'
