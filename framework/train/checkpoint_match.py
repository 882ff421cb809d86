"""Does a checkpoint hold this model? Checked before anything is written.

A logdir holding another model's checkpoints (a changed hidden_dim, another
experiment) would fail deep in the restore, with TensorFlow's "Received
incompatible tensor" or "Found 207 Python objects that were not bound",
after the run had already written into the logdir. `Mismatch` compares the
model variables a checkpoint holds (their paths, shapes and dtypes, read
from its index: no tensor is loaded) with the model's, and says what
differs in one phrase, or None when they fit.

Model variables are saved under `model/vars/<path>` (checkpointer.py's
KeyedVariables), the path escaped as tf.train.Checkpoint does ('.' as '..',
'/' as '.S').

Example:
  saved = SavedVariables('/tmp/run/train/ckpt-300')
  # {'regression.net.fc[0].w': ([8, 16], tf.float32), ...}
  Mismatch(saved, {'regression.net.fc[0].w': ([8, 32], tf.float32), ...})
  # "variable 'regression.net.fc[0].w' is float32[8, 16] in the checkpoint
  # but float32[8, 32] in this model"
"""
import re

import tensorflow as tf

_PREFIX = 'model/vars/'
_SUFFIX = '/.ATTRIBUTES/VARIABLE_VALUE'
_ESCAPE = re.compile(r'\.(.)')


def _Unescape(name):
  return _ESCAPE.sub(lambda m: '/' if m.group(1) == 'S' else m.group(1),
                     name)


def SavedVariables(checkpoint_path):
  """{variable path: (shape list, dtype)} of the model variables saved in
  a checkpoint (its index only).

  Raises:
    tf.errors.OpError: the index cannot be read.
  """
  reader = tf.train.load_checkpoint(checkpoint_path)
  dtypes = reader.get_variable_to_dtype_map()
  return {_Unescape(key[len(_PREFIX):-len(_SUFFIX)]): (list(shape),
                                                      dtypes[key])
          for key, shape in reader.get_variable_to_shape_map().items()
          if key.startswith(_PREFIX) and key.endswith(_SUFFIX)}


def ModelVariables(variables):
  """{path: (shape list, dtype)} of a {path: variable} dict (e.g.
  checkpointer.TaskVariables(task))."""
  return {path: (v.shape.as_list(), v.dtype.base_dtype)
          for path, v in variables.items()}


def _Typed(shape_dtype):
  shape, dtype = shape_dtype
  return f"{tf.as_dtype(dtype).name}[{', '.join(map(str, shape))}]"


def Mismatch(saved, model):
  """How the saved model variables differ from the model's, or None.

  Args:
    saved: {path: (shape, dtype)} of the checkpoint (SavedVariables).
    model: {path: (shape, dtype)} of this model (ModelVariables), in the
      model's order.

  Returns:
    None when both hold the same paths with the same shapes and dtypes;
    else one phrase: the variables only one of them holds (how many, and
    the first of each), or else the first variable (in the model's order)
    whose shape or dtype differs.
  """
  missing = [p for p in model if p not in saved]
  extra = sorted(p for p in saved if p not in model)
  if missing or extra:
    parts = []
    if missing:
      parts.append(f'{len(missing)} of this model\'s {len(model)} variables '
                   f'are not in the checkpoint (first {missing[0]!r} '
                   f'{_Typed(model[missing[0]])})')
    if extra:
      parts.append(f'the checkpoint holds {len(extra)} variables this model '
                   f'lacks (first {extra[0]!r} {_Typed(saved[extra[0]])})')
    return '; '.join(parts)
  differ = [p for p in model if _Typed(saved[p]) != _Typed(model[p])]
  if not differ:
    return None
  first = differ[0]
  more = (f' (and {len(differ) - 1} more variables differ)'
          if len(differ) > 1 else '')
  return (f'variable {first!r} is {_Typed(saved[first])} in the checkpoint '
          f'but {_Typed(model[first])} in this model{more}')
