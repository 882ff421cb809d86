"""A pipeline action kind added from outside (actions.Kind): the README's.

The kind P(s, j) does stage s's forward of micro-batch j and then its
backward, as one action: on the last stage of 1F1B, where F(S-1, j) and
B(S-1, j) run back to back. Adding it is the kind, the schedule builder
that uses it and the executor's handler, one module that the README's "An
action kind of one's own" writes and this test runs from there; the
checker, the simulator, the memory estimate and the timeline learn it from
what it does (F, B).
"""
import numpy as np
import tensorflow as tf

from cadence.framework.nested_map import NestedMap
from cadence.framework.pipeline import actions
from cadence.framework.pipeline import executor
from cadence.framework.pipeline import memory_estimate
from cadence.framework.pipeline import schedule_builders
from cadence.framework.pipeline import schedules
from cadence.framework.pipeline import timeline as timeline_lib
from cadence.framework.pipeline import timeline_chart
from cadence.framework.planning import hardware
from cadence.framework.planning import step_model
from cadence.tests import readme_blocks
from cadence.tests import test_utils

A = actions.Action
F, B = actions.FORWARD, actions.BACKWARD
P = 'P'
_NAME = 'fused_1f1b'
_DEVICES = ['/device:CPU:0', '/device:CPU:1']
_B, _D = 2, 3


def setUpModule():
  # The README's module ("An action kind of one's own") registers the kind,
  # its handler and the schedule as it runs.
  readme_blocks.Module('cadence.framework.pipeline.fused_1f1b')


def tearDownModule():
  executor.UnregisterHandler(P)
  schedules.Unregister(_NAME)
  actions.Unregister(P)


