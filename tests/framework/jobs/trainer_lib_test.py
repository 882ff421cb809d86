"""Tests for cadence.framework.jobs.trainer_lib and inspect_lib (in process).

The command line itself (exit codes, stderr, SIGKILL) is tested through
real subprocesses in tests/trainer_test.py.
"""
import io
import logging as py_logging
import os
import re
import sys
from unittest import mock

from absl import logging
import tensorflow as tf

from cadence.framework.jobs import graph_optimizer
from cadence.framework.jobs import inspect_lib
from cadence.framework.jobs import run_params
from cadence.framework.jobs import trainer_lib
from cadence.framework.train import checkpoint_files
from cadence.framework.train import programs
from cadence.framework.train import summary_utils

_KEY = 'synthetic.linear_regression.RegressionTiny'


def _Options(**kw):
  return trainer_lib.TrainerOptions(model=_KEY, **kw)


class LoadParamsTest(tf.test.TestCase):

  def testUnknownModelNamesTheClosestKeys(self):
    with self.assertRaisesRegex(
        trainer_lib.UserError,
        r"^Unknown model 'synthetic.linear_regression.RegresionTiny'. Did you "
        r"mean 'synthetic.linear_regression.RegressionTiny', "
        r"'synthetic.linear_regression.RegressionGPipeTiny'[,?]"):
      run_params.LoadParams(trainer_lib.TrainerOptions(
          model='synthetic.linear_regression.RegresionTiny'), 'Train')

  def testKeyValueOverrides(self):
    p = run_params.LoadParams(_Options(
        model_params_override='input.file_pattern=/data/x-*.csv; '
        'task.train.learner.learning_rate=0.5;task.hidden_dims=[3, 4]',
        max_steps=7), 'Train')
    self.assertEqual(p.input.file_pattern, '/data/x-*.csv')  # Bare string.
    self.assertEqual(p.task.train.learner.learning_rate, 0.5)
    self.assertEqual(p.task.hidden_dims, [3, 4])
    self.assertEqual(p.task.train.max_steps, 7)

  def testTextAndFileOverrides(self):
    path = os.path.join(self.get_temp_dir(), 'override.txt')
    with open(path, 'w') as f:
      f.write('# A comment.\ninput.batch_size : 4\ntask.train.max_steps : 9\n')
    p = run_params.LoadParams(_Options(
        model_params_file_override=path,
        model_params_override='input.batch_size : 5'), 'Train')
    self.assertEqual(p.input.batch_size, 5)  # The flag comes last.
    self.assertEqual(p.task.train.max_steps, 9)
    with open(path, 'w') as f:
      f.write('input.batch_size : 4\ninput.bach_size : 4\n')
    with self.assertRaisesRegex(
        trainer_lib.UserError, r"--model_params_file_override .*: line 2: "
        r"Params 'input' has no param 'bach_size'; did you mean 'batch_size'"):
      run_params.LoadParams(_Options(model_params_file_override=path),
                             'Train')

  def testBadOverrides(self):
    with self.assertRaisesRegex(
        trainer_lib.UserError,
        r"^--model_params_override: Params 'task.train' has no param "
        r"'max_stesp'; did you mean 'max_steps'\?$"):
      run_params.LoadParams(_Options(
          model_params_override='task.train.max_stesp=3'), 'Train')
    with self.assertRaisesRegex(
        trainer_lib.UserError, r"--model_params_override: cannot parse the "
        r"value of 'task.train.max_steps': 'ten'"):
      run_params.LoadParams(_Options(
          model_params_override='task.train.max_steps=ten'), 'Train')
    with self.assertRaisesRegex(trainer_lib.UserError,
                                r"'max_steps' is not 'key=value'"):
      run_params.LoadParams(_Options(model_params_override='max_steps'),
                             'Train')


