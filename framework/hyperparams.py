"""Hyper-parameters: a tree of described knobs that round-trips through text.

A `Params` holds named values, each defined once with a description. Values may
be nested `Params` or lists/tuples of `Params`, addressed by dotted keys such as
`'encoder.dim'` or `'layers[1].dim'`. `ToText()` writes one `key : value` line
per leaf (the `params.txt` dump); `FromText()` reads such lines back into an
existing structure (the `--model_params_override` path).

Value encoding used by `ToText`/`FromText` (every form is a Python expression):
  * None, bool, int, str, float: Python literals (`'a\\n'`, `1e-05`, `inf`,
    `-inf`, `nan`); lists, tuples (`(1,)`) and dicts of encodable values.
  * classes: `type('package.module.Class')`; functions:
    `function('package.module.func')`; enum members:
    `enum('package.module.Enum.MEMBER')`; dtypes: `tf.float32`.
"""
import ast
import copy
import difflib
import enum
import importlib
import re
import types

import tensorflow as tf

_NAME_RE = re.compile(r'^[a-z][a-z0-9_]*$')
_KEY_PART_RE = re.compile(r'^([a-z][a-z0-9_]*)((?:\[\d+\])*)$')
_INDEX_RE = re.compile(r'\[(\d+)\]')
# Values shared, not copied, by `Params.Copy`.
_SHARED_TYPES = (type, types.FunctionType, types.BuiltinFunctionType,
                 types.MethodType, types.ModuleType, tf.dtypes.DType,
                 enum.Enum)
_FUNCTION_TYPES = (types.FunctionType, types.BuiltinFunctionType)


# ------------------------------------------------------------ helpers ----
def _Join(path, name):
  return f'{path}.{name}' if path else name


def _Where(path):
  return repr(path) if path else "'<root>'"


def _DidYouMean(name, candidates):
  close = difflib.get_close_matches(name, list(candidates), n=3, cutoff=0.6)
  if close:
    return '; did you mean ' + ', '.join(repr(c) for c in close) + '?'
  return '; defined params: ' + (', '.join(sorted(candidates)) or '(none)')


def _NaturalKey(key):
  """Sort key that orders 'layers[2]' before 'layers[10]'."""
  return [int(t) if t.isdigit() else t for t in re.split(r'(\d+)', key)]


def _ParseKey(key):
  """'a.b[1].c' -> [('a', []), ('b', [1]), ('c', [])]."""
  parts = []
  for part in key.split('.'):
    m = _KEY_PART_RE.match(part)
    if not m:
      raise ValueError(f'Bad params key {key!r}: part {part!r} is not '
                       "'name' or 'name[index]' with a snake_case name")
    parts.append((m.group(1), [int(i) for i in _INDEX_RE.findall(m.group(2))]))
  return parts


def _Index(value, indices, path):
  """Applies list indices to `value`; returns (item, path of the item)."""
  for i in indices:
    if not isinstance(value, (list, tuple)):
      raise TypeError(f'{path!r} is a {type(value).__name__}, not a list or '
                      f'tuple; cannot index it with [{i}]')
    if i >= len(value):
      raise IndexError(f'{path!r} has {len(value)} items; index [{i}] is '
                       'out of range')
    value, path = value[i], f'{path}[{i}]'
  return value, path


def _Children(value):
  """(suffix, Params) pairs reachable from one value: itself or its items."""
  if isinstance(value, Params):
    return [('', value)]
  if (isinstance(value, (list, tuple)) and value and
      all(isinstance(x, Params) for x in value)):
    return [(f'[{i}]', x) for i, x in enumerate(value)]
  return []


def _CopyValue(value):
  if isinstance(value, Params):
    return value.Copy()
  if isinstance(value, _SHARED_TYPES):
    return value
  if type(value) is list:  # pylint: disable=unidiomatic-typecheck
    return [_CopyValue(x) for x in value]
  if type(value) is tuple:  # pylint: disable=unidiomatic-typecheck
    return tuple(_CopyValue(x) for x in value)
  if type(value) is dict:  # pylint: disable=unidiomatic-typecheck
    return {k: _CopyValue(x) for k, x in value.items()}
  return copy.deepcopy(value)


