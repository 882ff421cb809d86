"""Every registered experiment instantiates; the Tiny ones build their model.

For each key of `model_registry.GetAllRegisteredKeys()`: the params of each
dataset method it defines (Train, and Dev/Test when present) come back from
`GetParams`, survive a text round trip, and name a BaseTask. Experiments
whose class name ends in 'Tiny' are small enough to build fully here: the
model, its learner, and the Train input generator.
"""
import pytest

from cadence.framework import base_model
from cadence.framework import model_registry

_KEYS = model_registry.GetAllRegisteredKeys()


def testSomethingIsRegistered():
  assert 'synthetic.linear_regression.RegressionTiny' in _KEYS


@pytest.mark.parametrize('key', _KEYS)
def testParamsInstantiate(key):
  cls = model_registry.GetClass(key)
  datasets = [d for d in model_registry.DATASETS if hasattr(cls, d)]
  assert 'Train' in datasets, f'{key} defines no Train()'
  for dataset in datasets:
    params = model_registry.GetParams(key, dataset)
    assert params.input is not None, (key, dataset)
    assert issubclass(params.task.cls, base_model.BaseTask), (key, dataset)
    text = params.ToText()
    again = model_registry.GetParams(key, dataset)
    again.FromText(text)
    assert again.ToText() == text, (key, dataset)


@pytest.mark.parametrize('key', [k for k in _KEYS if k.endswith('Tiny')])
def testTinyModelsBuild(key):
  params = model_registry.GetParams(key, 'Train')
  model = params.Instantiate()
  assert model.task.vars.Flatten(), f'{key}: the task has no variables'
  learner = model.task.InstantiateLearner()
  learner.Build()
  assert learner.trainable, f'{key}: nothing trains'
  params.input.Instantiate()
