"""Memory of a training step per pipeline stage, estimated before running.

A stage (device) holds, at its worst moment (`Moments`: the ticks of the
schedule):

  params:      its variables;
  grads:       one gradient per trained variable once it has run a backward
               (the sum over micro-batches, alive until the update; a
               micro-batch's gradients join it layer by layer and are freed
               as they do: measured, bench/gpipe_memory.py --per_device);
  slots:       the optimizer's slot variables (Adam: 2 per parameter);
  activations: what the backward of its cell keeps: `act` bytes per
               micro-batch (a layer's cost record's `act`: the tensors
               TF's gradient reads, not every forward tensor), for as many
               micro-batches as the schedule and `remat` keep at once, plus
               the cell's outputs (`out` bytes a micro-batch) that wait for
               the backward; with W deferred (zero-bubble
               schedules), `residuals` bytes (the cost record's `residuals`:
               what W reads) per micro-batch between its B and its W;
  transient:   the temporaries of one micro-batch's backward (the gradients
               flowing through a layer): the largest `transient` of the
               cell's units' cost records (a backward frees what it read
               as it passes);
  input:       the first stage's: the whole batch's input (tf.split's parts
               share its buffer, so all M micro-batches stay while any
               does) and the input gradients waiting to be joined; any
               other stage's: the input gradients it made that the stage
               before has not back-propagated yet.

StageMemory is each stage's worst moment (what each device must hold);
SharedMemory the step's worst moment of all stages together (what one
memory holding every stage needs: logical devices of one host, a split
onto one accelerator). Validated against TF's allocator by
bench/gpipe_memory.py: per device from the allocator's events
(memory_profile.py), and the process's peak.

How many micro-batches' activations a cell keeps at its worst tick (W =
backward_window, in flight = schedules.InFlight: M for GPipe,
min(S-i, M) for 1F1B with S stages; KeptMicroBatches, and per tick `Moments`):

  remat 'never':       in flight;
  remat 'selective':   in flight, but only `act_weights` bytes of each (the
                       products with a weight, remat_policy 'weights'),
                       and the rest of one micro-batch's `act`
                       recomputed in the backward (with its transient);
  remat 'always':      min(W, in flight) (the backward re-runs them);
  remat 'except_last': min(W + 1, in flight) for 1F1B (the last
                       micro-batch's forward overlaps re-runs), 1 for GPipe
                       (the last is back-propagated before any re-run).

Outputs: every micro-batch in flight keeps cell i's output (GPipe: all M),
counted once for a kept micro-batch whose `act` holds it already (its
`act_outputs`: a cell ending in a relu).

`SavedBytes` measures what an `act` formula (framework/cost.py) estimates:
the bytes of the forward tensors a function's gradient graph reads (buffers
shared by reshapes counted once); the tests hold the formulas to it.

Example:
  memory = NestedMap(schedule='1f1b', remat='never', num_micro_batches=8,
                     backward_window=1, cells=[NestedMap(
                         act=30 << 20, act_weights=12 << 20,
                         residuals=16 << 20, out=2 << 20,
                         transient=8 << 20, outside=0)] * 4)
  stages = StageMemory(memory, params=[100 << 20] * 4, slots=[200 << 20] * 4)
  [s.total for s in stages]   # bytes per stage
  SharedMemory(memory, [100 << 20] * 4, [200 << 20] * 4).total  # together
"""
import collections

import tensorflow as tf

from cadence.framework.nested_map import NestedMap
from cadence.framework.pipeline import deferred_w
from cadence.framework.pipeline import remat_policy
from cadence.framework.pipeline import schedules

# Ops whose output shares its input's buffer.
_ALIASES = frozenset(['Reshape', 'Identity', 'ExpandDims', 'Squeeze',
                      'StopGradient', 'Snapshot', 'IdentityN'])


class Stage(collections.namedtuple(
    'Stage', ['params', 'slots', 'grads', 'activations', 'transient'])):
  """Bytes a stage holds at one moment; see the module docstring."""
  __slots__ = ()

  @property
  def total(self):
    return sum(self)


def _KeptRule(loss_inside, remat, num_micro_batches, backward_window):
  """kept(live, backward, last): how many micro-batches' activations a cell
  keeps at a tick where `live` micro-batches are in flight, given whether
  it runs a backward then and whether it has run its last forward."""
  w = backward_window or num_micro_batches
  if remat in ('never', 'selective'):
    return lambda live, backward, last: live
  if remat == 'always':
    return lambda live, backward, last: min(w, live) if backward else 0
  if remat == 'except_last':
    if loss_inside:
      # Forwards and backwards interleave: the last micro-batch's kept
      # forward overlaps the re-runs.
      return lambda live, backward, last: min(w + 1, live)
    # All forwards first: the last one kept is back-propagated first, then
    # the others are re-run one at a time.
    return lambda live, backward, last: 1 if last and live else 0
  raise ValueError(f'memory_estimate: remat={remat!r}; expected '
                   "'never', 'selective', 'always' or 'except_last'.")


