"""The model registry: experiment classes by key.

An experiment is a class decorated with `RegisterSingleTaskModel` (or
`RegisterMultiTaskModel`). Its key names it in one of two ways:

  * a short key, for Cadence's own experiments in
    `params/<domain>/<file>.py`: the module path below `cadence.params`
    plus the class name, e.g. 'lm.one_billion_wds.Foo';
  * a full key, for an experiment in any other importable module (the
    user's own package): the module's dotted path plus the class name,
    e.g. 'my_pkg.my_module.MyExp'.

  # my_pkg/my_module.py (my_pkg on the Python path)
  from cadence.framework import model_registry
  from cadence.params.synthetic import linear_regression

  @model_registry.RegisterSingleTaskModel
  class MyExp(linear_regression.RegressionTiny):
    INPUT_DIM = 4

  model_registry.GetParams('my_pkg.my_module.MyExp', 'Train')

A key whose module is found under cadence.params is a short key; any
other is a full one. Modules are imported on demand from the key, so
`trainer.py` imports only the experiment it runs; a class runs only if
it is registered. The registry is the one table this module
owns; it is filled by the decorators at import time and read through the
functions below.

`CheckKey` answers a key without importing anything: it finds the key's
module as `import` would, without running it or its packages' __init__,
and reads its source with `ast` (milliseconds, against seconds for
importing an experiment and TensorFlow). So the trainer answers a
misspelt --model before TensorFlow loads, with the closest keys of both
kinds (the short keys, and those of the user's module or of the modules
beside it), a class without the decorator with a line saying to add it,
and a module that does not parse with its file, line and error.
`GetClass` imports; a module whose import fails gets one line naming the
file, the line and the Python error. This module imports no TensorFlow.
"""
import ast
import difflib
import importlib
import inspect
import os
import pkgutil
import sys
import traceback

_PARAMS_PACKAGE = 'cadence.params'
DATASETS = ('Train', 'Dev', 'Test')

# key -> (experiment class, kind, 'file:line' of its registration); kind is
# 'single_task' or 'multi_task'.
_registry = {}


def KeyOf(cls):
  """The registry key of an experiment class: its short key under
  cadence.params, else its full key (see the module docstring)."""
  module = cls.__module__
  prefix = _PARAMS_PACKAGE + '.'
  if module.startswith(prefix):
    module = module[len(prefix):]
  return f'{module}.{cls.__name__}'


def _Register(cls, kind, where):
  key = KeyOf(cls)
  old = _registry.get(key)
  if old is not None:
    old_cls, _, old_where = old
    # Re-importing or reloading a module re-runs the same registration line;
    # a different class, or a second one of the same name in the module that
    # is executing now, is a real duplicate.
    executing = sys.modules.get(cls.__module__)
    if where != old_where and (
        old_cls.__qualname__ != cls.__qualname__ or
        getattr(executing, cls.__name__, None) is old_cls):
      raise ValueError(
          f'Model key {key!r} is registered twice: {old_where} and {where}.')
  _registry[key] = (cls, kind, where)
  return cls


def _CallerLocation():
  frame = sys._getframe(2)  # pylint: disable=protected-access
  return f'{frame.f_code.co_filename}:{frame.f_lineno}'


def RegisterSingleTaskModel(cls):
  """Class decorator: registers a single-task experiment."""
  return _Register(cls, 'single_task', _CallerLocation())


def RegisterMultiTaskModel(cls):
  """Class decorator: registers a multi-task experiment."""
  return _Register(cls, 'multi_task', _CallerLocation())


def _ImportAll():
  """Imports every module under cadence.params (to list all keys)."""
  package = importlib.import_module(_PARAMS_PACKAGE)
  for info in pkgutil.walk_packages(package.__path__, _PARAMS_PACKAGE + '.'):
    importlib.import_module(info.name)


def GetAllRegisteredKeys():
  """Sorted short keys of every experiment under cadence.params (the
  user's experiments registered in this process are not among them)."""
  _ImportAll()
  prefix = _PARAMS_PACKAGE + '.'
  return sorted(k for k, (cls, _, _) in _registry.items()
                if cls.__module__.startswith(prefix))


# --- a module's source, read without importing it ---


_DECORATORS = ('RegisterSingleTaskModel', 'RegisterMultiTaskModel')


