"""The chart of a pipeline timeline: what ran when, on which device.

One row per device of the model split; in it, each action's blocks
(`Timeline.blocks`: when its ops ran) as boxes, forward blue, backward
orange and weight gradient green, micro-batches alternating shades. Actions
whose boxes overlap in time (their ops ran at once on two threads) get lanes
of their own, so no box hides another; an action's blocks thinner than 2
pixels (a few cheap ops that ran apart from the rest of it) are marks under
the lanes. A last, grey row holds the ops outside every action (the loss and
its softmax between the phases, the gradients' sums); white is idle time.
Each action's label (its micro-batch, or stage.micro-batch when a device
holds several stages) goes inside its span's box where it fits, else in a
strip above the row where it overlaps no other label; the exact times of
every action are `Timeline.SpanTable`, written beside the chart. `Layout`
computes every box and label (pixels), `Svg` and `Image` draw them.

Example:
  chart = Layout(timeline, width=960)
  [box.action for box in chart.boxes]; [label.text for label in chart.labels]
  open('/tmp/pipe.svg', 'w').write(Svg(timeline))
"""
import collections
import math

import numpy as np

from cadence.framework.pipeline import schedules

# Colours of forward and backward boxes (SVG and image), by micro-batch
# parity so that neighbours differ; the ops outside every action.
COLOURS = {schedules.FORWARD: ((66, 133, 244), (120, 170, 250)),
           schedules.BACKWARD: ((234, 134, 0), (246, 178, 90)),
           schedules.WEIGHT: ((52, 168, 83), (129, 201, 149))}
OTHER_COLOUR = (160, 160, 160)
_FONT_SIZE = 11
_CHAR_WIDTH = 6.6     # Pixels per character of an 11 px sans-serif label
_LABEL_PAD = 4        # (an upper bound), and the room a label keeps.
_MIN_WIDE = 2.0       # Thinner blocks (pixels) are marks under the row.
_OVERLAP_PX = 4.0     # Boxes of one lane may overlap this much (pixels).

Box = collections.namedtuple('Box', ['action', 'x', 'y', 'w', 'h', 'rgb',
                                     'start', 'end'])
Label = collections.namedtuple('Label', ['action', 'text', 'x', 'y', 'w', 'h',
                                         'inside'])
Chart = collections.namedtuple('Chart', ['boxes', 'labels', 'rows', 'width',
                                         'height', 'left', 'scale'])
# A row of the chart: its name, top y, height and number of lanes.
Row = collections.namedtuple('Row', ['name', 'y', 'h', 'lanes'])


def LabelWidth(text):
  """Pixels a label of `text` needs (an upper bound, with its padding)."""
  return len(text) * _CHAR_WIDTH + _LABEL_PAD


def _Overlap(a, b):
  """Whether boxes (x, y, w, h) a and b share more than a boundary."""
  return (a[0] < b[0] + b[2] and b[0] < a[0] + a[2] and
          a[1] < b[1] + b[3] and b[1] < a[1] + a[3])


def _Clash(a, b):
  """Whether boxes (x0, x1) a and b overlap by more than a few pixels, or
  by more than half the narrower (a thin box inside another's)."""
  overlap = min(a[1], b[1]) - max(a[0], b[0])
  return overlap > min(_OVERLAP_PX, 0.5 * min(a[1] - a[0], b[1] - b[0]))


def _Lanes(spans):
  """Lane of each action of one row, and the number of lanes: the first lane
  where none of the action's boxes clashes with a box already there.

  Args:
    spans: [(action, [(x0, x1)] pixels)], in the order to place them.
  """
  lanes, out = [], {}
  for action, boxes in spans:
    for i, taken in enumerate(lanes + [[]]):
      if not any(_Clash(a, b) for a in boxes for b in taken):
        break
    if i == len(lanes):
      lanes.append([])
    lanes[i].extend(boxes)
    out[action] = i
  return out, max(1, len(lanes))


def _LabelText(action, cells_per_row):
  return (str(action.micro_batch) if cells_per_row == 1 else
          f'{action.stage}.{action.micro_batch}')


