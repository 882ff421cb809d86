"""Tests for cadence.framework.train.runners and train_state: a runner of
one's own changes the step through the public interface alone."""
import os

import tensorflow as tf

from cadence.framework import model_registry
from cadence.framework.distribute import ps_programs
from cadence.framework.distribute import tpu_programs
from cadence.framework.nested_map import NestedMap
from cadence.framework.train import checkpointer
from cadence.framework.train import programs
from cadence.framework.train import runners

_KEY = 'synthetic.linear_regression.RegressionTiny'
_STEPS = 12


def _Program(logdir, **kw):
  p = model_registry.GetParams(_KEY, 'Train')
  p.task.train.Set(max_steps=_STEPS, summary_interval_steps=6,
                   log_interval_steps=6, save_interval_steps=6)
  return programs.TrainProgram(p.Instantiate().task, logdir,
                               peak_flops=1e12, **kw), p


class _CountingRunner(runners.SyncRunner):
  """The synchronous step, plus the examples it stepped over in a variable
  of its own (what an option adds to a step), and the loop's calls."""

  def __init__(self, state, **kwargs):
    super().__init__(state, **kwargs)
    self.examples = tf.Variable(0.0, trainable=False)
    self.calls = []

  def Step(self, iterator):
    stats = super().Step(iterator)
    self.examples.assign_add(stats.examples)
    return stats

  def Call(self, loop, iterator, num_steps, keys):
    self.calls.append(num_steps)
    return super().Call(loop, iterator, num_steps, keys)


def _Stats(skipped, grad_norm, learning_rate):
  """A learner's stats of one step."""
  return NestedMap(skipped=tf.constant(skipped),
                   grad_norm=tf.constant(grad_norm),
                   learning_rate=tf.constant(learning_rate))


def _Metrics(**values):
  """{name: {vw, w}} of (value x weight, weight) pairs."""
  return NestedMap({k: NestedMap(vw=tf.constant(v * w), w=tf.constant(w))
                    for k, (v, w) in values.items()})


class RunnerTest(tf.test.TestCase):

  def testARunnerOfOnesOwnThroughThePublicInterface(self):
    plain, _ = _Program(os.path.join(self.get_temp_dir(), 'plain'))
    mine, params = _Program(os.path.join(self.get_temp_dir(), 'mine'),
                            runner=_CountingRunner)
    self.assertEqual(plain.Run(), _STEPS)
    self.assertEqual(mine.Run(), _STEPS)
    # The same update: the override only adds to the step.
    for (path, a), (_, b) in zip(plain.learner.trainable,
                                 mine.learner.trainable):
      self.assertAllClose(a.numpy(), b.numpy(), rtol=1e-6, msg=path)
    # Every step's examples, counted inside the compiled loop.
    self.assertEqual(mine.runner.examples.numpy(),
                     _STEPS * params.input.batch_size)
    # The loop called it from boundary to boundary: the first step, then
    # to the checkpoint at 6 and 12.
    self.assertEqual(mine.runner.calls, [1, 5, 6])
    # The runner's own variable is not the checkpoint's: its layout is the
    # train state's.
    latest = mine.checkpointer.latest_checkpoint
    self.assertEqual(set(checkpointer.ReadValues(latest, '')),
                     set(checkpointer.ReadValues(
                         plain.checkpointer.latest_checkpoint, '')))

  def testStateCountsAStepAndSkipsItsAverages(self):
    program, _ = _Program(self.get_temp_dir())
    state = program.state
    stats = state.CountStep(_Stats(skipped=True, grad_norm=3.0,
                                   learning_rate=0.5),
                            tf.constant(8.0), _Metrics(loss=(2.0, 8.0)))
    self.assertEqual(int(state.global_step.numpy()), 1)
    self.assertEqual(int(state.input_position.numpy()), 1)
    self.assertEqual(int(state.skipped_total.numpy()), 1)
    self.assertEqual(int(state.consecutive.numpy()), 1)
    # A skipped step's grad norm and metrics do not count in averages.
    self.assertEqual(float(stats.grad_norm), 0.0)
    self.assertEqual(float(stats.metrics.loss.vw), 0.0)
    self.assertEqual((float(stats.ok_steps), float(stats.skipped_steps)),
                     (0.0, 1.0))
    stats = state.CountStep(_Stats(skipped=False, grad_norm=3.0,
                                   learning_rate=0.5),
                            tf.constant(8.0), _Metrics(loss=(2.0, 8.0)))
    self.assertEqual(int(state.consecutive.numpy()), 0)
    self.assertEqual(float(stats.grad_norm), 3.0)
    self.assertEqual(float(stats.metrics.loss.vw), 16.0)

  def testRunnersThatCannotShardSayWhy(self):
    p = model_registry.GetParams(_KEY, 'Train')
    p.task.train.learner.shard_optimizer_state = True
    task = p.Instantiate().task
    with self.assertRaisesRegex(
        ValueError, r"shard_optimizer_state=True does not apply to "
        r'parameter servers: they hold each slot once already'):
      ps_programs.PsRunner.Shards(task, None, 2, 0)
    with self.assertRaisesRegex(
        ValueError, r'shard_optimizer_state=True is not built for TPUs'):
      tpu_programs.TpuRunner.Shards(task, None, 1, 0)
    p.task.train.learner.shard_optimizer_state = False
    self.assertEqual((1, 0), ps_programs.PsRunner.Shards(
        p.Instantiate().task, None, 2, 0))

  def testTaskCopiesMustMatchTheStrategysReplicas(self):
    p = model_registry.GetParams(_KEY, 'Train')
    tasks = [p.Instantiate().task for _ in range(2)]
    with self.assertRaisesRegex(
        ValueError, r"got 2 task copies for the strategy's 1 local "
        r'replica\(s\); build one per replica'):
      programs.TrainProgram(tasks, self.get_temp_dir(), peak_flops=1e12)
