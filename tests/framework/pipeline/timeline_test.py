"""Tests for cadence.framework.pipeline.timeline (and summary images)."""
import collections
import os

import tensorflow as tf

from cadence.framework.nested_map import NestedMap
from cadence.framework.pipeline import executor
from cadence.framework.pipeline import schedules as ps
from cadence.framework.pipeline import timeline as timeline_lib
from cadence.framework.pipeline import timeline_chart
from cadence.framework.train import summary_utils

_DEVICES = ['/device:CPU:0', '/device:CPU:1']
Ev = timeline_lib.OpEvent
F, B = ps.FORWARD, ps.BACKWARD


def _Op(kind, cell, step, a, b, name='MatMul'):
  """An op of action (kind, cell, step) from 100 + a to 100 + b seconds."""
  scope = ps.Action(F, cell, step).scope
  if kind == F:
    return Ev(f'model/{scope}/{name}', 100 + a, 100 + b)
  # A tape's gradient op: named after the forward op.
  return Ev(f'gradient_tape/{scope}/{name}/MatMul', 100 + a, 100 + b)


def _Events():
  """A hand-made profile of 2 cells x 2 micro-batches (seconds from 100).

  cell 0: F0 [0, 1], F1 [1, 2] (and a cheap op at [0, 0.01]), B1 [5, 6],
          B0 [6, 6.5] + [7, 8] (idle between its two ops);
  cell 1: F0 [1, 2] (and a cheap op at [0, 0.02]), F1 [2, 3], B1 [3.5, 4],
          B0 [4, 5].
  Outside the actions: the input's split [-0.5, 0.2], the loss [3, 3.5],
  the optimizer [8.5, 9] (after the pipeline).
  """
  ops = [(F, 0, 0, 0, 1), (F, 0, 1, 0, 0.01), (F, 0, 1, 1, 2),
         (B, 0, 1, 5, 6), (B, 0, 0, 6, 6.5), (B, 0, 0, 7, 8),
         (F, 1, 0, 0, 0.02), (F, 1, 0, 1, 2), (F, 1, 1, 2, 3),
         (B, 1, 1, 3.5, 4), (B, 1, 0, 4, 5)]
  ev = [_Op(*op, name=f'MatMul_{i}') for i, op in enumerate(ops)]
  return ev + [Ev('split', 99.5, 100.2), Ev('loss/Softmax', 103.0, 103.5),
               Ev('optimizer/Adam', 108.5, 109.0)]


def _Boxes(chart, action):
  return [b for b in chart.boxes if b.action == action]


def _SpanBox(chart, timeline, action):
  box, = [b for b in _Boxes(chart, action)
          if (b.start, b.end) == timeline.actions[action]]
  return box


def _Overlap(a, b):
  return (a.x < b.x + b.w and b.x < a.x + a.w and a.y < b.y + b.h and
          b.y < a.y + a.h)