class InspectTest(tf.test.TestCase):

  def testModelReport(self):
    params = run_params.LoadParams(_Options(), 'Train')
    report = inspect_lib.ModelReport(params)
    lines = report.splitlines()
    self.assertIn('Model regression (task RegressionModel '
                  "'regression'; built without weights or data)", lines[0])
    row = [line for line in lines if 'regression.net.fc[0].w' in line][0]
    self.assertEqual(row.split()[1:4], ['[8,', '16]', 'float32'])
    self.assertIn('4 variables, 161 parameters', report)  # 8*16+16+16*1+1
    # Per example: fc0 2*8*16 + 16 + 16, fc1 2*16 + 1, loss 4; batch 32.
    total = 32 * (256 + 16 + 16 + 33 + 4)
    self.assertIn(f'Forward FLOPs per batch of 32: {total:,}', report)
    row = [line for line in lines if line.startswith('net.fc[0]')][0]
    self.assertEqual(row.split()[1:], [f'{32 * 288:,}',
                                       f'{100 * 288 / 325:.1f}%'])

  def testInspectParamsWritesAndPrints(self):
    logdir = self.get_temp_dir()
    with mock.patch.object(sys, 'stdout', io.StringIO()) as out:
      code = trainer_lib.Main(_Options(mode='inspect_params', logdir=logdir))
    self.assertEqual(code, trainer_lib.EXIT_OK)
    with open(os.path.join(logdir, 'params.txt')) as f:
      text = f.read()
    self.assertEqual(out.getvalue(), text)
    self.assertIn('task.train.max_steps : 500\n', text)

  def testInspectPipeline(self):
    # The smallest pipelined experiment: 2 cells x 4 micro-batches, GPipe.
    logdir = self.get_temp_dir()
    with mock.patch.object(sys, 'stdout', io.StringIO()) as out:
      code = trainer_lib.Main(trainer_lib.TrainerOptions(
          model='synthetic.linear_regression.RegressionGPipeTiny',
          mode='inspect_pipeline', worker_split_size=2, logdir=logdir))
    self.assertEqual(code, trainer_lib.EXIT_OK)
    self.assertIn('Pipeline step: 2 stages x 4 micro-batches', out.getvalue())
    self.assertRegex(out.getvalue(), r'bubble: measured [\d.]+, ideal '
                     r'\(equal-time actions\) = 0.200')
    # Each device's measured memory (this task gives no estimate).
    for i in range(2):
      self.assertRegex(out.getvalue(), rf'\n  CPU:{i}: measured [\d.]+ '
                       r'(KiB|MiB)\n')
    where = os.path.join(logdir, 'inspect_pipeline')
    with open(os.path.join(where, 'pipeline_timeline.svg')) as f:
      drawn = set(re.findall(r'<title>([FB]\(\d, \d\))', f.read()))
    self.assertLen(drawn, 16)   # 2 x 4 x (F, B).
    with open(os.path.join(where, 'pipeline_timeline.txt')) as f:
      self.assertLen(f.read().splitlines(), 2 + 16)
    self.assertIn('pipeline_timeline', summary_utils.ReadImages(where))
    self.assertTrue(out.getvalue().endswith(
        f'Chart and summary: {where}\n'))
    # Without --logdir: the same report, and a last line saying that no
    # chart was written and how to get one.
    with mock.patch.object(sys, 'stdout', io.StringIO()) as out:
      code = trainer_lib.Main(trainer_lib.TrainerOptions(
          model='synthetic.linear_regression.RegressionGPipeTiny',
          mode='inspect_pipeline', worker_split_size=2))
    self.assertEqual(code, trainer_lib.EXIT_OK)
    self.assertIn('Pipeline step: 2 stages x 4 micro-batches', out.getvalue())
    self.assertTrue(out.getvalue().endswith(
        '\nNo chart written: add --logdir=DIR to write the chart (SVG), '
        "every action's times and a TensorBoard image to "
        'DIR/inspect_pipeline.\n'), out.getvalue()[-300:])
    # A model without a pipeline: a user error.
    with mock.patch.object(sys, 'stderr', io.StringIO()) as err:
      code = trainer_lib.Main(_Options(mode='inspect_pipeline'))
    self.assertEqual(code, trainer_lib.EXIT_USER_ERROR)
    self.assertRegex(err.getvalue(), r'^Error: --mode=inspect_pipeline: '
                     r'Timeline: no op of the profile belongs to a pipeline')

  def testMainReturnsTwoForUserErrors(self):
    with mock.patch.object(sys, 'stderr', io.StringIO()) as err:
      code = trainer_lib.Main(_Options(mode='sync', job='bogus',
                                       logdir=self.get_temp_dir()))
    self.assertEqual(code, trainer_lib.EXIT_USER_ERROR)
    self.assertRegex(err.getvalue(), r"^Error: --job='bogus' is not one of")
    with mock.patch.object(sys, 'stderr', io.StringIO()) as err:
      code = trainer_lib.Main(_Options(mode='inspect_model',
                                       device_memory_gib=-1))
    self.assertEqual(code, trainer_lib.EXIT_USER_ERROR)
    self.assertEqual('Error: --device_memory_gib=-1 must be a number >= 0 '
                     '(GiB of memory per device; 0: no check).\n',
                     err.getvalue())

  def testPipelinedExperimentUnderParameterServersIsAUserError(self):
    # RegressionGPipeTiny's WORKER_SPLIT_SIZE is 2; refused before any
    # server starts.
    with mock.patch.object(sys, 'stderr', io.StringIO()) as err:
      code = trainer_lib.Main(trainer_lib.TrainerOptions(
          model='synthetic.linear_regression.RegressionGPipeTiny',
          logdir=self.get_temp_dir(), job='trainer',
          cluster_spec='chief=h:3@ps=h:1@worker=h:2', task_type='chief'))
    self.assertEqual(code, trainer_lib.EXIT_USER_ERROR)
    # The split size is the experiment's, named as such, and the fix.
    self.assertRegex(err.getvalue(),
                     r'^Error: Parameter-server training .* --worker_replicas'
                     r"=1 and the experiment's WORKER_SPLIT_SIZE=2 \(devices "
                     r'per replica\) must both be 1\. .*, or give '
                     r'--worker_split_size=1 to train here\.$')
    self.assertLen(err.getvalue().strip().splitlines(), 1)


