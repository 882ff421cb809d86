"""Trainer modes as a registry: a mode (`--mode=NAME`) is one module.

A mode module declares a `Mode` subclass, which `modes.py` registers
(`Register`):

  NAME, HELP    its --mode value and one line of what it does;
  FLAGS         a dataclass of its own flags, declared once: each field is
                the flag `PREFIX + field name`, its default the field's,
                its kind and help from `Flag` (framework/distribute/
                flag_fields.py: the distribution options declare theirs
                with it too, distribution.py);
  Check         its checks of the command line, run before TensorFlow loads,
                after the common flags' (raise user_error.UserError: one
                line);
  Environment   what TensorFlow must see in the environment as it loads;
  CheckBeforeDevices  what every task of a cluster refuses before its
                devices are set up (no TensorFlow op), e.g. the params it
                loads and checks: Run gets them as context.params;
  Run           the mode itself, once the devices are set up; returns
                its exit code, or None for 0 (a user's mistake raises
                UserError: exit 2; a signal that stops it before it writes
                anything raises Stopped: exit 4).

The trainer's own mode, sync (sync_mode.py: train, evaluate or decode
--job), is one like the others: its checks, its CheckBeforeDevices and
its Run (sync_run.py) are its own, and trainer_lib.Main runs every mode
the same way.

`modes.py` imports every mode module once, in the order `--mode` lists
them (a new mode is its module plus one line there); `trainer.py` defines
the registered modes' flags from their FLAGS (`DefineFlags`) and
`trainer_lib.Main` runs the mode `--mode` names. A flag of one mode given
with another is refused by `CheckModeFlags`. A new mode flag is one field
of its mode's FLAGS. No TensorFlow here: the mode modules import what
needs it inside `Run`.

Example (a mode of one's own, registered from a test):
  @dataclasses.dataclass
  class CountFlags:
    count_to: int = mode_registry.Flag(3, 'how far to count')

  class CountMode(mode_registry.Mode):
    NAME, HELP, FLAGS = 'count', 'prints 1..N', CountFlags
    def Run(self, context):
      print(*range(1, context.flags.count_to + 1))

  mode_registry.Register(CountMode)
"""
import dataclasses

from cadence.framework.distribute import flag_fields
from cadence.framework.jobs import user_error

_REGISTRY = {}   # NAME: the Mode subclass, in registration order.
# A field of a mode's FLAGS: Flag(default, help_text, kind=None); the kind
# ('string', 'bool', 'integer' or 'float') comes from the default unless
# given (framework/distribute/flag_fields.py, shared with the distribution
# options' flags).
Flag = flag_fields.Flag
NoFlags = flag_fields.NoFlags   # The FLAGS of a mode without flags of its own.


class Stopped(Exception):
  """A mode stopped by a signal before it wrote anything: the trainer exits
  with code 4 and this one line (rerun the command)."""


@dataclasses.dataclass
class Context:
  """What a mode's Run gets: the trainer's options (trainer_options.
  TrainerOptions), the mode's own flags (its FLAGS), the distribution
  setup (distribution.Setup: its cluster is entered) and what the mode's
  CheckBeforeDevices returned (None by default)."""
  options: object
  flags: object
  setup: object
  params: object = None


class Mode:
  """A trainer mode; see the module docstring."""
  NAME = ''
  HELP = ''
  FLAGS = NoFlags
  PREFIX = ''   # The flags' names: PREFIX + field name.
  # False: the trainer logs the distribution setup before Run, and a
  # UserError or ValueError (bad params, as the layers raise them) out of
  # Run exits 2 with its one line. True: Run does both itself (sync: it
  # logs the setup once it knows its job is not finished already, and
  # answers its build's errors so; an error while it trains is raised as
  # it is).
  REPORTS_ITS_RUN = False

  def Check(self, options, flags):
    """Checks before TensorFlow loads (`flags`: this mode's FLAGS of
    `options`), after the common flags'; raises user_error.UserError.
    None by default."""

  def Environment(self, flags):
    """{name: value} of environment variables TensorFlow reads as it loads
    (set only where unset); {} by default."""
    del flags
    return {}

  def CheckBeforeDevices(self, options, flags, setup_cls):
    """What every task refuses before its distribution option
    (`setup_cls`, chosen, not created) sets up the devices, so before it
    waits for its peers or serves them; runs no TensorFlow op. Returns what
    Run gets as context.params (None by default); raises UserError."""
    del options, flags, setup_cls

  def Run(self, context):
    """Runs the mode (a Context); returns its exit code, or None for 0. A
    user's mistake raises UserError."""
    raise NotImplementedError(f'--mode={self.NAME} has no Run.')


