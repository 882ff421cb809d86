"""The chart of a pipeline timeline: what ran when, on which device.

One row per device of the model split; in it, each action's blocks
(`Timeline.blocks`: when its ops ran) as boxes, forward blue, backward
orange and weight gradient green, micro-batches alternating shades. Actions
whose boxes overlap in time (their ops ran at once on two threads) get lanes
of their own, so no box hides another; an action's blocks thinner than 2
pixels (a few cheap ops that ran apart from the rest of it) are marks under
the lanes. A last, grey row holds the ops outside every action (the loss and
its softmax between the phases, the gradients' sums), if any; white is idle
time. Each box in a lane gets its action's label (its micro-batch, or
stage.micro-batch when a device holds several stages): inside the box
where it fits, at the chart's font or else at a smaller one; else above
the row, on the first of `MAX_TIERS` tiers of labels where it overlaps no
other, with a leader line down to the box; the actions' spans have the
first pick of the tiers, their other blocks the rest (only where boxes
narrower than their labels crowd more than that is a box left
unlabelled). Every box also carries its action and exact times as a
tooltip (`<title>`), and `Timeline.SpanTable`, written beside the chart,
lists them all. Bands after the actions (`after`: e.g. a simulated step's
all-reduce and update) span the rows; the time axis runs to their end, or
to the span's, and labels that end time in the chart's right margin.
`Layout` computes every box and label (pixels), `Compose` the rest of the
picture (title, legend, axis, notes); `Svg` writes it, and
timeline_image.Image draws it in pixels (TensorBoard's image).

Example:
  chart = Layout(timeline, width=960)
  [box.action for box in chart.boxes]; [label.text for label in chart.labels]
  open('/tmp/pipe.svg', 'w').write(Svg(timeline))
"""
import collections
import math

import numpy as np

from cadence.framework.pipeline import actions
from cadence.framework.pipeline import schedules

# The ops outside every action.
OTHER_COLOUR = (160, 160, 160)
# Bands after the actions, in turn (a light grey, apart from the outside
# ops' grey).
AFTER_COLOURS = ((205, 205, 205), (230, 230, 230))

_FONT_SIZE = 11
_SMALL_FONT = 9       # A label that fits its box only at this size.
_CHAR_WIDTH = 6.6     # Pixels per character of an 11 px sans-serif label
_LABEL_PAD = 4        # (an upper bound), and the room a label keeps.
_LABEL_GAP = 2        # Pixels between two labels of a tier.
MAX_TIERS = 3         # Tiers of labels above a row, at most.
_MIN_WIDE = 2.0       # Thinner blocks (pixels) are marks under the row.
_OVERLAP_PX = 4.0     # Boxes of one lane may overlap this much (pixels).

Box = collections.namedtuple('Box', ['action', 'x', 'y', 'w', 'h', 'rgb',
                                     'start', 'end'])
# A label: inside its box, or above the row (inside False) with a leader,
# the line (x0, y0, x1, y1) from its foot to its box's top; size: font px.
# main: the label of the action's span (else of another of its blocks).
Label = collections.namedtuple('Label', ['action', 'text', 'x', 'y', 'w', 'h',
                                         'inside', 'size', 'leader', 'main'],
                               defaults=[_FONT_SIZE, None, True])
# A band after the actions across the rows: its name, pixels and seconds.
Band = collections.namedtuple('Band', ['name', 'x', 'y', 'w', 'h', 'start',
                                       'end'])
Chart = collections.namedtuple('Chart', ['boxes', 'labels', 'rows', 'width',
                                         'height', 'left', 'scale', 'end',
                                         'bands'])
# A row of the chart: its name, top y, height, number of lanes, and the
# height of its strip of marks (0: none).
Row = collections.namedtuple('Row', ['name', 'y', 'h', 'lanes', 'marks'])


def _Colour(action):
  """An action's box colour (SVG and image): its kind's (actions.Kind.
  colours), by micro-batch parity so that neighbours differ."""
  return actions.KindOf(action.kind).colours[action.micro_batch % 2]