def Layout(timeline, width=960, left=150, top=44, lane_height=18, strip=14,
           marks=5, gap=6, labels=True):
  """Every box and label of the chart of `timeline`, in pixels.

  Each action's span (`Timeline.actions`) and its other blocks at least
  `_MIN_WIDE` pixels wide go in its lane; its thinner blocks (a few cheap
  ops that ran apart from the rest of it) go as marks in a strip under the
  row's lanes, where they clash with no box.

  Args:
    timeline: a timeline.Timeline.
    width: the chart's width; the time axis runs from `left` to it.
    left: room for the device names.
    top: room for the title and the legend.
    lane_height: height of a lane (a row has one lane per set of actions
      that ran at once).
    strip: height of the strip above a row for labels that do not fit in
      their box (there only when one needs it).
    marks: height of the strip of thin blocks under a row.
    gap: pixels between rows.
    labels: False: no labels (and no label strips).

  Returns:
    A Chart: boxes (Box: action, or None for an op outside the actions),
    labels (Label: inside True when in its box), rows (Row), width, height,
    left, scale (pixels per second).
  """
  scale = (width - left) / (timeline.span or 1)
  x_of = lambda t: left + t * scale  # pylint: disable=unnecessary-lambda-assignment
  cells_per_row = collections.Counter(
      timeline.Row(schedules.Action(schedules.FORWARD, i, 0))
      for i in range(timeline.num_cells))
  boxes, chart_labels, rows = [], [], []
  y = top
  for r, name in enumerate(timeline.rows):
    mine = sorted((a for a in timeline.blocks if timeline.Row(a) == r),
                  key=lambda a: (timeline.actions[a], a))
    laned, thin = {}, []
    for a in mine:
      laned[a] = []
      for s, e in timeline.blocks[a]:
        if (s, e) == timeline.actions[a] or (e - s) * scale >= _MIN_WIDE:
          laned[a].append((s, e))
        else:
          thin.append((a, s, e))
    lane_of, num_lanes = _Lanes(
        [(a, [(x_of(s), x_of(e)) for s, e in laned[a]]) for a in mine])
    texts = {a: _LabelText(a, cells_per_row[r]) for a in mine}
    fits = {a: (timeline.actions[a][1] - timeline.actions[a][0]) * scale >=
               LabelWidth(texts[a]) for a in mine}
    row_strip = strip if labels and not all(fits.values()) else 0
    lanes_y = y + row_strip
    rows.append(Row(name, y, row_strip + num_lanes * lane_height +
                    (marks if thin else 0), num_lanes))
    for a, s, e in thin:
      boxes.append(Box(a, x_of(s), lanes_y + num_lanes * lane_height,
                       max((e - s) * scale, 1.0), marks - 1,
                       COLOURS[a.kind][a.micro_batch % 2], s, e))
    strip_taken = []
    for a in mine:
      lane_y = lanes_y + lane_of[a] * lane_height
      for s, e in laned[a]:
        boxes.append(Box(a, x_of(s), lane_y, max((e - s) * scale, 1.0),
                         lane_height - 2,
                         COLOURS[a.kind][a.micro_batch % 2], s, e))
      if not labels:
        continue
      w, h = LabelWidth(texts[a]), _FONT_SIZE + 2
      centre = x_of(sum(timeline.actions[a]) / 2)
      if fits[a]:
        chart_labels.append(Label(a, texts[a], centre - w / 2,
                                  lane_y + (lane_height - 2 - h) / 2, w, h,
                                  True))
        continue
      box = (min(max(centre - w / 2, left), width - w), y, w, row_strip)
      if not any(_Overlap(box, taken) for taken in strip_taken):
        strip_taken.append(box)
        chart_labels.append(Label(a, texts[a], *box, False))
    y += rows[-1].h + gap
  if timeline.other:
    rows.append(Row('ops outside actions', y, lane_height, 1))
    for s, e in timeline.other:
      boxes.append(Box(None, x_of(s), y, max((e - s) * scale, 1.0),
                       lane_height - 2, OTHER_COLOUR, s, e))
    y += lane_height + gap
  return Chart(boxes, chart_labels, rows, width, y, left, scale)


def _Ticks(span, count=6):
  """Axis ticks (seconds): multiples of 1, 2 or 5 x 10^k ms, <= count+1."""
  if span <= 0:
    return [0.0]
  raw = span / count
  step = min(m * 10 ** math.ceil(math.log10(raw / m)) for m in (1, 2, 5))
  return [i * step for i in range(int(span / step + 1e-9) + 1)]


