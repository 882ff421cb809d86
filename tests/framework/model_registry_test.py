"""Tests for cadence.framework.model_registry."""
import importlib
import sys

import pytest

import cadence.params
from cadence.framework import hyperparams
from cadence.framework import model_registry

_EXPERIMENT = '''
from cadence.framework import hyperparams
from cadence.framework import model_registry


@model_registry.RegisterSingleTaskModel
class {name}:
  """A registry test experiment."""
  DIM = 3

  def Model(self):
    p = hyperparams.Params()
    p.Define('dim', self.DIM, 'Model depth.')
    p.Define('input', None, 'Input params.')
    return p

  def Train(self):
    p = hyperparams.Params()
    p.Define('split', 'train', 'Which split.')
    return p

  def Dev(self):
    return self.Train().Set(split='dev')
'''


def _Forget(module, key):
  """Drops the modules named `module...` and the registered keys `key...`
  that a test made."""
  for name in [m for m in sys.modules if m.startswith(module)]:
    del sys.modules[name]
  for name in [k for k in model_registry._registry if k.startswith(key)]:  # pylint: disable=protected-access
    del model_registry._registry[name]  # pylint: disable=protected-access


@pytest.fixture(name='domain')
def _Domain(tmp_path, monkeypatch):
  """A temporary `cadence.params.regtest` package holding two experiments."""
  pkg = tmp_path / 'regtest'
  pkg.mkdir()
  (pkg / '__init__.py').write_text('')
  (pkg / 'toy.py').write_text(_EXPERIMENT.format(name='ToyModel'))
  (pkg / 'other.py').write_text(_EXPERIMENT.format(name='OtherModel'))
  monkeypatch.setattr(cadence.params, '__path__',
                      list(cadence.params.__path__) + [str(tmp_path)])
  yield pkg
  _Forget('cadence.params.regtest', 'regtest.')


def testKeyAndOnDemandImport(domain):
  del domain
  assert 'cadence.params.regtest.toy' not in sys.modules
  cls = model_registry.GetClass('regtest.toy.ToyModel')
  assert cls.__name__ == 'ToyModel'
  assert model_registry.KeyOf(cls) == 'regtest.toy.ToyModel'
  assert 'cadence.params.regtest.toy' in sys.modules
  assert 'cadence.params.regtest.other' not in sys.modules


def testGetParamsMergesDataset(domain):
  del domain
  p = model_registry.GetParams('regtest.toy.ToyModel', 'Train')
  assert p.dim == 3 and p.input.split == 'train'
  assert model_registry.GetParams('regtest.toy.ToyModel', 'dev').input.split == 'dev'
  with pytest.raises(KeyError, match="Unknown dataset 'Dve'.*Did you mean 'Dev'"):
    model_registry.GetParams('regtest.toy.ToyModel', 'Dve')
  with pytest.raises(KeyError, match='defines no Test'):
    model_registry.GetParams('regtest.toy.ToyModel', 'Test')


def testUnknownKeyListsClosest(domain):
  del domain
  with pytest.raises(KeyError, match=r"Unknown model 'regtest.toy.ToyModle'.*"
                     r"Did you mean 'regtest.toy.ToyModel'"):
    model_registry.GetClass('regtest.toy.ToyModle')
  with pytest.raises(KeyError, match=r"Did you mean 'regtest.other.OtherModel'"):
    model_registry.GetClass('regtest.othr.OtherModel')
  assert 'regtest.other.OtherModel' in model_registry.GetAllRegisteredKeys()


def testDuplicateKeyNamesBothDefinitions(domain):
  model_registry.GetClass('regtest.toy.ToyModel')
  impostor = type('ToyModel', (), {'__module__': 'cadence.params.regtest.toy'})
  with pytest.raises(ValueError) as err:
    model_registry.RegisterSingleTaskModel(impostor)
  message = str(err.value)
  assert "'regtest.toy.ToyModel' is registered twice" in message
  assert str(domain / 'toy.py') in message
  assert 'model_registry_test.py' in message


