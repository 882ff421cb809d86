"""TensorBoard summaries: writing scalars and text, reading them back.

Each job writes to its own folder below the logdir (`train/`, `eval_dev/`,
`decoder_test/`), so TensorBoard shows one run per job. The summaries are
written with the core `tf.summary.write` op and TensorBoard's plugin
metadata ('scalars', 'text'), so the tensorboard package is not needed to
write them (tensorflow-cpu does not install it); images likewise ('images',
PNG-encoded). `SummaryWriter` is a thin owner of one `tf.summary` file
writer; `ReadScalars` / `ReadTexts` / `ReadImages` read event files back
(tests and benchmarks use them).

Example:
  writer = SummaryWriter('/tmp/logdir/train')
  writer.WriteScalars(100, {'loss': 0.25, 'learning_rate': 1e-3})
  writer.Flush()
  ReadScalars('/tmp/logdir/train')['loss']  # [(100, 0.25)]
"""
import glob
import math
import os

import numpy as np
import tensorflow as tf


def _Metadata(plugin_name):
  metadata = tf.compat.v1.SummaryMetadata()
  metadata.plugin_data.plugin_name = plugin_name
  return metadata


class SummaryWriter:
  """Writes scalar and text summaries for one job into `logdir`.

  Args:
    logdir: the folder the event files go to; created if missing, with the
      event file, at the first write (constructing touches nothing).
  """

  def __init__(self, logdir):
    self._logdir = logdir
    self._file_writer = None
    self._scalar_metadata = _Metadata('scalars')
    self._text_metadata = _Metadata('text')
    self._image_metadata = _Metadata('images')

  @property
  def logdir(self):
    return self._logdir

  @property
  def _writer(self):
    """The tf.summary writer, made at the first write."""
    if self._file_writer is None:
      tf.io.gfile.makedirs(self._logdir)
      self._file_writer = tf.summary.create_file_writer(self._logdir)
    return self._file_writer

  def WriteScalars(self, step, scalars):
    """Writes `{tag: number}` at `step`; None values are left out.

    Args:
      step: int, the global step the values belong to.
      scalars: dict of tag -> Python number or scalar tensor/array.
    """
    with self._writer.as_default(step=int(step)):
      for tag, value in sorted(scalars.items()):
        if value is None:
          continue
        tf.summary.write(tag, tf.constant(float(value), tf.float32),
                         metadata=self._scalar_metadata)

  def WriteText(self, step, tag, text):
    """Writes a text summary (markdown) at `step`."""
    with self._writer.as_default(step=int(step)):
      tf.summary.write(tag, tf.constant(text, tf.string),
                       metadata=self._text_metadata)

  def WriteImage(self, step, tag, image):
    """Writes an image summary at `step` from an RGB uint8 array [h, w, 3]
    (TensorBoard's image format: width, height, then the PNG bytes)."""
    image = np.asarray(image, np.uint8)
    png = tf.io.encode_png(image)
    data = tf.stack([tf.constant(str(image.shape[1])),
                     tf.constant(str(image.shape[0])), png])
    with self._writer.as_default(step=int(step)):
      tf.summary.write(tag, data, metadata=self._image_metadata)

  def Flush(self):
    if self._file_writer is not None:
      self._file_writer.flush()

  def Close(self):
    if self._file_writer is not None:
      self._file_writer.close()


class NullWriter:
  """A SummaryWriter that writes nothing: for a host that is not the chief
  (only the chief of a multi-host job writes summaries)."""

  logdir = None

  def WriteScalars(self, step, scalars):
    del step, scalars

  def WriteText(self, step, tag, text):
    del step, tag, text

  def Flush(self):
    pass

  def Close(self):
    pass


def _Events(logdir):
  for path in sorted(glob.glob(os.path.join(logdir, 'events.out.tfevents.*'))):
    for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
      yield tf.compat.v1.Event.FromString(record)


def ReadScalars(logdir):
  """Reads the scalar summaries of the event files in `logdir`.

  Returns:
    dict tag -> list of (step, float value) in the order written.
  """
  out = {}
  for event in _Events(logdir):
    for value in event.summary.value:
      if value.HasField('tensor'):
        array = tf.make_ndarray(value.tensor)
        if array.dtype.kind not in 'fiu' or array.size != 1:
          continue
        number = float(np.asarray(array).reshape(()))
      elif value.HasField('simple_value'):
        number = float(value.simple_value)
      else:
        continue
      out.setdefault(value.tag, []).append((int(event.step), number))
  return out


def ReadTexts(logdir):
  """Reads the text summaries in `logdir`: tag -> list of (step, str)."""
  out = {}
  for event in _Events(logdir):
    for value in event.summary.value:
      if (not value.HasField('tensor') or
          value.metadata.plugin_data.plugin_name == 'images'):
        continue
      array = tf.make_ndarray(value.tensor)
      if array.dtype.kind not in 'SUO':
        continue
      text = np.asarray(array).reshape(-1)[0]
      if isinstance(text, bytes):
        text = text.decode('utf-8', 'replace')
      out.setdefault(value.tag, []).append((int(event.step), str(text)))
  return out


def ReadImages(logdir):
  """Reads the image summaries in `logdir`: tag -> list of (step, RGB uint8
  array [h, w, 3])."""
  out = {}
  for event in _Events(logdir):
    for value in event.summary.value:
      if (value.metadata.plugin_data.plugin_name == 'images' and
          value.HasField('tensor')):
        png = tf.make_ndarray(value.tensor)[2]
        out.setdefault(value.tag, []).append(
            (int(event.step), tf.io.decode_png(png, channels=3).numpy()))
  return out


def FormatDuration(seconds):
  """'1:02:03' for 3723 s; '?' when unknown or infinite."""
  if seconds is None or not math.isfinite(seconds) or seconds < 0:
    return '?'
  seconds = int(round(seconds))
  hours, rest = divmod(seconds, 3600)
  minutes, secs = divmod(rest, 60)
  return f'{hours}:{minutes:02d}:{secs:02d}'