class TimelineTest(tf.test.TestCase):

  def testSpansAreTheUnionOfTheirOps(self):
    timeline = timeline_lib.Timeline(_Events(), _DEVICES)
    self.assertEqual((2, 2), (timeline.num_cells, timeline.num_steps))
    self.assertAllClose(8.0, timeline.span)
    self.assertAllClose(8.0 / 250, timeline.join)
    f01, b00 = ps.Action(F, 0, 1), ps.Action(B, 0, 0)
    # A cheap op long before the rest: its own block; the span is the rest.
    self.assertAllClose([(0, 0.01), (1, 2)], timeline.segments[f01])
    self.assertAllClose([(0, 0.01), (1, 2)], timeline.blocks[f01])
    self.assertAllClose((1, 2), timeline.actions[f01])
    self.assertAllClose(1.01, timeline.busy[f01])
    # Idle between two ops of an action is not its time; the span is the
    # longer block.
    self.assertAllClose([(6, 6.5), (7, 8)], timeline.segments[b00])
    self.assertAllClose((7, 8), timeline.actions[b00])
    self.assertAllClose(1.5, timeline.busy[b00])
    # Ops closer than `join` are one block (the gap counts in the block,
    # not in busy time).
    joined = timeline_lib.Timeline(_Events(), _DEVICES, join=0.6)
    self.assertAllClose([(6, 8)], joined.blocks[b00])
    self.assertAllClose(1.5, joined.busy[b00])
    self.assertAllClose([(0, 0.2), (3, 3.5)], timeline.other)
    times = timeline.DeviceTimes()
    for got, want in zip(times, [dict(forward=2.0, backward=2.5, idle=3.5),
                                 dict(forward=2.02, backward=1.5,
                                      idle=4.48)]):
      self.assertAllClose(want, got)
    self.assertAllClose((3.5 + 4.48) / 16, timeline.measured_bubble)
    self.assertAllClose(1.0 / 3, timeline.ideal_bubble)
    report = timeline.Report()
    self.assertIn('2 stages x 2 micro-batches, 8000.0 ms', report)
    self.assertRegex(report, r'/device:CPU:1 +2020.0 +1500.0 +4480.0')
    self.assertIn('bubble: measured 0.499, ideal (equal-time actions) = 0.333',
                  report)
    self.assertIn('ran 700.0 ms of the span', report)
    table = timeline.SpanTable().splitlines()
    self.assertLen(table, 2 + 8)
    self.assertRegex(table[2], r'^F\(0, 0\) +/device:CPU:0 +0.00- +1000.00 +'
                     r'0.00- +1000.00 +1000.00 +1$')
    self.assertIn('F(0, 1)   /device:CPU:0', table[3])
    self.assertRegex(table[3], r'1000.00- +2000.00 +0.00- +2000.00 +1010.00 '
                     r'+2$')

  def testCellsShareDevices(self):
    timeline = timeline_lib.Timeline(_Events(), _DEVICES[:1])
    self.assertEqual(_DEVICES[:1], timeline.rows)
    # Cell 1's forwards run while cell 0's do: their union counts once.
    self.assertAllClose([dict(forward=3.0, backward=4.0, idle=1.0)],
                        timeline.DeviceTimes())
    chart = timeline_chart.Layout(timeline)
    texts = {label.action: label.text for label in chart.labels}
    self.assertEqual('1.0', texts[ps.Action(F, 1, 0)])  # stage.micro-batch
    self.assertIn('label: its stage.micro-batch', timeline.Svg())

  def testConcurrentActionsGetLanesAndLabelsNeverOverlap(self):
    # Device 0: F(0, 0) and F(0, 1) ran at once (two threads); F(0, 2) and
    # F(0, 3) are too short for their labels, side by side.
    ev = [_Op(F, 0, 0, 0, 2), _Op(F, 0, 1, 1, 3), _Op(F, 0, 2, 3, 3.01),
          _Op(F, 0, 3, 3.012, 3.02), _Op(F, 1, 0, 3, 4),
          _Op(F, 0, 1, 0.2, 0.202, name='Less')]
    timeline = timeline_lib.Timeline(ev, _DEVICES)
    chart = timeline_chart.Layout(timeline, width=950)
    a = [ps.Action(F, 0, j) for j in range(4)]
    # Each action's span is one box; the cheap op of F(0, 1) a mark.
    (b0,), (b1, mark) = _Boxes(chart, a[0]), sorted(
        _Boxes(chart, a[1]), key=lambda b: -b.w)
    self.assertEqual(b1, _SpanBox(chart, timeline, a[1]))
    self.assertNotEqual(b0.y, b1.y)            # Two lanes.
    # 0.2 s of 4 s on the axis's 760 pixels (950 - left 150 - right 40),
    # 1 pixel wide.
    self.assertAllClose((150 + 760 * 0.2 / 4, 1.0), (mark.x, mark.w))
    self.assertGreaterEqual(mark.y, max(b0.y + b0.h, b1.y + b1.h))
    self.assertEqual(2, chart.rows[0].lanes)
    for first in range(len(chart.boxes)):
      for second in chart.boxes[first + 1:]:
        self.assertFalse(_Overlap(chart.boxes[first], second),
                         (chart.boxes[first], second))
    labels = {label.action: label for label in chart.labels if label.main}
    self.assertTrue(labels[a[0]].inside)
    # A label in its box: inside the box of the action's span.
    for action in (a[0], a[1]):
      label, box = labels[action], _SpanBox(chart, timeline, action)
      self.assertBetween(label.x, box.x, box.x + box.w - label.w)
      self.assertBetween(label.y, box.y, box.y + box.h - label.h)
    # Too short: the label goes above the row; the next one, which would
    # cover it there, on a tier above it; each with a leader to its box.
    self.assertFalse(labels[a[2]].inside)
    self.assertLessEqual(labels[a[2]].y + labels[a[2]].h,
                         min(b.y for b in chart.boxes if b.action in a))
    self.assertFalse(labels[a[3]].inside)
    self.assertLessEqual(labels[a[3]].y + labels[a[3]].h, labels[a[2]].y)
    for action in a[2:]:
      label, box = labels[action], _SpanBox(chart, timeline, action)
      self.assertAllClose((label.x + label.w / 2, label.y + label.h - 2,
                           box.x + box.w / 2, box.y), label.leader)
    self.assertLen(chart.labels, len(timeline.actions))
    placed = list(labels.values())
    for i, label in enumerate(placed):
      self.assertBetween(label.x, 0, 950 - label.w)
      for other in placed[i + 1:]:
        self.assertFalse(_Overlap(label, other), (label, other))
    svg = timeline.Svg(width=950)
    for label in placed:
      self.assertIn(f'<text x="{label.x + label.w / 2:.1f}" '
                    f'y="{label.y + label.h - 3:.1f}" text-anchor="middle"',
                    svg)
      self.assertIn(f'>{label.text}</text>', svg)
    self.assertIn('A label above a row names the box its line leads to',
                  svg)

  def testPictures(self):
    timeline = timeline_lib.Timeline(_Events(), _DEVICES)
    chart = timeline_chart.Layout(timeline, width=950)
    svg = timeline.Svg(width=950)
    # 8 spans, 3 other blocks (B(0, 0)'s first op, the two cheap ops) and 2
    # ops outside the actions; a white background.
    self.assertEqual(1 + 13 + 4, svg.count('<rect '))
    self.assertLen(chart.boxes, 13)
    # Each box in a lane has a label: B(0, 0)'s other block too.
    b00 = [label for label in chart.labels if label.action == (B, 0, 0)]
    self.assertEqual([(False, '0'), (True, '0')],
                     [(label.main, label.text) for label in b00])
    block, = [b for b in _Boxes(chart, ps.Action(B, 0, 0)) if b.start == 6]
    self.assertBetween(b00[0].x, block.x, block.x + block.w - b00[0].w)
    box = _SpanBox(chart, timeline, ps.Action(B, 0, 0))
    # B(0, 0)'s span, from 7 to 8 s: x = 150 + 7/8 * 760 (the axis runs
    # from the names' 150 pixels to the right margin's 40).
    self.assertAllClose((815.0, 95.0), (box.x, box.w))
    self.assertIn(f'<rect x="815.0" y="{box.y:.1f}" width="95.0" '
                  'height="16" fill="rgb(234, 134, 0)"><title>B(0, 0) (busy '
                  '1500.00 ms in all): 7000.00-8000.00 ms</title>', svg)
    self.assertIn('ops outside the actions: 3000.00-3500.00 ms', svg)
    # The grey row is in the legend and the notes; so are the marks.
    self.assertIn('>ops outside the actions</text>', svg)
    self.assertIn('(the grey row:', svg)
    self.assertIn('Marks under a row', svg)
    for tick in ('0 ms', '2000 ms', '8000 ms'):
      self.assertIn(f'>{tick}</text>', svg)
    # The labelled picture of the same chart: timeline_image_test.py.
    image = timeline.Image()
    self.assertEqual(960, image.shape[1])
    paths = timeline.WritePictures(self.get_temp_dir())
    with open(paths[0]) as f:
      self.assertEqual(timeline.Svg(), f.read())
    with open(paths[1]) as f:
      self.assertEqual(timeline.SpanTable(), f.read())
    writer = summary_utils.SummaryWriter(self.get_temp_dir())
    writer.WriteImage(3, 'timeline', image)
    writer.WriteText(3, 'note', 'hello')
    writer.Close()
    images = summary_utils.ReadImages(self.get_temp_dir())
    self.assertEqual(3, images['timeline'][0][0])
    self.assertAllEqual(image, images['timeline'][0][1])
    self.assertEqual({'note': [(3, 'hello')]},
                     summary_utils.ReadTexts(self.get_temp_dir()))

  def testEveryActionOfANarrowInterleavedChartIsLabelled(self):
    """2 stages a device, 4 micro-batches, actions of very different
    lengths, one after the other on each device: every action's span has
    its label, inside its box (at the chart's font or a smaller one) or
    above its row with a leader to it, and every box its tooltip."""
    table = ps.Build('interleaved_1f1b', 4, 2, 4)
    # Seconds of F and B of micro-batch j: wide, narrow, middling, narrow.
    seconds = {F: (1.0, 0.1, 0.3, 0.12), B: (2.0, 0.15, 0.5, 1.0)}
    ev = []
    for device in table.actions:
      t = 0.0
      for a in device:
        ev.append(_Op(a.kind, a.stage, a.micro_batch, t,
                      t + seconds[a.kind][a.micro_batch]))
        t += seconds[a.kind][a.micro_batch]
    timeline = timeline_lib.Timeline(ev, _DEVICES, schedule=table.name)
    chart = timeline_chart.Layout(timeline)
    labels = {label.action: label for label in chart.labels}
    self.assertLen(chart.labels, 32)
    self.assertCountEqual(timeline.actions, labels)
    sizes = collections.Counter(label.size if label.inside else 'above'
                                for label in chart.labels)
    self.assertEqual({11, 9, 'above'}, set(sizes), sizes)
    for action, label in labels.items():
      box = _SpanBox(chart, timeline, action)
      self.assertEqual(f'{action.stage}.{action.micro_batch}', label.text)
      if label.inside:
        self.assertLessEqual(timeline_chart.LabelWidth(label.text,
                                                       label.size), box.w)
        self.assertBetween(label.x, box.x, box.x + box.w - label.w)
        self.assertBetween(label.y, box.y, box.y + box.h - label.h)
        self.assertIsNone(label.leader)
        continue
      row = chart.rows[timeline.Row(action)]
      self.assertBetween(label.y, row.y, box.y - label.h)
      self.assertAllClose((label.x + label.w / 2, label.y + label.h - 2,
                           box.x + box.w / 2, box.y), label.leader)
      for other in chart.boxes:
        self.assertFalse(_Overlap(label, other), (label, other))
    for i, label in enumerate(chart.labels):
      self.assertBetween(label.x, 0, chart.width - label.w)
      for other in chart.labels[i + 1:]:
        self.assertFalse(_Overlap(label, other), (label, other))
    svg = timeline.Svg()
    self.assertEqual(len(chart.boxes), svg.count('"><title>'))
    for action in timeline.actions:
      self.assertIn(f'<title>{action} (busy', svg)

  def testLabelsStackOnAtMostMaxTiers(self):
    """10 boxes of a pixel side by side: the first MAX_TIERS get labels on
    tiers above the row, the rest only their tooltips, and the notes say
    so."""
    ev = [_Op(F, 0, j, 0.001 * j, 0.001 * (j + 1)) for j in range(10)]
    timeline = timeline_lib.Timeline(ev + [_Op(F, 1, 0, 0.01, 1.0)],
                                     _DEVICES)
    chart = timeline_chart.Layout(timeline)
    above = [label for label in chart.labels if label.action.stage == 0]
    self.assertEqual([ps.Action(F, 0, j) for j in
                      range(timeline_chart.MAX_TIERS)],
                     [label.action for label in above])
    self.assertEqual(timeline_chart.MAX_TIERS * 14,
                     min(b.y for b in chart.boxes if b.action.stage == 0) -
                     chart.rows[0].y)
    svg = timeline.Svg()
    self.assertIn('Boxes without a label: more narrow boxes side by side '
                  'than 3 tiers', svg)
    for action in timeline.actions:
      self.assertIn(f'<title>{action} (busy', svg)

  def testTheTimeAxisEndsWithTheEndTime(self):
    """The axis labels its end (the span's, or the bands' after it) in the
    chart's right margin, in place of a round tick it would overlap."""
    ev = [_Op(F, 0, 0, 0, 4), _Op(F, 1, 0, 4, 8.37)]
    timeline = timeline_lib.Timeline(ev, _DEVICES)
    chart = timeline_chart.Layout(timeline, width=950)
    self.assertAllClose(8.37, chart.end)
    # The axis: 150 to 950 - 40 pixels.
    self.assertAllClose(910.0, max(b.x + b.w for b in chart.boxes))
    svg = timeline.Svg(width=950)
    self.assertIn('<text x="910.0" y="', svg)
    self.assertIn('text-anchor="middle">8370 ms</text>', svg)
    self.assertLessEqual(910 + timeline_chart.LabelWidth('8370 ms') / 2, 950)
    self.assertIn('<line x1="910.0"', svg)          # Its tick.
    self.assertIn('>6000 ms</text>', svg)
    self.assertNotIn('>8000 ms</text>', svg)        # 34 pixels from the end.
    # Bands after the actions: the axis runs to their end.
    after = [('update', 1.63, 'the optimizer update')]
    chart = timeline_chart.Layout(timeline, width=950,
                                  after=[('update', 1.63)])
    self.assertAllClose(10.0, chart.end)
    band, = chart.bands
    self.assertAllClose((150 + 8.37 * 76, 1.63 * 76, 8.37, 10.0),
                        (band.x, band.w, band.start, band.end))
    self.assertEqual((chart.rows[0].y, chart.rows[-1].y + chart.rows[-1].h),
                     (band.y, band.y + band.h))
    svg = timeline_chart.Svg(timeline, 950, after=after)
    self.assertIn('>10000 ms</text>', svg)
    self.assertIn('<title>update: 8370.00-10000.00 ms: the optimizer update'
                  '</title>', svg)
    self.assertIn('Update (the band after the actions): the optimizer '
                  'update.', svg)
    # No ops outside the actions: no grey row, legend or note of them.
    self.assertNotIn('outside', svg)
    self.assertNotIn('Marks under a row', svg)

  def testNoPipelineInTheProfile(self):
    with self.assertRaisesRegex(ValueError, 'Timeline: no op of the profile '
                                'belongs to a pipeline action'):
      timeline_lib.Timeline([Ev('dense/MatMul', 0, 1)], _DEVICES)

  def testProfilesOfRealStepsFollowTheirSchedules(self):
    k, m = 2, 4
    ws = [tf.Variable(tf.random.stateless_normal([64, 64], [i, 0]) * 0.1)
          for i in range(k)]

    def _Cell(th, x):
      return NestedMap(h=tf.tanh(tf.matmul(x.h, th.w)))

    def _Last(th, xs):
      return NestedMap(loss=tf.reduce_sum(_Cell(th, xs[0]).h ** 2))

    @tf.function
    def _Step(xs):
      with tf.GradientTape() as tape:
        loss, _ = executor.PipelineLoss(
            _DEVICES, [_Cell, _Last], [NestedMap(w=w) for w in ws],
            [NestedMap(h=tf.TensorSpec([32, 64])),
             NestedMap(loss=tf.TensorSpec([]))], NestedMap(h=xs),
            NestedMap(), schedule='1f1b', trace_actions=True)
      return tape.gradient(loss, ws)

    def _GPipeStep(remat):
      @tf.function
      def _Step(xs):
        with tf.GradientTape() as tape:
          acc, _ = executor.StackedRecurrent(
              _DEVICES, [lambda th, s, x: _Cell(th, x)] * k,
              [NestedMap(w=w) for w in ws],
              [NestedMap(h=tf.zeros([32, 64]))] * k, NestedMap(h=xs),
              remat=remat, trace_actions=True)
          loss = tf.reduce_sum(acc.h ** 2)
        return tape.gradient(loss, ws)
      return _Step

    xs = tf.random.stateless_normal([m, 32, 64], [1, 1])
    # 'selective' keeps a cut trace of the cell's forward and gradient: its
    # ops must be named by their actions too.
    for name, step, table in (
        ('1f1b', _Step, ps.Build('1f1b', k, k, m)),
        ('gpipe', _GPipeStep('always'), ps.Build('gpipe', k, k, m)),
        ('gpipe selective', _GPipeStep('selective'),
         ps.Build('gpipe', k, k, m))):
      step(xs)
      logdir = os.path.join(self.get_temp_dir(), name)
      ops = timeline_lib.ProfileOps(lambda: step(xs), logdir)  # pylint: disable=cell-var-from-loop
      timeline = timeline_lib.Timeline(ops, _DEVICES, schedule=table.name)
      self.assertEqual((k, m), (timeline.num_cells, timeline.num_steps))
      # Every product of the step ran inside an action.
      products = [e.name for e in ops if e.name.split('/')[-1] == 'MatMul']
      self.assertNotEmpty(products)
      self.assertEqual([], [n for n in products
                            if ps.ActionOfOp(n + '/') is None], name)
      # Each device ran every one of its actions, in the schedule's order:
      # the executor chains each device's actions (an action's inputs wait
      # for the one before it), so their first ops start in that order.
      self.assertLen(timeline.actions, 2 * k * m)
      for i, order in enumerate(table.actions):
        ran = sorted((a for a in timeline.actions if a.stage == i),
                     key=lambda a: timeline.segments[a][0][0])
        self.assertEqual(list(order), ran, name)
      # A forward's product, which needs the stage before's output, runs
      # once that stage's forward product of the micro-batch has ended.
      # (Its span is not compared: on a loaded machine a preempted cheap
      # early op of the action can weigh more than its real block.)
      runs = collections.defaultdict(list)
      for e in ops:
        if e.name.split('/')[-1] == 'MatMul':
          runs[ps.ActionOfOp(e.name + '/')].append((e.start, e.end))
      for a in timeline.actions:
        if a.kind == F and a.stage > 0:
          before = runs[ps.Action(F, a.stage - 1, a.micro_batch)]
          self.assertGreaterEqual(min(s for s, _ in runs[a]),
                                  max(e for _, e in before), (name, a))
      self.assertBetween(timeline.measured_bubble, 0.0, 1.0)


if __name__ == '__main__':
  tf.test.main()