def LabelWidth(text, size=_FONT_SIZE):
  """Pixels a label of `text` at font `size` px needs (an upper bound, with
  its padding)."""
  return len(text) * _CHAR_WIDTH * size / _FONT_SIZE + _LABEL_PAD


def FormatMs(seconds):
  """Milliseconds with 4 significant digits (a tiny model on an H100 takes
  microseconds), whole ones from 1000 ms."""
  ms = 1000 * seconds
  return f'{ms:.0f}' if ms >= 1000 else f'{ms:.4g}'


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


def _InsideSize(text, pixels):
  """The font size at which `text` fits a box `pixels` wide, or None."""
  for size in (_FONT_SIZE, _SMALL_FONT):
    if LabelWidth(text, size) <= pixels:
      return size
  return None


def _Tiers(wanted, left, right):
  """Places labels above a row: each on the lowest tier (0: nearest the
  row) where it overlaps no label placed before it; none if each of the
  MAX_TIERS has one there (a tower of labels would be no clearer).

  Args:
    wanted: [(key, centre x, width)] in the order to place them.
    left, right: the pixels the labels stay within.

  Returns:
    {key: (tier, x)} of the labels placed.
  """
  placed, out = [], {}
  for key, centre, w in wanted:
    x = min(max(centre - w / 2, left), right - w)
    tier = 0
    while any(t == tier and x < x1 + _LABEL_GAP and x0 < x + w + _LABEL_GAP
              for t, x0, x1 in placed):
      tier += 1
    if tier < MAX_TIERS:
      placed.append((tier, x, x + w))
      out[key] = (tier, x)
  return out


def Layout(timeline, width=960, left=150, top=44, lane_height=18, strip=14,
           marks=5, gap=6, labels=True, right=40, after=()):
  """Every box and label of the chart of `timeline`, in pixels.

  Each action's span (`Timeline.actions`) and its other blocks at least
  `_MIN_WIDE` pixels wide go in its lane; its thinner blocks (a few cheap
  ops that ran apart from the rest of it) go as marks in a strip under the
  row's lanes, where they clash with no box. Each box of a lane gets a
  label: inside it if it fits (at a smaller font if need be), else above
  the row with a leader, if one of MAX_TIERS has room (see the module
  docstring).

  Args:
    timeline: a timeline.Timeline.
    width: the chart's width.
    left: room for the device names; the time axis starts there.
    top: room for the title and the legend.
    lane_height: height of a lane (a row has one lane per set of actions
      that ran at once).
    strip: height of a tier of labels above a row, for labels that do not
      fit in their box (as many tiers as they need up to MAX_TIERS, none
      if all fit).
    marks: height of the strip of thin blocks under a row.
    gap: pixels between rows.
    labels: False: no labels (and no label strips).
    right: room right of the time axis's end (for its last label).
    after: [(name, seconds)]: bands after the actions, one after the
      other, across the rows; the time axis runs to their end.

  Returns:
    A Chart: boxes (Box: action, or None for an op outside the actions),
    labels (Label: inside True when in its box), rows (Row), width, height,
    left, scale (pixels per second), end (seconds: the time axis's end),
    bands (Band).
  """
  end = timeline.span + sum(seconds for _, seconds in after)
  scale = (width - left - right) / (end or 1)
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
    # A label for each box of the lanes, (action, block): the spans'
    # first (they have the first pick of the tiers), then the other blocks.
    named = ([(a, timeline.actions[a]) for a in mine] +
             [(a, b) for a in mine for b in laned[a]
              if b != timeline.actions[a]])
    size = {(a, b): _InsideSize(texts[a], (b[1] - b[0]) * scale)
            for a, b in named}
    tiers = _Tiers([((a, b), x_of(sum(b) / 2), LabelWidth(texts[a]))
                    for a, b in named if labels and size[a, b] is None],
                   left, width - 2)
    row_strip = strip * (1 + max((t for t, _ in tiers.values()),
                                 default=-1))
    lanes_y = y + row_strip
    row_marks = marks if thin else 0
    rows.append(Row(name, y, row_strip + num_lanes * lane_height + row_marks,
                    num_lanes, row_marks))
    for a, s, e in thin:
      boxes.append(Box(a, x_of(s), lanes_y + num_lanes * lane_height,
                       max((e - s) * scale, 1.0), marks - 1,
                       _Colour(a), s, e))
    for a in mine:
      lane_y = lanes_y + lane_of[a] * lane_height
      for s, e in laned[a]:
        boxes.append(Box(a, x_of(s), lane_y, max((e - s) * scale, 1.0),
                         lane_height - 2,
                         _Colour(a), s, e))
      for b in laned[a] if labels else ():
        main, centre = b == timeline.actions[a], x_of(sum(b) / 2)
        if (a, b) in tiers:
          # Above the row, tier 0 nearest it; a leader down to the box.
          (tier, x), w = tiers[a, b], LabelWidth(texts[a])
          label_y = lanes_y - (tier + 1) * strip
          chart_labels.append(Label(
              a, texts[a], x, label_y, w, strip, False, _FONT_SIZE,
              (x + w / 2, label_y + strip - 2, centre, lane_y), main))
        elif size[a, b] is not None:
          w, h = LabelWidth(texts[a], size[a, b]), size[a, b] + 2
          chart_labels.append(Label(a, texts[a], centre - w / 2,
                                    lane_y + (lane_height - 2 - h) / 2, w,
                                    h, True, size[a, b], None, main))
        # Else no room on any tier: its tooltip names it.
    y += rows[-1].h + gap
  bands, t = [], timeline.span
  for name, seconds in after:
    bands.append(Band(name, x_of(t), top, seconds * scale, y - gap - top, t,
                      t + seconds))
    t += seconds
  if timeline.other:
    rows.append(Row('ops outside actions', y, lane_height, 1, 0))
    for s, e in timeline.other:
      boxes.append(Box(None, x_of(s), y, max((e - s) * scale, 1.0),
                       lane_height - 2, OTHER_COLOUR, s, e))
    y += lane_height + gap
  return Chart(boxes, chart_labels, rows, width, y, left, scale, end, bands)


