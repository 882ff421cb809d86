"""Checks of params values, with the house's error messages.

Every check names its owner (the class and the layer's path or the params'
name), the field, the value and the rule, e.g.

  ProjectionLayer 'lm.softmax': input_dim=0 must be an int >= 1.

so a user can find the value in `params.txt` and knows what to write
instead. Layers validate in `__init__` and in `FPropMeta`, both before any
step runs; the trainer reports the ValueError as one line and exit code 2.

Example:
  owner = validation.Owner(self)                 # "Conv2DLayer 'net.conv'"
  validation.CheckInt(owner, 'num_heads', p.num_heads)
  validation.CheckProb(owner, 'dropout_prob', p.dropout_prob)
  raise validation.Error(owner, 'num_heads', p.num_heads,
                         f'must divide input_dim={p.input_dim}.')
"""
import difflib
import numbers

from cadence.framework import hyperparams


# SingleTaskModel fills `task.input` from the model's `input` (base_model.py):
# a user overrides `input...`, so that is the path errors name.
_FILLED_FROM = (('task.input', 'input'),)


def UserPath(path):
  """The params path a user overrides for `path` (e.g. 'task.input.x' ->
  'input.x': the task's input is a copy of the model's)."""
  for copy, source in _FILLED_FROM:
    if path == copy or path.startswith(copy + '.'):
      return source + path[len(copy):]
  return path


def Owner(obj, name=None):
  """"<Class> '<path or name>'" for error messages.

  Args:
    obj: a layer (its `path` is used), an object with `params.name`, a
      class (pass `name`), or the InstantiableParams of a class: then the
      params' own path in the experiment's tree is named too, e.g.
      "PipeliningLayer (params 'task.stack_tpl.pipeline_tpl')", which is
      the key to override.
    name: overrides the name part.
  """
  where = ''
  if isinstance(obj, type):
    cls = obj
  elif isinstance(obj, hyperparams.InstantiableParams):
    cls = obj.cls
    if name is None and 'name' in obj:
      name = obj.name
    if obj.Path():
      where = f' (params {UserPath(obj.Path())!r})'
  else:
    cls = type(obj)
    params = getattr(obj, 'params', None)
    if isinstance(params, hyperparams.Params) and params.Path():
      where = f' (params {UserPath(params.Path())!r})'
  if name is None:
    name = getattr(obj, 'path', None)
  if name is None and hasattr(obj, 'params'):
    name = getattr(obj.params, 'name', None)
  label = getattr(cls, '__name__', str(cls))
  return (f'{label} {name!r}' if name else label) + where


def ShortRepr(value, limit=160, string_limit=1000):
  """repr of a params value for one line: layer params as `Class.Params()`,
  anything longer than `limit` characters cut at its end with '...'. A
  string (a path, a file pattern: what the user must see to fix it) is
  kept whole up to `string_limit` characters, and a longer one cut in its
  middle, so that it keeps its start and its file's name."""
  if isinstance(value, hyperparams.InstantiableParams):
    return f'{getattr(value.cls, "__name__", value.cls)}.Params()'
  if isinstance(value, (list, tuple)) and value and all(
      isinstance(v, hyperparams.Params) for v in value):
    inner = ', '.join(ShortRepr(v, limit) for v in value)
    text = f'[{inner}]' if isinstance(value, list) else f'({inner})'
  else:
    text = repr(value)
  if isinstance(value, str):
    if len(text) <= string_limit:
      return text
    head = (string_limit - 3) // 2
    return text[:head] + '...' + text[len(text) - (string_limit - 3 - head):]
  return text if len(text) <= limit else text[:limit - 3] + '...'


def Error(owner, field, value, rule, error_cls=ValueError):
  """The exception `<owner>: <field>=<value> <rule>` (not raised); the value
  as `ShortRepr` gives it."""
  return error_cls(f'{owner}: {field}={ShortRepr(value)} {rule}')


