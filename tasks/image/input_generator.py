"""Batches of the embedded shapes data set (tasks/image/shapes_data.py).

The images are drawn once, when the generator is built, and served from
memory as uint8; each batch is converted to float32 in [-1, 1].
"""
import tensorflow as tf

from cadence.framework import base_input_generator
from cadence.framework.nested_map import NestedMap
from cadence.framework import shapes
from cadence.framework import validation
from cadence.tasks.image import shapes_data


class ShapesInput(base_input_generator.BaseInputGenerator):
  """Batches of NestedMap(image=[b, h, w, 3] float32, label=[b] int32).

  Example:
    p = ShapesInput.Params().Set(image_size=[32, 32], num_examples=64,
                                 batch_size=8)
    batch = next(iter(p.Instantiate().Dataset()))
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('image_size', [32, 32], 'Image [height, width] in pixels.')
    p.Define('num_examples', 10000, 'Examples drawn (cycled when repeat is '
             'True), an int > 0.')
    p.Define('data_seed', 1, 'Seed of the data set: train, dev and test use '
             'different seeds.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    images, labels = shapes_data.DrawShapes(p.num_examples, p.image_size,
                                            p.data_seed)
    self._images = tf.constant(images)
    self._labels = tf.constant(labels)

  @classmethod
  def _CheckParams(cls, p, owner):
    super()._CheckParams(p, owner)
    validation.CheckIntList(owner, 'image_size', p.image_size, 2)
    validation.CheckInt(owner, 'num_examples', p.num_examples)
    validation.CheckInt(owner, 'data_seed', p.data_seed, 0)

  @classmethod
  def BatchShapes(cls, params):
    """image [b, h, w, 3], label [b]; b is None unless fixed_input_shape."""
    b = params.batch_size if params.fixed_input_shape else None
    return NestedMap(image=shapes.Shape([b] + list(params.image_size) + [3]),
                     label=shapes.Shape([b]))

  def _NeedsFiles(self):
    return False

  def _RecordDataset(self):
    records = tf.data.Dataset.range(self.params.num_examples)
    return records.repeat() if self.params.repeat else records

  def _ProcessRecord(self, record):
    image = tf.cast(tf.gather(self._images, record), tf.float32)
    return NestedMap(image=image / 127.5 - 1.0,
                     label=tf.gather(self._labels, record))

  def _ProcessRecordBatch(self, records):
    return self._ProcessRecord(records)
