"""An experiment's params as the trainer's command line makes them.

`LoadParams` takes the registered experiment (`--model`) for a dataset and
applies, in order, `--model_params_file_override`, `--model_params_override`
(`key=value;...` items or Params text) and `--max_steps`; a bad key or
value is a UserError naming the flag and the param's path. `WriteParams`
writes a run's params.txt (a different one already there is kept:
params_file.py).

Example:
  params = LoadParams(trainer_options.TrainerOptions(
      model='synthetic.linear_regression.RegressionTiny',
      model_params_override='task.input_dim=4'), 'Train')
"""
import os

from absl import logging
import tensorflow as tf

from cadence.framework import model_registry
from cadence.framework.jobs import checkpoint_fit
from cadence.framework.jobs import params_file
from cadence.framework.jobs import params_overrides
from cadence.framework.jobs import trainer_options
from cadence.framework.jobs import user_error

UserError = user_error.UserError


def Message(e):
  """The line of a params error (a KeyError's without repr quotes)."""
  return e.args[0] if isinstance(e, KeyError) and e.args else str(e)


_PARAMS_ERRORS = (AttributeError, KeyError, ValueError, TypeError, IndexError)


def _SetPairs(params, pairs, source):
  """Sets 'key=value' pairs; a value that is not a Python literal (e.g. a
  bare path) is taken as a string when the param holds a string or None."""
  for key, value in pairs:
    try:
      params.FromText(f'{key} : {value}')
      continue
    except _PARAMS_ERRORS as e:
      error = e
    if 'cannot parse the value' in str(error):
      try:
        current = params.Get(key)
      except _PARAMS_ERRORS as e:
        error = e
      else:
        if isinstance(current, str) or current is None:
          params.Set(**{key: value})
          continue
    message = Message(error)
    message = message[len('line 1: '):] if message.startswith(
        'line 1: ') else message
    raise UserError(f'{source}: {message}') from None


def _SetText(params, text, source):
  try:
    params.FromText(text)
  except _PARAMS_ERRORS as e:
    raise UserError(f'{source}: {Message(e)}') from None


def LoadParams(options, dataset):
  """The model params of `options.model` for `dataset`, overrides applied."""
  if not options.model:
    raise UserError(trainer_options.MODEL_REQUIRED)
  try:
    params = model_registry.GetParams(options.model, dataset)
  except KeyError as e:
    raise UserError(Message(e)) from None
  if options.model_params_file_override:
    path = options.model_params_file_override
    if not tf.io.gfile.exists(path):
      raise UserError(f'--model_params_file_override: no file {path!r}.')
    with tf.io.gfile.GFile(path, 'rb') as f:
      data = f.read()
    _SetText(params, params_overrides.ParamsFileText(path, data),
             f'--model_params_file_override {path}')
  if options.model_params_override:
    pairs = params_overrides.ParseOverride(options.model_params_override)
    if pairs is None:
      _SetText(params, options.model_params_override,
               '--model_params_override')
    else:
      _SetPairs(params, pairs, '--model_params_override')
  if options.max_steps is not None:
    params.task.train.max_steps = options.max_steps
  return params


ParamsText = checkpoint_fit.ParamsText


def WriteParams(params, path):
  """Writes the params text to `path`; returns the text. A different file
  already there is kept (params_file.Write), in one log line."""
  text = ParamsText(params)
  tf.io.gfile.makedirs(os.path.dirname(path))
  kept = params_file.Write(path, text)
  if kept:
    logging.warning('%s', kept)
  return text


def InferenceParams(params):
  """A copy of the model params whose task runs with is_inference=True."""
  params = params.Copy()
  params.task.is_inference = True
  return params


def HasDataset(options, dataset):
  """Whether the experiment of `options.model` defines `dataset`."""
  return hasattr(model_registry.GetClass(options.model), dataset)