class _Count(collections.namedtuple('_Count', [
    'kept', 'live', 'waiting', 'done', 'backward', 'sent'])):
  """A stage at one tick: micro-batches whose activations it keeps; in
  flight (forwarded, not back-propagated: their outputs wait); waiting for
  their deferred W after B (what W reads stays); backwards (or W's)
  finished before; whether it runs a backward (B or W) then; input
  gradients its B made that the stage before has not consumed yet (its
  B of that micro-batch not done)."""
  __slots__ = ()


def _Table(memory):
  """The schedule of a memory record: a PipelinePlan's Schedule, or one
  built from a name for its stages on `num_devices` devices (default: one
  each) and a table's text."""
  if isinstance(memory.schedule, schedules.Schedule):
    return memory.schedule
  num_cells = len(memory.cells)
  try:
    return schedules.Build(
        memory.schedule, num_cells,
        getattr(memory, 'num_devices', None) or num_cells,
        memory.num_micro_batches,
        table=getattr(memory, 'schedule_table', None) or None)
  except KeyError as e:
    raise ValueError(f'memory_estimate: {e.args[0]}') from None


def _Counts(memory):
  """Yields, per moment of a pipelined step, (per stage a `_Count`,
  outside). A moment is a tick of the schedule (`schedules.Schedule.
  Ticks`); a schedule whose loss runs outside the pipeline adds one after
  its last forward (`outside` True), where the loss runs on the whole
  batch."""
  table = _Table(memory)
  num_cells, m = table.num_stages, table.num_micro_batches
  ticks = table.Ticks()
  kept = _KeptRule(table.loss_inside, memory.remat, m, memory.backward_window)
  defer_w = table.defers_w
  # The work each tick does (actions.Kind.does): a kind's memory is that
  # of its work.
  ticks = [[w for a in tick for w in a.Work()] for tick in ticks]
  last_forward = max(t for t, tick in enumerate(ticks)
                     if any(w.kind == schedules.FORWARD for w in tick))
  live, waiting, done = [0] * num_cells, [0] * num_cells, [0] * num_cells
  sent = [0] * num_cells
  last = [False] * num_cells
  for t, tick in enumerate(ticks):
    backward = {i for kind, i, _ in tick if kind == schedules.BACKWARD}
    weight = {i for kind, i, _ in tick if kind == schedules.WEIGHT}
    for kind, i, j in tick:
      if kind == schedules.FORWARD:
        live[i] += 1
        last[i] = last[i] or j == m - 1
    yield [_Count(kept(live[i], i in backward, last[i]), live[i], waiting[i],
                  done[i], i in backward or i in weight, sent[i])
           for i in range(num_cells)], False
    for i in backward:
      live[i] -= 1
      if defer_w:
        waiting[i] += 1
      else:
        done[i] += 1
      if i > 0:   # Its input gradient, for the stage before.
        sent[i] += 1
      if i + 1 < num_cells:   # Consumed what the stage after sent.
        sent[i + 1] -= 1
    for i in weight:
      waiting[i] -= 1
      done[i] += 1
    if not table.loss_inside and t == last_forward:
      yield [_Count(kept(live[i], False, last[i]), live[i], waiting[i], 0,
                    False, 0) for i in range(num_cells)], True


def KeptMicroBatches(schedule, remat, num_cells, num_micro_batches,
                     backward_window=1, num_devices=None, table=None):
  """Per stage: the most micro-batches whose activations it keeps at once,
  and the most in flight (whose outputs wait for the backward).

  Returns:
    (kept activations, kept outputs): two lists of S ints, one a stage.
  """
  memory = NestedMap(schedule=schedule, remat=remat,
                     num_micro_batches=num_micro_batches,
                     backward_window=backward_window, num_devices=num_devices,
                     schedule_table=table, cells=[None] * num_cells)
  act, out = [0] * num_cells, [0] * num_cells
  for counts, _ in _Counts(memory):
    for i, c in enumerate(counts):
      act[i], out[i] = max(act[i], c.kept), max(out[i], c.live)
  return act, out


