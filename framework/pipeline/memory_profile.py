"""Measured memory of a real step, per device, from TF's allocator events.

With the profiler on, TensorFlow's BFC allocators record every allocation
and deallocation of a tensor buffer (address, bytes, the op that allocated
it). Where TF placed each op (its device, also for ops the program left
unplaced) comes from the run metadata of the step's first call, which
records the placed graphs. Together they give, per device, the bytes of the
step's tensors live at once at its worst moment: what each pipeline stage
needs beyond its variables, even when the stages are logical devices of one
host that share one allocator (whose own peak is only the sum at the
process's worst moment).

Buffers allocated before the profiled call (variables, the inputs) are not
in it; `DeviceTotals` adds their bytes per device. Ops the placed graphs do not
name (inside a function the step calls without inlining it) count as
`UNATTRIBUTED`: build pipelines with `trace_actions` to measure them per
device.

GPU allocators are BFC allocators and record them; so did the CPU one in
the TF releases setup.py allows (>= 2.16). Where a CPU profile
holds none, set TF_CPU_ALLOCATOR_USE_BFC=true before TensorFlow starts.

Example:
  placement = Placement(lambda: float(step(batch)))   # The first call.
  peaks = DevicePeaks(lambda: float(step(batch)), placement)
  peaks['/job:localhost/replica:0/task:0/device:CPU:1']  # bytes
"""
import collections

import tensorflow as tf
from tensorflow.python.eager import context  # Run metadata: no public API.

from cadence.framework.pipeline import timeline

UNATTRIBUTED = 'unattributed'
_ALLOCATION, _DEALLOCATION = 'MemoryAllocation', 'MemoryDeallocation'


def Placement(run):
  """Runs `run()`, the first call of its tf.functions, recording where TF
  placed the nodes of the graphs it instantiates.

  Returns:
    {node name: device}.

  Raises:
    ValueError: if the call instantiated no graph (a function traced and
      run before: the run metadata only records new instantiations).
  """
  ctx = context.context()
  ctx.enable_run_metadata()
  try:
    # Drop what the process collected before (another step's graphs, when
    # run metadata was on elsewhere): only `run`'s graphs are read.
    ctx.export_run_metadata()
    run()
    metadata = ctx.export_run_metadata()
  finally:
    ctx.disable_run_metadata()
  placement = {node.name: node.device
               for graph in metadata.function_graphs
               for partition in graph.partition_graphs
               for node in partition.node}
  if not placement:
    raise ValueError('Placement: the call instantiated no graph; pass the '
                     'first call of the step function (before it has run).')
  return placement


def AllocatorEvents(space):
  """The allocator events of a profile (an XSpace), in time order.

  Returns:
    A list of (time in ps, bytes: > 0 allocated, < 0 freed, buffer address,
    the allocating op's name ('' for a deallocation)).
  """
  events = []
  for plane in space.planes:
    names, stats = plane.event_metadata, plane.stat_metadata
    for line in plane.lines:
      for ev in line.events:
        kind = names[ev.metadata_id].name
        if kind not in (_ALLOCATION, _DEALLOCATION):
          continue
        values = {}
        for s in ev.stats:
          values[stats[s.metadata_id].name] = (
              stats[s.ref_value].name if s.HasField('ref_value') else
              s.str_value or s.int64_value or s.uint64_value)
        size = int(values.get('allocation_bytes', 0))
        op = str(values.get('tf_op', '')).rsplit(':', 1)[0]
        events.append((line.timestamp_ns * 1000 + ev.offset_ps,
                       size if kind == _ALLOCATION else -size,
                       values.get('addr'), op))
  events.sort(key=lambda e: e[0])
  return events


def Peaks(events, placement):
  """Per device, the most bytes of the events' buffers live at once.

  Args:
    events: AllocatorEvents.
    placement: {op name: device} (Placement); an op it lacks counts as
      UNATTRIBUTED.

  Returns:
    {device: peak bytes}; a freed buffer counts against the device that
    allocated it, a buffer freed but never allocated in `events` not at all.
  """
  live, peak, owner = collections.Counter(), collections.Counter(), {}
  for _, size, addr, op in events:
    if size > 0:
      device = placement.get(op) or UNATTRIBUTED
      owner[addr] = (device, size)
      live[device] += size
      peak[device] = max(peak[device], live[device])
    elif addr in owner:
      device, size = owner.pop(addr)
      live[device] -= size
  return dict(peak)


def DevicePeaks(run, placement, logdir=None):
  """Runs `run()` under the profiler; Peaks of its allocator events.

  Args:
    run: runs the step (not its first call: that one traces).
    placement: Placement of the step's first call.
    logdir: where the profile goes; None: a temporary folder.

  Raises:
    ValueError: if the profile holds no allocator event (a CPU allocator
      that is not BFC).
  """
  events = AllocatorEvents(timeline.ProfileSpace(run, logdir))
  if not events:
    raise ValueError(
        'DevicePeaks: the profile holds no allocator event; on CPU, set '
        'TF_CPU_ALLOCATOR_USE_BFC=true before TensorFlow starts.')
  return Peaks(events, placement)


def ShortDevice(device):
  """'CPU:1' of '/job:localhost/replica:0/task:0/device:CPU:1'."""
  return tf.DeviceSpec.from_string(device).to_string().rsplit('device:',
                                                              1)[-1]


def DeviceTotals(peaks, variables, inputs=()):
  """Per device ('CPU:1'; UNATTRIBUTED kept): its measured peak (Peaks) plus
  the bytes of the buffers a step's profile does not see: its variables,
  and its inputs made before the profiled call.

  Args:
    peaks: {device: bytes} (Peaks, DevicePeaks).
    variables: the tf.Variables the step uses (the model's, the
      optimizer's).
    inputs: a nest of the eager tensors the step is called with (its
      batch), each on its own device.
  """
  totals = collections.Counter()
  for t in list(variables) + tf.nest.flatten(inputs):
    totals[ShortDevice(t.device)] += t.shape.num_elements() * t.dtype.size
  for device, size in peaks.items():
    totals[device if device == UNATTRIBUTED else ShortDevice(device)] += size
  return dict(totals)
