"""Memory of a training step per pipeline stage, estimated before running.

A stage (device) holds, at its peak:

  params:      its variables;
  grads:       one gradient per trained variable (they accumulate over the
               micro-batches and live until the update);
  slots:       the optimizer's slot variables (Adam: 2 per parameter);
  activations: what the backward of its cell keeps: `act` bytes per
               micro-batch (a layer's FPropMeta `act_bytes`: the tensors
               TF's gradient reads, not every forward tensor), for as many
               micro-batches as the schedule and `remat` keep at once, plus
               the cell's outputs (`out` bytes a micro-batch) that wait for
               the backward;
  transient:   the largest temporaries of one micro-batch's backward (the
               gradients flowing through the cell), taken as one more `act`.

How many micro-batches' activations a cell keeps (W = backward_window,
in flight = pipeline_schedule.InFlight: M for GPipe, min(K-i, M) for 1F1B):

  remat 'never':       in flight;
  remat 'always':      min(W, in flight) (the backward re-runs them);
  remat 'except_last': min(W + 1, in flight) for 1F1B (the last
                       micro-batch's forward overlaps re-runs), 1 for GPipe
                       (the last is back-propagated before any re-run).

Outputs: every micro-batch in flight keeps cell i's output (GPipe: all M).

`SavedBytes` measures what an `act_bytes` formula estimates: the bytes of
the forward tensors a function's gradient graph reads (buffers shared by
reshapes counted once); the tests hold the formulas to it.

Example:
  stages = StageMemory(schedule='1f1b', remat='never', num_micro_batches=8,
                       cells=[NestedMap(act=30 << 20, out=2 << 20)] * 4,
                       params=[100 << 20] * 4, slots_per_param=2)
  [s.total for s in stages]   # bytes per stage
"""
import collections

import tensorflow as tf

from cadence.framework import pipeline_schedule

_SCHEDULES = {'gpipe': pipeline_schedule.GPipeSchedule,
              '1f1b': pipeline_schedule.OneFOneBSchedule}
# Ops whose output shares its input's buffer.
_ALIASES = frozenset(['Reshape', 'Identity', 'ExpandDims', 'Squeeze',
                      'StopGradient', 'Snapshot', 'IdentityN'])


class Stage(collections.namedtuple(
    'Stage', ['params', 'grads', 'slots', 'activations', 'transient'])):
  """Bytes one stage holds at its peak; see the module docstring."""
  __slots__ = ()

  @property
  def total(self):
    return sum(self)


def KeptMicroBatches(schedule, remat, num_cells, num_micro_batches,
                     backward_window=1):
  """Per cell: how many micro-batches' activations it keeps at once.

  Returns:
    (kept activations, kept outputs): two lists of K ints.
  """
  if schedule not in _SCHEDULES:
    raise ValueError(f'KeptMicroBatches: schedule={schedule!r}; expected one '
                     f'of {sorted(_SCHEDULES)}.')
  flight = pipeline_schedule.InFlight(
      _SCHEDULES[schedule](num_cells, num_micro_batches), num_cells)
  w = backward_window or num_micro_batches
  if remat == 'never':
    act = flight
  elif remat == 'always':
    act = [min(w, f) for f in flight]
  elif remat == 'except_last':
    act = ([min(w + 1, f) for f in flight] if schedule == '1f1b' else
           [1] * num_cells)
  else:
    raise ValueError(f'KeptMicroBatches: remat={remat!r}; expected '
                     "'never', 'always' or 'except_last'.")
  return act, flight


def StageMemory(schedule, remat, num_micro_batches, cells, params,
                slots_per_param, grads=None, backward_window=1):
  """The `Stage` bytes of each cell's device; see the module docstring.

  Args:
    schedule: 'gpipe' or '1f1b'; None for an unpipelined model (one cell,
      one micro-batch: the whole batch).
    remat: the pipeline's remat mode.
    num_micro_batches: M.
    cells: K NestedMaps(act=bytes a micro-batch's backward keeps, out=bytes
      of the cell's output for a micro-batch).
    params: K ints, bytes of each cell's variables.
    slots_per_param: optimizer slot bytes per parameter byte.
    grads: K ints, bytes of the trained variables' gradients (default:
      params).
    backward_window: the pipeline's backward_window.

  Returns:
    K `Stage`s.
  """
  k = len(cells)
  grads = params if grads is None else grads
  if schedule is None:
    act, out = [1] * k, [0] * k
  else:
    act, out = KeptMicroBatches(schedule, remat, k, num_micro_batches,
                                backward_window)
  return [Stage(params=params[i], grads=grads[i],
                slots=int(slots_per_param * grads[i]),
                activations=act[i] * c.act + out[i] * c.out,
                transient=c.act)
          for i, c in enumerate(cells)]


def SavedBytes(fn, input_specs, theta_specs=()):
  """Bytes of forward tensors the gradient of `fn(*inputs, *theta)` reads.

  Traces `fn` (nothing runs) under a tape and differentiates its float
  outputs w.r.t. every float input and theta leaf; counts each forward
  tensor a gradient op reads once (a reshape counts as its input), the
  inputs included, theta (weights, counted as parameters) and constants
  not.

  Args:
    fn: fn(*inputs, *theta) -> a nest of tensors.
    input_specs: tf.TensorSpecs of the inputs.
    theta_specs: tf.TensorSpecs of the weights.
  """
  specs = list(input_specs) + list(theta_specs)

  def _Traced(*args):
    sources = [a for a in args if a.dtype.is_floating]
    with tf.GradientTape() as tape:
      tape.watch(sources)
      out = tf.nest.flatten(fn(*args))
    targets = [o for o in out if o.dtype.is_floating]
    grads = tape.gradient(targets, sources,
                          output_gradients=[tf.ones_like(o) for o in targets])
    return targets, [g for g in grads if g is not None]

  concrete = tf.function(_Traced, autograph=False).get_concrete_function(
      *specs)
  graph = concrete.graph
  weights = set(t.op for t in graph.inputs[len(input_specs):len(specs)])
  num_targets = len(concrete.structured_outputs[0])
  # The forward: the ancestors of the targets (the outputs before the
  # gradients).
  forward, todo = set(), [t.op for t in graph.outputs[:num_targets]]
  while todo:
    op = todo.pop()
    if op not in forward:
      forward.add(op)
      todo += [t.op for t in op.inputs] + list(op.control_inputs)
  saved = {}
  for op in graph.get_operations():
    if op in forward:
      continue
    for t in op.inputs:
      while t.op.type in _ALIASES and t.op.inputs:
        t = t.op.inputs[0]
      if (t.op in forward and t.op not in weights and t.op.type != 'Const'
          and t.shape.is_fully_defined()):
        saved[t.name] = t.shape.num_elements() * t.dtype.size
  return sum(saved.values())