_SAVE_EVERY_10 = 'task.train.save_interval_steps=10'


def _Main(**kw):
  """trainer_lib.Main in this process: (exit code, stderr)."""
  with mock.patch.object(sys, 'stderr', io.StringIO()) as err:
    code = trainer_lib.Main(_Options(**dict(
        dict(mode='sync', job='trainer', peak_tflops=1.0), **kw)))
  return code, err.getvalue()


class FaultsTest(tf.test.TestCase):
  """Faults the trainer meets at start; in a subprocess (signals, a full
  disk, damaged checkpoints): tests/trainer_faults_test.py."""

  def testAnUnwritableLogdirIsAUserError(self):
    logdir = self.get_temp_dir()
    with open(os.path.join(logdir, 'train'), 'w') as f:
      f.write('a file where the train folder must be\n')
    code, err = _Main(logdir=logdir, max_steps=10)
    self.assertEqual(code, trainer_lib.EXIT_USER_ERROR)
    self.assertEqual(err, f'Error: --logdir: cannot write in {logdir}/train: '
                     f'{logdir}/train is not a directory.\n')

  def _Trained(self, max_steps):
    """A logdir trained to `max_steps`, a checkpoint every 10; train dir."""
    logdir = self.get_temp_dir()
    self.assertEqual(_Main(logdir=logdir, max_steps=max_steps,
                           model_params_override=_SAVE_EVERY_10)[0], 0)
    return logdir, os.path.join(logdir, 'train')

  def testNoReadableCheckpointIsAUserError(self):
    logdir, train_dir = self._Trained(20)
    for step in (10, 20):
      os.remove(os.path.join(train_dir, f'ckpt-{step}.index'))
    code, err = _Main(logdir=logdir, max_steps=30,
                      model_params_override=_SAVE_EVERY_10)
    self.assertEqual(code, trainer_lib.EXIT_USER_ERROR)
    self.assertEqual(err, f'Error: No readable checkpoint in {train_dir}: '
                     'ckpt-20: its index file ckpt-20.index is missing; '
                     'ckpt-10: its index file ckpt-10.index is missing. Move '
                     'them away to train from step 0, or use a new --logdir.'
                     '\n')

  def testMaxStepsLoweredBelowTheLatestCheckpointEndsTheRun(self):
    logdir, train_dir = self._Trained(30)
    mark = os.path.join(train_dir, checkpoint_files.FINAL_MARK)
    os.remove(mark)  # As a run stopped before its end leaves it.
    # Resumed with max_steps 20: finished at its checkpoint of step 30,
    # which it marks final for the evalers.
    self.assertEqual(_Main(logdir=logdir, max_steps=20,
                           model_params_override=_SAVE_EVERY_10)[0], 0)
    self.assertEqual(checkpoint_files.ReadFinalMark(train_dir),
                     dict(step=30, reason='global step 30 >= max_steps 20'))
    # An evaler that handled step 30 is finished whatever its max_steps.
    os.makedirs(os.path.join(logdir, 'eval_dev'))
    with open(os.path.join(logdir, 'eval_dev', 'last_step.txt'), 'w') as f:
      f.write('30')
    with self.assertLogs(level='INFO') as logs:
      self.assertEqual(_Main(logdir=logdir, max_steps=1000,
                             job='evaler_dev')[0], 0)
    self.assertIn("The evaler_dev job is finished: it handled every "
                  "checkpoint up to step 30 (the trainer's final checkpoint, "
                  "global step 30 >= max_steps 20, ", logs.output[-1])


