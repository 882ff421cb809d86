"""Step seeds: explicit, stateless randomness for FProp.

Every random op inside a layer's FProp is a `tf.random.stateless_*` op whose
seed is derived from three things:

  (global step, micro-batch index) -> the *step seed*, an int64 tensor [2];
  the layer's path (static)        -> folded in by `LayerSeed`;
  an op index inside the layer     -> folded in by `LayerSeed`.

The step seed is passed, never read from a global: the train loop makes one
with `MakeStepSeed(global_step)`, attaches it to theta with
`base_layer.WithStepSeed`, and a pipeline derives one per micro-batch with
`MicroBatchSeed`. Re-running an FProp with the same step seed replays the
same masks, which is what makes rematerialised backward passes exact.

Example:
  seed = MakeStepSeed(global_step=10, random_seed=1234)
  mb_seed = MicroBatchSeed(seed, 3)
  op_seed = LayerSeed(mb_seed, 'lm.stack.x_layers[2].dropout')
  mask = tf.random.stateless_uniform([4, 8], seed=op_seed) > 0.1
"""
import zlib

import tensorflow as tf

SEED_DTYPE = tf.int64


def _FoldIn(seed, data):
  return tf.random.experimental.stateless_fold_in(
      seed, tf.cast(data, SEED_DTYPE))


def PathHash(path):
  """A stable (process-independent) 31-bit hash of a layer path string."""
  return zlib.crc32(path.encode('utf-8')) & 0x7FFFFFFF


def MakeStepSeed(global_step, random_seed=0):
  """Returns the step seed, int64 [2], for a global step.

  Args:
    global_step: int or scalar integer tensor.
    random_seed: int, the experiment's base seed; distinct experiments with
      distinct seeds draw distinct masks at the same step.
  """
  base = tf.constant([random_seed & 0x7FFFFFFF, 0x5EED], SEED_DTYPE)
  return _FoldIn(base, global_step)


def MicroBatchSeed(step_seed, micro_batch_index):
  """Derives the step seed of one micro-batch from the step's seed."""
  return _FoldIn(step_seed, tf.cast(micro_batch_index, SEED_DTYPE) + 1)


def LayerSeed(step_seed, layer_path, op_index=0):
  """The [2] seed for random op number `op_index` of layer `layer_path`."""
  seed = _FoldIn(step_seed, PathHash(layer_path))
  return _FoldIn(seed, op_index)


def CheckStepSeed(step_seed, owner):
  """Validates a step seed value; `owner` names the layer for the error."""
  if step_seed is None:
    raise ValueError(
        f'{owner}: FProp draws random numbers in training mode but theta '
        'carries no step seed. Attach one with '
        'base_layer.WithStepSeed(theta, step_seed.MakeStepSeed(step)), '
        'or set is_inference=True.')
  step_seed = tf.convert_to_tensor(step_seed)
  if step_seed.shape.rank is not None and step_seed.shape.as_list() != [2]:
    raise ValueError(
        f'{owner}: a step seed must have shape [2]; got {step_seed.shape}.')
  return tf.cast(step_seed, SEED_DTYPE)
