"""Experiment classes: the params of a model and of its datasets.

An experiment lives in `params/<domain>/<file>.py`, is registered with
`model_registry.RegisterSingleTaskModel`, keeps its knobs as UPPER_CASE class
attributes, and defines `Task()` plus one method per dataset: `Train()`
(required), `Dev()` and `Test()` (optional) return input generator params.
`model_registry.GetParams(key, 'Dev')` returns `Model()` with `input` set
from `Dev()`.

Example:
  @model_registry.RegisterSingleTaskModel
  class Small(base_model_params.SingleTaskModelParams):
    HIDDEN = 32

    def Train(self):
      return MyInput.Params().Set(file_pattern='/data/train-*')

    def Task(self):
      return MyTask.Params().Set(name='small', hidden=self.HIDDEN)
"""
from cadence.framework import base_model


class SingleTaskModelParams:
  """Base of single-task experiments; see the module docstring."""

  # Devices per model split (the pipeline stages of one replica) when
  # --worker_split_size is not given; a pipelined experiment sets its stage
  # count here.
  WORKER_SPLIT_SIZE = 1

  def Train(self):
    """Input generator params of the training data."""
    raise NotImplementedError(f'{type(self).__name__} must define Train().')

  def Task(self):
    """The task's params (a `base_model.BaseTask` subclass's `Params()`)."""
    raise NotImplementedError(f'{type(self).__name__} must define Task().')

  def Model(self):
    """The model params: a SingleTaskModel around `Task()`."""
    return base_model.SingleTaskModel.Params(self.Task())
