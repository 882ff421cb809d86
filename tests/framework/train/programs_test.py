"""Tests for cadence.framework.train.programs and eval_programs (in process)."""
import gc
import os
import re
from unittest import mock
import weakref

import numpy as np
import tensorflow as tf

from cadence.framework import model_registry
from cadence.framework import optimizer
from cadence.framework.train import checkpoint_files
from cadence.framework.train import checkpointer
from cadence.framework.train import eval_programs
from cadence.framework.train import preemption
from cadence.framework.train import programs
from cadence.framework.train import summary_utils
from cadence.framework.train import train_report
from cadence.tasks.synthetic import regression
from cadence.tests import test_utils

_KEY = 'synthetic.linear_regression.RegressionTiny'


def _Params(dataset='Train', **train):
  p = model_registry.GetParams(_KEY, dataset)
  defaults = dict(summary_interval_steps=10, log_interval_steps=10,
                  save_interval_steps=10)
  p.task.train.Set(**dict(defaults, **train))
  return p


def _Program(logdir, params, **kw):
  kw.setdefault('peak_flops', 1e12)  # No probe in tests.
  return programs.TrainProgram(params.Instantiate().task, logdir, **kw)


def _Values(path, prefixes=('model/', 'optimizer/')):
  return {k: v for k, v in checkpointer.ReadValues(path, '').items()
          if k.startswith(prefixes)}


