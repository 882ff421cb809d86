"""Memory of a training step per pipeline stage, estimated before running.

A stage (device) holds, at its peak:

  params:      its variables;
  grads:       one gradient per trained variable (they accumulate over the
               micro-batches and live until the update), twice with
               several micro-batches: a micro-batch's backward returns its
               gradients while the sum so far is alive;
  slots:       the optimizer's slot variables (Adam: 2 per parameter);
  activations: what the backward of its cell keeps: `act` bytes per
               micro-batch (a layer's FPropMeta `act_bytes`: the tensors
               TF's gradient reads, not every forward tensor), for as many
               micro-batches as the schedule and `remat` keep at once, plus
               the cell's outputs (`out` bytes a micro-batch) that wait for
               the backward;
  transient:   the temporaries of one micro-batch's backward (the gradients
               flowing through a layer), taken as the largest layer's act.

Validated against TF's allocator (bench/gpipe_memory.py): within 25% of
the measured peak for the bench Transformer (L = 4, 8, 16) and the Tiny
LM; see StageMemory for the two moments of a step that compete.

How many micro-batches' activations a cell keeps (W = backward_window,
in flight = pipeline_schedule.InFlight: M for GPipe, min(K-i, M) for 1F1B):

  remat 'never':       in flight;
  remat 'selective':   in flight, but only `act_weights` bytes of each (the
                       products with a weight, remat_policy 'weights'),
                       and one micro-batch's whole `act` recomputed in the
                       backward (its transient);
  remat 'always':      min(W, in flight) (the backward re-runs them);
  remat 'except_last': min(W + 1, in flight) for 1F1B (the last
                       micro-batch's forward overlaps re-runs), 1 for GPipe
                       (the last is back-propagated before any re-run).

Outputs: every micro-batch in flight keeps cell i's output (GPipe: all M).

`SavedBytes` measures what an `act_bytes` formula estimates: the bytes of
the forward tensors a function's gradient graph reads (buffers shared by
reshapes counted once); the tests hold the formulas to it.

Example:
  memory = NestedMap(schedule='1f1b', remat='never', num_micro_batches=8,
                     backward_window=1, cells=[NestedMap(
                         act=30 << 20, out=2 << 20, transient=8 << 20,
                         outside=0)] * 4)
  stages = StageMemory(memory, params=[100 << 20] * 4, slots=[200 << 20] * 4)
  [s.total for s in stages]   # bytes per stage
"""
import collections

import tensorflow as tf

from cadence.framework import pipeline_schedule
from cadence.framework import remat_policy

_SCHEDULES = {'gpipe': pipeline_schedule.GPipeSchedule,
              '1f1b': pipeline_schedule.OneFOneBSchedule}
# Ops whose output shares its input's buffer.
_ALIASES = frozenset(['Reshape', 'Identity', 'ExpandDims', 'Squeeze',
                      'StopGradient', 'Snapshot', 'IdentityN'])


class Stage(collections.namedtuple(
    'Stage', ['params', 'slots', 'grads', 'activations', 'transient'])):
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
  if remat in ('never', 'selective'):
    act = flight
  elif remat == 'always':
    act = [min(w, f) for f in flight]
  elif remat == 'except_last':
    act = ([min(w + 1, f) for f in flight] if schedule == '1f1b' else
           [1] * num_cells)
  else:
    raise ValueError(f'KeptMicroBatches: remat={remat!r}; expected '
                     "'never', 'selective', 'always' or 'except_last'.")
  return act, flight


def _ForwardKept(remat, num_micro_batches):
  """Micro-batches whose activations GPipe keeps when its forward ends."""
  return {'never': num_micro_batches, 'selective': num_micro_batches,
          'except_last': 1, 'always': 0}[remat]


def StageMemory(memory, params, slots, grads=None):
  """The `Stage` of each cell's device: its bytes at the step's peak.

  Two moments compete, the larger counts:
    backward: params, slots, the stage's gradients (a pipeline has them all
      after its first micro-batch's backward, and twice while it adds a
      micro-batch's; an unpipelined model none yet: its peak is where the
      backward starts), the activations and outputs kept
      (KeptMicroBatches) and one layer's transient;
    outside: (GPipe's last stage) params, slots, what the forward keeps and
      the loss on the whole batch with its gradient (`outside` bytes
      twice), before the pipeline's backward starts.

  Args:
    memory: NestedMap(schedule ('gpipe', '1f1b' or None: unpipelined),
      remat, num_micro_batches, backward_window, cells=K NestedMaps(act:
      bytes a micro-batch's backward reads, act_weights: of them, those
      remat 'selective' keeps, out: bytes of its output, transient: the
      largest layer's act, outside: bytes of what runs on the whole batch
      outside the pipeline after this cell)), as a task's FPropMeta gives
      it.
    params: K ints, bytes of each cell's variables.
    slots: K ints, bytes of each cell's optimizer slots.
    grads: K ints, bytes of the trained variables' gradients (default:
      params).

  Returns:
    K `Stage`s.
  """
  cells = memory.cells
  k, m = len(cells), memory.num_micro_batches
  grads = params if grads is None else grads
  if memory.schedule is None:
    act, out, grad_share = [1] * k, [0] * k, 0
  else:
    act, out = KeptMicroBatches(memory.schedule, memory.remat, k, m,
                                memory.backward_window)
    grad_share = 2 if m > 1 else 1
  stages = []
  selective = memory.remat == 'selective'
  for i, c in enumerate(cells):
    per = c.act_weights if selective else c.act
    backward = Stage(params[i], slots[i], grad_share * grads[i],
                     act[i] * per + out[i] * c.out,
                     c.act if selective else c.transient)
    stage = backward
    if c.outside and memory.schedule is not None:
      kept = _ForwardKept(memory.remat, m) * per + out[i] * c.out
      outside = Stage(params[i], slots[i], 0, kept + c.outside, c.outside)
      stage = max(backward, outside, key=lambda s: s.total)
    stages.append(stage)
  return stages


def SavedBytes(fn, input_specs, theta_specs=(), policy='all'):
  """Bytes of the forward tensors the gradient of `fn(*inputs, *theta)`
  needs: those it keeps under remat_policy `policy` and the inputs it (or
  the recomputation) reads; theta (weights, counted as parameters) and
  constants not. A reshape counts as its input (one buffer).

  Traces `fn` (nothing runs) under a tape and differentiates its float
  outputs w.r.t. every float input and theta leaf.

  Args:
    fn: fn(*inputs, *theta) -> a nest of tensors.
    input_specs: tf.TensorSpecs of the inputs.
    theta_specs: tf.TensorSpecs of the weights.
    policy: 'all' (what a GradientTape keeps) or 'weights' (selective
      recomputation), see remat_policy.
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
  weights = [t.op for t in graph.inputs[len(input_specs):len(specs)]]
  kept, read = remat_policy.Walk(
      graph, graph.outputs[:len(concrete.structured_outputs[0])], weights,
      policy)
  saved = {}
  for t in kept + [t for t in read if t.op not in weights]:
    while t.op.type in _ALIASES and t.op.inputs:
      t = t.op.inputs[0]
    if t.shape.is_fully_defined() and t.op not in weights:
      saved[t.ref()] = t.shape.num_elements() * t.dtype.size
  return sum(saved.values())