def Moments(memory, params, slots, grads=None, update=None):
  """Each stage's bytes at every moment of a training step.

  A moment is a tick of the schedule (schedules), plus, for a schedule
  whose loss runs outside the pipeline (GPipe), the one between its
  phases. At a tick a stage holds its params and slots; its gradients' sum
  once it runs or has run a backward (with W deferred: its first W); the
  activations it keeps (KeptMicroBatches' rule at that tick) and the
  outputs of the micro-batches in flight; after B, until its deferred W,
  what W reads (`residuals`: the inputs of the weight products and the
  gradients of their outputs, ResidualBytes); and, while it runs a
  backward or a W, one layer's transient
  (remat 'selective': and what it recomputes, act - act_weights). The first
  stage holds the whole batch's input (the micro-batches are slices of one
  buffer) beyond the micro-batches its `act` keeps, and the input
  gradients of the micro-batches back-propagated, until they are joined
  at the end; any other stage holds the input gradients its backwards
  made until the stage before has back-propagated those micro-batches
  (the previous stage's `out` bytes each). Between GPipe's phases, a stage with `outside` bytes (what
  the loss on the whole batch keeps for its backward) holds them and its
  backward's temporaries (`outside_transient`, default `outside`) on top
  of what its forward kept. An unpipelined model has one moment, where its
  backward starts: no gradients yet. With `update`, a last moment: the
  update after the backward, each stage holding its params, slots and
  gradients and `update` more (the all-reduce's buffers, UpdateBytes),
  no activations.

  Args:
    memory: NestedMap(schedule (a registered name, or None: unpipelined),
      remat, num_micro_batches, backward_window, cells=S NestedMaps(act:
      bytes a micro-batch's backward reads, act_weights: of them, those
      remat 'selective' keeps, residuals: what a deferred W reads
      (read only by schedules that defer W), out: bytes of its output,
      transient: its backward's temporaries, act_outputs (optional, default
      0): of act, the bytes of its output, outside: bytes of what runs on
      the whole batch outside the pipeline after this stage keeps, and
      optionally outside_transient: the temporaries of that backward), and
      optionally num_devices (the stages' devices; default one each) and
      schedule_table (a 'table' schedule's text) and input (bytes of one
      micro-batch of the pipeline's inputs, default 0), as a task's
      FPropMeta gives it.
    params: S ints, bytes of each stage's variables.
    slots: S ints, bytes of each stage's optimizer slots.
    grads: S ints, bytes of the trained variables' gradients (default:
      params).
    update: S ints, bytes each stage's update holds beyond its gradients
      (UpdateBytes), or None: no update moment.

  Returns:
    A list of moments, each a list of S `Stage`s.
  """
  cells = memory.cells
  grads = params if grads is None else grads
  last = [] if update is None else [[
      Stage(params[i], slots[i], grads[i], 0, update[i])
      for i in range(len(cells))]]
  if memory.schedule is None:
    return [[Stage(params[i], slots[i], 0, c.act, c.transient)
             for i, c in enumerate(cells)]] + last
  selective = memory.remat == 'selective'
  m, micro_input = memory.num_micro_batches, getattr(memory, 'input', 0)
  moments = []
  for counts, outside in _Counts(memory):
    moment = []
    for i, (c, n) in enumerate(zip(cells, counts)):
      # A kept micro-batch's output is in its `act` when the backward
      # reads it (act_outputs): counted once.
      both = 0 if selective else min(c.out, c.get('act_outputs', 0))
      held = (n.kept * (c.act_weights if selective else c.act) +
              n.live * c.out - n.kept * both +
              # Only schedules that defer W have micro-batches waiting for a W.
              (n.waiting * c.residuals if n.waiting else 0) +
              # Input gradients the stage before has yet to take.
              (n.sent * cells[i - 1].out if i else 0))
      g = grads[i] if n.backward or n.done else 0
      transient = 0
      if n.backward:   # 'selective' first recomputes what it did not keep.
        transient = c.transient + (c.act - c.act_weights if selective else 0)
      if i == 0:
        # The micro-batches are slices of the batch's one buffer: all M
        # stay alive, not only the kept ones `act` counts; and the input
        # gradients of back-propagated ones wait to be joined.
        held += micro_input * (m - n.kept + n.done + n.waiting)
      if outside and c.outside:
        held = held + c.outside
        transient = c.get('outside_transient', c.outside)
      moment.append(Stage(params[i], slots[i], g, held, transient))
    moments.append(moment)
  return moments + last


def UpdateBytes(grads, num_replicas):
  """Per stage, the bytes its update holds beyond its gradients (`grads`:
  bytes per stage) with `num_replicas` data-parallel replicas (of every
  host), or None (one replica: the update runs in place, no moment of its
  own). The all-reduce packs a stage's gradients into one buffer and
  returns the mean in another: 2x the gradients, sharded slots or not
  (a sharded update then holds one variable's shards and gathered block at
  a time, less than these; framework/train/sharded_update.py). Measured
  (bench/sharded_update_bench.py): the update is the step's peak of a
  model whose activations are small beside its weights."""
  if num_replicas <= 1:
    return None
  return [2 * g for g in grads]