class ActionKindTest(tf.test.TestCase):

  def testCheckerLearnsWhatItDoes(self):
    fused = schedules.Build(_NAME, 2, 2, 4)
    self.assertEqual([A(P, 1, j) for j in range(4)], list(fused.actions[1]))
    # Its needs are its work's, less its own: P(1, j) waits for F(0, j);
    # B(0, j) waits for the P that does B(1, j).
    self.assertEqual([A(F, 0, 2)], fused.Needs(A(P, 1, 2)))
    self.assertEqual([A(F, 0, 2), A(P, 1, 2)], fused.Needs(A(B, 0, 2)))
    self.assertEqual(schedules.Build('1f1b', 2, 2, 4).InFlight(),
                     fused.InFlight())
    # As text, and the checker's rules.
    table = 'F0:0 F0:1 B0:0 B0:1 | P1:0 P1:1'
    self.assertEqual(
        [A(P, 1, 0), A(P, 1, 1)],
        list(schedules.Build(schedules.TABLE, 2, 2, 2,
                             table=table).actions[1]))
    cases = [
        ('F0:0 F0:1 B0:0 B0:1 | P1:0 F1:1 P1:1',
         r"device 1, tick 2: P\(1, 1\) does the work of F\(1, 1\), which "
         r'F\(1, 1\) at device 1, tick 1 does already'),
        ('F0:0 F0:1 B0:0 B0:1 | P1:0',
         r'micro-batch 1 never finishes stage 1: F\(1, 1\) is missing'),
        ('F0:0 B0:0 F0:1 B0:1 | P1:1 P1:0',
         r'deadlocks: device 0 at tick 1: B\(0, 0\) waits for P\(1, 0\); '
         r'device 1 at tick 0: P\(1, 1\) waits for F\(0, 1\)'),
    ]
    for text, error in cases:
      with self.subTest(text=text):
        with self.assertRaisesRegex(ValueError, error):
          schedules.Build(schedules.TABLE, 2, 2, 2, table=text)

  def testSimulatorCostsItsWork(self):
    stages = [step_model.StageCost(1.0, 2.0, 0.5, 1000, 0, 0.0, 0.1, 0.03),
              step_model.StageCost(1.5, 2.5, 0.7, 1000, 0, 0.0, 0.2, 0.03)]
    fused = schedules.Build(_NAME, 2, 2, 4)
    for j in range(4):
      want = sum(step_model.ActionCost(A(kind, 1, j), stages[1], False,
                                       'always', 4) for kind in (F, B))
      # One action: its overhead once.
      self.assertAlmostEqual(want - stages[1].overhead, step_model.ActionCost(
          A(P, 1, j), stages[1], False, 'always', 4), places=12)
    # Without overheads the fused schedule is the same step as 1F1B, the
    # transfers between the stages (1 ms each way on this link) included.
    slow, fast = (hardware.Parse('devices=64,tflops=1,memory_gbps=1000,'
                                 f'link_gbps={gbps}') for gbps in (0.001, 1e6))
    plain = [s._replace(overhead=0.0) for s in stages]
    for remat in ('never', 'always'):
      with self.subTest(remat=remat):
        want = step_model.SimulateStep(schedules.Build('1f1b', 2, 2, 4),
                                       plain, slow, remat)
        got = step_model.SimulateStep(fused, plain, slow, remat)
        self.assertAlmostEqual(want.time, got.time, places=9)
        self.assertAlmostEqual(want.bubble, got.bubble, places=9)
        self.assertGreater(
            got.time,
            step_model.SimulateStep(fused, plain, fast, remat).time + 0.002)

  def testMemoryEstimateLearnsWhatItKeeps(self):
    # The fused tick holds what 1F1B's B tick holds: the micro-batch is
    # forwarded and being back-propagated. Per stage, the same peak, but
    # that the last stage's fused tick runs while stage 0 takes the input
    # gradient of the one before (it is held until then: cell 0's out).
    cells = [NestedMap(act=100, act_weights=40, residuals=50, out=10,
                       transient=30, outside=0),
             NestedMap(act=200, act_weights=80, residuals=90, out=20,
                       transient=50, outside=0)]
    for remat in ('never', 'always', 'except_last', 'selective'):
      with self.subTest(remat=remat):
        def _Peaks(schedule, remat=remat):
          memory = NestedMap(schedule=schedule, remat=remat,
                             num_micro_batches=4, backward_window=1,
                             cells=cells)
          return memory_estimate.StageMemory(memory, [1000, 2000], [10, 20])
        fused = _Peaks(schedules.Build(_NAME, 2, 2, 4))
        plain = _Peaks('1f1b')
        self.assertEqual(plain[0], fused[0])
        self.assertEqual(plain[1]._replace(
            activations=plain[1].activations + cells[0].out), fused[1])
        self.assertGreater(fused[1].activations, 0)

  def testExecutorRunsItAsTheUnpipelinedModel(self):
    rng = np.random.RandomState(7)
    thetas = test_utils.DenseThetas(2, _D, rng)
    xs = tf.constant(rng.normal(size=[4, _B, _D]), tf.float32)
    ys = tf.constant(rng.normal(size=[4, _B, _D]), tf.float32)

    def _Cell(theta, x):
      return NestedMap(h=tf.tanh(tf.matmul(x.h, theta.w) + theta.b))

    def _Loss(theta, inputs):
      x, side = inputs
      return NestedMap(loss=tf.reduce_sum((_Cell(theta, x).h - side.y)**2))

    def _Unpipelined():
      return tf.add_n([_Loss(thetas[1], (_Cell(thetas[0], NestedMap(
          h=xs[j])), NestedMap(y=ys[j]))).loss for j in range(4)])

    def _Fused():
      loss, _ = executor.PipelineLoss(
          _DEVICES, [_Cell, _Loss], thetas,
          [NestedMap(h=tf.TensorSpec([_B, _D])),
           NestedMap(loss=tf.TensorSpec([]))],
          NestedMap(h=xs), NestedMap(y=ys), schedule=_NAME, remat='always')
      return loss

    wrt = [v for th in thetas for v in th.Flatten()] + [xs]
    want = test_utils.LossAndGrads(_Unpipelined, wrt)
    for fn in (_Fused, tf.function(_Fused)):
      with self.subTest(graph=fn is not _Fused):
        got = test_utils.LossAndGrads(fn, wrt)
        self.assertAllClose(want, got, atol=1e-5, rtol=1e-5)

  def testExecutorNamesAKindWithoutHandler(self):
    actions.Register(actions.Kind('Q', 'unhandled', (F, B),
                                  ((0, 0, 0), (0, 0, 0))))
    try:
      schedules.Register('unhandled', loss_inside=True)(
          lambda sd, d, m: [[A(a.kind if a.kind != P else 'Q', *a[1:])
                             for a in device]
                            for device in schedules.Build(
                                _NAME, len(sd), d, m, stage_devices=sd
                            ).actions])
      try:
        with self.assertRaisesRegex(
            ValueError, r"owner: schedule 'unhandled' has actions of "
            r"kind\(s\) \['Q'\], which the executor has no handler for"):
          executor.BuildSchedule('owner', 'unhandled', _DEVICES, 2)
      finally:
        schedules.Unregister('unhandled')
    finally:
      actions.Unregister('Q')

  def testTimelineLearnsItsPhaseAndColour(self):
    # A hand-made profile of the fused schedule on 2 stages x 2
    # micro-batches: F(0, j) ops, then P(1, j), then B(0, j).
    ev = timeline_lib.OpEvent
    ops = [(A(F, 0, 0), 0, 1), (A(F, 0, 1), 1, 2), (A(P, 1, 0), 1, 3),
           (A(P, 1, 1), 3, 5), (A(B, 0, 0), 3, 4), (A(B, 0, 1), 5, 6)]
    events = [ev(f'model/{a.scope}/MatMul', 10 + s, 10 + e)
              for a, s, e in ops]
    timeline = timeline_lib.Timeline(
        events, _DEVICES, schedules.Build(_NAME, 2, 2, 2))
    self.assertEqual([dict(forward=2.0, backward=2.0, idle=2.0),
                      dict(forward=0.0, backward=4.0, idle=2.0)],
                     timeline.DeviceTimes())
    chart = timeline_chart.Layout(timeline)
    colours = {b.action: b.rgb for b in chart.boxes}
    self.assertEqual((150, 90, 200), colours[A(P, 1, 0)])
    self.assertEqual((190, 150, 230), colours[A(P, 1, 1)])
    self.assertIn('forward and backward', timeline_chart.Svg(timeline))


class ParseTableTest(tf.test.TestCase):

  def testUnregisteredLetterIsNotAnAction(self):
    # Outside setUpModule's registration, 'P' is refused as any unknown
    # letter is.
    actions.Unregister(P)
    try:
      with self.assertRaisesRegex(ValueError, r"'P1:0' is not an action"):
        schedule_builders.ParseTable('F0:0 P1:0')
    finally:
      actions.Register(actions.Kind(P, 'forward and backward', (F, B),
                                    ((150, 90, 200), (190, 150, 230))))


if __name__ == '__main__':
  tf.test.main()
