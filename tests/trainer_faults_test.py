"""Faults through the trainer's command line, in real subprocesses.

Preemption (SIGTERM at a random moment: a checkpoint at the step reached,
exit 0, a bit-identical resume), damaged checkpoints and a save into a full
"disk" (a file-size limit). Each subprocess pays TensorFlow's import, so
independent runs start together and the assertions are grouped per run.
An evaler beside a trainer that stops early: tests/trainer_test.py (a NaN
stop); an unwritable logdir, no readable checkpoint and a lowered max_steps:
in process, in tests/framework/jobs/trainer_lib_test.py.
"""
import glob
import os
import random
import re
import shutil
import signal
import time

import numpy as np
import tensorflow as tf

from cadence.framework.train import checkpoint_files
from cadence.framework.train import checkpointer
from cadence.tests import test_utils

_KEY = 'synthetic.linear_regression.RegressionTiny'
_LM = 'lm.one_billion_wds.OneBWdsGPipeTransformerTiny'
_Run = test_utils.TrainerRun


def _Intervals(n):
  """Overrides putting every summary, log and save interval at `n`."""
  return ';'.join(f'task.train.{k}_interval_steps={n}'
                  for k in ('summary', 'log', 'save'))


def _Trained(path):
  """The model and optimizer values of a checkpoint."""
  return {k: v for k, v in checkpointer.ReadValues(path, '').items()
          if k.startswith(('model/', 'optimizer/'))}


def _Steps(train_dir):
  return [checkpointer.StepOf(p) for p in
          checkpointer.ListCheckpoints(train_dir)]


class PreemptionTest(tf.test.TestCase):

  def testSigtermCheckpointsTheStepReachedAndResumesBitIdentical(self):
    """SIGTERM at a random moment after the first step, inside the compiled
    loop: one loop call runs every step after the first, so the stop comes
    from the flag the loop reads each step, not from a boundary."""
    # name -> (flags, max_steps, seconds after the first step to signal).
    cases = {
        'regression': ([f'--model={_KEY}',
                        f'--model_params_override={_Intervals(4000)}'],
                       4000, random.uniform(0.05, 0.5)),
        # The Tiny GPipe LM, 2 pipeline stages on 2 logical CPUs; one layer
        # each and a smaller batch, to keep the test short.
        'lm': ([f'--model={_LM}', '--worker_split_size=2',
                f'--model_params_override={_Intervals(40)};task.stack_tpl.'
                'num_layers=2;input.batch_size=8;input.max_seq_len=32'],
               40, random.uniform(0.05, 0.8)),
    }
    tmp = self.get_temp_dir()
    flags, runs = {}, {}
    for name, (model_flags, max_steps, _) in cases.items():
      flags[name] = model_flags + [f'--max_steps={max_steps}',
                                   '--job=trainer', '--peak_tflops=1']
      runs[name] = _Run(*flags[name], f'--logdir={tmp}/{name}_stopped')
      runs[name + '_whole'] = _Run(*flags[name],
                                   f'--logdir={tmp}/{name}_whole')
    # Signal each `delay` seconds after its first step, all in one loop.
    signal_at = {}
    while len(signal_at) < len(cases) or any(
        t is not None for t in signal_at.values()):
      for name, (_, _, delay) in cases.items():
        if name not in signal_at and re.search(r'First step done',
                                               runs[name].Stderr()):
          signal_at[name] = time.monotonic() + delay
        elif signal_at.get(name) and time.monotonic() >= signal_at[name]:
          runs[name].Signal(signal.SIGTERM)
          signal_at[name] = None
        elif name not in signal_at and runs[name].proc.poll() is not None:
          self.fail(f'{name} ended before its first step:\n'
                    f'{runs[name].Stderr()[-3000:]}')
      time.sleep(0.01)
    stopped_at = {}
    for name, (_, max_steps, delay) in cases.items():
      code, _, err = runs[name].Finish()
      context = f'{name}, SIGTERM {delay:.2f} s after the first step:\n'
      self.assertEqual(code, 0, context + err[-3000:])
      self.assertNotIn('Traceback', err)
      train_dir = f'{tmp}/{name}_stopped/train'
      last = test_utils.LogLines(err)[-1]
      self.assertRegex(last, rf'Stopped by SIGTERM at step \d+: saved '
                       rf'{train_dir}/ckpt-\d+\. Rerun the same command to '
                       r'resume from it\.$')
      step = stopped_at[name] = int(re.search(r'at step (\d+)',
                                              last).group(1))
      self.assertBetween(step, 1, max_steps - 1, context)
      # The only checkpoint is the step reached's (the save interval is
      # max_steps), and the run is not marked finished.
      self.assertEqual(_Steps(train_dir), [step])
      self.assertIsNone(checkpoint_files.ReadFinalMark(train_dir))
      runs[name] = _Run(*flags[name], f'--logdir={tmp}/{name}_stopped')
    for name, (_, max_steps, _) in cases.items():
      code, _, err = runs[name].Finish()
      self.assertEqual(code, 0, err[-3000:])
      step, train_dir = stopped_at[name], f'{tmp}/{name}_stopped/train'
      self.assertIn(f'Restored {train_dir}/ckpt-{step}: global step {step}, '
                    f'input position {step}.', err)
      code, _, err = runs[name + '_whole'].Finish()
      self.assertEqual(code, 0, err[-3000:])
      a = _Trained(f'{tmp}/{name}_whole/train/ckpt-{max_steps}')
      b = _Trained(f'{train_dir}/ckpt-{max_steps}')
      self.assertEqual(sorted(a), sorted(b))
      self.assertNotEmpty(a)
      for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=f'{name} {key}')


