"""What a task exports for serving: its inference graph (Lingvo's Inference()).

A task that can be served implements `Inference(batch_size, max_len)` and
returns an `InferenceGraph`: named `Signature`s, each a function of the
task's theta and named input tensors returning a dict of output tensors,
with a sentence of documentation per signature; files the graph needs
beside it (`assets`, e.g. a SentencePiece model); or, for a task whose
network is a Keras model, that model (`keras_model`), which is exported
the Keras way. `framework/jobs/export.py` restores a checkpoint into the
task's variables and writes the graph as a SavedModel that TensorFlow
alone loads (`trainer.py --mode=export`).

`batch_size` and `max_len` say which dims are static: None leaves a dim
dynamic; an int fixes it (TPU and XLA servers need static shapes). A task
for which `max_len` means nothing (an image classifier) rejects one.

Example (a task's method):
  def Inference(self, batch_size=None, max_len=None):
    def _Predict(theta, x):
      return {'y': self.ComputePredictions(theta, NestedMap(x=x)).y}
    return inference.InferenceGraph(signatures={'predict': inference.Signature(
        _Predict, {'x': tf.TensorSpec([batch_size, 8], tf.float32)},
        'x [batch, 8] float32 -> y [batch] float32, the regression.')})
"""
import dataclasses

from cadence.framework import validation


@dataclasses.dataclass
class Signature:
  """One serving signature.

  Attributes:
    fn: fn(theta, **inputs) -> dict of output name -> tensor. theta is the
      task's, carrying no step seed: a signature that draws random numbers
      takes its seed as an input and attaches it itself.
    inputs: dict of input name -> tf.TensorSpec (its shape says which dims
      are static), in the order of the function's arguments.
    doc: what the signature computes: its inputs and outputs with shapes
      and meaning. Written beside the SavedModel (assets.extra/).
  """
  fn: object
  inputs: dict
  doc: str


@dataclasses.dataclass
class InferenceGraph:
  """A task's inference graph; see the module docstring.

  Attributes:
    signatures: dict of name -> Signature.
    assets: dict of attribute name -> path of a file the SavedModel carries
      (copied into its assets/; a loader finds it as
      `loaded.<name>.asset_path`).
    keras_model: a keras.Model to export with Keras's own export (its
      'serve' endpoint) instead of signatures; its variables are the task's.
    keras_inputs: the keras_model's input TensorSpecs.
    doc: what the export is for and how to call it (written beside it).
  """
  signatures: dict = dataclasses.field(default_factory=dict)
  assets: dict = dataclasses.field(default_factory=dict)
  keras_model: object = None
  keras_inputs: list = None
  doc: str = ''


def CheckDims(owner, batch_size, max_len, uses_max_len=True):
  """Raises ValueError for a bad `batch_size` or `max_len` of an export.

  Args:
    owner: names the task in the message, e.g.
      f'{validation.Owner(task)} Inference'.
    batch_size: None or an int >= 1.
    max_len: None or an int >= 2 (a BOS and one more token).
    uses_max_len: False for a task without sequences: max_len must be None.
  """
  validation.CheckOptionalInt(owner, 'batch_size', batch_size)
  validation.CheckOptionalInt(owner, 'max_len', max_len, low=2)
  if not uses_max_len and max_len is not None:
    raise validation.Error(owner, 'max_len', max_len,
                           'has no meaning for this task: it has no '
                           'sequence length.')
