"""Flags declared once, as the fields of a dataclass.

A trainer mode (framework/jobs/mode_registry.py) and a distribution option
(option.py) each declare their own flags as a dataclass whose fields are
`Flag(default, help)`: the field's name is the flag's (after the
registry's prefix, if any), its default the flag's, and its kind (absl's
DEFINE_string, _bool, _integer or _float) comes from the default; a flag
with `choices` is an enum. Their registry defines the flags in absl from
the fields (`Define`) and reads their values back into the dataclass
(`Read`), from absl's FLAGS or from a {flag name: value} mapping (what
trainer_lib.TrainerOptions carries). The trainer's common flags are
declared so too (framework/jobs/trainer_options.py), each with the check
of its value (`check`) that runs before TensorFlow loads.

It lives in framework/distribute because that is the lowest room the
registries may import (the modes and the common flags are in
framework/jobs, above it).
No TensorFlow and no absl import: the trainer defines and checks its flags
before TensorFlow loads, and the caller passes absl's `flags` module.

Example:
  @dataclasses.dataclass
  class TpuFlags:
    tpu: str = flag_fields.Flag('', 'Train on this Cloud TPU.')

  for f in dataclasses.fields(TpuFlags):
    flag_fields.Define(flags, f, f.name, f.metadata['help'])
  flag_fields.Read(TpuFlags, flags.FLAGS)   # TpuFlags(tpu='...')
"""
import dataclasses

KINDS = ('string', 'bool', 'integer', 'float')


def Flag(default, help_text, kind=None, choices=None, check=None):
  """A field of a FLAGS dataclass: its default, its help, and its absl kind
  ('string', 'bool', 'integer' or 'float'; default: from the default's
  type, which a default of None cannot give).

  Args:
    default: the flag's default.
    help_text: its help line, or a function of no arguments giving it when
      the flag is defined (a registry's listing).
    kind: as above; not with `choices`.
    choices: the values of an enum flag (absl's DEFINE_enum), or a function
      of no arguments giving them when the flag is defined or checked (a
      registry's names: those registered by then).
    check: None, or check(name, value) of one value, raising the caller's
      error (the trainer's UserError) that names the flag, the value and
      the rule; its registry runs it before TensorFlow loads.

  Raises:
    ValueError: no kind, or not one of KINDS.
  """
  if choices is not None:
    kind = 'enum'
  else:
    if kind is None:
      kind = {str: 'string', bool: 'bool', int: 'integer',
              float: 'float'}.get(type(default))
    if kind not in KINDS:
      raise ValueError(f'Flag(default={default!r}): kind={kind!r} must be '
                       f'one of {", ".join(KINDS)} (give it for a default '
                       'of None).')
  return dataclasses.field(default=default, metadata=dict(
      help=help_text, kind=kind, choices=choices, check=check))


def HelpOf(field):
  """The help line of a `Flag` field (its function called, if it is one)."""
  text = field.metadata['help']
  return text() if callable(text) else text


def ChoicesOf(field):
  """The values of an enum `Flag` field, as a tuple; None for another."""
  choices = field.metadata.get('choices')
  return tuple(choices() if callable(choices) else choices) if (
      choices is not None) else None


@dataclasses.dataclass
class NoFlags:
  """The FLAGS of a mode or an option without flags of its own."""


def Names(flags_cls, prefix=''):
  """The flag names of the dataclass `flags_cls`, in its field order."""
  return [prefix + f.name for f in dataclasses.fields(flags_cls)]


def Define(flags_module, field, name, help_text, flag_values=None,
           module_name=None):
  """Defines the flag `name` of a `Flag` field in absl.

  Args:
    flags_module: absl's `flags` module.
    field: the dataclasses.Field (its default and kind).
    name: the flag's name (the field's, after its registry's prefix).
    help_text: its help line (the field's help, as its registry words it).
    flag_values: the absl FlagValues (None: absl's FLAGS).
    module_name: the module --helpfull lists it under (None: this one).
  """
  if flag_values is None:
    flag_values = flags_module.FLAGS
  kind = field.metadata['kind']
  if kind == 'enum':
    flags_module.DEFINE_enum(name, field.default, list(ChoicesOf(field)),
                             help_text, flag_values=flag_values,
                             module_name=module_name)
    return
  define = getattr(flags_module, f'DEFINE_{kind}')
  define(name, field.default, help_text, flag_values=flag_values,
         module_name=module_name)


def Read(flags_cls, values, prefix=''):
  """An instance of `flags_cls` with the values of its flags.

  Args:
    flags_cls: a dataclass of `Flag` fields.
    values: a dict {flag name: value}, or an object with the flags as
      attributes (absl's FLAGS, a namespace); a flag it lacks has its
      default.
    prefix: the flags' names are prefix + field name.
  """
  out = {}
  for f in dataclasses.fields(flags_cls):
    name = prefix + f.name
    out[f.name] = (values.get(name, f.default) if isinstance(values, dict)
                   else getattr(values, name, f.default))
  return flags_cls(**out)


def Values(flags_cls, values, prefix=''):
  """{flag name: value} of the flags of `flags_cls` in `values` (as for
  `Read`)."""
  flags = Read(flags_cls, values, prefix)
  return {prefix + f.name: getattr(flags, f.name)
          for f in dataclasses.fields(flags_cls)}


def Given(flags, prefix=''):
  """['--name', ...] of the flags of the dataclass instance `flags` that
  are not at their default."""
  return [f'--{prefix}{f.name}' for f in dataclasses.fields(flags)
          if getattr(flags, f.name) != f.default]
