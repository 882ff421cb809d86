"""A mistake in the command line or the params: one line, exit code 2.

The trainer's checks (command_line.py, and each mode's own in its module)
raise `UserError` with one line naming the flag, the value and the rule;
the helpers here word those lines alike. No TensorFlow.

Example:
  if value not in choices:
    raise UserError(NotOneOf('run_locally', value, choices))
  # --run_locally='cpus' is not one of cpu, gpu. Did you mean 'cpu'?
"""
import difflib
import math

EXIT_USER_ERROR = 2


class UserError(Exception):
  """A mistake in the command line or the params; exits with code 2."""


def Hint(value, choices, form=repr):
  """' Did you mean X?' for the closest of `choices` (written by `form`;
  case ignored), or ''."""
  by_lower = {str(c).lower(): c for c in choices}
  close = difflib.get_close_matches(str(value).lower(), list(by_lower), n=2,
                                    cutoff=0.6)
  return (f' Did you mean {" or ".join(form(by_lower[c]) for c in close)}?'
          if close else '')


def NotOneOf(flag, value, choices):
  """The message of an enum flag's bad value."""
  return (f'--{flag}={value!r} is not one of {", ".join(choices)}.'
          f'{Hint(value, choices)}')


def IsInt(value):
  return isinstance(value, int) and not isinstance(value, bool)


def IsNumber(value):
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def IsLocal(path):
  """Whether `path` is on this host's file system (no 'scheme://')."""
  return '://' not in path


def CheckInt(name, value, low, none_ok, meaning):
  """An int flag >= `low` (or None where `none_ok`), else a UserError
  naming the rule and what the value means."""
  if (value is None and none_ok) or (IsInt(value) and value >= low):
    return
  rule = f'must be {"None or " if none_ok else ""}an int >= {low}'
  raise UserError(f'--{name}={value!r} {rule} ({meaning}).')


def CheckNumber(name, value, meaning):
  """A number flag >= 0 and finite, else a UserError naming the rule and
  what the value means."""
  if not (IsNumber(value) and value >= 0 and math.isfinite(value)):
    raise UserError(f'--{name}={value!r} must be a number >= 0 ({meaning}).')


def IntCheck(low, meaning, none_ok=False):
  """The `check` of an int flag (flag_fields.Flag): `CheckInt`."""
  return lambda name, value: CheckInt(name, value, low, none_ok, meaning)


def NumberCheck(meaning):
  """The `check` of a number flag (flag_fields.Flag): `CheckNumber`."""
  return lambda name, value: CheckNumber(name, value, meaning)
