"""Files written whole or not at all.

A reader of a file Cadence writes (a checkpoint's state file, a cache
entry, a plan) sees the old file or the new one, never a part: the bytes go
to a temporary file beside the target, which is then renamed over it (a
rename within a folder is atomic on POSIX file systems). The temporary
name is `<path>.tmp-<12 hex digits>`, unique per write, so two writers of
one path never share one; a write that fails removes its temporary file.

Local paths use the os module alone, so the caches written before
TensorFlow loads do not load it; a path with a scheme (`gs://...`) goes
through tf.io.gfile.

Example:
  atomic_file.Write('/logdir/train/checkpoint', text)
  atomic_file.TempPath('/out/.model')   # '/out/.model.tmp-3f0c9a1b2d4e'
"""
import os
import uuid


def TempPath(path):
  """A fresh temporary name beside `path`: `<path>.tmp-<12 hex>`."""
  return f'{path}.tmp-{uuid.uuid4().hex[:12]}'


def Write(path, data):
  """Writes `data` (str as UTF-8, or bytes) to `path` whole or not at all.

  Raises:
    OSError, or tf.errors.OpError for a path with a scheme: the write
      failed; `path` is as it was and no temporary file is left.
  """
  blob = data.encode('utf-8') if isinstance(data, str) else data
  tmp = TempPath(path)
  if '://' in path:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    try:
      with tf.io.gfile.GFile(tmp, 'wb') as f:
        f.write(blob)
      tf.io.gfile.rename(tmp, path, overwrite=True)
    finally:
      if tf.io.gfile.exists(tmp):
        tf.io.gfile.remove(tmp)
    return
  try:
    with open(tmp, 'wb') as f:
      f.write(blob)
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)
