"""PipelineTimeline: where each pipeline device spent a real training step.

A step runs under TensorFlow's profiler; every op the pipeline executors
build carries the name scope of its action (`schedules.Action.
scope`: forward F, backward B (with its re-run) or weight gradient W, of
stage s on micro-batch j), so the profile says when each action ran. An
action's interval spans its first op's start to its last op's end. Per
device (the schedule's placement of the stages; by default stage s on
device s % D of the model split):

  forward / backward: time inside F / B actions (their union);
  idle: the rest of the pipeline's span (first action start to last end).

The measured bubble is the idle share of all devices' time in the span,
next to the ideal: the bubble of the schedule's own action lists when every
action takes the same time (`schedules.Schedule.Bubble`; (K-1)/(M+K-1) for
GPipe and 1F1B). The chart is a Gantt chart, one row per device, one box per
action labelled with its micro-batch: an SVG (no dependency), a PNG if
matplotlib is installed, and an RGB array for a TensorBoard image summary.

Example:
  ops = ProfileOps(lambda: step(batch))          # A warm (traced) step.
  timeline = Timeline(ops, ['/device:CPU:0', '/device:CPU:1'])
  print(timeline.Report())                       # bubble 0.31 (ideal 0.20)
  open('/tmp/pipe.svg', 'w').write(timeline.Svg())
"""
import collections
import glob
import os
import tempfile

import numpy as np
import tensorflow as tf

from cadence.framework.pipeline import schedules

class NoPipelineError(ValueError):
  """A profile without any pipeline action (the model runs no pipeline)."""


OpEvent = collections.namedtuple('OpEvent', ['name', 'start', 'end'])
# Colours of forward and backward boxes (SVG and image), by micro-batch
# parity so that neighbours differ.
_COLOURS = {schedules.FORWARD: ((66, 133, 244), (120, 170, 250)),
            schedules.BACKWARD: ((234, 134, 0), (246, 178, 90)),
            schedules.WEIGHT: ((52, 168, 83), (129, 201, 149))}


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
  """Every event of a profile as an OpEvent (name, start s, end s)."""
  events = []
  for plane in space.planes:
    names = plane.event_metadata
    for line in plane.lines:
      for ev in line.events:
        name = names[ev.metadata_id].name.rsplit(':', 1)[0]
        start = line.timestamp_ns * 1e-9 + ev.offset_ps * 1e-12
        events.append(OpEvent(name, start, start + ev.duration_ps * 1e-12))
  return events


def ProfileOps(run, logdir=None):
  """OpEvents of `run()` under the TF profiler (see ProfileSpace)."""
  return OpEvents(ProfileSpace(run, logdir))


def _Union(intervals):
  """Total length of the union of (start, end) intervals."""
  total, end = 0.0, None
  for a, b in sorted(intervals):
    if end is None or a > end:
      total += b - a
      end = b
    elif b > end:
      total += b - end
      end = b
  return total


