"""Tests for framework/pipeline/plan.py: a plan is its units' sums."""
import tensorflow as tf

from cadence.framework import cost
from cadence.framework.pipeline import plan as plan_lib
from cadence.framework.pipeline import schedules


def _Unit(name, size, flops=100, act=40, act_weights=10, residuals=20,
          transient=8):
  """A unit whose costs are per example, on `size` examples."""
  return plan_lib.Unit(name, cost.Cost(
      out_shapes=(), flops=flops * size, bwd_flops=2 * flops * size,
      act=act * size, act_weights=act_weights * size,
      residuals=residuals * size, transient=transient * size,
      act_outputs=0))


def _Costs(size):
  """Four units (the third twice the others'), outs 4 bytes an example."""
  units = [_Unit(f'u{i}', size, flops=200 if i == 2 else 100)
           for i in range(4)]
  return units, [4 * size] * 4, 3 * size


def _Plan(schedule='gpipe', m=4, size=2, bounds=(0, 2, 4), devices=2,
          loss=True):
  plan = plan_lib.PipelinePlan(
      *_Costs(size)[:1], list(bounds),
      schedules.Build(schedule, len(bounds) - 1, devices, m), m, size,
      'never', 1, _Costs(size)[1], _Costs(size)[2], cost_fn=_Costs,
      schedule_fn=lambda s, mb, d: schedules.Build(schedule, s, d, mb))
  if not loss:
    return plan
  return plan.With(
      before_fn=lambda batch: [_Unit('emb', batch, flops=10, act=0)],
      loss_fn=lambda size: _Unit('loss', size, flops=30, act=5,
                                 act_weights=5, residuals=5, transient=50))


