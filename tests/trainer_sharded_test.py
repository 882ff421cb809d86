"""Sharded optimizer state (learner.shard_optimizer_state) through the
trainer's command line, in real subprocesses.

A kill storm: a sharded run of 2 replicas x 2 stages, stopped again and
again by SIGKILL or SIGTERM at random moments and resumed each time with
the same command, must end with the weights and slots of an uninterrupted
run, bit for bit; and --mode=export must read its checkpoint as it reads
an unsharded one's. (Sharded equals unsharded, and checkpoints across
layouts and hosts: tests/framework/train/sharded_update_test.py and
tests/trainer_multihost_test.py.)
"""
import os
import random
import re
import signal
import time

import numpy as np
import tensorflow as tf

from cadence.framework.train import checkpointer
from cadence.tests import test_utils

_KEY = 'examples.pipelined_mlp.PipelinedMlp'
_STEPS = 3000   # About 300 steps a second: the storm ends well before.
_FLAGS = [f'--model={_KEY}', '--job=trainer', '--peak_tflops=1',
          '--worker_replicas=2', '--worker_split_size=2',
          f'--max_steps={_STEPS}',
          '--model_params_override=task.train.learner.shard_optimizer_state='
          'True;task.train.save_interval_steps=100;'
          'task.train.log_interval_steps=1000;'
          'task.train.summary_interval_steps=1000']
_Run = test_utils.TrainerRun


def _Trained(path):
  """The model and optimizer values of a checkpoint."""
  return {k: v for k, v in checkpointer.ReadValues(path, '').items()
          if k.startswith(('model/', 'optimizer/'))}


class KillStormTest(tf.test.TestCase):

  def testKilledAndResumedAgainAndAgainEqualsUninterrupted(self):
    tmp = self.get_temp_dir()
    whole = _Run(*_FLAGS, f'--logdir={tmp}/whole')
    stormed = f'--logdir={tmp}/stormed'
    rng = random.Random(38)
    signals = []
    for _ in range(4):
      run = _Run(*_FLAGS, stormed)
      run.WaitForLog(r'First step done|Global step \d+ >= max_steps')
      time.sleep(rng.uniform(0.0, 1.5))
      signum = rng.choice([signal.SIGKILL, signal.SIGTERM])
      run.Signal(signum)
      code, _, err = run.Finish()
      signals.append((signum.name, code))
      # SIGKILL ends it at once; SIGTERM saves the step reached, exit 0.
      self.assertEqual(-signal.SIGKILL if signum == signal.SIGKILL else 0,
                       code, err[-3000:])
      if signum == signal.SIGTERM:
        self.assertRegex(test_utils.LogLines(err)[-1],
                         r'Stopped by SIGTERM at step \d+: (saved|its '
                         r'checkpoint \S+ was already written)')
    code, _, err = _Run(*_FLAGS, stormed).Finish()
    self.assertEqual(code, 0, err[-3000:])
    self.assertRegex(err, r'Restored \S+ckpt-\d+: global step \d+',
                     signals)
    code, _, err = whole.Finish()
    self.assertEqual(code, 0, err[-3000:])
    a = _Trained(f'{tmp}/whole/train/ckpt-{_STEPS}')
    b = _Trained(f'{tmp}/stormed/train/ckpt-{_STEPS}')
    self.assertEqual(sorted(a), sorted(b))
    self.assertTrue(any(re.search(r'optimizer/slots/.*/v/', k) for k in a))
    for key in a:
      np.testing.assert_array_equal(a[key], b[key],
                                    err_msg=f'{key} after {signals}')
    # Export reads the sharded run's checkpoint as any other.
    code, _, err = _Run(*_FLAGS[:1], f'--logdir={tmp}/stormed',
                        '--mode=export').Finish()
    self.assertEqual(code, 0, err[-3000:])
    self.assertTrue(os.path.exists(os.path.join(
        tmp, 'stormed', 'export', str(_STEPS), 'saved_model.pb')),
                    err[-3000:])


if __name__ == '__main__':
  tf.test.main()
