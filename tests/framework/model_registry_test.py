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
  for name in list(sys.modules):
    if name.startswith('cadence.params.regtest'):
      del sys.modules[name]
  for key in [k for k in model_registry._registry if k.startswith('regtest.')]:  # pylint: disable=protected-access
    del model_registry._registry[key]  # pylint: disable=protected-access


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


def testOutsideParamsPackageIsRejected():
  cls = type('Stray', (), {'__module__': 'somewhere.else'})
  with pytest.raises(ValueError, match="module 'somewhere.else'.*must live under cadence.params"):
    model_registry.RegisterSingleTaskModel(cls)


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
  with pytest.raises(ValueError, match=r"'regtest.dup.Twice' is registered "
                     r'twice: .*dup.py:\d+ and .*dup.py:\d+'):
    model_registry.GetClass('regtest.dup.Twice')


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
