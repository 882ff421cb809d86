"""End-to-end tests of the trainer command line, in real subprocesses.

Each subprocess pays TensorFlow's import (seconds), so independent runs are
started together and the assertions are grouped per run.
"""
import json
import os
import re
import signal
import sys
import time

import numpy as np
import tensorflow as tf

from cadence.framework.train import checkpointer
from cadence.framework.train import summary_utils
from cadence.tests import test_utils

_KEY = 'synthetic.linear_regression.RegressionTiny'
_Run = test_utils.TrainerRun


def _Steps(logdir, sub, tag='loss'):
  return [s for s, _ in summary_utils.ReadScalars(
      os.path.join(logdir, sub)).get(tag, [])]


def _Files(logdir):
  """{path below logdir: (size, mtime)} of every file."""
  out = {}
  for folder, _, names in os.walk(logdir):
    for name in names:
      path = os.path.join(folder, name)
      stat = os.stat(path)
      out[os.path.relpath(path, logdir)] = (stat.st_size, stat.st_mtime_ns)
  return out


class TrainerTest(tf.test.TestCase):

  def testTrainEvalThenEvalerAndDecoderJobs(self):
    logdir = os.path.join(self.get_temp_dir(), 'run')
    code, _, err = _Run(f'--model={_KEY}', f'--logdir={logdir}',
                        '--max_steps=200').Finish()
    self.assertEqual(code, 0, err[-3000:])
    self.assertIn('Compiling the train step', err)
    self.assertRegex(err, r'First step done \(global step 1, loss [\d.]+\) '
                     r'in [\d.]+ s, compiling the train step included; '
                     r'[\d.]+ s after start\.')
    self.assertIn('Decoding Dev with the final weights (step 200)...', err)
    # TensorFlow's INFO records (the saver's at each save) are filtered.
    self.assertNotIn('Sharding callback duration', err)
    self.assertRegex(err, r'step 100/200  loss [\d.e-]+  [\d.]+ steps/s  '
                     r'\d+ examples/s  ETA \d+:\d\d:\d\d')
    with open(os.path.join(logdir, 'params.txt')) as f:
      self.assertIn('task.train.max_steps : 200\n', f.read())
    losses = summary_utils.ReadScalars(os.path.join(logdir, 'train'))['loss']
    self.assertLess(losses[-1][1], losses[0][1] / 5)
    # trainer_and_evaler evaluated Dev after each checkpoint, and decoded Dev
    # once with the final weights.
    self.assertEqual(_Steps(logdir, 'eval_dev'), [100, 200])
    self.assertEqual(_Steps(logdir, 'decoder_dev', 'mae'), [200])

    evaler = _Run(f'--model={_KEY}', f'--logdir={logdir}',
                  '--max_steps=200', '--job=evaler_test')
    decoder = _Run(f'--model={_KEY}', f'--logdir={logdir}',
                   '--max_steps=200', '--job=decoder_test')
    for proc in (evaler, decoder):
      code, _, err = proc.Finish()
      self.assertEqual(code, 0, err[-3000:])
    self.assertEqual(_Steps(logdir, 'eval_test'), [100, 200])
    self.assertTrue(os.path.exists(os.path.join(logdir, 'eval_test',
                                                'params.txt')))
    self.assertEqual(_Steps(logdir, 'decoder_test', 'mae'), [100, 200])
    with open(os.path.join(logdir, 'decoder_test',
                           'decoder_out-00000200.txt')) as f:
      lines = f.read().splitlines()
    self.assertLen(lines, 64)
    self.assertRegex(lines[0], r'^target=-?[\d.]+ prediction=-?[\d.]+$')

    # Rerunning finished jobs builds nothing, writes nothing and says so.
    before = _Files(logdir)
    trainer = _Run(f'--model={_KEY}', f'--logdir={logdir}',
                   '--max_steps=200')
    evaler = _Run(f'--model={_KEY}', f'--logdir={logdir}',
                  '--max_steps=200', '--job=evaler_test')
    finished = {
        trainer: rf'The run is finished: {logdir}/train holds the checkpoint '
                 r'of step 200 \(max_steps 200\); nothing to do\.',
        evaler: r'The evaler_test job is finished: it handled every '
                r'checkpoint up to step 200 \(max_steps 200, '
                rf'{logdir}/eval_test/last_step.txt\); nothing to do\.'}
    for proc, message in finished.items():
      code, out, err = proc.Finish()
      self.assertEqual(code, 0, err[-3000:])
      self.assertEqual(out, '')
      lines = test_utils.LogLines(err)
      self.assertLen(lines, 1, err[-3000:])
      self.assertRegex(lines[0], message)
    self.assertEqual(_Files(logdir), before)

  def testKillAndResumeEqualsUninterrupted(self):
    whole = os.path.join(self.get_temp_dir(), 'whole')
    killed = os.path.join(self.get_temp_dir(), 'killed')
    args = [f'--model={_KEY}', '--max_steps=1500', '--job=trainer']
    reference = _Run(*args, f'--logdir={whole}')
    victim = _Run(*args, f'--logdir={killed}')
    # The `checkpoint` state file is written once the first save completed.
    first = os.path.join(killed, 'train', 'checkpoint')
    deadline = time.monotonic() + test_utils.TIMEOUT
    while not os.path.exists(first) and victim.proc.poll() is None:
      self.assertLess(time.monotonic(), deadline, 'no checkpoint appeared')
      time.sleep(0.01)
    victim.Signal(signal.SIGKILL)
    self.assertEqual(victim.Finish()[0], -signal.SIGKILL)
    self.assertFalse(os.path.exists(os.path.join(killed, 'train',
                                                 'ckpt-1500.index')))
    # Its writer lock file stays, naming it; the kernel released the lock,
    # so the restart below proceeds (framework/train/logdir_lock.py).
    with open(os.path.join(killed, '.writer.lock')) as f:
      self.assertEqual(json.load(f)['pid'], victim.proc.pid)
    code, _, err = _Run(*args, f'--logdir={killed}').Finish()
    self.assertEqual(code, 0, err[-3000:])
    restored = re.search(r'Restored \S+ckpt-\d+: global step (\d+)', err)
    self.assertIsNotNone(restored, err[-3000:])
    restored = int(restored.group(1))
    self.assertBetween(restored, 100, 1499)
    code, _, err = reference.Finish()
    self.assertEqual(code, 0, err[-3000:])
    a = checkpointer.ReadValues(os.path.join(whole, 'train', 'ckpt-1500'), '')
    b = checkpointer.ReadValues(os.path.join(killed, 'train', 'ckpt-1500'),
                                '')
    keys = [k for k in a if k.startswith(('model/', 'optimizer/'))]
    self.assertLen(keys, 13)
    for key in keys:
      np.testing.assert_array_equal(a[key], b[key], err_msg=key)

  def testNanStepsAreSkippedThenTooManyStopTheRunAndItsEvaler(self):
    logdir = os.path.join(self.get_temp_dir(), 'nan')
    args = [f'--model={_KEY}', f'--logdir={logdir}', '--max_steps=100',
            '--model_params_override=task.train.debug_nan_steps=[5, 30, 31, '
            '32];task.train.max_consecutive_skips=3;'
            'task.train.save_interval_steps=10']
    # An evaler beside the trainer stops after the run's final checkpoint.
    evaler = _Run(*args, '--job=evaler_dev')
    code, _, err = _Run(*args, '--job=trainer').Finish()
    self.assertEqual(code, 3, err[-3000:])
    self.assertNotIn('Traceback', err)
    last = err.strip().splitlines()[-1]
    train_dir = os.path.join(logdir, 'train')
    self.assertRegex(last, r'^Error: Training stopped at step 33: 3 '
                     'consecutive steps were skipped .* The last good '
                     rf'checkpoint is {train_dir}/ckpt-30 \(step 30\); '
                     'nothing was saved after it.')
    self.assertEqual([checkpointer.StepOf(p) for p in
                      checkpointer.ListCheckpoints(train_dir)],
                     [10, 20, 30])
    total = summary_utils.ReadScalars(train_dir)['skipped_steps_total']
    self.assertEqual(total[-1], (33, 4.0))  # Step 5 and steps 30, 31, 32.
    code, _, err = evaler.Finish()
    self.assertEqual(code, 0, err[-3000:])
    self.assertIn("Stopping: the trainer's run ended (3 consecutive skipped "
                  'steps); its final checkpoint is step 30.', err)
    self.assertEqual(_Steps(logdir, 'eval_dev'), [10, 20, 30])

  def testUserErrorsExitTwoWithOneMessage(self):
    logdir = self.get_temp_dir()
    missing = os.path.join(logdir, 'no-such-data-*.csv')
    cases = [
        (['--model=synthetic.linear_regression.RegresionTiny'],
         r"^Error: Unknown model 'synthetic.linear_regression.RegresionTiny'. "
         r"Did you mean 'synthetic.linear_regression.RegressionTiny', "
         r"'synthetic.linear_regression.RegressionGPipeTiny'[,?]"),
        ([f'--model={_KEY}', '--model_params_override=task.train.max_stesp=3'],
         r"^Error: --model_params_override: Params 'task.train' has no param "
         r"'max_stesp'; did you mean 'max_steps'\?$"),
        ([f'--model={_KEY}', f'--model_params_override=input.file_pattern='
          f'{missing}'],
         rf"^Error: Input: RegressionInput 'input': file_pattern "
         rf"'{re.escape(missing)}' matches no files for: "
         rf'{re.escape(missing)}\.$'),
    ]
    procs = [_Run(*args, f'--logdir={logdir}') for args, _ in cases]
    for proc, (_, message) in zip(procs, cases):
      code, _, err = proc.Finish()
      self.assertEqual(code, 2, err[-3000:])
      self.assertNotIn('Traceback', err)
      self.assertRegex(err.strip().splitlines()[-1], message)

  def testInspectModelFromTrainerPy(self):
    code, out, err = _Run(
        f'--model={_KEY}', '--mode=inspect_model', '--worker_split_size=2',
        script=True).Finish()
    self.assertEqual(code, 0, err[-3000:])
    self.assertRegex(out, r'regression\.net\.fc\[0\]\.w +\[8, 16\] +float32 '
                     r'+\S+CPU:0')
    self.assertIn('Forward FLOPs per batch of 32: 10,400', out)
    self.assertIn("Cluster(devices=['/device:CPU:0', '/device:CPU:1'], "
                  'num_devices_per_split=2)', err)

  def testAUsersPackageFromItsOwnFolder(self):
    """`python -m cadence.trainer` and the installed `cadence-trainer` run
    an experiment of the current folder's package by its full key, as
    PYTHONPATH would (no PYTHONPATH here)."""
    folder = test_utils.WriteFiles(
        os.path.join(self.get_temp_dir(), 'project'), test_utils.USER_PACKAGE)
    logdir = os.path.join(self.get_temp_dir(), 'user_run')
    train = _Run('--model=userexps.exps.MyRegression', f'--logdir={logdir}',
                 '--max_steps=3', '--job=trainer', cwd=folder)
    command = os.path.join(os.path.dirname(sys.executable), 'cadence-trainer')
    typo = _Run('--model=userexps.exps.MyRegresion', f'--logdir={logdir}2',
                command=[command], cwd=folder)
    code, _, err = typo.Finish()
    test_utils.AssertUserErrorLine(
        self, code, err, r"^Error: Unknown model 'userexps\.exps\."
        r"MyRegresion'\. Did you mean 'userexps\.exps\.MyRegression'[,?]")
    code, _, err = train.Finish()
    self.assertEqual(code, 0, err[-3000:])
    self.assertIn('Model userexps.exps.MyRegression, job trainer', err)
    with open(os.path.join(logdir, 'params.txt')) as f:
      self.assertIn('task.input_dim : 4\n', f.read())
    self.assertEqual(_Steps(logdir, 'train')[-1], 3)


if __name__ == '__main__':
  tf.test.main()
