"""The trainer's command line, checked before TensorFlow loads.

`trainer.py` parses its flags with absl, then `Check`s every value here
before it imports TensorFlow (seconds, 16-30 s on a loaded machine), so a
misspelt flag, experiment or job, a missing --logdir, a bad number, a bad
override or a bad cluster come back at once as one line:

  Error: --steps_per_loop=-1 must be an int >= 0 (0: up to the next
  summary, log or checkpoint).

Each common flag's check is declared with the flag
(framework/jobs/trainer_options.py), each mode's in its module (its
`Check`), each distribution option's in its own. `trainer_lib.Main` runs
the same `Check` on the `TrainerOptions` it is given, so Python callers
get the same answers. Importing this module registers the built-in modes
(modes.py), so --mode's values are known here. The experiment key is
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
import re

from cadence.framework.distribute import distribution
from cadence.framework.distribute import tf_config
from cadence.framework.jobs import mode_registry
from cadence.framework.jobs import modes
from cadence.framework.jobs import trainer_options
from cadence.framework.jobs import user_error

EXIT_USER_ERROR = user_error.EXIT_USER_ERROR
UserError = user_error.UserError
MODES = modes.NAMES   # The built-in modes (registered), in --mode's order.


def OptionFlags(options):
  """{flag name: value} of the distribution options' own flags in
  `options`: a TrainerOptions' `option_flags`, or the attributes of absl's
  FLAGS (or of any object with the trainer's flags)."""
  values = getattr(options, 'option_flags', None)
  return values if isinstance(values, dict) else distribution.FlagValues(
      options)


def Check(options):
  """Checks every value of the trainer's command line; no TensorFlow.

  In order: each common flag by its declaration (trainer_options.
  CheckValues), the distribution options' own flags, a mode's flags given
  with another mode, the cluster (--cluster_spec or $TF_CONFIG) and the
  options' flags against the option it chooses, then the mode's own checks
  (its Check: e.g. sync's --job and --logdir).

  Args:
    options: the flags (absl's FLAGS) or a `trainer_options.TrainerOptions`:
      anything with the trainer's flags as attributes.

  Raises:
    UserError: one line naming the flag, the value and the rule.
  """
  trainer_options.CheckValues(options)
  try:   # Each distribution option's own (e.g. --tpu_zone needs --tpu).
    distribution.CheckFlags(OptionFlags(options))
  except distribution.SetupError as e:
    raise UserError(str(e)) from None
  mode_registry.CheckModeFlags(options)
  _CheckOptionChosen(options, ReadCluster(options))
  mode = mode_registry.Get(options.mode)
  mode.Check(options, mode_registry.FlagsOf(type(mode), options))


def ReadCluster(options):
  """The TF_CONFIG dict of --cluster_spec (with --task_type and
  --task_index) or $TF_CONFIG, or None for a local run.

  Raises:
    UserError: the configuration cannot describe a cluster.
  """
  try:
    return tf_config.Read(options.cluster_spec, options.task_type,
                          options.task_index)
  except tf_config.ConfigError as e:
    raise UserError(str(e)) from None


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
