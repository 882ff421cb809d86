"""Tests for cadence.framework.pipeline.timeline_image and pixel_font: the
TensorBoard picture of a timeline is the SVG's figure, labelled.

The words are checked pixel for pixel: where the figure puts a text, the
picture holds pixel_font's mask of it in black on white (or on its box's
colour); boxes are in their actions' colours where the layout put them.
"""
import math
import string

import numpy as np
import tensorflow as tf

from cadence.framework.pipeline import pixel_font
from cadence.framework.pipeline import schedules as ps
from cadence.framework.pipeline import timeline as timeline_lib
from cadence.framework.pipeline import timeline_chart
from cadence.framework.pipeline import timeline_image

_DEVICES = ['/device:CPU:0', '/device:CPU:1']
Ev = timeline_lib.OpEvent
F, B = ps.FORWARD, ps.BACKWARD
_WHITE, _BLACK = (255, 255, 255), (0, 0, 0)


def _Op(kind, stage, micro_batch, start, end):
  """An op of action (kind, stage, micro_batch), seconds from 100."""
  scope = ps.Action(F, stage, micro_batch).scope
  name = (f'model/{scope}/MatMul' if kind == F else
          f'gradient_tape/{scope}/MatMul/MatMul')
  return Ev(name, 100 + start, 100 + end)


def _GPipe():
  """2 stages x 2 micro-batches of GPipe, 1 s an action, and the loss
  (outside the actions) between the phases."""
  ops = [(F, 0, 0, 0, 1), (F, 0, 1, 1, 2), (F, 1, 0, 1, 2), (F, 1, 1, 2, 3),
         (B, 1, 1, 3.5, 4.5), (B, 1, 0, 4.5, 5.5), (B, 0, 1, 4.5, 5.5),
         (B, 0, 0, 5.5, 6.5)]
  return timeline_lib.Timeline(
      [_Op(*op) for op in ops] + [Ev('loss/Softmax', 103.0, 103.5)],
      _DEVICES)


def _Written(image, text, x, baseline, anchor='start', ink=_BLACK):
  """Whether `image` holds `text` in `ink` as timeline_image.Text writes
  it: True where pixel_font draws, and nothing in `ink` elsewhere in the
  text's rows and columns."""
  mask = pixel_font.Render(text)
  shift = {'start': 0, 'middle': mask.shape[1] / 2,
           'end': mask.shape[1]}[anchor]
  left = int(math.floor(x - shift + 0.5))
  top = int(math.floor(baseline - pixel_font.ASCENT + 0.5))
  region = image[top:top + mask.shape[0], left:left + mask.shape[1]]
  return np.array_equal(np.all(region == ink, axis=-1), mask)


def _Centre(box):
  return int(box.y + box.h / 2), int(box.x + 2)


