"""PipelineTimeline: where each pipeline device spent a real training step.

A step runs under TensorFlow's profiler; every op the pipeline executors
build carries the name scope of its action (`schedules.Action.scope`:
forward F, backward B (with its re-run) or weight gradient W, of stage s on
micro-batch j), so the profile says when each op of each action ran. What an
action ran is the union of its ops' execution intervals (`segments`), not
its first op's start to its last op's end: the executor builds the actions'
ops in one graph, and TensorFlow runs an op as soon as its inputs are ready,
so a few cheap ops of a later action (masks, slices of its input) may run
long before the rest of it. Its *blocks* are those intervals joined across
gaps shorter than `join` (the executor's own pauses between two ops), and
its span (`actions`) is the block that holds most of its work. Per device
(the schedule's placement of the stages; by default stage s on device
s % D of the model split):

  forward / backward: time some op of an F / B action ran (their union);
  idle: the rest of the pipeline's span (first action op's start to the
    last one's end): no op of any action ran on the device. The ops that
    ran outside every action in the span (the loss and its softmax between
    the phases, the gradients' sums) are `other`, on no device in
    particular (a CPU profile does not say).

The measured bubble is the idle share of all devices' time in the span,
next to the ideal: the bubble of the schedule's own action lists when every
action takes the same time (`schedules.Schedule.Bubble`; (S-1)/(M+S-1) for
GPipe and 1F1B over S stages). The chart (framework/pipeline/timeline_chart.py) draws each
action's blocks on its device's row, the other ops on a row of their own;
`SpanTable` lists every action's exact times.

Example:
  ops = ProfileOps(lambda: step(batch))          # A warm (traced) step.
  timeline = Timeline(ops, ['/device:CPU:0', '/device:CPU:1'])
  print(timeline.Report())                       # bubble 0.31 (ideal 0.20)
  timeline.WritePictures('/tmp/pipe')            # .svg and .txt
"""
import collections
import glob
import os
import re
import tempfile

import tensorflow as tf

from cadence.framework.pipeline import schedules
from cadence.framework.pipeline import timeline_chart
from cadence.framework.pipeline import timeline_image


class NoPipelineError(ValueError):
  """A profile without any pipeline action (the model runs no pipeline)."""


OpEvent = collections.namedtuple('OpEvent', ['name', 'start', 'end'])
# A TensorFlow op's event in a host plane: 'its/name:OpType'. The profiler's
# own events ('ExecutorState::Process', 'MemoryAllocation', ...) are not.
_OP_EVENT_RE = re.compile(r'^([^:]+):[A-Za-z_]\w*$')


def _ReadXSpace(logdir):
  """The newest profile (an XSpace proto) the profiler wrote to `logdir`."""
  from tensorflow.tsl.profiler.protobuf import xplane_pb2  # pylint: disable=g-import-not-at-top
  paths = sorted(glob.glob(os.path.join(logdir, '**', '*.xplane.pb'),
                           recursive=True), key=os.path.getmtime)
  if not paths:
    raise ValueError(f'ProfileOps: the profiler wrote no trace to {logdir}.')
  space = xplane_pb2.XSpace()
  with open(paths[-1], 'rb') as f:
    space.ParseFromString(f.read())
  return space


def ProfileSpace(run, logdir=None):
  """Runs `run()` under the TF profiler; returns its XSpace proto.

  Args:
    run: a function that runs the step (call it once before, so the
      profile holds no tracing).
    logdir: where the profile goes; None: a temporary folder.
  """
  with tempfile.TemporaryDirectory() as tmp:
    where = logdir or tmp
    tf.profiler.experimental.start(where)
    try:
      run()
    finally:
      tf.profiler.experimental.stop()
    return _ReadXSpace(where)


def OpEvents(space):
  """Every TensorFlow op's event of a profile as an OpEvent (op name,
  start s, end s); the profiler's own events are left out."""
  events = []
  for plane in space.planes:
    names = plane.event_metadata
    for line in plane.lines:
      for ev in line.events:
        op = _OP_EVENT_RE.match(names[ev.metadata_id].name)
        if op:
          start = line.timestamp_ns * 1e-9 + ev.offset_ps * 1e-12
          events.append(OpEvent(op.group(1), start,
                                start + ev.duration_ps * 1e-12))
  return events


