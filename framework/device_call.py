"""OnDevice: a computation whose backward runs where its forward ran.

tf.GradientTape builds a gradient op under the device scope around
`tape.gradient` (a train step has none), not beside the forward op it
differentiates, so TF's placer puts the backward of code that ran under
`tf.device(d)` on the step's default device: the first. For a pipelined
LM that is the softmax's backward (logits-sized tensors, the largest of a
step) on stage 0 instead of the last stage (measured per device with
memory_profile: bench/gpipe_memory.py --per_device). `tf.gradients`
colocates each gradient op with its forward op, so OnDevice runs `fn` under
a custom gradient that differentiates it with `tf.gradients`.

Eagerly (no graph to colocate in, tests) OnDevice is `fn` under the scope.

Example:
  sums = OnDevice(last_device, self._LossSums, theta.softmax, x, batch)
"""
import tensorflow as tf

from cadence.framework import cluster as cluster_lib


def _IsFloat(x):
  return isinstance(x, (tf.Tensor, tf.Variable)) and x.dtype.is_floating


def OnDevice(device, fn, *args):
  """fn(*args) under cluster.DeviceScope(device), its gradient there too.

  Args:
    device: a device string, or None (the device in scope).
    fn: fn(*args) -> a nest of tensors.
    *args: nests of tensors (floating ones get gradients; variables are
      read on their own devices first) and Python values.

  Returns:
    fn's nest.
  """
  flat = tf.nest.flatten(args)
  floats = [i for i, x in enumerate(flat) if _IsFloat(x)]
  if tf.executing_eagerly() or not floats:
    with cluster_lib.DeviceScope(device):
      return fn(*args)
  flat = [x.read_value() if isinstance(x, tf.Variable) else x for x in flat]
  structure = []

  @tf.custom_gradient
  def _Call(*xs):
    # tf.gradients differentiates every op between the ops of its sources
    # and its outputs: a source that is one output of an op with others (a
    # batch from an iterator: one op, every field) would put all its
    # siblings' consumers between (the whole pipeline, whose backward would
    # run here, once more, and take the activations its own backward keeps:
    # remat 'never' became a re-run in the trainer). Fresh identities are
    # sources of their own.
    with cluster_lib.DeviceScope(device):
      xs = [tf.identity(x) for x in xs]
    inputs = list(flat)
    for i, x in zip(floats, xs):
      inputs[i] = x
    with cluster_lib.DeviceScope(device):
      out = fn(*tf.nest.pack_sequence_as(args, inputs))
    structure.append(out)
    outs = tf.nest.flatten(out)

    def _Grad(*dys, variables=None):
      # `variables`: those fn reads without being passed them (captured).
      pairs = [(o, d) for o, d in zip(outs, dys)
               if o.dtype.is_floating and d is not None]
      sources = list(xs) + list(variables or [])
      grads = tf.gradients([o for o, _ in pairs], sources,
                           grad_ys=[d for _, d in pairs],
                           unconnected_gradients=tf.UnconnectedGradients.ZERO)
      if variables:
        return grads[:len(xs)], grads[len(xs):]
      return grads

    return outs, _Grad

  outs = _Call(*[flat[i] for i in floats])
  return tf.nest.pack_sequence_as(structure[0], outs)