class TimelineImageTest(tf.test.TestCase):

  def testThePictureIsTheFigureWithItsWords(self):
    timeline = _GPipe()
    image = timeline.Image()
    figure = timeline_chart.Compose(timeline, 960, lane_height=24,
                                    tooltips=False)
    self.assertEqual((math.ceil(figure.height), 960, 3), image.shape)
    self.assertEqual(np.uint8, image.dtype)
    # Taller than its rows: the title, the legend, 24 px lanes, the axis.
    self.assertEqual(2, len([r for r in figure.chart.rows
                             if r.name.startswith('/device')]))
    self.assertGreaterEqual(figure.chart.rows[0].h, 24)
    # The title, the device names and the grey row's, left of the rows.
    self.assertTrue(_Written(image, figure.titles[0], 4, 14))
    self.assertStartsWith(figure.titles[0], 'Pipeline step: 2 stages x 2 '
                          'micro-batches, 6500 ms')
    names = [row.name for row in figure.chart.rows]
    self.assertEqual(_DEVICES + ['ops outside actions'], names)
    for row in figure.chart.rows:
      self.assertTrue(_Written(image, row.name, 4, row.y + row.h / 2 + 4),
                      row.name)
    # The legend: each kind's swatch in its colour, framed, and its name.
    legend = {name: (x, y, rgb) for x, y, rgb, name in figure.legend}
    self.assertEqual(['forward', 'backward', 'ops outside the actions',
                      'idle'], list(legend))
    for name, (x, y, rgb) in legend.items():
      x = int(round(x))
      self.assertAllEqual(rgb, image[y - 4, x + 5], name)
      self.assertAllEqual((136, 136, 136), image[y - 9, x], name)
      self.assertTrue(_Written(image, name, x + 14, y), name)
    # Boxes in their actions' colours; labels inside them, on the colour.
    for action in timeline.actions:
      box = _Box(figure, timeline, action.kind, action.stage,
                 action.micro_batch)
      self.assertAllEqual(box.rgb, image[_Centre(box)], action)
      label, = [l for l in figure.chart.labels if l.action == action]
      self.assertTrue(label.inside)
      self.assertEqual(str(action.micro_batch), label.text)
      self.assertTrue(_Written(image, label.text, label.x + label.w / 2,
                               label.y + label.h - 3, 'middle'), action)
    loss, = [b for b in figure.chart.boxes if b.action is None]
    self.assertAllEqual(timeline_chart.OTHER_COLOUR, image[_Centre(loss)])
    # Idle: white, between F(1, 1)'s end and B(1, 1)'s start.
    row1 = figure.chart.rows[1]
    idle_x = int(figure.chart.left + 3.25 * figure.chart.scale)
    self.assertAllEqual(_WHITE, image[int(row1.y + row1.h / 2), idle_x])
    # The time axis: its line, round marks and the end, each labelled.
    texts = [text for _, text in figure.marks]
    self.assertEqual(['0 ms', '2000 ms', '4000 ms', '6000 ms', '6500 ms'],
                     texts)
    for x, text in figure.marks:
      self.assertAllEqual((136, 136, 136),
                          image[figure.axis + 2, int(round(x))])
      self.assertTrue(_Written(
          image, text, x, figure.axis + 14,
          timeline_chart.AxisAnchor(x, text, 960)), text)
    # The notes under it, which point to the table (no tooltips here).
    for i, line in enumerate(figure.notes):
      self.assertTrue(_Written(image, line, 4, figure.axis + 32 + 15 * i))
    self.assertIn('the .txt table beside the SVG chart.',
                  ' '.join(figure.notes))
    self.assertNotIn('tooltip', ' '.join(figure.notes))

  def testALabelAboveItsRowHasAHaloAndALeader(self):
    """A box too narrow for its label: the label above the row, white
    around its letters, and a grey leader down to the box."""
    ops = [(F, 0, 0, 0, 4), (F, 0, 1, 4, 4.02), (F, 1, 0, 4.02, 8)]
    timeline = timeline_lib.Timeline([_Op(*op) for op in ops], _DEVICES)
    image = timeline_image.Image(timeline)
    figure = timeline_chart.Compose(timeline, 960, lane_height=24,
                                    tooltips=False)
    label, = [l for l in figure.chart.labels if not l.inside]
    self.assertEqual(ps.Action(F, 0, 1), label.action)
    centre, baseline = label.x + label.w / 2, label.y + label.h - 3
    self.assertTrue(_Written(image, '1', centre, baseline, 'middle'))
    mask = pixel_font.Render('1')
    left = int(math.floor(centre - mask.shape[1] / 2 + 0.5))
    top = int(math.floor(baseline - pixel_font.ASCENT + 0.5))
    # The rim: white around the glyph, one pixel out.
    self.assertAllEqual(_WHITE, image[top - 1, left + 2])
    x0, y0, x1, y1 = label.leader
    middle = image[int(round((y0 + y1) / 2)), int(round((x0 + x1) / 2))]
    self.assertAllEqual((85, 85, 85), middle)
    self.assertIn('A label above a row names the box', ' '.join(
        figure.notes))

  def testBandsAfterTheActionsAreNamedInThem(self):
    timeline = _GPipe()
    after = [('all-reduce', 3.0, 'the gradients summed'),
             ('update', 0.5, 'the optimizer')]
    image = timeline_image.Image(timeline, after=after)
    figure = timeline_chart.Compose(timeline, 960, after=after,
                                    lane_height=24, tooltips=False)
    wide, narrow = figure.chart.bands
    self.assertEqual('level', timeline_chart.BandText(wide))
    self.assertTrue(_Written(image, 'all-reduce', wide.x + wide.w / 2,
                             wide.y + wide.h / 2 + 4, 'middle',
                             ink=_BLACK))
    self.assertAllEqual(timeline_chart.AFTER_COLOURS[1],
                        image[int(narrow.y + 2), int(narrow.x + 1)])
    self.assertEqual('10000 ms', figure.marks[-1][1])


def _Box(figure, timeline, kind, stage, micro_batch):
  """The box of an action's span in `figure`."""
  action = ps.Action(kind, stage, micro_batch)
  box, = [b for b in figure.chart.boxes if b.action == action and
          (b.start, b.end) == timeline.actions[action]]
  return box


class PixelFontTest(tf.test.TestCase):

  def testEveryPrintableCharacterHasItsOwnGlyph(self):
    chars = [c for c in string.printable if c.isprintable()]
    self.assertLen(chars, 95)
    masks = {c: pixel_font.Render(c) for c in chars}
    for c, mask in masks.items():
      self.assertEqual((pixel_font.HEIGHT, 5), mask.shape, c)
      self.assertEqual(c == ' ', not mask.any(), c)
    seen = {}
    for c, mask in masks.items():
      self.assertNotIn(mask.tobytes(), seen, (c, seen.get(mask.tobytes())))
      seen[mask.tobytes()] = c

  def testTextIsItsGlyphsSixPixelsApart(self):
    mask = pixel_font.Render('Fg')
    self.assertEqual((pixel_font.HEIGHT, 11), mask.shape)
    self.assertEqual(0, pixel_font.Width(''))
    self.assertAllEqual(pixel_font.Render('F'), mask[:, :5])
    self.assertFalse(mask[:, 5].any())
    self.assertAllEqual(pixel_font.Render('g'), mask[:, 6:])
    # Capitals sit on the baseline; g's tail hangs below it.
    self.assertFalse(mask[pixel_font.ASCENT:, :5].any())
    self.assertTrue(mask[pixel_font.ASCENT:, 6:].any())
    # Within the chart's room for its 11 px font.
    self.assertLessEqual(pixel_font.Width('/device:CPU:0'),
                         timeline_chart.LabelWidth('/device:CPU:0'))
    # A character with no glyph: a box.
    box = pixel_font.Render('\u00b5')
    self.assertTrue(box[0].all() and box[6].all() and box[:7, 0].all())


if __name__ == '__main__':
  tf.test.main()
