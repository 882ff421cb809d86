"""Work of one's own, added from this module alone: a transfer.

T(s, j) copies stage s's output of micro-batch j to stage s+1's device as
soon as F(s, j) made it, so that F(s+1, j) reads a local copy (a send and
its receive, scheduled as one action on the sending device). Adding it is
three registrations and a schedule builder, nothing in Cadence edited:

  actions.RegisterWork  the work: it needs F(s, j), it feeds F(s+1, j)
                        (so F(s+1, j) waits for it), it applies to every
                        stage but the last, it belongs to the forward phase;
  actions.Register      the kind T that does it;
  executor.RegisterHandler  its handler, through PipelineRun's public
                        interface (Forward's output, SetOutput,
                        StageDevice);
  schedules.Register    'gpipe_send': GPipe with T(s, j) right after F(s, j).

The checker, the simulator, the memory estimate and the step model learn
the work from its registration; the executor runs it as the unpipelined
model, loss and gradients, the loss outside the pipeline (GPipe's phases)
and inside it.
"""
import numpy as np
import tensorflow as tf

from cadence.framework.nested_map import NestedMap
from cadence.framework.pipeline import actions
from cadence.framework.pipeline import executor
from cadence.framework.pipeline import memory_estimate
from cadence.framework.pipeline import schedule_builders
from cadence.framework.pipeline import schedules
from cadence.framework.planning import hardware
from cadence.framework.planning import step_model
from cadence.tests import test_utils

A = actions.Action
F, B, T = actions.FORWARD, actions.BACKWARD, 'T'
_NAME = 'gpipe_send'
_DEVICES = ['/device:CPU:0', '/device:CPU:1', '/device:CPU:2']
_B, _D, _M = 2, 3, 4


def _TransferNeeds(s, j, num_stages, num_micro_batches, recurrent,
                   loss_inside):
  del num_stages, num_micro_batches, recurrent, loss_inside   # Unused.
  return [A(F, s, j)]


def _TransferFeeds(s, j, num_stages, num_micro_batches):
  del num_stages, num_micro_batches   # Unused.
  return [A(F, s + 1, j)]


def _NotLast(s, j, num_stages, num_micro_batches):
  del j, num_micro_batches   # Unused.
  return s < num_stages - 1


def RunTransfer(run, stage, micro_batch, after=()):
  """T(s, j): stage s's output of micro-batch j, copied onto stage s+1's
  device; F(s+1, j) and B(s, j) read the copy."""
  del after   # Its input, F's output, orders it.
  with tf.device(run.StageDevice(stage + 1)):
    copy = [tf.identity(x) for x in run.Output(stage, micro_batch)]
  run.SetOutput(stage, micro_batch, copy)
  return copy if not tf.executing_eagerly() else []


def GPipeSend(stage_devices, num_devices, num_micro_batches):
  """GPipe's device lists with T(s, j) right after F(s, j) (but the last
  stage's)."""
  num_stages = len(stage_devices)
  lists = schedule_builders.GPipe(stage_devices, num_devices,
                                  num_micro_batches)
  return [[b for a in device for b in (
      [a, A(T, a.stage, a.micro_batch)]
      if a.kind == F and a.stage < num_stages - 1 else [a])]
          for device in lists]


def setUpModule():
  actions.RegisterWork(actions.Work(
      T, 'transfer', _TransferNeeds, feeds=_TransferFeeds, applies=_NotLast,
      forward=True, seconds=lambda stage: stage.out_bytes / 1e9))
  actions.Register(actions.Kind(T, 'transfer', (T,),
                                ((120, 120, 120), (170, 170, 170))))
  executor.RegisterHandler(T, RunTransfer)
  schedules.Register(_NAME, loss_inside=False)(GPipeSend)


def tearDownModule():
  schedules.Unregister(_NAME)
  executor.UnregisterHandler(T)
  actions.Unregister(T)
  actions.UnregisterWork(T)


def _Cell(theta, x):
  return NestedMap(h=tf.tanh(tf.matmul(x.h, theta.w) + theta.b))