class PipelinePlanTest(tf.test.TestCase):

  def testStagesAreTheSumsOfTheirUnits(self):
    plan = _Plan()
    self.assertEqual((2, 4, 2, 8), (plan.num_stages, plan.num_micro_batches,
                                    plan.micro_batch_size, plan.batch))
    self.assertEqual(['u0', 'u1'], [u.name for u in plan.StageUnits(0)])
    stage = plan.StageCost(1)   # u2 (200 a row) and u3, on 2 examples.
    self.assertEqual((600, 1200, 160, 16), (
        stage.flops, stage.bwd_flops, stage.act, stage.transient))
    # Forward FLOPs of the whole batch (8 examples): the embedding in the
    # first stage, the loss in the last.
    self.assertEqual([8 * 200 + 8 * 10, 8 * 300 + 8 * 30],
                     plan.StageFlops())

  def testCellsHoldTheLossWhereTheScheduleRunsIt(self):
    outside = _Plan('gpipe').cells
    self.assertEqual([dict(act=160, act_weights=40, residuals=80,
                           transient=16, out=8, act_outputs=0,
                           outside=0)] * 1,
                     [dict(c) for c in outside[:1]])
    # GPipe: the loss on the whole batch after the forwards.
    self.assertEqual((160, 0 + 4 * 2 * 5, 4 * 2 * 50),
                     (outside[1].act, outside[1].outside,
                      outside[1].outside_transient))
    # 1F1B: inside the last stage, one micro-batch's.
    inside = _Plan('1f1b').cells[1]
    self.assertEqual((160 + 10, 40 + 10, 80 + 10, 100, 0),
                     (inside.act, inside.act_weights, inside.residuals,
                      inside.transient, inside.outside))

  def testReplanCostsTheUnitsAtTheNewSize(self):
    plan = _Plan()
    other = plan.Replan(bounds=[0, 1, 3, 4],
                        schedule=schedules.Build('1f1b', 3, 3, 2),
                        micro_batch_size=4, remat='always')
    self.assertEqual((3, 2, 4, 8, 'always'), (
        other.num_stages, other.num_micro_batches, other.micro_batch_size,
        other.batch, other.remat))
    self.assertEqual(4 * 300, other.StageCost(1).flops)
    self.assertEqual(4 * 30, other.loss.cost.flops)
    self.assertEqual([16, 16, 16], [c.out for c in other.cells])
    # Unchanged what it was not asked to change.
    self.assertEqual((plan.bounds, 2), (plan.Replan().bounds,
                                        plan.Replan().micro_batch_size))

  def testOnDevicesRebuildsTheScheduleForThem(self):
    plan = _Plan('1f1b', bounds=(0, 1, 2, 3, 4), devices=4)
    two = plan.OnDevices(2)
    self.assertEqual((2, [0, 1, 0, 1]), (two.num_devices, two.stage_devices))
    self.assertIs(plan, plan.OnDevices(4))

  def testStagesThatDoNotFitTheDevicesSayWhereTheyCameFromAndTheFixes(self):
    units, outs, first = _Costs(2)
    plan = plan_lib.PipelinePlan(
        units, [0, 2, 4], schedules.Build('gpipe', 2, 2, 4), 4, 2, 'never',
        1, outs, first, splits_path='task.stack_tpl.splits',
        schedule_fn=lambda s, mb, d: schedules.Build('gpipe', s, d, mb))
    with self.assertRaisesWithLiteralMatch(
        ValueError, "Schedule 'gpipe': 2 stage(s) on 4 devices leave "
        'device(s) [2, 3] idle. --worker_split_size=4 gives a replica 4 '
        'devices: use --worker_split_size=2, or cut the model into 4 stages '
        '(task.stack_tpl.splits=4).'):
      plan.OnDevices(4, '--worker_split_size=4')
    # No cut of the 4 units fills 8 devices: the flag's fix alone.
    with self.assertRaisesRegex(
        ValueError, r"idle\. The experiment's WORKER_SPLIT_SIZE=8 gives a "
        r'replica 8 devices: use --worker_split_size=2\.$'):
      plan.OnDevices(8, "the experiment's WORKER_SPLIT_SIZE=8")

  def testDevicesFix(self):
    fix = plan_lib.DevicesFix
    self.assertEqual('A replica has 3 devices: use --worker_split_size=2, '
                     'or cut the model into 3 stages.', fix(3, '', 2, 3))
    # v stages a device: an int `splits` K cuts K x v stages.
    self.assertEqual('--worker_split_size=4 gives a replica 4 devices: use '
                     '--worker_split_size=2, or cut the model into 8 stages '
                     '(s.splits=4).',
                     fix(4, '--worker_split_size=4', 2, 8, 's.splits',
                         stages_per_device=2))
    self.assertEqual('A replica has 2 devices: use --worker_split_size=1, '
                     'or a schedule_table of 2 lines.',
                     fix(2, '', 1, None, 's.splits', table=True))
    self.assertEqual('A replica has 2 devices.', fix(2))

  def testUnpipelinedIsOneStageOnTheWholeBatch(self):
    units, outs, first = _Costs(8)
    plan = plan_lib.PipelinePlan(units, [0, 4], None, 1, 8, None, None,
                                 outs, first).With(
                                     loss_fn=lambda n: _Unit('loss', n))
    self.assertEqual(([0], 1), (plan.stage_devices, plan.num_devices))
    self.assertEqual(8 * 4 * 40 + 8 * 40, plan.cells[0].act)

  def testBadCuts(self):
    units, outs, first = _Costs(2)
    with self.assertRaisesRegex(ValueError, r'bounds \[0, 2\] must run from '
                                r'0 to the 4 units'):
      plan_lib.PipelinePlan(units, [0, 2], None, 1, 2, None, None, outs,
                            first)
    with self.assertRaisesRegex(ValueError, 'the schedule has 3 stages, the '
                                'cut 2'):
      plan_lib.PipelinePlan(units, [0, 2, 4], schedules.Build('gpipe', 3, 3,
                                                              1),
                            1, 2, None, None, outs, first)


if __name__ == '__main__':
  tf.test.main()