def Register(mode_cls):
  """Adds a Mode subclass to the registry (after the ones before it);
  returns it, so it can decorate the class.

  Raises:
    ValueError: no NAME, a NAME registered already, or a flag name another
      mode has.
  """
  name = mode_cls.NAME
  if not name:
    raise ValueError(f'{mode_cls.__name__}: a Mode needs a NAME.')
  if name in _REGISTRY and _REGISTRY[name] is not mode_cls:
    raise ValueError(f'--mode={name} is registered already (by '
                     f'{_REGISTRY[name].__name__}).')
  taken = {f: m.NAME for m in _REGISTRY.values() if m is not mode_cls
           for f in FlagNames(m)}
  for flag in FlagNames(mode_cls):
    if flag in taken:
      raise ValueError(f'{mode_cls.__name__}: the flag --{flag} is '
                       f'--mode={taken[flag]}\'s already.')
  _REGISTRY[name] = mode_cls
  return mode_cls


def Unregister(name):
  """Removes a mode (a test's own, when it is done)."""
  _REGISTRY.pop(name, None)


def Names():
  """The registered modes' NAMEs, in registration order."""
  return tuple(_REGISTRY)


def Get(name):
  """An instance of the mode `name`.

  Raises:
    KeyError: no such mode.
  """
  if name not in _REGISTRY:
    raise KeyError(f'--mode={name!r} is not one of {", ".join(Names())}.')
  return _REGISTRY[name]()


def FlagNames(mode_cls):
  """The flag names of a Mode subclass, in its FLAGS' field order."""
  return flag_fields.Names(mode_cls.FLAGS, mode_cls.PREFIX)


def FlagsOf(mode_cls, options):
  """The mode's FLAGS with the values of `options`: absl's FLAGS or any
  object with the flags as attributes, or a TrainerOptions (its
  `mode_flags`: {flag name: value}); a flag it lacks has its default."""
  values = getattr(options, 'mode_flags', None)
  return flag_fields.Read(mode_cls.FLAGS,
                          values if isinstance(values, dict) else options,
                          mode_cls.PREFIX)


def FlagValues(flag_values):
  """{flag name: value} of every registered mode's flags in absl's parsed
  `flag_values`: what trainer.py hands trainer_lib (TrainerOptions.
  mode_flags)."""
  return {name: getattr(flag_values, name)
          for m in _REGISTRY.values() for name in FlagNames(m)}


def DefineFlags(flags_module, flag_values=None):
  """Defines every registered mode's flags in absl (`flags_module`: absl's
  `flags`), each help line starting with its mode."""
  for m in _REGISTRY.values():
    for f in dataclasses.fields(m.FLAGS):
      flag_fields.Define(flags_module, f, m.PREFIX + f.name,
                         f'--mode={m.NAME}: {f.metadata["help"]}',
                         flag_values, module_name=__name__)


def CheckModeFlags(options):
  """Refuses a mode's flag given (not at its default) with another mode.

  Raises:
    UserError: naming the flags and the mode they need.
  """
  for m in _REGISTRY.values():
    if m.NAME == options.mode:
      continue
    given = flag_fields.Given(FlagsOf(m, options), m.PREFIX)
    if given:
      raise user_error.UserError(
          f'{", ".join(given)} need(s) --mode={m.NAME} (now '
          f'--mode={options.mode}).')