class DamageTest(tf.test.TestCase):
  """Damaged checkpoints and a save into a full disk."""

  def testDamagedCheckpointsAndAFailedSave(self):
    tmp = self.get_temp_dir()
    # 250 KB checkpoints (the Adam slots of a 2048-wide hidden layer).
    flags = [f'--model={_KEY}', '--job=trainer', '--peak_tflops=1',
             '--model_params_override=task.hidden_dims=[2048]']
    base = os.path.join(tmp, 'base')
    code, _, err = _Run(*flags, f'--logdir={base}',
                        '--max_steps=400').Finish()
    self.assertEqual(code, 0, err[-3000:])

    def _Copy(name):
      path = os.path.join(tmp, name)
      shutil.copytree(base, path)
      return os.path.join(path, 'train')

    # The three newest damaged three ways: the trainer restores ckpt-100.
    damaged = _Copy('damaged')
    hows = {400: 'truncated data', 300: 'deleted index',
            200: 'garbage index'}
    for step, how in hows.items():
      test_utils.DamageCheckpoint(os.path.join(damaged, f'ckpt-{step}'), how)
    full = _Copy('full')

    runs = dict(
        reference=_Run(*flags, f'--logdir={base}', '--max_steps=500'),
        damaged=_Run(*flags, f'--logdir={os.path.dirname(damaged)}',
                     '--max_steps=500'),
        # No file over 64 KB: the checkpoint's data cannot be written.
        full=_Run(*flags, f'--logdir={os.path.dirname(full)}',
                  '--max_steps=500', file_size_limit=64 * 1024))
    done = {name: run.Finish() for name, run in runs.items()}

    code, _, err = done['reference']
    self.assertEqual(code, 0, err[-3000:])
    reference = _Trained(os.path.join(base, 'train', 'ckpt-500'))
    self.assertLen(reference, 13)

    code, _, err = done['damaged']
    self.assertEqual(code, 0, err[-3000:])
    why = {400: r'its data is unreadable \(.*Read less bytes',
           300: r'its index file ckpt-300.index is missing',
           200: r'its index is unreadable \(.*bad magic number'}
    for step, text in why.items():
      self.assertRegex(err, rf'Checkpoint {damaged}/ckpt-{step} is '
                       rf'unreadable: {text}')
    self.assertIn(f'Moved ckpt-400, ckpt-300, ckpt-200 into {damaged}/bad; '
                  f'restored {damaged}/ckpt-100 instead.', err)
    self.assertIn(f'Restored {damaged}/ckpt-100: global step 100', err)
    # Kept aside, never deleted: every file the damage left.
    self.assertEqual(sorted(os.listdir(os.path.join(damaged, 'bad'))), [
        'ckpt-200.data-00000-of-00001', 'ckpt-200.index',
        'ckpt-300.data-00000-of-00001', 'ckpt-400.data-00000-of-00001',
        'ckpt-400.index'])
    self.assertEqual(_Steps(damaged), [100, 200, 300, 400, 500])
    trained = _Trained(os.path.join(damaged, 'ckpt-500'))
    for key in reference:
      np.testing.assert_array_equal(trained[key], reference[key], err_msg=key)

    code, _, err = done['full']
    self.assertEqual(code, 4, err[-3000:])
    self.assertNotIn('Traceback', err)
    self.assertRegex(
        err.strip().splitlines()[-1],
        rf'^Error: Could not write checkpoint {full}/ckpt-500 \(step '
        rf'500\): {full}/ckpt-500_temp/\S+; File too large\. The latest '
        rf'checkpoint is {full}/ckpt-400\. Free space or fix the folder, '
        r'then rerun the same command to resume from it\.$')
    self.assertEqual(_Steps(full), [100, 200, 300, 400])
    self.assertEmpty(glob.glob(os.path.join(full, 'ckpt-500*')))
    # The latest still loads: the values the base run saved at step 400.
    kept = _Trained(os.path.join(full, 'ckpt-400'))
    saved = _Trained(os.path.join(base, 'train', 'ckpt-400'))
    for key in saved:
      np.testing.assert_array_equal(kept[key], saved[key], err_msg=key)


if __name__ == '__main__':
  tf.test.main()