def _RoundTimes(span, count=6):
  """Axis marks (seconds): multiples of 1, 2 or 5 x 10^k ms, <= count+1."""
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


def _Notes(timeline, chart, after, idle, tooltips=True):
  """What the chart's colours, bands, marks and labels mean."""
  if idle is None:
    idle = ('no op of a pipeline action ran on the device' +
            (', e.g. while the loss runs between the forward and the '
             'backward phase (the grey row: ops outside the actions, on any '
             'device)' if timeline.other else ''))
  notes = [f'Idle (white): {idle}.']
  notes += [f'{name[:1].upper()}{name[1:]} (the band after the actions): '
            f'{what}.' for name, _, what in after]
  if any(row.marks for row in chart.rows):
    notes.append('Marks under a row: a few cheap ops of an action that ran '
                 'apart from the rest of it (their inputs were ready early).')
  if any(not label.inside for label in chart.labels):
    notes.append('A label above a row names the box its line leads to (the '
                 'box is too narrow for it).')
  if sum(label.main for label in chart.labels) < len(timeline.actions):
    notes.append(f'Boxes without a label: more narrow boxes side by side '
                 f'than {MAX_TIERS} tiers of labels hold.')
  notes.append('Exact times of every action (its span, first op to last, '
               'busy ms): ' + ('a box\'s tooltip, and the .txt table beside '
                               'this chart.' if tooltips else
                               'the .txt table beside the SVG chart.'))
  return ' '.join(notes)


def _AxisMarks(chart):
  """[(x, text)] of the time axis: marks at round times, then one at its
  end, labelled with the end time."""
  end_x = chart.left + chart.end * chart.scale
  end = f'{FormatMs(chart.end)} ms'
  marks = [(chart.left + t * chart.scale, f'{1000 * t:g} ms')
           for t in _RoundTimes(chart.end)]
  # The end's label replaces a round mark's that it would overlap.
  marks = [(x, text) for x, text in marks
           if end_x - x >= (LabelWidth(end) + LabelWidth(text)) / 2]
  return marks + [(end_x, end)]