class Timeline:
  """The actions of one profiled step; see the module docstring.

  Args:
    op_events: OpEvents (ProfileOps); those outside any action are ignored.
    devices: the model split's devices.
    schedule: the registered name of the schedule that ran: where each
      stage ran and the ideal bubble come from its action lists
      (`schedules.Build`); None: stage s ran on devices[s % D], ideal
      (K-1)/(M+K-1).

  Raises:
    NoPipelineError: if no op of the profile belongs to a pipeline action.
  """

  def __init__(self, op_events, devices, schedule=None):
    spans = {}
    for ev in op_events:
      action = schedules.ActionOfOp(ev.name + '/')
      if action is not None:
        a, b = spans.get(action, (ev.start, ev.end))
        spans[action] = (min(a, ev.start), max(b, ev.end))
    if not spans:
      raise NoPipelineError('Timeline: no op of the profile belongs to a pipeline '
                       'action; does the model run a pipeline '
                       '(PipeliningLayer or GPipeTransformerStack)?')
    self.devices = list(devices)
    self.num_cells = 1 + max(a.stage for a in spans)
    self.num_steps = 1 + max(a.micro_batch for a in spans)
    self.schedule = None if schedule is None else schedules.Build(
        schedule, self.num_cells, len(self.devices), self.num_steps)
    self.start = min(a for a, _ in spans.values())
    self.end = max(b for _, b in spans.values())
    self.actions = {a: (s - self.start, e - self.start)
                    for a, (s, e) in spans.items()}

  @property
  def span(self):
    """Seconds from the first action's start to the last one's end."""
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
      mine = [(a, iv) for a, iv in self.actions.items() if self.Row(a) == r]
      times = {name: _Union([iv for a, iv in mine if a.kind in kinds])
               for name, kinds in (('forward', (schedules.FORWARD,)),
                                   ('backward', (schedules.BACKWARD,
                                                 schedules.WEIGHT)))}
      times['idle'] = self.span - _Union([iv for _, iv in mine])
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
    lines = [f'Pipeline step: {self.num_cells} cells x {self.num_steps} '
             f'micro-batches, {1000 * self.span:.1f} ms from the first '
             'action to the last.',
             f'{"device":<24}{"forward ms":>12}{"backward ms":>13}'
             f'{"idle ms":>10}']
    for device, t in zip(self.rows, self.DeviceTimes()):
      lines.append(f'{device:<24}{1000 * t["forward"]:12.1f}'
                   f'{1000 * t["backward"]:13.1f}{1000 * t["idle"]:10.1f}')
    lines.append(f'bubble: measured {self.measured_bubble:.3f}, ideal '
                 f'(equal-time actions) = {self.ideal_bubble:.3f}')
    return '\n'.join(lines) + '\n'

  # --- pictures ---------------------------------------------------------------

  def _Boxes(self, width, left, row_height, top):
    """(action, x, y, w, h) of each box, in pixels."""
    scale = (width - left) / (self.span or 1)
    for a, (s, e) in sorted(self.actions.items(), key=lambda kv: kv[1]):
      yield (a, left + s * scale, top + self.Row(a) * row_height,
             max((e - s) * scale, 1.0), row_height - 4)

  def Svg(self, width=960, row_height=28):
    """The Gantt chart as SVG text: device rows, boxes of F/B actions
    labelled with their micro-batch, the time axis in ms."""
    left, top = 150, 24
    height = top + row_height * len(self.rows) + 24
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
           f'height="{height}" font-family="sans-serif" font-size="11">',
           f'<text x="4" y="14">Pipeline step: {self.num_cells} cells x '
           f'{self.num_steps} micro-batches, {1000 * self.span:.1f} ms; '
           f'bubble {self.measured_bubble:.2f} (ideal '
           f'{self.ideal_bubble:.2f}); F blue, B orange</text>']
    for r, device in enumerate(self.rows):
      out.append(f'<text x="4" y="{top + r * row_height + 16}">{device}'
                 '</text>')
    for a, x, y, w, h in self._Boxes(width, left, row_height, top):
      rgb = _COLOURS[a.kind][a.micro_batch % 2]
      out.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{h}" '
                 f'fill="rgb{rgb}" stroke="white"><title>{a} '
                 f'{1000 * self.actions[a][0]:.2f}-'
                 f'{1000 * self.actions[a][1]:.2f} ms</title></rect>')
      if w >= 10:
        out.append(f'<text x="{x + w / 2:.1f}" y="{y + h / 2 + 4}" '
                   f'text-anchor="middle">{a.micro_batch}</text>')
    axis = top + row_height * len(self.rows) + 14
    for f in np.linspace(0, 1, 5):
      x = left + f * (width - left)
      out.append(f'<text x="{x:.0f}" y="{axis}" text-anchor="middle">'
                 f'{1000 * f * self.span:.0f} ms</text>')
    return '\n'.join(out + ['</svg>']) + '\n'

  def Image(self, width=480, row_height=20):
    """The chart as an RGB uint8 array [rows * row_height, width, 3] (no
    text: micro-batches alternate shades)."""
    image = np.full([row_height * len(self.rows), width, 3], 255, np.uint8)
    for a, x, y, w, h in self._Boxes(width, 0, row_height, 2):
      x0, x1 = int(x), max(int(x) + 1, int(x + w) - 1)
      image[int(y):int(y + h), x0:x1] = _COLOURS[a.kind][a.micro_batch % 2]
    return image

  def WritePictures(self, logdir, name='pipeline_timeline'):
    """Writes <name>.svg (and <name>.png with matplotlib) to `logdir`;
    returns the paths written."""
    tf.io.gfile.makedirs(logdir)
    paths = [os.path.join(logdir, f'{name}.svg')]
    with tf.io.gfile.GFile(paths[0], 'w') as f:
      f.write(self.Svg())
    try:
      from matplotlib import pyplot  # pylint: disable=g-import-not-at-top
    except ImportError:
      return paths
    fig, ax = pyplot.subplots(figsize=(10, 1 + 0.5 * len(self.rows)))
    for a, (s, e) in self.actions.items():
      ax.barh(self.Row(a), 1000 * (e - s), left=1000 * s,
              color=np.array(_COLOURS[a.kind][a.micro_batch % 2]) / 255)
    ax.set_yticks(range(len(self.rows)), self.rows)
    ax.invert_yaxis()
    ax.set_xlabel('ms')
    paths.append(os.path.join(logdir, f'{name}.png'))
    fig.savefig(paths[1])
    pyplot.close(fig)
    return paths
