"""The pipeline timeline's chart as pixels: TensorBoard's image of it.

`--mode=inspect_pipeline` writes the chart as SVG and, for TensorBoard
(which shows images, not SVG), as this picture of the same figure
(timeline_chart.Compose): its title, the legend of the action kinds'
colours, one row per device named on the left, each action's boxes with
their labels (micro-batch, or stage.micro-batch), the labels above a row
with their leaders, the time axis in ms and the notes under it. The
letters are pixel_font's (5 x 7 pixels, within the room the layout keeps
for the SVG's 11 px font); a label above a row gets a white halo, as in
the SVG. What the SVG has and a picture cannot: tooltips (the notes point
to the .txt table instead).

Example:
  image = Image(timeline)          # uint8 [height, 960, 3]
  writer.WriteImage(1, 'pipeline_timeline', image)
"""
import math

import numpy as np

from cadence.framework.pipeline import pixel_font
from cadence.framework.pipeline import timeline_chart

INK = (0, 0, 0)
_FRAME = (136, 136, 136)    # The SVG's #888: swatches' frames, the axis.
_LEADER = (85, 85, 85)      # The SVG's #555.
_WHITE = (255, 255, 255)


def _Fill(image, x, y, w, h, rgb):
  """Paints the pixels of [x, x + w) x [y, y + h), clipped to the image."""
  x0, y0 = max(0, int(round(x))), max(0, int(round(y)))
  x1 = min(image.shape[1], max(x0 + 1, int(round(x + w))))
  y1 = min(image.shape[0], max(y0 + 1, int(round(y + h))))
  image[y0:y1, x0:x1] = rgb


def _Line(image, x0, y0, x1, y1, rgb):
  """A one-pixel line from (x0, y0) to (x1, y1)."""
  n = int(max(abs(x1 - x0), abs(y1 - y0))) + 1
  xs = np.rint(np.linspace(x0, x1, n)).astype(int)
  ys = np.rint(np.linspace(y0, y1, n)).astype(int)
  keep = ((xs >= 0) & (xs < image.shape[1]) & (ys >= 0) &
          (ys < image.shape[0]))
  image[ys[keep], xs[keep]] = rgb


def _Paste(image, mask, x, y, rgb):
  """Paints `rgb` where `mask` (bool [h, w]) is True, its top left at
  (x, y); what falls outside the image is left out."""
  h, w = mask.shape
  x0, y0 = max(0, x), max(0, y)
  x1, y1 = min(image.shape[1], x + w), min(image.shape[0], y + h)
  if x1 > x0 and y1 > y0:
    part = mask[y0 - y:y1 - y, x0 - x:x1 - x]
    image[y0:y1, x0:x1][part] = rgb


def _Halo(mask):
  """`mask` grown by a pixel each way (one more row and column each side)."""
  grown = np.zeros([mask.shape[0] + 2, mask.shape[1] + 2], bool)
  for dy in range(3):
    for dx in range(3):
      grown[dy:dy + mask.shape[0], dx:dx + mask.shape[1]] |= mask
  return grown


def Text(image, x, baseline, text, anchor='start', halo=False, up=False,
         rgb=INK):
  """Writes `text` with its baseline at y `baseline`, from x (anchor
  'start'), centred on it ('middle') or ending there ('end'); `up`: turned
  a quarter left, reading upwards, centred on (x, baseline); `halo`: on a
  white rim."""
  mask = pixel_font.Render(text)
  if up:
    mask = np.rot90(mask)
    left, top = x - mask.shape[1] / 2, baseline - mask.shape[0] / 2
  else:
    shift = {'start': 0, 'middle': mask.shape[1] / 2,
             'end': mask.shape[1]}[anchor]
    left, top = x - shift, baseline - pixel_font.ASCENT
  left, top = int(math.floor(left + 0.5)), int(math.floor(top + 0.5))
  if halo:
    _Paste(image, _Halo(mask), left - 1, top - 1, _WHITE)
  _Paste(image, mask, left, top, rgb)


def Image(timeline, width=960, lane_height=24, title=None, after=(),
          idle=None):
  """The chart of `timeline` as an RGB uint8 array [height, width, 3].

  Args:
    timeline: a timeline.Timeline.
    width: pixels.
    lane_height: pixels of a lane of a device's row.
    title, after, idle: timeline_chart.Svg's.

  Returns:
    The picture (see the module docstring).
  """
  figure = timeline_chart.Compose(timeline, width, title, after, idle,
                                  lane_height=lane_height, tooltips=False)
  chart = figure.chart
  image = np.full([int(math.ceil(figure.height)), width, 3], 255, np.uint8)
  for i, line in enumerate(figure.titles):
    Text(image, 4, 14 + 15 * i, line)
  for x, y, rgb, name in figure.legend:
    _Fill(image, x, y - 9, 10, 10, _FRAME)
    _Fill(image, x + 1, y - 8, 8, 8, rgb)
    Text(image, x + 14, y, name)
  x, y, key = figure.key
  Text(image, x, y, key)
  for row in chart.rows:
    Text(image, 4, row.y + row.h / 2 + 4, row.name)
  for i, band in enumerate(chart.bands):
    _Fill(image, band.x, band.y, band.w, band.h,
          timeline_chart.AFTER_COLOURS[i % 2])
    cx, cy = band.x + band.w / 2, band.y + band.h / 2
    how = timeline_chart.BandText(band)
    if how == 'level':
      Text(image, cx, cy + 4, band.name, 'middle')
    elif how == 'up':
      Text(image, cx, cy, band.name, up=True)
  for label in chart.labels:   # Leaders first, as in the SVG.
    if label.leader:
      _Line(image, *label.leader, _LEADER)
  for box in chart.boxes:
    _Fill(image, box.x, box.y, box.w, box.h, box.rgb)
  for label in chart.labels:
    Text(image, label.x + label.w / 2, label.y + label.h - 3, label.text,
         'middle', halo=not label.inside)
  end_x = chart.left + chart.end * chart.scale
  _Line(image, chart.left, figure.axis, end_x, figure.axis, _FRAME)
  for x, text in figure.marks:
    _Line(image, x, figure.axis, x, figure.axis + 4, _FRAME)
    Text(image, x, figure.axis + 14, text,
         timeline_chart.AxisAnchor(x, text, width))
  for i, line in enumerate(figure.notes):
    Text(image, 4, figure.axis + 32 + 15 * i, line)
  return image