def FieldError(params, field, value, rule, error_cls=ValueError):
  """The exception `<Class> '<name>': <params path>.<field>=<value> <rule>`
  (not raised): the field named by its full params path, the key a user
  overrides (e.g. `task.net_tpl.units[2]`), or by `field` alone for params
  outside an experiment's tree.

  Example:
    raise FieldError(p, 'units[2]', p.units[2], 'must be a Layer.Params().')
  """
  path = UserPath(params.Path())
  where = f'{path}.{field}' if path else field
  owner = 'Params'
  if isinstance(params, hyperparams.InstantiableParams):
    owner = Owner(params.cls, name=params.name if 'name' in params else None)
  return error_cls(f'{owner}: {where}={ShortRepr(value)} {rule}')


def IsInt(value, low=None, high=None):
  """True for an int (not a bool) within [low, high] (None: unbounded)."""
  return (isinstance(value, numbers.Integral) and
          not isinstance(value, bool) and
          (low is None or value >= low) and (high is None or value <= high))


def IsNumber(value):
  """True for a real number that is not a bool."""
  return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _Range(low, high, low_open=False, high_open=False):
  left, right = '(' if low_open else '[', ')' if high_open else ']'
  lo = '-inf' if low is None else f'{low:g}'
  hi = 'inf' if high is None else f'{high:g}'
  return f'{left}{lo}, {hi}{right}'


def CheckInt(owner, field, value, low=1, high=None):
  """Raises unless `value` is an int in [low, high]; returns it."""
  if not IsInt(value, low, high):
    rule = (f'must be an int >= {low}' if high is None else
            f'must be an int in [{low}, {high}]')
    raise Error(owner, field, value, rule + '.')
  return value


def CheckOptionalInt(owner, field, value, low=1, high=None):
  """Like CheckInt, but None is allowed."""
  if value is not None and not IsInt(value, low, high):
    rule = (f'must be None or an int >= {low}' if high is None else
            f'must be None or an int in [{low}, {high}]')
    raise Error(owner, field, value, rule + '.')
  return value


def CheckNumber(owner, field, value, low=None, high=None, low_open=False,
                high_open=False):
  """Raises unless `value` is a real number (not a bool) in the range."""
  ok = IsNumber(value) and (
      low is None or (value > low if low_open else value >= low)) and (
          high is None or (value < high if high_open else value <= high))
  if not ok:
    if high is None and low is not None:
      rule = f'> {low:g}' if low_open else f'>= {low:g}'
    elif low is None and high is not None:
      rule = f'< {high:g}' if high_open else f'<= {high:g}'
    else:
      rule = 'in ' + _Range(low, high, low_open, high_open)
    raise Error(owner, field, value, f'must be a number {rule}.')
  return value


def CheckProb(owner, field, value):
  """A dropout-style probability: a number in [0, 1)."""
  if not (IsNumber(value) and 0.0 <= value < 1.0):
    raise Error(owner, field, value, 'must be a probability in [0, 1).')
  return value


def CheckBool(owner, field, value):
  if not isinstance(value, bool):
    raise Error(owner, field, value, 'must be True or False.')
  return value


def CheckIntList(owner, field, value, length=None, low=1):
  """A list/tuple of ints >= low (of `length` items if given)."""
  ok = isinstance(value, (list, tuple)) and (
      length is None or len(value) == length) and all(
          IsInt(v, low) for v in value)
  if not ok:
    what = f'{length} ' if length is not None else ''
    raise Error(owner, field, value, f'must be a list of {what}ints >= '
                f'{low}.')
  return value


def CheckOneOf(owner, field, value, choices):
  """Raises unless `value` is one of `choices`, suggesting the closest."""
  if value in choices:
    return value
  by_lower = {str(c).lower(): c for c in choices}
  close = difflib.get_close_matches(str(value).lower(), list(by_lower), n=1,
                                    cutoff=0.6)
  hint = f' Did you mean {by_lower[close[0]]!r}?' if close else ''
  raise Error(owner, field, value,
              f'must be one of {", ".join(map(repr, choices))}.{hint}')


def CheckDivides(owner, field, value, total, total_name):
  """Raises unless the int `value` divides `total` (an int)."""
  if total % value:
    raise Error(owner, field, value, f'must divide {total_name}={total}; '
                f'{total} % {value} = {total % value}.')
  return value