class TransferWorkTest(tf.test.TestCase):

  def testScheduleReadersLearnTheWork(self):
    schedule = schedules.Build(_NAME, 3, 3, _M)
    self.assertEqual((F, B, T), schedule.works)
    self.assertEqual([A(F, 0, 0), A(T, 0, 0), A(F, 0, 1), A(T, 0, 1)],
                     list(schedule.actions[0][:4]))
    # F(1, j) waits for the copy T(0, j); T(0, j) for F(0, j); T is in the
    # forward phase.
    self.assertEqual([A(F, 0, 2), A(T, 0, 2)], schedule.Needs(A(F, 1, 2)))
    self.assertEqual([A(F, 0, 2)], schedule.Needs(A(T, 0, 2)))
    self.assertTrue(actions.IsForward(A(T, 1, 0)))
    # The checker owes it for every stage but the last.
    lists = [list(d) for d in schedule.actions]
    lists[1].remove(A(T, 1, 3))
    with self.assertRaisesRegex(
        ValueError, r"Schedule 'x', device 1: T\(1, 3\) is missing: the "
        r'schedule does transfer \(T\) elsewhere'):
      schedules.Check(schedules.Schedule('x', 3, _M, [0, 1, 2], lists,
                                         False))
    # The memory estimate reads it (no bytes of its own), the step model
    # costs it by its `seconds`.
    cells = [NestedMap(act=100, act_weights=40, out=10, transient=30,
                       outside=0)] * 3
    memory = NestedMap(schedule=schedule, remat='never',
                       num_micro_batches=_M, backward_window=1, cells=cells)
    plain = NestedMap(memory, schedule='gpipe')
    self.assertEqual(
        memory_estimate.StageMemory(plain, [1000] * 3, [0] * 3),
        memory_estimate.StageMemory(memory, [1000] * 3, [0] * 3))
    stage = step_model.StageCost(
        forward=1.0, backward=2.0, recompute=0.0, accumulate=0.0,
        overhead=0.0, out_bytes=2e9, defer_w=0.0, update=0.0,
        grad_bytes=0)
    self.assertEqual(2.0, step_model.ActionCost(A(T, 0, 1), stage, False,
                                                'never', _M))
    step = step_model.SimulateStep(schedule, [stage] * 3,
                                   hardware.Parse('h100x8'), 'never')
    self.assertGreater(step.time, step_model.SimulateStep(
        schedules.Build('gpipe', 3, 3, _M), [stage] * 3,
        hardware.Parse('h100x8'), 'never').time)

  def testExecutorRunsItAsTheUnpipelinedModel(self):
    rng = np.random.RandomState(11)
    thetas = test_utils.DenseThetas(3, _D, rng)
    xs = tf.constant(rng.normal(size=[_M, _B, _D]), tf.float32)
    ys = tf.constant(rng.normal(size=[_M, _B, _D]), tf.float32)

    def _Loss(theta, inputs):
      x, side = inputs
      return NestedMap(loss=tf.reduce_sum((_Cell(theta, x).h - side.y)**2))

    def _Unpipelined():
      total = []
      for j in range(_M):
        h = NestedMap(h=xs[j])
        for theta in thetas[:2]:
          h = _Cell(theta, h)
        total.append(_Loss(thetas[2], (h, NestedMap(y=ys[j]))).loss)
      return tf.add_n(total)

    def _LossOutside():
      # GPipe's phases: the pipeline's outputs, then the loss on them.
      acc, _ = executor.StackedRecurrent(
          _DEVICES, [lambda th, unused_s, x: _Cell(th, x)] * 3, thetas,
          [NestedMap(h=tf.zeros([_B, _D]))] * 3, NestedMap(h=xs),
          schedule=_NAME, recurrent=False)
      return tf.add_n([tf.reduce_sum((acc.h[j] - ys[j])**2)
                       for j in range(_M)])

    def _LossInside():
      loss, _ = executor.PipelineLoss(
          _DEVICES, [_Cell, _Cell, _Loss], thetas,
          [NestedMap(h=tf.TensorSpec([_B, _D]))] * 2 +
          [NestedMap(loss=tf.TensorSpec([]))],
          NestedMap(h=xs), NestedMap(y=ys), schedule=_NAME, remat='always')
      return loss

    def _UnpipelinedOutside():   # The same model as _LossOutside's.
      total = []
      for j in range(_M):
        h = NestedMap(h=xs[j])
        for theta in thetas:
          h = _Cell(theta, h)
        total.append(tf.reduce_sum((h.h - ys[j])**2))
      return tf.add_n(total)

    wrt = [v for th in thetas for v in th.Flatten()] + [xs]
    for run, reference in ((_LossInside, _Unpipelined),
                           (_LossOutside, _UnpipelinedOutside)):
      want = test_utils.LossAndGrads(reference, wrt)
      for fn in (run, tf.function(run)):
        with self.subTest(run=run.__name__, graph=fn is not run):
          got = test_utils.LossAndGrads(fn, wrt)
          self.assertAllClose(want, got, atol=1e-5, rtol=1e-5)

  def testTheCopyRunsOnTheNextStagesDevice(self):
    rng = np.random.RandomState(3)
    thetas = test_utils.DenseThetas(3, _D, rng)
    xs = tf.constant(rng.normal(size=[_M, _B, _D]), tf.float32)

    @tf.function
    def _Run():
      acc, _ = executor.StackedRecurrent(
          _DEVICES, [lambda th, unused_s, x: _Cell(th, x)] * 3, thetas,
          [NestedMap(h=tf.zeros([_B, _D]))] * 3, NestedMap(h=xs),
          schedule=_NAME, recurrent=False)
      return acc.h

    graph = _Run.get_concrete_function().graph
    copies = [op for op in graph.get_operations()
              if f'pipeline_action_{T}_' in op.name and op.type == 'Identity']
    self.assertLen(copies, 2 * _M)   # Stages 0 and 1, every micro-batch.
    for op in copies:
      stage = int(op.name.split(f'pipeline_action_{T}_')[1].split('_')[0])
      self.assertEqual(f'/device:CPU:{stage + 1}',
                       tf.DeviceSpec.from_string(op.device).to_string()
                       .replace('/job:localhost/replica:0/task:0', ''))


if __name__ == '__main__':
  tf.test.main()