def _Spec(name, path):
  """The spec of module `name` from the meta path finders (`path`: its
  package's __path__, None for a top-level module), or None. A finder
  only looks: nothing is executed."""
  for finder in sys.meta_path:
    try:
      spec = finder.find_spec(name, path)
    except (ImportError, ValueError, AttributeError, TypeError, OSError):
      continue   # A finder that cannot look for this name.
    if spec is not None:
      return spec
  return None


def _FindSource(module):
  """The source file of the dotted `module` ('' for a module without one,
  e.g. a namespace package), or None if there is no such module.

  Each package on the way is found in sys.modules or by the meta path
  finders with its parent's __path__, as `import` does, but none is run
  (not even its __init__).
  """
  parts = module.split('.')
  path, file = None, None
  for i in range(len(parts)):
    name = '.'.join(parts[:i + 1])
    if i and path is None:
      return None   # Its parent is a module, not a package.
    loaded = sys.modules.get(name)
    if loaded is not None:
      path = getattr(loaded, '__path__', None)
      file = getattr(loaded, '__file__', None)
      continue
    spec = _Spec(name, None if i == 0 else list(path))
    if spec is None:
      return None
    path = spec.submodule_search_locations
    file = spec.origin if spec.has_location else None
  return file or ''


def _Parse(path):
  """The `ast` of the source file `path`; SyntaxError if it does not
  parse, OSError or ValueError (null bytes) if it cannot be read."""
  with open(path, 'rb') as f:
    return ast.parse(f.read(), path)


def _IsRegistration(node):
  """True for `RegisterSingleTaskModel` / `model_registry.Register...`."""
  name = node.attr if isinstance(node, ast.Attribute) else getattr(
      node, 'id', None)
  return name in _DECORATORS


def _Registered(tree):
  """Names of the classes a module's source registers: classes decorated
  at its top level, and top-level `Register...(Name)` calls."""
  names = []
  for node in tree.body:
    if isinstance(node, ast.ClassDef) and any(
        _IsRegistration(d) for d in node.decorator_list):
      names.append(node.name)
    elif (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and
          _IsRegistration(node.value.func) and node.value.args and
          isinstance(node.value.args[0], ast.Name)):
      names.append(node.value.args[0].id)
  return names


def _Binding(tree, name):
  """How a module's top level binds `name`: 'registered'; ('class', line)
  for a class without any decorator that is not registered; 'maybe' for
  anything else that may bind it (another class, a function, an
  assignment, an import, `from ... import *`: only its import can say);
  None for nothing."""
  if name in _Registered(tree):
    return 'registered'
  for node in tree.body:
    if isinstance(node, ast.ClassDef) and node.name == name:
      return 'maybe' if node.decorator_list else ('class', node.lineno)
  for node in tree.body:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      bound = [node.name]
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
      bound = [a.asname or a.name.split('.')[0] for a in node.names]
    elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
      targets = getattr(node, 'targets', None) or [node.target]
      bound = [n.id for t in targets for n in ast.walk(t)
               if isinstance(n, ast.Name)]
    else:
      continue
    if name in bound or '*' in bound:
      return 'maybe'
  return None


def _ScanFolders(roots, prefix, recursive=True):
  """Sorted keys (`prefix` + module + class) registered in the source of
  the modules in the folders `roots` (a package's __path__), and with
  `recursive` of the packages below; a file that does not parse or
  cannot be read is skipped (a key naming it is answered with its
  error)."""
  keys = set()
  for root in roots:
    for folder, dirs, files in os.walk(root):
      # Packages only, as pkgutil.walk_packages imports them.
      dirs[:] = sorted(d for d in dirs if recursive and os.path.isfile(
          os.path.join(folder, d, '__init__.py')))
      rel = os.path.relpath(folder, root)
      package = '' if rel == '.' else rel.replace(os.sep, '.')
      for name in sorted(f for f in files if f.endswith('.py')):
        module = package if name == '__init__.py' else '.'.join(
            filter(None, [package, name[:-len('.py')]]))
        try:
          tree = _Parse(os.path.join(folder, name))
        except (SyntaxError, ValueError, OSError):
          continue
        keys.update(prefix + '.'.join(filter(None, [module, cls]))
                    for cls in _Registered(tree))
  return sorted(keys)