def AxisAnchor(x, text, width):
  """Where a mark's label hangs from its x: 'middle', or 'end' where that
  would cross the chart's right edge `width`."""
  return 'end' if x + LabelWidth(text) / 2 > width else 'middle'


def BandText(band):
  """How a band's name goes inside it: 'level', 'up' (turned a quarter
  left) when only that fits, or None when neither does (the legend names
  it)."""
  if LabelWidth(band.name) <= band.w:
    return 'level'
  if band.w >= _FONT_SIZE + 2 and LabelWidth(band.name) <= band.h:
    return 'up'
  return None


# What a picture of the chart draws, in pixels, apart from its chart's
# boxes and labels: the title's lines (baselines 14 + 15 i from the top,
# at x 4); the legend's swatches (10 x 10, top y - 9) and names (at x + 14,
# baseline y) as (x, y, rgb, name); the key line (x, y, text); the time
# axis's y and marks [(x, text)]; the notes' lines under it (baselines
# axis + 32 + 15 i); its width and height.
Figure = collections.namedtuple('Figure', [
    'titles', 'legend', 'key', 'chart', 'axis', 'marks', 'notes', 'width',
    'height'])


def Compose(timeline, width=960, title=None, after=(), idle=None,
            lane_height=18, tooltips=True):
  """Where everything of the chart of `timeline` goes: a Figure, which Svg
  writes and timeline_image.Image draws (Svg's arguments;
  `lane_height`: Layout's; `tooltips`: whether the picture has them, as an
  SVG does, which the notes then point to)."""
  if title is None:
    title = (f'Pipeline step: {timeline.num_cells} stages x '
             f'{timeline.num_steps} micro-batches, '
             f'{FormatMs(timeline.span)} ms from the first action op to the '
             f'last; bubble {timeline.measured_bubble:.2f} (ideal '
             f'{timeline.ideal_bubble:.2f})')
  titles = _Wrap(title, width - 8)
  used = {a.kind for a in timeline.actions} | {schedules.FORWARD,
                                                schedules.BACKWARD}
  items = [(kind.colours[0], kind.name) for kind in map(
      actions.KindOf, actions.Letters()) if kind.letter in used]
  if timeline.other:
    items.append((OTHER_COLOUR, 'ops outside the actions'))
  items += [(AFTER_COLOURS[i % 2], name)
            for i, (name, _, _) in enumerate(after)]
  items.append(((255, 255, 255), 'idle'))
  label = ('stage.micro-batch' if timeline.num_cells > len(timeline.rows)
           else 'micro-batch')
  key = f'boxes: when an action\'s ops ran; label: its {label}'
  legend_y = 15 * len(titles) + 17
  legend, x = [], 4
  for rgb, text in items:
    legend.append((x, legend_y, rgb, text))
    x += 18 + LabelWidth(text)
  key_y = legend_y
  if x + LabelWidth(key) > width:
    x, key_y = 4, legend_y + 15
  chart = Layout(timeline, width, top=key_y + 12, lane_height=lane_height,
                 after=[(name, seconds) for name, seconds, _ in after])
  notes = _Wrap(_Notes(timeline, chart, after, idle, tooltips), width - 8)
  axis = chart.height - 2
  return Figure(titles, legend, (x, key_y, key), chart, axis,
                _AxisMarks(chart), notes, width, axis + 30 + 15 * len(notes))


def _SvgAxis(figure):
  """The time axis: a line, and each mark with its label."""
  chart, y = figure.chart, figure.axis
  end_x = chart.left + chart.end * chart.scale
  out = [f'<line x1="{chart.left}" y1="{y}" x2="{end_x:.1f}" y2="{y}" '
         'stroke="#888"/>']
  for x, text in figure.marks:
    out.append(f'<line x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{y + 4}" '
               f'stroke="#888"/><text x="{x:.1f}" y="{y + 14}" '
               f'text-anchor="{AxisAnchor(x, text, chart.width)}">{text}'
               '</text>')
  return out