class TrainProgramTest(tf.test.TestCase):

  def testLossFallsAndSummariesAreWritten(self):
    logdir = self.get_temp_dir()
    program = _Program(logdir, _Params(max_steps=200, save_interval_steps=100,
                                       summary_interval_steps=20))
    self.assertEqual(program.Run(), 200)
    # One trace for every loop length (the step count is a tensor).
    self.assertEqual(program.train_loop.experimental_get_tracing_count(), 1)
    scalars = summary_utils.ReadScalars(os.path.join(logdir, 'train'))
    losses = [v for _, v in scalars['loss']]
    self.assertEqual([s for s, _ in scalars['loss']], list(range(20, 201, 20)))
    self.assertLess(losses[-1], losses[0] / 10)
    for tag in ('mae', 'grad_norm', 'learning_rate', 'steps_per_sec',
                'examples_per_sec', 'mfu', 'model_tflops_per_sec',
                'skipped_steps', 'skipped_steps_total'):
      self.assertIn(tag, scalars)
    self.assertAllClose(scalars['learning_rate'][-1][1], 0.01)
    self.assertEqual(scalars['skipped_steps_total'][-1][1], 0)
    # Utilisation: examples/s x train FLOPs per example / peak.
    one = train_report.InputShapes(program.input_generator.Dataset(), 1)
    flops = 3 * regression.RegressionModel.FPropMeta(program.task.params,
                                                     one).flops
    step, mfu = scalars['mfu'][-1]
    examples = dict(scalars['examples_per_sec'])[step]
    self.assertAllClose(mfu, examples * flops / 1e12, rtol=1e-4)
    self.assertEqual([checkpointer.StepOf(p) for p in checkpointer.
                      ListCheckpoints(os.path.join(logdir, 'train'))],
                     [100, 200])

  def testStepRunnerTrainsWithoutFiles(self):
    """StepRunner runs the compiled loop's steps (the global step moves, the
    loss falls) and writes no file (no checkpoint, no summary)."""
    logdir = self.get_temp_dir()
    program = _Program(logdir, _Params(max_steps=1000))
    dataset = program.input_generator.Dataset()
    run = program.StepRunner(dataset)
    files = lambda: sorted(os.path.join(d, f) for d, _, fs in os.walk(logdir)  # pylint: disable=g-long-lambda
                           for f in fs)
    made = files()

    def _Loss():   # One more step on the first batch: its loss.
      stats = program.RunSteps(program.runner.Iterator(dataset, 0), 1)
      return stats['metrics.loss.vw'] / stats['metrics.loss.w']

    before = _Loss()
    self.assertGreater(run(50), 0.0)
    self.assertEqual(51, program.global_step)
    self.assertLess(_Loss(), before / 2)
    self.assertEqual(made, files())

  def _RunOnClock(self, seconds_a_step, **train):
    """Runs 60 steps on a fake clock that says each step took
    `seconds_a_step`; returns (the steps of the progress lines, the
    lengths of the compiled loop's calls, the train summaries)."""
    logdir = os.path.join(self.get_temp_dir(), f'clock_{seconds_a_step}_'
                          f'{train.get("log_interval_secs")}')
    programs_made = []

    def _Clock():  # The time the steps so far took.
      return seconds_a_step * programs_made[0].global_step

    program = _Program(logdir, _Params(
        max_steps=60, summary_interval_steps=20, log_interval_steps=50,
        save_interval_steps=60, **train), clock=_Clock)
    programs_made.append(program)
    with mock.patch.object(program, 'RunSteps',
                           wraps=program.RunSteps) as run_loop, \
        self.assertLogs(level='INFO') as logs:
      self.assertEqual(program.Run(), 60)
    lines = [int(m.group(1)) for m in
             (re.match(r'INFO:absl:step (\d+)/60  loss ', l)
              for l in logs.output) if m]
    chunks = [call.args[1] for call in run_loop.call_args_list]
    return lines, chunks, summary_utils.ReadScalars(
        os.path.join(logdir, 'train'))

  def testSlowStepsLogAtLeastEveryIntervalOfTraining(self):
    # 10 s a step: the 50-step lines would be 500 s apart.
    lines, chunks, scalars = self._RunOnClock(10.0, log_interval_secs=30.0)
    gaps = [10.0 * (b - a) for a, b in zip([1] + lines, lines)]
    self.assertLessEqual(max(gaps), 30.0)
    # Chunks aim to end 24 s after the last line: 2 steps of 10 s each.
    self.assertEqual(lines[:3], [3, 5, 7])
    self.assertIn(50, lines)
    self.assertEqual(lines[-1], 60)
    self.assertEqual(sum(chunks), 60)
    # The summaries come at their steps, their rates on the loop's clock.
    self.assertEqual([s for s, _ in scalars['steps_per_sec']], [20, 40, 60])
    self.assertAllClose([v for _, v in scalars['steps_per_sec']],
                        [0.1] * 3)

  def testFastStepsRunFromBoundaryToBoundary(self):
    lines, chunks, _ = self._RunOnClock(0.01, log_interval_secs=30.0)
    self.assertEqual(lines, [50, 60])
    # The first step, then to each summary, line or checkpoint boundary.
    self.assertEqual(chunks, [1, 19, 20, 10, 10])
    # By steps only: the same, however slow the steps.
    lines, chunks, _ = self._RunOnClock(10.0, log_interval_secs=0)
    self.assertEqual(lines, [50, 60])
    self.assertEqual(chunks, [1, 19, 20, 10, 10])

  def testTheProgramOwnsItsInputIterator(self):
    # Run leaves the iterator (and tf.data's threads) to the program, so a
    # trainer that exits next does not wait for them to stop.
    program = _Program(self.get_temp_dir(), _Params(max_steps=3))
    made = []
    make = program.runner.Iterator

    def _Made(*args):
      made.append(make(*args))
      return made[-1]

    with mock.patch.object(program.runner, 'Iterator', _Made):
      self.assertEqual(3, program.Run())
    ref = weakref.ref(made.pop())
    gc.collect()
    self.assertIsNotNone(ref())
    del program
    gc.collect()
    self.assertIsNone(ref())

  def testResumeAfterAnEndOrAStopEqualsUninterrupted(self):
    whole = os.path.join(self.get_temp_dir(), 'whole')
    parts = os.path.join(self.get_temp_dir(), 'parts')
    stopped = os.path.join(self.get_temp_dir(), 'stopped')
    _Program(whole, _Params(max_steps=30)).Run()
    _Program(parts, _Params(max_steps=20)).Run()
    # An agreement that turns true once step 7 is done, as a stop on
    # another worker would: inside the compiled loop of steps 1..10.
    step = []
    watcher = preemption.Watcher(signals=(), agreement=lambda local: (
        tf.logical_or(local, step[0].read_value() >= 7)))
    program = _Program(stopped, _Params(max_steps=30), watcher=watcher)
    step.append(program.state.global_step)
    train_dir = os.path.join(stopped, 'train')
    with self.assertRaisesRegex(
        programs.Preempted,
        r'^Stopped by a stop on another worker at step 7: saved '
        rf'{train_dir}/ckpt-7\. Rerun the same command to resume from it\.$'):
      program.Run()
    self.assertEqual([checkpointer.StepOf(p) for p in
                      checkpointer.ListCheckpoints(train_dir)], [7])
    self.assertIsNone(checkpoint_files.ReadFinalMark(train_dir))
    # The summaries cover the steps run: the partial window ends at 7.
    scalars = summary_utils.ReadScalars(train_dir)
    self.assertEqual([s for s, _ in scalars['loss']], [7])
    for logdir in (parts, stopped):
      _Program(logdir, _Params(max_steps=30)).Run()
    a = _Values(os.path.join(whole, 'train', 'ckpt-30'))
    self.assertLen(a, 13)  # 4 variables, 8 Adam slots, the update count.
    for logdir in (parts, stopped):
      b = _Values(os.path.join(logdir, 'train', 'ckpt-30'))
      self.assertEqual(sorted(a), sorted(b))
      for key in a:
        self.assertAllEqual(a[key], b[key], msg=key)
      values = checkpointer.ReadValues(
          os.path.join(logdir, 'train', 'ckpt-30'), 'input_position')
      self.assertEqual(list(values.values()), [30])
    self.assertEqual(checkpoint_files.ReadFinalMark(train_dir),
                     dict(step=30, reason='max_steps 30 reached'))

  def testARequestBetweenLoopsStopsBeforeTheNextStep(self):
    logdir = self.get_temp_dir()
    watcher = preemption.Watcher(signals=())
    program = _Program(logdir, _Params(max_steps=30), watcher=watcher,
                       on_checkpoint=[lambda step: watcher.Request('a test')])
    train_dir = os.path.join(logdir, 'train')
    with self.assertRaisesRegex(
        programs.Preempted, rf'^Stopped by a test at step 10: its checkpoint '
        rf'{train_dir}/ckpt-10 was already written\.'):
      program.Run()
    self.assertEqual(program.global_step, 10)

  def testNanStepIsSkippedAndCounted(self):
    logdir = self.get_temp_dir()
    program = _Program(logdir, _Params(max_steps=6, debug_nan_steps=[3],
                                       summary_interval_steps=1))
    program.Run()
    self.assertEqual(int(program.learner.optimizer.num_updates.numpy()), 5)
    scalars = summary_utils.ReadScalars(os.path.join(logdir, 'train'))
    skipped = dict(scalars['skipped_steps'])
    # The step run at global step 3 is summarised at step 4.
    self.assertEqual(skipped, {2: 0, 3: 0, 4: 1, 5: 0, 6: 0})
    self.assertEqual(dict(scalars['skipped_steps_total'])[6], 1)
    self.assertTrue(np.isnan(dict(scalars['loss'])[4]))
    self.assertTrue(np.isfinite(dict(scalars['loss'])[6]))

  def testConsecutiveSkipsStopAtTheLastGoodCheckpoint(self):
    logdir = self.get_temp_dir()
    program = _Program(logdir, _Params(
        max_steps=50, debug_nan_steps=list(range(25, 40)),
        max_consecutive_skips=4))
    train_dir = os.path.join(logdir, 'train')
    with self.assertRaisesRegex(
        programs.TrainingStopped,
        r'Training stopped at step 29: 4 consecutive steps were skipped '
        r'because their loss or gradient norm was NaN/Inf .*'
        r'train.max_consecutive_skips=4. The last good checkpoint is '
        rf'{train_dir}/ckpt-20 \(step 20\); nothing was saved after it.'):
      program.Run()
    self.assertEqual(program.global_step, 29)
    self.assertEqual(program.checkpointer.latest_checkpoint,
                     os.path.join(train_dir, 'ckpt-20'))

  def testNonFiniteWeightsAreNeverSaved(self):
    logdir = self.get_temp_dir()
    p = _Params(max_steps=4, save_interval_steps=2)
    p.task.train.learner.Set(learning_rate=float('inf'),
                             optimizer=optimizer.SGD.Params())
    with self.assertRaisesRegex(programs.TrainingStopped,
                                'Training stopped at step 2: the weights are '
                                'NaN or Inf, so no checkpoint was written'):
      _Program(logdir, p).Run()
    self.assertEqual(checkpointer.ListCheckpoints(
        os.path.join(logdir, 'train')), [])

  def testEmaFollowsTheWeights(self):
    logdir = self.get_temp_dir()
    p = _Params(max_steps=3, ema_decay=0.5, save_interval_steps=1,
                summary_interval_steps=1, log_interval_steps=1)
    task = p.Instantiate().task
    initial = {k: v.numpy() for k, v in task.vars.FlattenItems()}
    seen = []

    def _Record(step):
      del step
      seen.append(({k: v.numpy() for k, v in task.vars.FlattenItems()},
                   {k: v.numpy() for k, v in
                    program.EmaTheta().FlattenItems()}))

    program = programs.TrainProgram(task, logdir, peak_flops=1e12,
                                    on_checkpoint=[_Record])
    program.Run()
    ema = dict(initial)
    for n, (weights, got) in enumerate(seen, 1):
      keep = min(0.5, (1.0 + n) / (10.0 + n))
      ema = {k: keep * ema[k] + (1 - keep) * weights[k] for k in ema}
      for k in ema:
        self.assertAllClose(got[k], ema[k], atol=1e-6, msg=k)
    self.assertNotAllClose(seen[-1][1]['net.fc[0].w'],
                           seen[-1][0]['net.fc[0].w'])


