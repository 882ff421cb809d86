"""What a train step needs to compile as one XLA program (TPU, --xla).

XLA compiles a program for fixed shapes on one device (a TPU replica: its
logical cores). Before any step, the trainer checks the whole program
statically, so a violation is one clear error instead of a compile failure
deep in XLA (or a recompilation at every batch):

  * `CheckInputSpec`: every field of the input batches has a fully defined
    shape (`fixed_input_shape=True`: batches cut with drop_remainder, rows
    padded to a fixed length);
  * `CheckStepShapes`: the task's forward pass traced once on those shapes
    has no tensor of unknown shape anywhere (a data-dependent shape such as
    `tf.boolean_mask`, a pipeline state or output whose shape is lost);
    nested functions and loop bodies included;
  * `CheckOneDevice`: one replica's stages on one device (off a TPU).

Example:
  spec = dataset.element_spec
  xla_step.CheckInputSpec(spec, "lm's input")
  xla_step.CheckStepShapes(task, spec)
"""
import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import cluster as cluster_lib
from cadence.framework.nested_map import NestedMap
from cadence.framework import step_seed

# Attributes naming the functions an op runs (loop bodies, branches, calls).
_FUNCTION_ATTRS = ('body', 'cond', 'then_branch', 'else_branch', 'f',
                   'branches')
# Handles and containers carry no array shape of their own.
_NO_SHAPE_DTYPES = (tf.resource, tf.variant, tf.string)

_FIX_INPUT = ('set fixed_input_shape=True in the input params (batches cut '
              'with drop_remainder, rows padded to a fixed length)')


class StaticShapeError(ValueError):
  """A shape that XLA (a TPU, --xla) cannot compile for once."""


def _Dims(shape):
  return '[' + ', '.join('?' if d is None else str(d)
                         for d in shape.as_list()) + ']'


def _UnknownDim(shape):
  """Index of the first unknown dimension of a TensorShape (-1: rank)."""
  if shape.rank is None:
    return -1
  for i, d in enumerate(shape.as_list()):
    if d is None:
      return i
  return None


def CheckOneDevice(cluster, owner):
  """Raises unless one replica's stages share one XLA program's device.

  XLA compiles one program per device; a replica split over several CPUs
  or GPUs cannot be one program (a TPU replica's logical cores can).
  """
  devices = cluster.DevicesInModelSplit(0)
  split = cluster.split_size_from or f'--worker_split_size={len(devices)}'
  if len(devices) > 1 and cluster_lib.LogicalCoreIndex(devices[0]) is None:
    raise StaticShapeError(
        f'{owner}: --xla compiles one replica\'s step as one XLA program on '
        f'one device, but a replica spans {len(devices)} devices '
        f'({", ".join(devices)}; {split}). Use --worker_split_size=1: the '
        'pipeline\'s stages then run in turn on that device (on a TPU, stage '
        's goes on logical core s).')


def CheckInputSpec(element_spec, owner):
  """Raises StaticShapeError naming a batch field of unknown shape.

  Args:
    element_spec: a dataset's element_spec (a NestedMap/dict of TensorSpec).
    owner: who reads the batches, for the message.
  """
  for key, spec in NestedMap(element_spec).FlattenItems():
    dim = _UnknownDim(spec.shape)
    if dim is None:
      continue
    what = ('has unknown rank' if dim < 0 else
            f'has shape {_Dims(spec.shape)}: dimension {dim} is not fixed')
    raise StaticShapeError(
        f'{owner}: input batch field {key!r} {what}; TPU and --xla need '
        f'fully defined batch shapes: {_FIX_INPUT}.')


def _SubGraphs(graph):
  """The graphs of the functions `graph`'s ops call (loops, conds, calls)."""
  for op in graph.get_operations():
    for attr in _FUNCTION_ATTRS:
      try:
        value = op.get_attr(attr)
      except ValueError:
        continue
      for fn in value if isinstance(value, list) else [value]:
        found = graph._get_function(fn.name)  # pylint: disable=protected-access
        if found is not None and getattr(found, 'graph', None) is not None:
          yield found.graph


def _Walk(graph, seen):
  if id(graph) in seen:
    return
  seen.add(id(graph))
  yield graph
  for sub in _SubGraphs(graph):
    yield from _Walk(sub, seen)


def FirstUnknownShape(graph):
  """(tensor, dim) of the first op output of unknown shape in `graph` and
  the functions it calls (dim -1: unknown rank), else None."""
  for g in _Walk(graph, set()):
    for op in g.get_operations():
      if op.type == 'Placeholder':
        continue  # Arguments: the caller's tensors, checked there.
      for t in op.outputs:
        if t.dtype in _NO_SHAPE_DTYPES:
          continue
        dim = _UnknownDim(t.shape)
        if dim is not None:
          return t, dim
  return None


def CheckStepShapes(task, element_spec):
  """Traces `task.FPropTower` on `element_spec` once; raises
  StaticShapeError naming the first tensor of unknown shape.

  The forward pass is what sets the shapes (the backward pass follows
  them): every op output of it, inside the pipeline's loops too, must be
  fully defined.
  """
  owner = f"Task '{task.path}'"
  CheckInputSpec(element_spec, f"The input of task '{task.path}'")
  specs = NestedMap(element_spec)

  def _FProp(batch):
    seed = step_seed.MakeStepSeed(tf.constant(0, tf.int64),
                                  task.params.random_seed or 0)
    return task.FPropTower(base_layer.WithStepSeed(task.theta, seed),
                           NestedMap(batch))

  concrete = tf.function(_FProp, autograph=False).get_concrete_function(
      specs)
  found = FirstUnknownShape(concrete.graph)
  if found is None:
    return
  tensor, dim = found
  what = ('has unknown rank' if dim < 0 else
          f'has shape {_Dims(tensor.shape)}: dimension {dim} depends on the '
          'data')
  raise StaticShapeError(
      f'{owner}: tensor {tensor.name!r} (op {tensor.op.type}) {what}; TPU '
      'and --xla need static shapes in FProp: replace data-dependent ops '
      '(tf.boolean_mask, tf.where(cond), tf.unique, ...) by masking with '
      'weights or padding.')
