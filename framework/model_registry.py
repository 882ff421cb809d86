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
"""
import difflib
import importlib
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
  keys = GetAllRegisteredKeys()
  close = difflib.get_close_matches(key, keys, n=3, cutoff=0.5)
  hint = (f' Did you mean {", ".join(map(repr, close))}?' if close else
          f' Registered keys: {", ".join(keys) or "(none)"}.')
  raise KeyError(f'Unknown model {key!r}.{hint}')


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