class EvalProgramsTest(tf.test.TestCase):

  def _EvalTask(self, dataset='Dev'):
    p = _Params(dataset)
    p.task.is_inference = True
    return p.Instantiate().task

  def testEvalAveragesOverTheDataset(self):
    task = self._EvalTask()
    logdir = self.get_temp_dir()
    results = eval_programs.EvalProgram(task, 'Dev', logdir).Run(
        7, task.theta)
    x, y = regression.SyntheticData(256, 8, first_example=1_000_000)
    pred = task.ComputePredictions(task.theta, regression.NestedMap(
        x=tf.constant(x), y=tf.constant(y))).y.numpy()
    self.assertAllClose(results['loss'], np.mean((pred - y) ** 2), rtol=1e-5)
    self.assertEqual(results['num_samples'], 256)
    scalars = summary_utils.ReadScalars(os.path.join(logdir, 'eval_dev'))
    self.assertAllClose(scalars['loss'], [(7, results['loss'])])

  def testDecodeWritesOutputAndMetrics(self):
    task = self._EvalTask('Test')
    logdir = self.get_temp_dir()
    # A decode program can read the input generator of an eval program.
    evaler = eval_programs.EvalProgram(task, 'Test', logdir)
    decoder = eval_programs.DecodeProgram(
        task, 'Test', logdir, input_generator=evaler.input_generator)
    self.assertIs(decoder.input_generator, evaler.input_generator)
    results = decoder.Run(5, task.theta)
    out = os.path.join(logdir, 'decoder_test', 'decoder_out-00000005.txt')
    lines = open(out).read().splitlines()
    self.assertLen(lines, 64)  # eval.decoder_samples
    pairs = np.array([[float(f.split('=')[1]) for f in line.split()]
                      for line in lines])
    self.assertAllClose(results['mae'], np.mean(np.abs(pairs[:, 1] -
                                                       pairs[:, 0])),
                        atol=1e-3)
    texts = summary_utils.ReadTexts(os.path.join(logdir, 'decoder_test'))
    self.assertEqual(texts['decoder_out'][0][1].split('\n\n')[0], lines[0])

  def testDecoderMetricsCoverExactlyTheLinesWritten(self):
    # 40 samples: 2 batches of 32 are decoded, 40 rows kept.
    p = _Params('Test')
    p.task.is_inference = True
    p.task.eval.decoder_samples = 40
    task = p.Instantiate().task
    logdir = self.get_temp_dir()
    results = eval_programs.DecodeProgram(task, 'Test', logdir).Run(
        3, task.theta)
    x, y = regression.SyntheticData(40, 8, first_example=2_000_000)
    pred = task.ComputePredictions(task.theta, regression.NestedMap(
        x=tf.constant(x), y=tf.constant(y))).y.numpy()
    self.assertAllClose(results['mae'], np.mean(np.abs(pred - y)), atol=1e-5)
    self.assertAllClose(results['mse'], np.mean((pred - y) ** 2), rtol=1e-5)
    lines = open(os.path.join(logdir, 'decoder_test',
                              'decoder_out-00000003.txt')).read().splitlines()
    self.assertEqual(lines, [f'target={t:.4f} prediction={v:.4f}'
                             for t, v in zip(y, pred)])

  def testWholeDatasetNeedsANonRepeatingInput(self):
    p = _Params('Train')
    p.task.eval.samples_per_summary = 0
    with self.assertRaisesRegex(ValueError, r'eval.samples_per_summary=0 asks '
                                'for the whole dataset, but its input repeats'):
      eval_programs.EvalProgram(p.Instantiate().task, 'Train',
                                self.get_temp_dir())

  def testRunOnCheckpointsHandlesEachOnce(self):
    directory = self.get_temp_dir()
    v = tf.Variable(0.0)
    ckpt = checkpointer.Checkpointer(directory, dict(v=v))
    for step in (10, 20):
      ckpt.Save(step)
    state = os.path.join(directory, 'state.txt')
    seen = []
    handle = lambda path: seen.append(checkpointer.StepOf(path))
    self.assertEqual(eval_programs.RunOnCheckpoints(directory, handle, 20,
                                                    state), [10, 20])
    ckpt.Save(30)
    self.assertEqual(eval_programs.RunOnCheckpoints(
        directory, handle, 40, state, poll_interval_secs=0.01,
        timeout_secs=0.05), [30])
    self.assertEqual(seen, [10, 20, 30])

  def testRunOnCheckpointsStopsAtTheFinalMarkOrATimeout(self):
    directory = self.get_temp_dir()
    ckpt = checkpointer.Checkpointer(directory, dict(v=tf.Variable(0.0)))
    for step in (10, 20):
      ckpt.Save(step)
    state = os.path.join(directory, 'state.txt')
    with self.assertLogs(level='INFO') as logs:
      self.assertEqual(eval_programs.RunOnCheckpoints(
          directory, lambda path: None, 100, state, poll_interval_secs=0.01,
          timeout_secs=0.05), [10, 20])
    self.assertIn('Stopping: no new checkpoint for 0.05 s (the timeout); '
                  'the last handled is step 20.', logs.output[-1])
    ckpt.Save(30)
    ckpt.MarkFinal('3 consecutive skipped steps')
    with self.assertLogs(level='INFO') as logs:
      self.assertEqual(eval_programs.RunOnCheckpoints(
          directory, lambda path: None, 100, state), [30])
    self.assertIn("Stopping: the trainer's run ended (3 consecutive skipped "
                  'steps); its final checkpoint is step 30.',
                  logs.output[-1])
    stop = []
    self.assertEqual(eval_programs.RunOnCheckpoints(
        directory, lambda path: stop.append('SIGTERM'), 100,
        os.path.join(directory, 'other.txt'),
        should_stop=lambda: stop and stop[0]), [10])

  def testRunOnCheckpointsSaysItWaitsAndSurvivesAnyStateFile(self):
    directory = self.get_temp_dir()
    ckpt = checkpointer.Checkpointer(directory, dict(v=tf.Variable(0.0)))
    ckpt.Save(10)
    state = os.path.join(directory, 'state.txt')
    with open(state, 'wb') as f:   # Not a step: handled again, from 10.
      f.write(b'\xff7\x00')
    now = [0.0]

    def _Clock():   # Each look at the clock: 4 s later.
      now[0] += 4.0
      return now[0]

    with self.assertLogs(level='INFO') as logs:
      self.assertEqual(eval_programs.RunOnCheckpoints(
          directory, lambda path: None, 100, state, poll_interval_secs=0,
          timeout_secs=100, clock=_Clock), [10])
    self.assertRegex(logs.output[0], f'{state} holds no step')
    waits = [l for l in logs.output if 'Waiting for a checkpoint' in l]
    # 100 s without a checkpoint, a line every 30 s or a little more.
    self.assertLen(waits, 3)
    self.assertRegex(waits[0], rf'Waiting for a checkpoint after step 10 in '
                     rf'{directory} \(3\d s so far; until step 100 or 100 s '
                     r'without one, --eval_timeout_s\)\.')
    self.assertIn('Stopping: no new checkpoint for 100 s', logs.output[-1])

  def testCheckpointStateSkipsAnUnreadableCheckpointAndMovesNothing(self):
    logdir = self.get_temp_dir()
    _Program(logdir, _Params(max_steps=30)).Run()
    train_dir = os.path.join(logdir, 'train')
    with open(os.path.join(train_dir, 'ckpt-20.index'), 'wb') as f:
      f.write(b'garbage' * 10)
    before = sorted(os.listdir(train_dir))
    task = self._EvalTask()
    state = eval_programs.CheckpointState(task, train_dir)
    seen = []

    def _Handle(path):
      seen.append(state.Restore(path))

    with self.assertLogs(level='WARNING') as logs:
      eval_programs.RunOnCheckpoints(train_dir, _Handle, 30,
                                     os.path.join(logdir, 'state.txt'))
    self.assertEqual(seen, [10, 30])
    self.assertRegex(logs.output[0], rf'Skipping {train_dir}/ckpt-20, deleted '
                     'or unreadable: Checkpoint .*ckpt-20 is unreadable: its '
                     r'index is unreadable \(.*bad magic number')
    self.assertEqual(sorted(os.listdir(train_dir)), before)