def _Wrap(text, width):
  """`text` cut into lines of at most `width` pixels (LabelWidth)."""
  lines = ['']
  for word in text.split():
    line = f'{lines[-1]} {word}'.strip()
    if lines[-1] and LabelWidth(line) > width:
      lines.append(word)
    else:
      lines[-1] = line
  return lines


def _Legend(x, y, rgb, text):
  return (f'<rect x="{x:.0f}" y="{y - 9}" width="10" height="10" '
          f'fill="rgb{rgb}" stroke="#888"/><text x="{x + 14:.0f}" y="{y}">'
          f'{text}</text>', x + 18 + LabelWidth(text))


def Svg(timeline, width=960):
  """The chart as SVG text (see the module docstring)."""
  chart = Layout(timeline, width)
  notes = _Wrap(
      'Idle (white): no op of a pipeline action ran on the device, e.g. '
      'while the loss runs between the forward and the backward phase (the '
      'grey row: ops outside the actions, on any device). Marks under a '
      'row: a few cheap ops of an action that ran apart from the rest of it '
      '(their inputs were ready early). Exact times '
      'of every action (its span, first op to last, busy ms): the .txt '
      'table beside this chart.', width - 8)
  height = chart.height + 24 + 15 * len(notes)
  out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
         f'height="{height}" font-family="sans-serif" '
         f'font-size="{_FONT_SIZE}">',
         f'<rect width="{width}" height="{height}" fill="white"/>',
         f'<text x="4" y="14">Pipeline step: {timeline.num_cells} stages x '
         f'{timeline.num_steps} micro-batches, {1000 * timeline.span:.1f} ms '
         f'from the first action op to the last; bubble '
         f'{timeline.measured_bubble:.2f} (ideal '
         f'{timeline.ideal_bubble:.2f})</text>']
  x = 4
  kinds = {a.kind for a in timeline.actions}
  for rgb, text in ((COLOURS[schedules.FORWARD][0], 'forward'),
                    (COLOURS[schedules.BACKWARD][0], 'backward'),
                    *(((COLOURS[schedules.WEIGHT][0], 'weight gradient'),)
                      if schedules.WEIGHT in kinds else ()),
                    (OTHER_COLOUR, 'ops outside the actions'),
                    ((255, 255, 255), 'idle')):
    item, x = _Legend(x, 32, rgb, text)
    out.append(item)
  label = ('stage.micro-batch' if timeline.num_cells > len(timeline.rows)
           else 'micro-batch')
  out.append(f'<text x="{x:.0f}" y="32">boxes: when an action\'s ops ran; '
             f'label: its {label}</text>')
  for row in chart.rows:
    out.append(f'<text x="4" y="{row.y + row.h / 2 + 4:.0f}">{row.name}'
               '</text>')
  for box in chart.boxes:
    what = (f'{box.action} (busy {1000 * timeline.busy[box.action]:.2f} ms '
            'in all)' if box.action else 'ops outside the actions')
    out.append(f'<rect x="{box.x:.1f}" y="{box.y:.1f}" width="{box.w:.1f}" '
               f'height="{box.h}" fill="rgb{box.rgb}"><title>{what}: '
               f'{1000 * box.start:.2f}-{1000 * box.end:.2f} ms</title>'
               '</rect>')
  for label in chart.labels:
    out.append(f'<text x="{label.x + label.w / 2:.1f}" '
               f'y="{label.y + label.h - 3:.1f}" text-anchor="middle">'
               f'{label.text}</text>')
  axis = chart.height + 10
  for t in _Ticks(timeline.span):
    tx = chart.left + t * chart.scale
    anchor = 'end' if tx > width - 30 else 'middle'
    out.append(f'<text x="{tx:.1f}" y="{axis}" text-anchor="{anchor}">'
               f'{1000 * t:g} ms</text>')
  for i, line in enumerate(notes):
    out.append(f'<text x="4" y="{axis + 18 + 15 * i}">{line}</text>')
  return '\n'.join(out) + '\n</svg>\n'


def Image(timeline, width=480, lane_height=10):
  """The chart as an RGB uint8 array [height, width, 3] (no text)."""
  chart = Layout(timeline, width, left=0, top=0, lane_height=lane_height,
                 gap=2, labels=False)
  image = np.full([int(chart.height), width, 3], 255, np.uint8)
  for box in chart.boxes:
    x0 = int(box.x)
    x1 = max(x0 + 1, int(box.x + box.w))
    image[int(box.y):int(box.y + box.h), x0:x1] = box.rgb
  return image
