"""The model registry: experiment classes by key.

An experiment is a class in `params/<domain>/<file>.py` decorated with
`RegisterSingleTaskModel` (or `RegisterMultiTaskModel`). Its key is its
module path below `cadence.params` plus the class name:

  # params/lm/one_billion_wds.py
  @model_registry.RegisterSingleTaskModel
  class Foo(base_model_params.SingleTaskModelParams): ...

  model_registry.GetParams('lm.one_billion_wds.Foo', 'Train')

Modules are imported on demand from the key, so `trainer.py` imports only
the experiment it runs. The registry is the one table this module owns;
it is filled by the decorators at import time and read through the
functions below.

`ScanKeys` lists the keys without importing anything: it reads the
decorators in the source of params/ with `ast` (milliseconds; importing
the experiments imports TensorFlow, seconds), so the trainer answers a
misspelt --model before TensorFlow loads (`CheckKey`). This module imports
no TensorFlow.
"""
import ast
import difflib
import importlib
import os
import pkgutil
import sys

_PARAMS_PACKAGE = 'cadence.params'
DATASETS = ('Train', 'Dev', 'Test')

# key -> (experiment class, kind, 'file:line' of its registration); kind is
# 'single_task' or 'multi_task'.
_registry = {}


def KeyOf(cls):
  """The registry key of an experiment class (see the module docstring)."""
  module = cls.__module__
  prefix = _PARAMS_PACKAGE + '.'
  if not module.startswith(prefix):
    raise ValueError(
        f'Experiment {cls.__qualname__} is defined in module {module!r}; '
        f'registered experiments must live under {_PARAMS_PACKAGE} '
        '(params/<domain>/<file>.py).')
  return f'{module[len(prefix):]}.{cls.__name__}'


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
  """Sorted keys of every experiment under cadence.params."""
  _ImportAll()
  return sorted(_registry)


_DECORATORS = ('RegisterSingleTaskModel', 'RegisterMultiTaskModel')


def _IsRegistration(node):
  """True for `RegisterSingleTaskModel` / `model_registry.Register...`."""
  name = node.attr if isinstance(node, ast.Attribute) else getattr(
      node, 'id', None)
  return name in _DECORATORS


def _ScanModule(path, module):
  """Keys registered in one params module's source: classes decorated at
  its top level, and top-level `Register...(Name)` calls."""
  with open(path, 'rb') as f:
    tree = ast.parse(f.read(), path)
  keys = []
  for node in tree.body:
    if isinstance(node, ast.ClassDef) and any(
        _IsRegistration(d) for d in node.decorator_list):
      keys.append(f'{module}.{node.name}')
    elif (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and
          _IsRegistration(node.value.func) and node.value.args and
          isinstance(node.value.args[0], ast.Name)):
      keys.append(f'{module}.{node.value.args[0].id}')
  return keys


def ScanKeys():
  """Sorted keys of the experiments under cadence.params, from the source.

  Nothing is imported: the files of the package's folders are parsed with
  `ast` and the classes decorated with RegisterSingleTaskModel or
  RegisterMultiTaskModel (or passed to them at a module's top level) are
  listed. A registration made any other way is not seen here;
  tests/framework/model_registry_test.py holds this list equal to
  `GetAllRegisteredKeys()`. A file that does not parse is skipped (its
  import will report it).
  """
  package = importlib.import_module(_PARAMS_PACKAGE)
  keys = set()
  for root in package.__path__:
    for folder, dirs, files in os.walk(root):
      # Packages only, as pkgutil.walk_packages imports them.
      dirs[:] = sorted(d for d in dirs if os.path.isfile(
          os.path.join(folder, d, '__init__.py')))
      rel = os.path.relpath(folder, root)
      package_name = '' if rel == '.' else rel.replace(os.sep, '.')
      for name in sorted(f for f in files if f.endswith('.py')):
        module = package_name if name == '__init__.py' else '.'.join(
            filter(None, [package_name, name[:-len('.py')]]))
        try:
          keys.update(_ScanModule(os.path.join(folder, name), module))
        except (SyntaxError, ValueError, OSError):
          continue
  return sorted(keys)


def _UnknownKeyError(key, keys):
  """The KeyError of an unknown key, naming the closest known keys."""
  close = difflib.get_close_matches(key, keys, n=3, cutoff=0.5)
  hint = (f' Did you mean {", ".join(map(repr, close))}?' if close else
          f' Registered keys: {", ".join(keys) or "(none)"}.')
  return KeyError(f'Unknown model {key!r}.{hint}')


def CheckKey(key):
  """Raises the KeyError of `GetClass` for a key that no params module
  registers, without importing any (`ScanKeys`); keys registered in this
  process already count too. Returns `key`."""
  if key in _registry:
    return key
  keys = ScanKeys()
  if key not in keys:
    raise _UnknownKeyError(key, sorted(set(keys) | set(_registry)))
  return key


def GetClass(key):
  """Returns the experiment class of `key`, importing its module.

  Raises:
    KeyError: naming the key and the closest registered keys.
  """
  if key not in _registry and '.' in key:
    module = f'{_PARAMS_PACKAGE}.{key.rsplit(".", 1)[0]}'
    try:
      importlib.import_module(module)
    except ModuleNotFoundError as e:
      if not module.startswith(str(e.name)) and e.name != module:
        raise  # A module the experiment file imports is missing.
  if key in _registry:
    return _registry[key][0]
  raise _UnknownKeyError(key, GetAllRegisteredKeys())


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