def _Import(path):
  """Resolves 'package.module.Attr.attr' to the object it names."""
  parts = path.split('.')
  for i in range(len(parts), 0, -1):
    module_name = '.'.join(parts[:i])
    try:
      obj = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
      if e.name and not module_name.startswith(e.name):
        raise  # The module exists but one of its own imports is missing.
      continue
    try:
      for attr in parts[i:]:
        obj = getattr(obj, attr)
    except AttributeError:
      raise ValueError(f'cannot resolve {path!r}: module {module_name!r} '
                       f'has no {".".join(parts[i:])!r}') from None
    return obj
  raise ValueError(f'cannot resolve {path!r}: no importable module prefix')


def _Resolves(path, obj):
  try:
    return _Import(path) is obj
  except (ImportError, ValueError):
    return False


def _PublicPaths(obj):
  """The public names a library exported `obj` under, if it says so.

  Keras (and other libraries exporting with namex) set `_api_export_path`
  on the exported class or function itself: keras.layers.Dense is defined
  in keras.src.layers.core.dense but exported as 'keras.layers.Dense'.
  Only the object's own attribute counts (a subclass inherits it).
  """
  paths = vars(obj).get('_api_export_path') if hasattr(obj, '__dict__') else (
      None)
  if isinstance(paths, str):
    return [paths]
  return [p for p in paths if isinstance(p, str)] if isinstance(
      paths, (list, tuple)) else []


def _ImportPath(obj):
  """The import path of a class or function; checks that it resolves back.

  A library's public name is preferred to the defining module's path
  (`type('keras.layers.Dense')`, not `type('keras.src.layers...')`).
  """
  for public in _PublicPaths(obj):
    if _Resolves(public, obj):
      return public
  module = getattr(obj, '__module__', None)
  qualname = getattr(obj, '__qualname__', '')
  if not module or not qualname or '<' in qualname:
    raise ValueError(f'{obj!r} has no import path (lambdas and local '
                     'classes/functions cannot be written to text)')
  path = f'{module}.{qualname}'
  if not _Resolves(path, obj):
    raise ValueError(f'{obj!r}: import path {path!r} does not resolve to it')
  return path


def _Encode(value):
  """Encodes one leaf value as a Python expression that `_Decode` reads."""
  if value is None or isinstance(value, (bool, str)):
    return repr(value)
  if isinstance(value, enum.Enum):
    return f'enum({_ImportPath(type(value)) + "." + value.name!r})'
  if isinstance(value, int):
    return int.__repr__(value)
  if isinstance(value, float):
    return float.__repr__(value)
  if isinstance(value, tf.dtypes.DType):
    return f'tf.{value.name}'
  if isinstance(value, type):
    return f'type({_ImportPath(value)!r})'
  if isinstance(value, _FUNCTION_TYPES):
    return f'function({_ImportPath(value)!r})'
  if type(value) is list:  # pylint: disable=unidiomatic-typecheck
    return '[' + ', '.join(_Encode(x) for x in value) + ']'
  if type(value) is tuple:  # pylint: disable=unidiomatic-typecheck
    inner = ', '.join(_Encode(x) for x in value)
    return f'({inner},)' if len(value) == 1 else f'({inner})'
  if type(value) is dict:  # pylint: disable=unidiomatic-typecheck
    return '{' + ', '.join(f'{_Encode(k)}: {_Encode(x)}'
                           for k, x in value.items()) + '}'
  raise ValueError(f'cannot encode {value!r} of type {type(value).__name__}')


_MARKERS = {
    'type': lambda obj: isinstance(obj, type),
    'function': lambda obj: callable(obj) and not isinstance(obj, type),
    'enum': lambda obj: isinstance(obj, enum.Enum),
}