def testOutsideParamsPackageRegistersItsFullKey():
  cls = type('Stray', (), {'__module__': 'somewhere.else'})
  try:
    assert model_registry.RegisterSingleTaskModel(cls) is cls
    assert model_registry.KeyOf(cls) == 'somewhere.else.Stray'
    assert model_registry.GetClass('somewhere.else.Stray') is cls
    assert 'somewhere.else.Stray' not in model_registry.GetAllRegisteredKeys()
  finally:
    del model_registry._registry['somewhere.else.Stray']  # pylint: disable=protected-access


def testMultiTaskVariantRegisters(domain):
  del domain
  def Model(self):
    del self
    p = hyperparams.Params()
    p.Define('input', None, 'Input.')
    return p

  cls = type('Multi', (), {'__module__': 'cadence.params.regtest.multi',
                           'Model': Model, 'Train': lambda self: 1})
  model_registry.RegisterMultiTaskModel(cls)
  assert model_registry.GetParams('regtest.multi.Multi', 'Train').input == 1


def testTwoDefinitionsInOneFile(domain):
  (domain / 'dup.py').write_text(_EXPERIMENT.format(name='Twice') +
                                 _EXPERIMENT.format(name='Twice'))
  # The import's ValueError, as the one line of a module that does not
  # import (the trainer's exit 2).
  with pytest.raises(model_registry.ModelError, match=r"'regtest.dup.Twice' "
                     r'is registered twice: .*dup.py:\d+ and .*dup.py:\d+'
                     ) as err:
    model_registry.GetClass('regtest.dup.Twice')
  assert isinstance(err.value.__cause__, ValueError)


def testReimportIsNotADuplicate(domain):
  del domain
  first = model_registry.GetClass('regtest.toy.ToyModel')
  del sys.modules['cadence.params.regtest.toy']
  del model_registry._registry['regtest.toy.ToyModel']  # pylint: disable=protected-access
  second = model_registry.GetClass('regtest.toy.ToyModel')
  assert second is not first
  importlib.reload(sys.modules['cadence.params.regtest.toy'])
  assert model_registry.GetClass('regtest.toy.ToyModel').__name__ == 'ToyModel'


def testScanKeysEqualsTheRegistryWithoutImporting(domain):
  (domain / 'called.py').write_text(
      'from cadence.framework import model_registry\n'
      'class Late:\n  pass\n'
      'model_registry.RegisterSingleTaskModel(Late)\n')
  scanned = model_registry.ScanKeys()
  assert 'cadence.params.regtest.toy' not in sys.modules
  assert {'regtest.toy.ToyModel', 'regtest.other.OtherModel',
          'regtest.called.Late'} <= set(scanned)
  # Every experiment of the checkout, as importing them all registers it.
  assert scanned == model_registry.GetAllRegisteredKeys()


def testCheckKeyNamesTheClosestWithoutImporting(domain):
  del domain
  assert model_registry.CheckKey('regtest.toy.ToyModel') == (
      'regtest.toy.ToyModel')
  with pytest.raises(KeyError, match=r"Unknown model 'regtest.toy.ToyModle'"
                     r"\. Did you mean 'regtest.toy.ToyModel'"):
    model_registry.CheckKey('regtest.toy.ToyModle')
  assert 'cadence.params.regtest.toy' not in sys.modules


# A user's own package, outside Cadence: (file, source); the line numbers
# of the errors are asserted below.
_USER_FILES = {
    '__init__.py': '',
    'exps.py': _EXPERIMENT.format(name='MyExp') + (
        '\n\nclass Plain:\n  """Not registered."""\n'),
    'broken.py': ('from cadence.framework import model_registry\n'
                  '\n'
                  '\n'
                  '@model_registry.RegisterSingleTaskModel\n'
                  'class Broken\n'
                  '  pass\n'),
    'raises.py': _EXPERIMENT.format(name='Raises') + (
        '\n\nTABLE = undefined_name + 1\n'),
    'helper.py': 'import os\nVALUE = os.no_such_function()\n',
    'uses_helper.py': ('from userexps import helper\n' +
                       _EXPERIMENT.format(name='UsesHelper')),
    'needs_missing.py': ('import os\nimport no_such_module_xyz\n' +
                         _EXPERIMENT.format(name='NeedsMissing')),
    'calls.py': ('def F():\n  return 1 / 0\n\n\nY = F()\n' +
                 _EXPERIMENT.format(name='Calls')),
    'calls_library.py': ('import os\nZ = os.path.join(1)\n' +
                         _EXPERIMENT.format(name='CallsLibrary')),
    'binds.py': ('import dataclasses\n'
                 'from userexps.exps import MyExp as Imported\n'
                 'from os.path import *\n'
                 '\n'
                 '\n'
                 '@dataclasses.dataclass\n'
                 'class Wrapped:\n'
                 '  pass\n'),
    'sub/__init__.py': 'raise RuntimeError("a package\'s __init__ ran")\n',
    'sub/deep.py': _EXPERIMENT.format(name='Deep'),
}