def ProfileOps(run, logdir=None):
  """OpEvents of `run()` under the TF profiler (see ProfileSpace)."""
  return OpEvents(ProfileSpace(run, logdir))


def Union(intervals, join=0.0):
  """The union of (start, end) intervals as sorted disjoint intervals;
  two closer than `join` become one (the gap included)."""
  out = []
  for a, b in sorted(intervals):
    if out and a <= out[-1][1] + join:
      out[-1][1] = max(out[-1][1], b)
    else:
      out.append([a, b])
  return [tuple(iv) for iv in out]


def _Length(intervals):
  return sum(b - a for a, b in Union(intervals))


def _MainBlock(blocks, segments):
  """The block (a union of `segments` joined) holding most of their time."""
  return max(blocks, key=lambda b: sum(
      e - s for s, e in segments if b[0] <= s and e <= b[1]))


class Timeline:
  """The actions of one profiled step; see the module docstring.

  Args:
    op_events: OpEvents (ProfileOps) of one step.
    devices: the model split's devices.
    schedule: the `schedules.Schedule` that ran, or its registered name
      (built for the profile's stages, devices and micro-batches): where
      each stage ran and the ideal bubble come from its action lists; None:
      stage s ran on devices[s % K], ideal (S-1)/(M+S-1).
    join: seconds; an action's ops closer than this form one block (default:
      a 250th of the pipeline's span: 4 pixels of a 1000-pixel chart).

  Attributes (seconds from the first action op's start):
    segments: {Action: [(start, end)]}, the union of its ops' intervals.
    blocks: {Action: [(start, end)]}, the segments joined across gaps
      shorter than `join`.
    actions: {Action: (start, end)}, its span: the block holding most of
      its segments' time.
    busy: {Action: seconds}, the length of its segments.
    other: [(start, end)], the union of the ops outside every action, cut
      to the pipeline's span.

  Raises:
    NoPipelineError: if no op of the profile belongs to a pipeline action.
  """

  def __init__(self, op_events, devices, schedule=None, join=None):
    ops = collections.defaultdict(list)
    outside = []
    for ev in op_events:
      action = schedules.ActionOfOp(ev.name + '/')
      (ops[action] if action is not None else outside).append(
          (ev.start, ev.end))
    if not ops:
      raise NoPipelineError('Timeline: no op of the profile belongs to a '
                            'pipeline action; does the model run a pipeline '
                            '(PipeliningLayer or GPipeTransformerStack)?')
    self.devices = list(devices)
    self.num_cells = 1 + max(a.stage for a in ops)
    self.num_steps = 1 + max(a.micro_batch for a in ops)
    self.schedule = schedule
    if isinstance(schedule, str):
      self.schedule = schedules.Build(schedule, self.num_cells,
                                      len(self.devices), self.num_steps)
    self.start = min(a for ivs in ops.values() for a, _ in ivs)
    self.end = max(b for ivs in ops.values() for _, b in ivs)
    self.join = self.span / 250 if join is None else join
    self.segments = {a: Union((s - self.start, e - self.start)
                              for s, e in ivs) for a, ivs in ops.items()}
    self.busy = {a: _Length(ivs) for a, ivs in self.segments.items()}
    self.blocks = {a: Union(ivs, self.join)
                   for a, ivs in self.segments.items()}
    self.actions = {a: _MainBlock(self.blocks[a], self.segments[a])
                    for a in self.segments}
    self.other = Union((max(s, self.start) - self.start,
                        min(e, self.end) - self.start)
                       for s, e in outside if e > self.start and
                       s < self.end)

  @property
  def span(self):
    """Seconds from the first action op's start to the last one's end."""
    return self.end - self.start

  def StageDevice(self, stage):
    """The device string stage `stage` ran on."""
    placed = (self.schedule.stage_devices if self.schedule is not None else
              schedules.Looped(self.num_cells, len(self.devices)))
    return self.devices[placed[stage]]

  @property
  def rows(self):
    """The devices the stages used, in stage order."""
    return list(dict.fromkeys(self.StageDevice(s)
                              for s in range(self.num_cells)))

  def Row(self, action):
    return self.rows.index(self.StageDevice(action.stage))

  def DeviceTimes(self):
    """Per row: dict(forward=s, backward=s, idle=s)."""
    out = []
    for r in range(len(self.rows)):
      mine = [(a, iv) for a, ivs in self.segments.items() if self.Row(a) == r
              for iv in ivs]
      # A kind whose work is all forward counts as forward; any other
      # (B, W, a fused forward and backward) as backward.
      times = {name: _Length([iv for a, iv in mine
                              if schedules.IsForward(a) == forward])
               for name, forward in (('forward', True), ('backward', False))}
      times['idle'] = self.span - _Length([iv for _, iv in mine])
      out.append(times)
    return out

  @property
  def measured_bubble(self):
    """Idle share of the devices' time in the pipeline's span."""
    times = self.DeviceTimes()
    return sum(t['idle'] for t in times) / (len(times) * self.span or 1)

  @property
  def ideal_bubble(self):
    """The bubble of the schedule's actions when all take the same time."""
    if self.schedule is not None:
      return self.schedule.Bubble()
    k, m = self.num_cells, self.num_steps
    return (k - 1) / (m + k - 1)

  def Report(self):
    """A text table per device, and the bubble next to the ideal."""
    lines = [f'Pipeline step: {self.num_cells} stages x {self.num_steps} '
             f'micro-batches, {1000 * self.span:.1f} ms from the first '
             'action op to the last.',
             f'{"device":<24}{"forward ms":>12}{"backward ms":>13}'
             f'{"idle ms":>10}']
    for device, t in zip(self.rows, self.DeviceTimes()):
      lines.append(f'{device:<24}{1000 * t["forward"]:12.1f}'
                   f'{1000 * t["backward"]:13.1f}{1000 * t["idle"]:10.1f}')
    lines.append(f'bubble: measured {self.measured_bubble:.3f}, ideal '
                 f'(equal-time actions) = {self.ideal_bubble:.3f}')
    lines.append('idle: no op of a pipeline action ran on the device; ops '
                 f'outside the actions (loss, gradient sums) ran '
                 f'{1000 * _Length(self.other):.1f} ms of the span.')
    return '\n'.join(lines) + '\n'

  def SpanTable(self):
    """Every action's exact times (ms), in the order its span started."""
    lines = ['Pipeline actions (ms from the first action op): span = the '
             'block of most of its work; ops = its first op\'s start to its '
             'last one\'s end; busy = time its ops ran.',
             f'{"action":<10}{"device":<24}{"span":>19}{"ops":>19}'
             f'{"busy":>9}{"blocks":>8}']
    for a in sorted(self.actions, key=lambda a: (self.actions[a], a)):
      (s, e), segs = self.actions[a], self.segments[a]
      lines.append(
          f'{str(a):<10}{self.rows[self.Row(a)]:<24}'
          f'{1000 * s:9.2f}-{1000 * e:9.2f}'
          f'{1000 * segs[0][0]:9.2f}-{1000 * segs[-1][1]:9.2f}'
          f'{1000 * self.busy[a]:9.2f}{len(self.blocks[a]):8d}')
    return '\n'.join(lines) + '\n'

  # --- pictures (framework/pipeline/timeline_chart.py, timeline_image.py) ----

  def Svg(self, width=960):
    """The chart as SVG text (timeline_chart.Svg)."""
    return timeline_chart.Svg(self, width)

  def Image(self, width=960, lane_height=24):
    """The chart as an RGB uint8 array, labelled (timeline_image.Image)."""
    return timeline_image.Image(self, width, lane_height)

  def WritePictures(self, logdir, name='pipeline_timeline'):
    """Writes <name>.svg (the chart) and <name>.txt (the SpanTable) to
    `logdir`; returns their paths."""
    tf.io.gfile.makedirs(logdir)
    paths = [os.path.join(logdir, f'{name}.svg'),
             os.path.join(logdir, f'{name}.txt')]
    for path, text in zip(paths, (self.Svg(), self.SpanTable())):
      with tf.io.gfile.GFile(path, 'w') as f:
        f.write(text)
    return paths