def _EvalNode(node):
  """Evaluates the restricted expression grammar written by `_Encode`."""
  if isinstance(node, ast.Constant):
    return node.value
  if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
    operand = _EvalNode(node.operand)
    if isinstance(operand, (int, float)) and not isinstance(operand, bool):
      return -operand if isinstance(node.op, ast.USub) else operand
  elif isinstance(node, ast.List):
    return [_EvalNode(e) for e in node.elts]
  elif isinstance(node, ast.Tuple):
    return tuple(_EvalNode(e) for e in node.elts)
  elif isinstance(node, ast.Dict) and None not in node.keys:
    return {_EvalNode(k): _EvalNode(v) for k, v in zip(node.keys, node.values)}
  elif isinstance(node, ast.Name) and node.id in ('inf', 'nan'):
    return float(node.id)
  elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and
        node.value.id == 'tf'):
    try:
      return tf.dtypes.as_dtype(node.attr)
    except TypeError:
      raise ValueError(f'tf.{node.attr} is not a dtype') from None
  elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and
        node.func.id in _MARKERS and len(node.args) == 1 and
        not node.keywords and isinstance(node.args[0], ast.Constant) and
        isinstance(node.args[0].value, str)):
    obj = _Import(node.args[0].value)
    if not _MARKERS[node.func.id](obj):
      raise ValueError(f'{node.args[0].value!r} is not a {node.func.id}')
    return obj
  raise ValueError(f'unsupported expression {ast.unparse(node)!r}')


def _Decode(text):
  try:
    tree = ast.parse(text.strip(), mode='eval')
  except SyntaxError as e:
    raise ValueError(f'not a valid expression: {e.msg}') from None
  return _EvalNode(tree.body)


class _Param:
  __slots__ = ('value', 'description')

  def __init__(self, value, description):
    self.value = value
    self.description = description