def _LineOf(name, text):
  """The line number of the first line of _USER_FILES[name] that starts
  with `text`."""
  lines = _USER_FILES[name].splitlines()
  return 1 + next(i for i, l in enumerate(lines) if l.startswith(text))


@pytest.fixture(name='user')
def _User(tmp_path, monkeypatch):
  """The package `userexps` (the files of _USER_FILES) on sys.path."""
  pkg = tmp_path / 'userexps'
  (pkg / 'sub').mkdir(parents=True)
  for name, text in _USER_FILES.items():
    (pkg / name).write_text(text)
  monkeypatch.syspath_prepend(str(tmp_path))
  yield pkg
  _Forget('userexps', 'userexps.')


def testFullKeyOfAUsersModule(user):
  del user
  assert model_registry.CheckKey('userexps.exps.MyExp') == 'userexps.exps.MyExp'
  assert 'userexps.exps' not in sys.modules   # Checked from its source.
  cls = model_registry.GetClass('userexps.exps.MyExp')
  assert cls.__module__ == 'userexps.exps'
  assert model_registry.KeyOf(cls) == 'userexps.exps.MyExp'
  p = model_registry.GetParams('userexps.exps.MyExp', 'Dev')
  assert p.dim == 3 and p.input.split == 'dev'
  # Cadence's own experiments by their full path too.
  assert model_registry.GetClass(
      'cadence.params.synthetic.linear_regression.RegressionTiny') is (
          model_registry.GetClass('synthetic.linear_regression.RegressionTiny'))
  assert 'userexps.exps.MyExp' not in model_registry.GetAllRegisteredKeys()


def testMisspeltKeysNameTheClosestOfBothKinds(user):
  del user
  # A class of the user's module, from its source (nothing imported).
  with pytest.raises(KeyError, match=r"^Unknown model 'userexps\.exps\."
                     r"MyExq'\. Did you mean 'userexps\.exps\.MyExp'\?$"):
    model_registry.CheckKey('userexps.exps.MyExq')
  # A module of the user's package, from the modules beside it.
  with pytest.raises(KeyError) as err:
    model_registry.CheckKey('userexps.exp.MyExp')
  assert str(err.value).startswith(
      "Unknown model 'userexps.exp.MyExp': no module userexps.exp under "
      "cadence.params or on the Python path. Did you mean "
      "'userexps.exps.MyExp', "), str(err.value)
  assert 'userexps.exps' not in sys.modules
  # A short key's module misspelt: the short keys.
  with pytest.raises(KeyError, match=r"Did you mean 'synthetic\."
                     r"linear_regression\.RegressionTiny'"):
    model_registry.CheckKey('synthetic.linear_regresion.RegressionTiny')
  # A package that is nowhere: where it is looked for.
  with pytest.raises(KeyError, match=r"^Unknown model 'nowhere_xyz\.exps\."
                     r"MyExp': no module nowhere_xyz\.exps under cadence\."
                     r'params or on the Python path \(is the folder holding '
                     r'nowhere_xyz/ on PYTHONPATH'):
    model_registry.CheckKey('nowhere_xyz.exps.MyExp')
  # After the import, the classes it registered.
  with pytest.raises(KeyError, match=r"Did you mean 'userexps\.exps\.MyExp'"):
    model_registry.GetClass('userexps.exps.MyExq')


def testAModuleThatDoesNotParseIsNamedWithItsLine(user):
  line = (f"Model 'userexps.broken.Broken': cannot import userexps.broken: "
          f"{user / 'broken.py'}, line 5: SyntaxError: expected ':'.")
  with pytest.raises(model_registry.ModelError) as err:
    model_registry.CheckKey('userexps.broken.Broken')
  assert str(err.value) == line
  with pytest.raises(model_registry.ModelError) as err:
    model_registry.GetClass('userexps.broken.Broken')
  assert str(err.value) == line