_MIRRORED_SCRIPT = r'''
import numpy as np, tensorflow as tf
cpus = tf.config.list_physical_devices('CPU')
tf.config.set_logical_device_configuration(
    cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2)
from cadence.framework import cluster as cluster_lib
from cadence.framework import model_registry
from cadence.framework.train import checkpointer
from cadence.framework.train import preemption, programs, replicas

def Train(logdir, strategy, batch_size, watcher=None, max_steps=6):
  p = model_registry.GetParams(
      'synthetic.linear_regression.RegressionTiny', 'Train')
  p.input.batch_size = batch_size
  p.task.train.Set(max_steps=max_steps, save_interval_steps=3)
  n = strategy.num_replicas_in_sync
  cluster = cluster_lib.Cluster.Params().Set(
      num_devices=n, worker_split_size=1).Instantiate()
  with cluster:
    tasks = replicas.BuildReplicas(p, cluster)
    programs.TrainProgram(tasks, logdir, strategy, peak_flops=1e12,
                          cluster=cluster, watcher=watcher).Run()
  return checkpointer.ReadValues(f'{logdir}/train/ckpt-{max_steps}', 'model/')

single = Train('/tmp/SINGLE', tf.distribute.get_strategy(), 32)
mirrored = tf.distribute.MirroredStrategy(['/cpu:0', '/cpu:1'])
# With signal handlers installed, the loop runs in the watcher's worker
# thread; the agreement all-reduces the stop flag over the replicas.
with preemption.Watcher(
    agreement=preemption.AllReduceAgreement(mirrored)) as watcher:
  result = Train('/tmp/MIRRORED', mirrored, 16, watcher)
  assert sorted(single) == sorted(result) and single
  for k in single:
    np.testing.assert_allclose(single[k], result[k], atol=2e-6, err_msg=k)
  watcher.Request('a test')
  try:
    Train('/tmp/MIRRORED', mirrored, 16, watcher, max_steps=9)
  except programs.Preempted as e:
    assert str(e).startswith('Stopped by a test at step 6: its checkpoint'), e
  else:
    raise AssertionError('not preempted')
print('OK')
'''


class MirroredPreemptionTest(tf.test.TestCase):

  def testTwoReplicasAgreeOnTheStepToStopAt(self):
    # A subprocess: a MirroredStrategy fixes collective group sizes for the
    # whole process (see DESIGN.md).
    tmp = self.get_temp_dir()
    script = _MIRRORED_SCRIPT.replace('/tmp/SINGLE', f'{tmp}/single').replace(
        '/tmp/MIRRORED', f'{tmp}/mirrored')
    self.assertIn('OK', test_utils.RunPython(script).stdout)


if __name__ == '__main__':
  tf.test.main()