# ------------------------------------------------------------- Params ----
class Params:
  """An ordered set of described hyper-parameters with attribute access.

  Example:
    p = Params()
    p.Define('dim', 8, 'Model width.')
    p.Define('ffn', Params(), 'Feed-forward block.')
    p.ffn.Define('hidden', 32, 'Hidden width of the feed-forward block.')
    p.Set(dim=16, **{'ffn.hidden': 64})
    assert p.Get('ffn.hidden') == 64
    q = p.Copy().FromText('dim : 4')  # Updates an existing structure.
    assert p.TextDiff(q) == '- dim : 16\n+ dim : 4\n'

  Attribute access to an undefined name raises AttributeError naming the
  params path and close matches. A nested Params learns its path
  (`'encoder.ffn'`, `'layers[1]'`) when assigned; a shared instance keeps the
  path of its latest assignment. Iteration yields (name, value) in definition
  order; `ToText` sorts by key.
  """

  def __init__(self):
    object.__setattr__(self, '_params', {})
    object.__setattr__(self, '_frozen', False)
    object.__setattr__(self, '_path', '')

  # -- definition and access --
  def Define(self, name, default, description):
    """Defines param `name` with a `default` value and a `description`."""
    if self._frozen:
      raise TypeError(f'Params {_Where(self._path)} is frozen; cannot define '
                      f'{name!r}')
    if not isinstance(name, str) or not _NAME_RE.match(name):
      raise ValueError(f'Params {_Where(self._path)}: param name {name!r} must '
                       f'match {_NAME_RE.pattern} (snake_case)')
    if name in self._params:
      raise ValueError(f'Params {_Where(self._path)}: param {name!r} is '
                       'already defined')
    if not isinstance(description, str) or not description.strip():
      raise ValueError(f'Params {_Where(self._path)}: param {name!r} needs a '
                       'non-empty description')
    self._params[name] = _Param(default, description)
    self._AttachPaths(name)

  def _Lookup(self, name, path):
    if name not in self._params:
      deeper = self._NestedKeysNamed(name, path)
      hint = (f'; did you mean {" or ".join(map(repr, deeper[:3]))}?' if
              deeper else _DidYouMean(name, self._params))
      raise AttributeError(f'Params {_Where(path)} has no param {name!r}' +
                           hint)
    return self._params[name].value

  def _NestedKeysNamed(self, name, path):
    """Full keys of params called `name` nested below this one, shallowest
    first: where a knob that moved into a sub-template now lives."""
    found = []
    frontier = [(self, path)]
    while frontier:
      deeper = []
      for node, node_path in frontier:
        params = node._params  # pylint: disable=protected-access
        for key, param in params.items():
          for suffix, child in _Children(param.value):
            child_path = _Join(node_path, key) + suffix
            if name in child._params:  # pylint: disable=protected-access
              found.append(_Join(child_path, name))
            deeper.append((child, child_path))
      frontier = deeper
    return found

  def _SetValue(self, name, value, path):
    if self._frozen:
      raise TypeError(f'Params {_Where(path)} is frozen; cannot set {name!r}')
    self._Lookup(name, path)
    self._params[name].value = value
    self._AttachPaths(name)

  def _AttachPaths(self, name):
    for suffix, child in _Children(self._params[name].value):
      child._SetPath(_Join(self._path, name) + suffix)  # pylint: disable=protected-access

  def _SetPath(self, path):
    object.__setattr__(self, '_path', path)
    for name in self._params:
      self._AttachPaths(name)

  def __getattr__(self, name):
    if name.startswith('_'):  # Internals, and copy/pickle probes.
      raise AttributeError(name)
    return self._Lookup(name, self._path)

  def __setattr__(self, name, value):
    self._SetValue(name, value, self._path)

  def __dir__(self):
    return list(super().__dir__()) + list(self._params)

  def _Resolve(self, key):
    """Walks a dotted key to the Params that owns its last part."""
    parts = _ParseKey(key)
    node, path = self, self._path
    for name, indices in parts[:-1]:
      value, path = _Index(node._Lookup(name, path), indices, _Join(path, name))
      if not isinstance(value, Params):
        raise AttributeError(f'{path!r} is a {type(value).__name__}, not '
                             f'Params; cannot resolve {key!r}')
      node = value
    name, indices = parts[-1]
    return node, name, indices, path

  def Get(self, key):
    """Returns the value at a dotted key such as 'layers[1].dim'."""
    node, name, indices, path = self._Resolve(key)
    return _Index(node._Lookup(name, path), indices, _Join(path, name))[0]

  def Set(self, **kwargs):
    """Sets values by name or dotted key (`**{'a.b': 1}`); returns self."""
    for key, value in kwargs.items():
      self._SetKey(key, value)
    return self

  def _SetKey(self, key, value):
    node, name, indices, path = self._Resolve(key)
    if not indices:
      node._SetValue(name, value, path)
      return
    if node._frozen:
      raise TypeError(f'Params {_Where(path)} is frozen; cannot set {key!r}')
    container, where = _Index(node._Lookup(name, path), indices[:-1],
                              _Join(path, name))
    _Index(container, indices[-1:], where)  # Checks type and range.
    if isinstance(container, list):
      container[indices[-1]] = value
    elif len(indices) == 1:  # A tuple held directly by the param: rebuild it.
      items = list(container)
      items[indices[-1]] = value
      node._params[name].value = tuple(items)
    else:
      raise TypeError(f'{where!r} is a tuple; cannot assign {key!r} in it')
    node._AttachPaths(name)

  def Delete(self, *names):
    """Removes params by name; returns self."""
    for name in names:
      if self._frozen:
        raise TypeError(f'Params {_Where(self._path)} is frozen; cannot '
                        f'delete {name!r}')
      self._Lookup(name, self._path)
      del self._params[name]
    return self

  def GetDescription(self, name):
    self._Lookup(name, self._path)
    return self._params[name].description

  # -- copy and freeze --
  def Path(self):
    """Where this Params sits in the tree it was defined in, e.g.
    'task.stack_tpl' ('' for a root); copies keep it."""
    return self._path

  def Copy(self):
    """A deep, unfrozen copy of the same class (classes, functions, dtypes,
    enums and modules are shared, not copied)."""
    new = object.__new__(type(self))
    Params.__init__(new)
    for name, param in self._params.items():
      new._params[name] = _Param(_CopyValue(param.value), param.description)
    new._SetPath(self._path)
    return new

  def Freeze(self):
    """Makes this Params and every nested Params read-only; returns self."""
    object.__setattr__(self, '_frozen', True)
    for param in self._params.values():
      for _, child in _Children(param.value):
        child.Freeze()
    return self

  def IsFrozen(self):
    return self._frozen

  # -- container protocol --
  def __iter__(self):
    return iter([(name, p.value) for name, p in self._params.items()])

  def __contains__(self, name):
    return name in self._params

  def __len__(self):
    return len(self._params)

  def __eq__(self, other):
    """Same class, same names and equal values (nested Params compared too)."""
    if type(self) is not type(other):  # pylint: disable=unidiomatic-typecheck
      return NotImplemented
    return ({n: p.value for n, p in self._params.items()} ==
            {n: p.value for n, p in other._params.items()})

  __hash__ = None

  def __str__(self):
    return ''.join(f'{k} : {v}\n' for k, v in self._SortedItems(True))

  def __repr__(self):
    return f'{type(self).__name__}({_Where(self._path)}):\n{self}'

  # -- text --
  def _Flatten(self, prefix, out, lenient):
    for name, param in self._params.items():
      key = _Join(prefix, name)
      children = _Children(param.value)
      for suffix, child in children:
        child._Flatten(key + suffix, out, lenient)
      if children:
        continue
      try:
        out[key] = _Encode(param.value)
      except ValueError as e:
        if not lenient:
          raise ValueError(f'Params {_Where(self._path)}: cannot write '
                           f'{key!r} to text: {e}') from None
        out[key] = repr(param.value)

  def _SortedItems(self, lenient):
    out = {}
    self._Flatten('', out, lenient)
    return sorted(out.items(), key=lambda kv: _NaturalKey(kv[0]))

  def ToText(self):
    """One 'dotted.key : value' line per leaf, sorted by key.

    Nested Params expand into dotted keys and lists/tuples of Params into
    indexed keys ('layers[0].dim : 4'); a nested Params with no params writes
    no line. Raises ValueError for a value with no text form (e.g. a lambda).
    """
    return ''.join(f'{k} : {v}\n' for k, v in self._SortedItems(False))

  def FromText(self, text):
    """Sets the 'key : value' lines of `text` into this Params; returns self.

    Blank lines and lines starting with '#' are skipped. Keys must already
    exist. Errors name the 1-based line number.
    """
    for lineno, line in enumerate(text.splitlines(), 1):
      line = line.strip()
      if not line or line.startswith('#'):
        continue
      key, sep, value_text = line.partition(' : ')
      if not sep:
        raise ValueError(f"line {lineno}: expected 'key : value', got {line!r}")
      key = key.strip()
      try:
        value = _Decode(value_text)
      except ValueError as e:
        raise ValueError(f'line {lineno}: cannot parse the value of {key!r}: '
                         f'{value_text!r} ({e})') from None
      try:
        self._SetKey(key, value)
      except (AttributeError, IndexError, TypeError, ValueError) as e:
        raise type(e)(f'line {lineno}: {e}') from None
    return self

  def TextDiff(self, other):
    """Line diff of `self.ToText()` against `other.ToText()`.

    Returns one '- key : value' line (value in self) and/or one
    '+ key : value' line (value in other) per key whose text differs, sorted
    by key; a key present on one side only gets only its own line. Returns ''
    when both texts are equal. Values without a text form show their repr.
    """
    mine, theirs = dict(self._SortedItems(True)), dict(other._SortedItems(True))
    lines = []
    for key in sorted(set(mine) | set(theirs), key=_NaturalKey):
      if mine.get(key) == theirs.get(key):
        continue
      if key in mine:
        lines.append(f'- {key} : {mine[key]}\n')
      if key in theirs:
        lines.append(f'+ {key} : {theirs[key]}\n')
    return ''.join(lines)


class InstantiableParams(Params):
  """Params with a `cls` param; `Instantiate()` builds `cls(params)`.

  Example:
    p = InstantiableParams(MyLayer)
    p.Define('dim', 4, 'Output width.')
    layer = p.Instantiate()  # MyLayer(p)
  """

  def __init__(self, cls=None):
    super().__init__()
    self.Define('cls', cls,
                'The class Instantiate() builds, called as cls(params, **kw).')

  def Instantiate(self, **kwargs):
    """Returns `self.cls(self, **kwargs)`."""
    if self.cls is None:
      raise ValueError(f'InstantiableParams {_Where(self._path)}: cls is None; '
                       'set p.cls before Instantiate()')
    return self.cls(self, **kwargs)