def testAParamsFileThatDoesNotParseIsNamedWithItsLine(domain):
  (domain / 'broken.py').write_text(_USER_FILES['broken.py'])
  with pytest.raises(model_registry.ModelError) as err:
    model_registry.CheckKey('regtest.broken.Broken')
  assert str(err.value) == (
      "Model 'regtest.broken.Broken': cannot import "
      f"cadence.params.regtest.broken: {domain / 'broken.py'}, line 5: "
      "SyntaxError: expected ':'.")
  assert 'regtest.toy.ToyModel' in model_registry.ScanKeys()   # Skipped.


def testAModuleThatDoesNotImportIsNamedWithItsLine(user):
  cases = {
      'userexps.raises.Raises': (
          'userexps.raises', 'raises.py', _LineOf('raises.py', 'TABLE'),
          "NameError: name 'undefined_name' is not defined"),
      # The file it imports, where that one failed.
      'userexps.uses_helper.UsesHelper': (
          'userexps.uses_helper', 'helper.py', 2,
          "AttributeError: module 'os' has no attribute 'no_such_function'"),
      'userexps.needs_missing.NeedsMissing': (
          'userexps.needs_missing', 'needs_missing.py', 2,
          "ModuleNotFoundError: No module named 'no_such_module_xyz'"),
      # The line in the module's own function that raised.
      'userexps.calls.Calls': (
          'userexps.calls', 'calls.py', 2,
          'ZeroDivisionError: division by zero'),
      # A library's function that raised: the module's line that called it.
      'userexps.calls_library.CallsLibrary': (
          'userexps.calls_library', 'calls_library.py', 2,
          'TypeError: expected str, bytes or os.PathLike object, not int'),
      # A package's __init__ on the way.
      'userexps.sub.deep.Deep': (
          'userexps.sub.deep', 'sub/__init__.py', 1,
          "RuntimeError: a package's __init__ ran"),
  }
  for key, (module, name, line, error) in cases.items():
    assert model_registry.CheckKey(key) == key   # Its source parses.
    with pytest.raises(model_registry.ModelError) as err:
      model_registry.GetClass(key)
    assert str(err.value) == (f'Model {key!r}: cannot import {module}: '
                              f'{user / name}, line {line}: {error}.')


def testAClassThatIsNotRegisteredSaysToRegisterIt(user):
  where = f"{user / 'exps.py'}, line {_LineOf('exps.py', 'class Plain')}"
  for check in (model_registry.CheckKey, model_registry.GetClass):
    with pytest.raises(model_registry.ModelError) as err:
      check('userexps.exps.Plain')
    assert str(err.value) == (
        f"Model 'userexps.exps.Plain': class Plain ({where}) is not a "
        'registered experiment: decorate it with @model_registry.'
        'RegisterSingleTaskModel (or RegisterMultiTaskModel; from '
        'cadence.framework import model_registry).')


def testCheckKeyRunsNothingAndLeavesOtherBindingsToTheImport(user):
  del user
  # Found through a package whose __init__ raises if it runs.
  assert model_registry.CheckKey('userexps.sub.deep.Deep') == (
      'userexps.sub.deep.Deep')
  assert not [m for m in sys.modules if m.startswith('userexps')]
  # A name the source may bind some other way: the import decides.
  for name in ('Imported', 'Wrapped', 'Anything'):   # Anything: import *.
    key = f'userexps.binds.{name}'
    assert model_registry.CheckKey(key) == key
  assert model_registry.GetClass('userexps.binds.Imported') is (
      model_registry.GetClass('userexps.exps.MyExp'))
  with pytest.raises(model_registry.ModelError,
                     match=r'class Wrapped \(.*binds\.py, line 6\) is not a '
                     'registered experiment'):
    model_registry.GetClass('userexps.binds.Wrapped')
  with pytest.raises(model_registry.ModelError,
                     match=r"^Unknown model 'userexps\.binds\.Anything'\."):
    model_registry.GetClass('userexps.binds.Anything')