def _NearbyKeys(module):
  """Keys registered in the modules beside `module`, a full key's module
  that was not found: those of the deepest package on its path that is
  found, one level deep; [] when none is."""
  parts = module.split('.')
  for i in range(len(parts) - 1, 0, -1):
    package = '.'.join(parts[:i])
    init = _FindSource(package)
    if init and init.endswith('__init__.py'):
      return _ScanFolders([os.path.dirname(init)], package + '.',
                          recursive=False)
  return []


def _At(path, line):
  return f'{path}, line {line}' if line else f'{path}'


def _Text(error):
  """'NameError: name ... is not defined': the error's type and first line."""
  text = (error.msg if isinstance(error, SyntaxError) else
          str(error)).strip().splitlines()
  return f'{type(error).__name__}: {text[0].rstrip(".")}' if text else (
      type(error).__name__)


def _BrokenModuleLine(key, module, error, path=None):
  """The line of a model whose module does not parse or import.

  Args:
    key: the --model key.
    module: the module it names.
    error: the exception: a SyntaxError (from `Parse` or `import`), or
      whatever the module's import raised.
    path: the module's file, when the error does not carry one.

  Returns:
    "Model 'my_pkg.exp.MyExp': cannot import my_pkg.exp: /src/my_pkg/
    exp.py, line 7: SyntaxError: expected ':'." The file and line are the
    syntax error's, else those of the deepest frame running code of a
    module being imported (its body, or a class or function of it): the
    failing line of the user's file, or the line of it that called into
    a library that raised.
  """
  if isinstance(error, SyntaxError):
    place = _At(error.filename or path, error.lineno)
  else:
    frames = traceback.extract_tb(error.__traceback__)
    imported = {f.filename for f in frames if f.name == '<module>'}
    ours = [f for f in frames if f.filename in imported]
    frame = (ours or frames or [None])[-1]
    place = _At(frame.filename, frame.lineno) if frame else path
  return f'Model {key!r}: cannot import {module}: {place}: {_Text(error)}.'


def _NotRegisteredLine(key, name, path, line):
  """The line of a key naming a class that is not a registered
  experiment."""
  return (f'Model {key!r}: class {name} ({_At(path, line)}) is not a '
          'registered experiment: decorate it with '
          '@model_registry.RegisterSingleTaskModel (or '
          'RegisterMultiTaskModel; from cadence.framework import '
          'model_registry).')


# --- keys ---


def ScanKeys():
  """Sorted short keys of the experiments under cadence.params, from the
  source.

  Nothing is imported: the files of the package's folders are parsed with
  `ast` and the classes decorated with RegisterSingleTaskModel or
  RegisterMultiTaskModel (or passed to them at a module's top level) are
  listed. A registration made any other way is not seen here; tests/framework/model_registry_test.py holds this list
  equal to `GetAllRegisteredKeys()`. A file that does not parse is
  skipped (a key naming it is answered with its syntax error).
  """
  package = importlib.import_module(_PARAMS_PACKAGE)
  return _ScanFolders(package.__path__, '')


class ModelError(KeyError):
  """A --model key that names no registered experiment, or whose module
  does not parse or import; its one line is `args[0]`."""

  def __str__(self):
    return self.args[0]


def _UnknownKeyError(key, keys, why=''):
  """The ModelError of an unknown key, naming the closest known keys."""
  close = difflib.get_close_matches(key, keys, n=3, cutoff=0.5)
  hint = (f' Did you mean {", ".join(map(repr, close))}?' if close else
          f' Registered keys: {", ".join(keys) or "(none)"}.')
  return ModelError(f'Unknown model {key!r}{why}.{hint}')


def _Known():
  """The keys to suggest: the short keys and those registered so far."""
  return sorted(set(ScanKeys()) | set(_registry))


def _Split(key):
  """(module, class name, _FindSource of the module) of a key: the module
  under cadence.params when one is found there (a short key), else the
  key's own module path."""
  module, _, name = key.rpartition('.')
  short = f'{_PARAMS_PACKAGE}.{module}'
  path = _FindSource(short)
  return (short, name, path) if path is not None else (
      module, name, _FindSource(module))


def _NotFound(key, module, known):
  """The ModelError of a key whose module is nowhere."""
  module = module[len(_PARAMS_PACKAGE) + 1:] if module.startswith(
      _PARAMS_PACKAGE + '.') else module
  top = module.split('.')[0]
  where = '' if _FindSource(top) is not None else (
      f' (is the folder holding {top}/ on PYTHONPATH, or the current folder '
      'of python -m cadence.trainer or cadence-trainer?)')
  return _UnknownKeyError(
      key, sorted(set(known) | set(_NearbyKeys(module))),
      f': no module {module} under {_PARAMS_PACKAGE} or on the Python '
      f'path{where}')


