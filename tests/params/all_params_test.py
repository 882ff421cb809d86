"""Every registered experiment instantiates; the Tiny ones build their model.

For each key of `model_registry.GetAllRegisteredKeys()`: the params of each
dataset method it defines (Train, and Dev/Test when present) come back from
`GetParams`, survive a text round trip, and name a BaseTask. Experiments
whose class name ends in 'Tiny' are small enough to build fully here: the
model, its learner, and the Train input generator. Every task's FPropMeta
returns its cost as a `cost.Cost` (framework/cost.py).
"""
import numpy as np
import pytest

from cadence.framework import base_model
from cadence.framework import cost
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


@pytest.mark.parametrize('key', _KEYS)
def testTaskFPropMetaReturnsACost(key):
  params = model_registry.GetParams(key, 'Train')
  task_p = params.task.Copy().Set(input=params.input.Copy())
  # The input's batch shapes, a batch left to the data taken as 4 examples
  # (as inspect_model takes the batch size).
  batch = params.input.cls.BatchShapes(params.input).Transform(
      lambda s: s.WithDim(0, 4) if s.rank and s[0] is None else s)
  meta = task_p.cls.FPropMeta(task_p, batch)
  assert isinstance(meta, cost.Cost), (key, type(meta))
  for field in cost.FIELDS + ('defaulted',):
    assert field in meta, (key, field)
  assert isinstance(meta.flops, int) and meta.flops > 0, (key, meta.flops)


def _SmallData(input_p, tmp):
  """`input_p` reading less data (fewer and smaller examples, a small
  grammar corpus in `tmp`), with every setting that groups examples into
  batches kept."""
  p = input_p.Copy()
  if 'num_examples' in p:
    p.num_examples = min(p.num_examples, 512)
  if 'image_size' in p:
    p.image_size = [min(d, 16) for d in p.image_size]
  if 'corpus' in p:   # LmCorpusInput: the embedded corpus, made small.
    p.Set(corpus='synthetic', data_dir=str(tmp / 'data'))
    p.synthetic.Set(num_train_shards=2, sentences_per_shard=300,
                    num_heldout_sentences=50)
    p.tokenizer.cache_dir = str(tmp / 'spm')
  return p


@pytest.mark.parametrize('key', _KEYS)
def testSameGlobalBatchesOnAnyHostLayout(key, tmp_path):
  """1 host x 2 replicas and 2 hosts x 1 replica read the same global
  batches (each host its share, in order), from a resumed position."""
  input_p = _SmallData(model_registry.GetParams(key, 'Train').input,
                       tmp_path)
  whole = list(input_p.Instantiate().Dataset(start_batch=1,
                                             num_replicas=2).take(2))
  hosts = [list(input_p.Copy().Set(
      num_input_shards=2, input_shard_index=h).Instantiate().Dataset(
          start_batch=1, num_replicas=1).take(2)) for h in range(2)]
  assert len(whole) == 2
  for batch, *shares in zip(whole, *hosts):
    for name in batch:
      np.testing.assert_array_equal(
          batch[name], np.concatenate([s[name] for s in shares]),
          err_msg=f'{key}: {name}')