def _SvgBandText(band):
  """The name of a band inside it (BandText), or ''."""
  cx, cy = band.x + band.w / 2, band.y + band.h / 2
  how = BandText(band)
  if how == 'level':
    return (f'<text x="{cx:.1f}" y="{cy + 4:.1f}" text-anchor="middle">'
            f'{band.name}</text>')
  if how == 'up':
    return (f'<text x="{cx + 4:.1f}" y="{cy:.1f}" text-anchor="middle" '
            f'transform="rotate(-90 {cx + 4:.1f} {cy:.1f})">{band.name}'
            '</text>')
  return ''


def Svg(timeline, width=960, title=None, after=(), idle=None):
  """The chart as SVG text (see the module docstring).

  Args:
    timeline: a timeline.Timeline.
    width: pixels.
    title: the chart's title (wrapped to the width); None: the profiled
      step's stages, micro-batches, span and bubble.
    after: [(name, seconds, what)]: bands after the actions (Layout's
      `after`); `what` says what each is (the notes, its tooltip).
    idle: what idle time means (the notes under the time axis); None: a
      profiled step's.

  Returns:
    The SVG text.
  """
  figure = Compose(timeline, width, title, after, idle)
  chart, height = figure.chart, figure.height
  # Times in tooltips: 2 decimals of a ms, more for a step of microseconds.
  places = max(2, 3 - math.floor(math.log10(1000 * chart.end or 1)))
  ms = lambda s: f'{1000 * s:.{places}f}'  # pylint: disable=unnecessary-lambda-assignment
  out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
         f'height="{height:.0f}" font-family="sans-serif" '
         f'font-size="{_FONT_SIZE}">',
         f'<rect width="{width}" height="{height:.0f}" fill="white"/>']
  out += [f'<text x="4" y="{14 + 15 * i}">{line}</text>'
          for i, line in enumerate(figure.titles)]
  out += [f'<rect x="{x:.0f}" y="{y - 9}" width="10" height="10" '
          f'fill="rgb{rgb}" stroke="#888"/><text x="{x + 14:.0f}" y="{y}">'
          f'{text}</text>' for x, y, rgb, text in figure.legend]
  x, y, key = figure.key
  out.append(f'<text x="{x:.0f}" y="{y}">{key}</text>')
  for row in chart.rows:
    out.append(f'<text x="4" y="{row.y + row.h / 2 + 4:.0f}">{row.name}'
               '</text>')
  for i, (band, (_, _, what)) in enumerate(zip(chart.bands, after)):
    out.append(f'<rect x="{band.x:.1f}" y="{band.y:.1f}" '
               f'width="{band.w:.1f}" height="{band.h:.1f}" '
               f'fill="rgb{AFTER_COLOURS[i % 2]}"><title>{band.name}: '
               f'{ms(band.start)}-{ms(band.end)} ms: {what}</title></rect>' +
               _SvgBandText(band))
  # Leaders first: a box covers a leader that would cross it.
  for label in chart.labels:
    if label.leader:
      out.append('<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" '
                 'stroke="#555" stroke-width="0.8"/>'.format(*label.leader))
  for box in chart.boxes:
    what = (f'{box.action} (busy {ms(timeline.busy[box.action])} ms in '
            'all)' if box.action else 'ops outside the actions')
    out.append(f'<rect x="{box.x:.1f}" y="{box.y:.1f}" width="{box.w:.1f}" '
               f'height="{box.h}" fill="rgb{box.rgb}"><title>{what}: '
               f'{ms(box.start)}-{ms(box.end)} ms</title></rect>')
  for label in chart.labels:
    # A label above a row has a white halo: a leader may pass behind it.
    style = ((f' font-size="{label.size}"' if label.size != _FONT_SIZE else
              '') + ('' if label.inside else ' stroke="white" '
                     'stroke-width="3" paint-order="stroke"'))
    out.append(f'<text x="{label.x + label.w / 2:.1f}" '
               f'y="{label.y + label.h - 3:.1f}" text-anchor="middle"'
               f'{style}>{label.text}</text>')
  out += _SvgAxis(figure)
  for i, line in enumerate(figure.notes):
    out.append(f'<text x="4" y="{figure.axis + 32 + 15 * i}">{line}</text>')
  return '\n'.join(out) + '\n</svg>\n'