def CheckKey(key):
  """Raises the ModelError of `GetClass` for a key that no module
  registers, without importing any; returns `key`.

  A short key must be registered in the source of cadence.params
  (`ScanKeys`). A full key's module must be found (on the Python path)
  and parse, and must not define the class without registering it; a
  class its source may bind some other way is left to `GetClass`. Keys
  registered in this process already count too.
  """
  if key in _registry:
    return key
  known = _Known()
  if key in known:
    return key
  if '.' not in key:
    raise _UnknownKeyError(key, known)
  module, name, path = _Split(key)
  if path is None:
    raise _NotFound(key, module, known)
  if not path.endswith('.py'):
    return key   # No source to read (e.g. an extension module).
  try:
    binding = _Binding(_Parse(path), name)
  except SyntaxError as e:
    raise ModelError(_BrokenModuleLine(key, module, e, path)) from None
  except (OSError, ValueError):
    return key   # Its import will say why.
  if isinstance(binding, tuple):
    raise ModelError(_NotRegisteredLine(key, name, path, binding[1]))
  if binding:
    return key
  prefix = key.rpartition('.')[0]
  raise _UnknownKeyError(key, sorted(set(known) | {
      f'{prefix}.{n}' for n in _Registered(_Parse(path))}))


def _Import(key, module):
  """The module `module` imported, or None when it (or a package on its
  path) does not exist.

  Raises:
    ModelError: its import failed (one line: the file, line and error).
  """
  try:
    return importlib.import_module(module)
  except ModuleNotFoundError as e:
    name = e.name or ''
    if module == name or module.startswith(name + '.'):
      return None
    raise ModelError(_BrokenModuleLine(key, module, e)) from e
  except Exception as e:  # pylint: disable=broad-except
    raise ModelError(_BrokenModuleLine(key, module, e)) from e


def _Place(cls):
  """(source file, line) of a class, as far as inspect can tell."""
  try:
    return inspect.getsourcefile(cls), inspect.getsourcelines(cls)[1]
  except (OSError, TypeError):
    return getattr(sys.modules.get(cls.__module__), '__file__', '?'), None


def GetClass(key):
  """Returns the experiment class of `key`, importing its module.

  A full key may also name a registered class through another module
  that imports it (`cadence.params.lm.one_billion_wds.Foo`).

  Raises:
    ModelError (a KeyError): the key names no registered experiment
      (naming the closest keys), a class that is not registered (saying
      to register it), or a module that does not import (its file, line
      and error).
  """
  if key in _registry:
    return _registry[key][0]
  if '.' not in key:
    raise _UnknownKeyError(key, _Known())
  module, name, _ = _Split(key)
  loaded = _Import(key, module)
  if loaded is None:
    raise _NotFound(key, module, _Known())
  if key in _registry:
    return _registry[key][0]
  obj = getattr(loaded, name, None)
  if any(obj is cls for cls, _, _ in _registry.values()):
    return obj
  if isinstance(obj, type):
    raise ModelError(_NotRegisteredLine(key, name, *_Place(obj)))
  raise _UnknownKeyError(key, _Known())


def GetParams(key, dataset):
  """The model params of experiment `key` with `input` set for `dataset`.

  Args:
    key: registry key, e.g. 'lm.one_billion_wds.OneBWdsGPipeTransformerTiny'.
    dataset: 'Train', 'Dev' or 'Test' (case-insensitive): the experiment
      method whose input params become `params.input`.

  Returns:
    The params returned by the experiment's `Model()`, with `input` set.
  """
  cls = GetClass(key)
  name = {d.lower(): d for d in DATASETS}.get(str(dataset).lower())
  if name is None:
    close = difflib.get_close_matches(str(dataset), DATASETS, n=1)
    hint = f' Did you mean {close[0]!r}?' if close else ''
    raise KeyError(
        f'Unknown dataset {dataset!r} for model {key!r}; expected one of '
        f'{", ".join(DATASETS)}.{hint}')
  experiment = cls()
  if not hasattr(experiment, name):
    raise KeyError(f'Model {key!r} defines no {name}() dataset method.')
  params = experiment.Model()
  params.input = getattr(experiment, name)()
  return params
