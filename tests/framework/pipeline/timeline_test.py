"""Tests for cadence.framework.pipeline.timeline (and summary images)."""
import os

import tensorflow as tf

from cadence.framework.nested_map import NestedMap
from cadence.framework.pipeline import executor
from cadence.framework.pipeline import schedules as ps
from cadence.framework.pipeline import timeline as timeline_lib
from cadence.framework.train import summary_utils

_DEVICES = ['/device:CPU:0', '/device:CPU:1']
Ev = timeline_lib.OpEvent


def _Events():
  """A hand-made profile of 2 cells x 2 micro-batches (seconds).

  cell 0: F0 [0, 1], F1 [1, 2], B1 [5, 6], B0 [6, 8]
  cell 1: F0 [1, 2], F1 [2, 3], B1 [3, 4], B0 [4, 5]
  Actions are spread over several ops (gaps inside count as busy); ops
  outside any action are ignored.
  """
  ev = []
  for (kind, cell, step), (a, b) in {
      ('F', 0, 0): (0, 1), ('F', 0, 1): (1, 2), ('B', 0, 1): (5, 6),
      ('B', 0, 0): (6, 8), ('F', 1, 0): (1, 2), ('F', 1, 1): (2, 3),
      ('B', 1, 1): (3, 4), ('B', 1, 0): (4, 5)}.items():
    scope = ps.Action('F', cell, step).scope
    if kind == 'F':
      name = f'model/{scope}/MatMul'
    else:   # A tape's gradient op: named after the forward op.
      name = f'gradient_tape/{scope}/MatMul/MatMul'
    ev += [Ev(name, 100 + a, 100 + a + 0.25), Ev(name + '_1', 100 + b - 0.25,
                                                 100 + b)]
  return ev + [Ev('optimizer/Adam', 99.0, 109.0)]


class TimelineTest(tf.test.TestCase):

  def testTimesBubbleAndReport(self):
    timeline = timeline_lib.Timeline(_Events(), _DEVICES)
    self.assertEqual((2, 2), (timeline.num_cells, timeline.num_steps))
    self.assertEqual(8.0, timeline.span)
    self.assertEqual((6.0, 8.0), timeline.actions[ps.Action('B', 0, 0)])
    self.assertEqual(
        [dict(forward=2.0, backward=3.0, idle=3.0),
         dict(forward=2.0, backward=2.0, idle=4.0)],
        timeline.DeviceTimes())
    self.assertAllClose(7.0 / 16, timeline.measured_bubble)
    self.assertAllClose(1.0 / 3, timeline.ideal_bubble)
    report = timeline.Report()
    self.assertIn('2 cells x 2 micro-batches, 8000.0 ms', report)
    self.assertRegex(report, r'/device:CPU:1 +2000.0 +2000.0 +4000.0')
    self.assertIn('bubble: measured 0.438, ideal (equal-time actions) = 0.333',
                  report)

  def testCellsShareDevices(self):
    timeline = timeline_lib.Timeline(_Events(), _DEVICES[:1])
    self.assertEqual(_DEVICES[:1], timeline.rows)
    self.assertEqual([dict(forward=3.0, backward=5.0, idle=0.0)],
                     timeline.DeviceTimes())

  def testPictures(self):
    timeline = timeline_lib.Timeline(_Events(), _DEVICES)
    svg = timeline.Svg(width=950, row_height=20)
    self.assertEqual(8, svg.count('<rect '))
    # B(0, 0) on row 0 from 6 to 8 s: x = 150 + 6/8 * 800.
    self.assertIn('<rect x="750.0" y="24" width="200.0" height="16" '
                  'fill="rgb(234, 134, 0)"', svg)
    self.assertIn('<title>B(0, 0) 6000.00-8000.00 ms</title>', svg)
    image = timeline.Image(width=80, row_height=10)
    self.assertEqual((20, 80, 3), image.shape)
    self.assertAllEqual([66, 133, 244], image[5, 5])     # F(0, 0)
    self.assertAllEqual([234, 134, 0], image[15, 45])    # B(1, 0)
    self.assertAllEqual([255, 255, 255], image[15, 75])  # cell 1 idle
    paths = timeline.WritePictures(self.get_temp_dir())
    with open(paths[0]) as f:
      self.assertEqual(svg.count('<rect '), f.read().count('<rect '))
    writer = summary_utils.SummaryWriter(self.get_temp_dir())
    writer.WriteImage(3, 'timeline', image)
    writer.WriteText(3, 'note', 'hello')
    writer.Close()
    images = summary_utils.ReadImages(self.get_temp_dir())
    self.assertEqual(3, images['timeline'][0][0])
    self.assertAllEqual(image, images['timeline'][0][1])
    self.assertEqual({'note': [(3, 'hello')]},
                     summary_utils.ReadTexts(self.get_temp_dir()))

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
      # Each device ran every one of its actions, in the schedule's order
      # (the executor chains each device's actions).
      self.assertLen(timeline.actions, 2 * k * m)
      for i, order in enumerate(table.actions):
        ran = sorted((a for a in timeline.actions if a.stage == i),
                     key=lambda a: timeline.actions[a][0])
        self.assertEqual(list(order), ran, name)
      self.assertBetween(timeline.measured_bubble, 0.0, 1.0)


if __name__ == '__main__':
  tf.test.main()