class GraphOptimizerTest(tf.test.TestCase):

  def testTheFlagReachesTheJobsScope(self):
    def _Off():
      return tf.config.optimizer.get_experimental_options().get(
          'disable_meta_optimizer', False)
    before = _Off()
    for enabled in (False, True):
      with mock.patch.object(graph_optimizer, 'Scope',
                             wraps=graph_optimizer.Scope) as scope:
        code, _ = _Main(logdir=os.path.join(self.get_temp_dir(),
                                            str(enabled)),
                        max_steps=1, graph_optimizer=enabled)
      self.assertEqual(code, 0)
      scope.assert_called_once_with(enabled)
      self.assertEqual(_Off(), before)         # Restored after the job.


class _Records(py_logging.Handler):

  def __init__(self):
    super().__init__()
    self.messages = []

  def emit(self, record):
    self.messages.append(record.getMessage())


class LoggingTest(tf.test.TestCase):

  def setUp(self):
    # The trainer's verbosity (absl's app.run sets it from --verbosity);
    # the absl logger's own level is restored after each test: pinning it
    # (set_verbosity(get_verbosity()) would, to the root's WARNING)
    # silences the INFO records later test files assert.
    super().setUp()
    absl_logger = logging.get_absl_logger()
    self.addCleanup(absl_logger.setLevel, absl_logger.level)
    logging.set_verbosity(logging.INFO)

  def _Record(self, level, message, name='tensorflow', path=__file__):
    return py_logging.LogRecord(name, level, path, 1, message, None, None)

  def testFilterDropsTensorFlowInfoUnlessDebug(self):
    keep = trainer_lib.TensorFlowInfoFilter().filter
    saver = os.path.join(os.path.dirname(tf.__file__), 'python',
                         'checkpoint', 'functional_saver.py')
    # TensorFlow's saver logs through absl; its source file gives it away.
    noise = self._Record(py_logging.INFO, 'Sharding callback duration: 117 '
                         'microseconds', name='absl', path=saver)
    self.assertFalse(keep(noise))
    self.assertFalse(keep(self._Record(py_logging.INFO, 'x')))
    self.assertFalse(keep(self._Record(py_logging.DEBUG, 'x')))
    self.assertTrue(keep(self._Record(py_logging.WARNING, 'a warning')))
    self.assertTrue(keep(self._Record(py_logging.WARNING, 'w', name='absl',
                                      path=saver)))
    # The saver's deliberate retracing at each multi-task (PS) save.
    self.assertFalse(keep(self._Record(
        py_logging.WARNING, '5 out of the last 5 calls to <function '
        'MultiDeviceSaver.save.<locals>.tf_function_save at 0x7f> triggered '
        'tf.function retracing. Tracing is expensive')))
    # The train loop, traced once per program (--plan_measure builds one
    # per calibration layout); another function's retracing is kept.
    self.assertFalse(keep(self._Record(
        py_logging.WARNING, '5 out of the last 5 calls to <bound method '
        'TrainProgram._TrainLoop of <cadence.framework.train.programs.'
        'TrainProgram object at 0x7f>> triggered tf.function retracing. '
        'Tracing is expensive', name='absl', path=__file__)))
    self.assertTrue(keep(self._Record(
        py_logging.WARNING, '5 out of the last 5 calls to <function '
        '_Step at 0x7f> triggered tf.function retracing. Tracing is '
        'expensive')))
    ours = self._Record(py_logging.INFO, 'Saved checkpoint', name='absl',
                        path=programs.__file__)
    self.assertTrue(keep(ours))
    logging.set_verbosity(logging.DEBUG)
    self.assertTrue(keep(noise))

  def testTensorFlowRecordsReachTheRootHandlerOnceWithoutInfo(self):
    tf_logger = tf.get_logger()
    root, level = py_logging.getLogger(), tf_logger.level
    own, records = _Records(), _Records()   # TF's own handler; absl's.
    tf_logger.addHandler(own)
    root.addHandler(records)
    tf_logger.setLevel(py_logging.INFO)
    try:
      trainer_lib.ConfigureLogging()
      trainer_lib.ConfigureLogging()   # Idempotent: one filter.
      tf_logger.info('Sharding callback duration: 117 microseconds')
      tf_logger.warning('Value in checkpoint could not be found')
    finally:
      root.removeHandler(records)
      tf_logger.removeHandler(own)
      tf_logger.setLevel(level)
    self.assertEqual(records.messages,
                     ['Value in checkpoint could not be found'])
    self.assertEqual(own.messages, [])
    self.assertLen([f for f in tf_logger.filters
                    if isinstance(f, trainer_lib.TensorFlowInfoFilter)], 1)


if __name__ == '__main__':
  tf.test.main()
