"""Micro-batches: how a batch is cut for a pipeline and put back together.

A pipeline runs a batch of B examples as M micro-batches of B / M examples
each, cut along the batch dimension of every input (`batch_dim`, 0 for
batch-major inputs, 1 for time-major ones). `Slice` and `Concat` are exact
inverses: the outputs come back in the inputs' order and layout.

Example:
  m, size = Count('pipe', batch=32, num_micro_batches=4)      # (4, 8)
  parts = Slice(NestedMap(x=x, p=paddings), m, batch_dim=0)   # 4 x [8, ...]
  whole = Concat(parts, batch_dim=0)                          # [32, ...]
"""
import tensorflow as tf

from cadence.framework import validation


def Count(owner, batch, num_micro_batches=None, micro_batch_size=None,
          batch_dim=0):
  """(num_micro_batches, micro_batch_size) for a batch of `batch` examples.

  Either knob may be None: both None means one micro-batch; one None is
  derived from the other; both set must multiply to `batch`.

  Args:
    owner: who asks, for errors, e.g. "PipeliningLayer 'lm.stack'".
    batch: the static batch size, an int.
    num_micro_batches: M, or None.
    micro_batch_size: B / M, or None.
    batch_dim: reported in errors.

  Raises:
    ValueError: naming the knob, its value and the batch when they do not
      fit.
  """
  validation.CheckOptionalInt(owner, 'num_micro_batches', num_micro_batches)
  validation.CheckOptionalInt(owner, 'micro_batch_size', micro_batch_size)
  where = f'batch {batch} (inputs dim batch_dim={batch_dim})'
  m, size = num_micro_batches, micro_batch_size
  if m is None and size is None:
    m = 1
  if size is None:
    if batch % m:
      raise validation.Error(owner, 'num_micro_batches', m,
                             f'does not divide {where}.')
    return m, batch // m
  if m is None:
    if batch % size:
      raise validation.Error(owner, 'micro_batch_size', size,
                             f'does not divide {where}.')
    return batch // size, size
  if m * size != batch:
    raise validation.Error(
        owner, 'micro_batch_size', size,
        f'* num_micro_batches={m} = {m * size} != {where}.')
  return m, size


def Slice(state, num_micro_batches, batch_dim=0):
  """Cuts every leaf of a NestedMap into M equal parts along `batch_dim`.

  Returns:
    A list of M NestedMaps of the state's structure; part j holds examples
    [j * size, (j + 1) * size) of every leaf.
  """
  m = num_micro_batches
  leaves = state.Flatten()
  parts = [tf.split(x, m, axis=batch_dim) if m > 1 else [x] for x in leaves]
  return [state.Pack([p[j] for p in parts]) for j in range(m)]


def Concat(parts, batch_dim=0):
  """The inverse of `Slice`: concatenates NestedMaps leaf by leaf."""
  if len(parts) == 1:
    return parts[0]
  flat = [p.Flatten() for p in parts]
  return parts[0].Pack([tf.concat(leaves, axis=batch_dim)
                        for leaves in zip(*flat)])