def DeviceMemory(memory, params, slots, grads=None, moments=None,
                 update=None):
  """Per device, the `Stage` sums of its stages at its own worst moment:
  what each device must hold when stages share devices (interleaved, V
  schedules); StageMemory when each stage has its own device. `moments`:
  Moments of these arguments, if computed already."""
  stage_devices = (_Table(memory).stage_devices if memory.schedule else
                   [0] * len(memory.cells))
  moments = moments or Moments(memory, params, slots, grads, update)
  out = []
  for d in range(max(stage_devices) + 1):
    mine = [i for i, sd in enumerate(stage_devices) if sd == d]
    out.append(max((Stage(*map(sum, zip(*[moment[i] for i in mine])))
                    for moment in moments), key=lambda s: s.total))
  return out


def StageMemory(memory, params, slots, grads=None, update=None):
  """The `Stage` of each cell's device at its own worst moment (Moments):
  what each device must hold when every stage has its own memory."""
  moments = Moments(memory, params, slots, grads, update)
  return [max((moment[i] for moment in moments), key=lambda s: s.total)
          for i in range(len(memory.cells))]


def SharedMemory(memory, params, slots, grads=None, moments=None,
                 update=None):
  """What all stages hold together at the step's worst moment (Moments), as
  one `Stage` (the sums): the need of one memory that holds every stage
  (logical devices of one host, a split onto one accelerator). At most the
  sum of StageMemory: stages peak at different moments. `moments`: as
  DeviceMemory's."""
  moments = moments or Moments(memory, params, slots, grads, update)
  worst = max(moments, key=lambda moment: sum(s.total for s in moment))
  return Stage(*map(sum, zip(*worst)))


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
  return _Bytes(kept + [t for t in read if t.op not in weights], weights)


def ResidualBytes(fn, input_specs, theta_specs=()):
  """Bytes of what a deferred W reads (deferred_w.CutBackward, as
  zero-bubble schedules run it): the inputs of the weight products and the
  gradients of their outputs that B computed, the forward tensors and the
  output gradients W needs; theta not. What a stage holds per micro-batch
  between its B and its W, which the `residuals` formulas of the
  layers estimate.

  Traces `fn` and its gradient (nothing runs), the output gradients fed,
  and cuts the gradient as the executor does.

  Args:
    fn: fn(*inputs, *theta) -> a nest of tensors.
    input_specs: tf.TensorSpecs of the inputs.
    theta_specs: tf.TensorSpecs of the weights.
  """
  specs = list(input_specs) + list(theta_specs)
  outs = tf.function(fn, autograph=False).get_concrete_function(
      *specs).structured_outputs
  d_specs = [tf.TensorSpec(o.shape, o.dtype) for o in tf.nest.flatten(outs)
             if o.dtype.is_floating]

  def _Grads(*flat):
    args = flat[:len(specs)]
    with tf.GradientTape() as tape:
      tape.watch([a for a in args if a.dtype.is_floating])
      out = [o for o in tf.nest.flatten(fn(*args)) if o.dtype.is_floating]
    return tape.gradient(
        out, [a for a in args if a.dtype.is_floating],
        output_gradients=list(flat[len(specs):]))

  traced = tf.compat.v1.wrap_function(_Grads, specs + d_specs)
  grads = list(traced.outputs)
  n_input_grads = sum(s.dtype.is_floating for s in input_specs)
  cut = deferred_w.CutBackward(traced, traced.inputs,
                             grads[n_input_grads:], grads[:n_input_grads])
  weights = [t.op for t in traced.inputs[len(input_specs):len(specs)]]
  return _Bytes(cut.residuals, weights)


def _Bytes(tensors, weights):
  """Bytes of `tensors` but those of ops `weights`, a buffer shared by
  reshapes (and other aliases) counted once."""
  saved = {}
  for t in tensors:
    while t.op.type in _ALIASES and t.op.inputs:
      t = t.op.inputs[0]
    if t.shape.is_fully_defined() and t.op not in weights:
      saved[t.ref()] = t.shape.num_elements() * t.dtype.size
  return sum(saved.values())


def FormatBytes(n):
  """'1.50 GiB', '12.00 MiB', '3.00 KiB' or '12 B'."""
  for unit, size in (('GiB', 2**30), ('MiB', 2**20), ('KiB', 2**10)):
    if n >= size:
      return f'{n / size:.2f} {unit}'
  return f'{n} B'
