"""Sharded optimizer state (learner.shard_optimizer_state) through the
trainer's command line, in real subprocesses.

A kill storm: a sharded run of the (shrunk) Tiny LM, 2 replicas x 2
stages, stopped 11 times at random moments (10 SIGKILLs, 1 SIGTERM) and
resumed each time with the same command, must end with the weights and
slots of an uninterrupted run, bit for bit; and --mode=export must read
its checkpoint as it reads an unsharded one's. (Sharded equals
unsharded, and checkpoints across layouts and hosts:
tests/framework/train/sharded_update_test.py and
tests/trainer_multihost_test.py.)

And exact on the LM: the Tiny LM (shrunk), whose clipping (at 0.25)
bites at every step and whose Adam (epsilon 1e-9) turns a last-bit
difference into a visible one within a few steps, trains sharded as
unsharded bit for bit
with 2 replicas x ZB-H1 and 4 replicas x GPipe, a NaN step included.
"""
import os
import random
import re
import signal
import time

import numpy as np
import tensorflow as tf

from cadence.framework.train import checkpointer
from cadence.framework.train import summary_utils
from cadence.tests import test_utils

# Each of the storm's runs is stopped within _STOP_S of its first step (at
# about 90 steps/s on an idle machine: 36 steps, past a save interval), so
# the storm trains at most about 400 steps: well short of this.
_STEPS = 700
_STOP_S = 0.4
_STORM = [signal.SIGKILL] * 10 + [signal.SIGTERM]   # Shuffled.


def _StormFlags(tmp):
  """The shrunk Tiny LM, 2 replicas x 2 stages, sharded slots."""
  return [f'--model={test_utils.TINY_LM}', '--job=trainer',
          '--peak_tflops=1', '--worker_replicas=2', f'--max_steps={_STEPS}',
          f'--model_params_override={test_utils.SmallLmOverrides(tmp)};'
          'task.train.learner.shard_optimizer_state=True;'
          'task.train.save_interval_steps=25;'
          'task.train.log_interval_steps=1000;'
          'task.train.summary_interval_steps=1000']


_Run = test_utils.TrainerRun
_LM_STEPS = 5
# The step from global step 3 (its summaries' step 4): its loss NaN, so
# its gradient norm, and it is skipped.
_LM_NAN_STEP = 3
# The shrunk LM's gradient norm is 0.6-0.9 in these steps (the Tiny LM's
# 1.7-1.8): its clipping at this bites at every step.
_LM_CLIP = 0.25


def _Trained(path):
  """The model and optimizer values of a checkpoint."""
  return {k: v for k, v in checkpointer.ReadValues(path, '').items()
          if k.startswith(('model/', 'optimizer/'))}


class KillStormTest(tf.test.TestCase):

  def testKilledAndResumedAgainAndAgainEqualsUninterrupted(self):
    tmp = self.get_temp_dir()
    flags = _StormFlags(tmp)
    whole = _Run(*flags, f'--logdir={tmp}/whole')
    # It writes the corpus the storm's runs read.
    whole.WaitForLog(r'First step done')
    stormed = f'--logdir={tmp}/stormed'
    rng = random.Random(38)
    storm = list(_STORM)
    rng.shuffle(storm)
    signals = []
    for signum in storm:
      run = _Run(*flags, stormed)
      run.WaitForLog(r'First step done|Global step \d+ >= max_steps')
      time.sleep(rng.uniform(0.0, _STOP_S))
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
    code, _, err = _Run(*flags, stormed).Finish()
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
    code, _, err = _Run(flags[0], flags[-1], f'--logdir={tmp}/stormed',
                        '--mode=export').Finish()
    self.assertEqual(code, 0, err[-3000:])
    self.assertTrue(os.path.exists(os.path.join(
        tmp, 'stormed', 'export', str(_STEPS), 'saved_model.pb')),
                    err[-3000:])


class LmShardedExactTest(tf.test.TestCase):

  def testShardedTrainsTheLmAsUnshardedBitForBit(self):
    tmp = self.get_temp_dir()
    overrides = (
        f'{test_utils.SmallLmOverrides(tmp)};'
        f'task.train.debug_nan_steps=[{_LM_NAN_STEP}];'
        f'task.train.learner.clip_gradient_norm_to_value={_LM_CLIP};'
        'task.train.save_interval_steps=1000;'
        'task.train.summary_interval_steps=1;task.train.log_interval_steps=1')

    def _Start(replicas, schedule, shard):
      return _Run(f'--model={test_utils.TINY_LM}', '--job=trainer',
                  f'--logdir={tmp}/{replicas}_{schedule}_{shard}',
                  f'--worker_replicas={replicas}',
                  f'--max_steps={_LM_STEPS}', '--model_params_override='
                  f'{overrides};task.stack_tpl.pipeline_tpl.schedule='
                  f"'{schedule}';task.train.learner."
                  f'shard_optimizer_state={shard}')

    # The first run writes the corpus the others read.
    runs = {(2, 'zb_h1', False): _Start(2, 'zb_h1', False)}
    self.assertEqual(0, runs[2, 'zb_h1', False].Finish()[0])
    runs[2, 'zb_h1', True] = _Start(2, 'zb_h1', True)
    runs[4, 'gpipe', False] = _Start(4, 'gpipe', False)
    for key in ((2, 'zb_h1', True), (4, 'gpipe', False)):
      code, _, err = runs[key].Finish()
      self.assertEqual(0, code, err[-3000:])
    code, _, err = _Start(4, 'gpipe', True).Finish()
    self.assertEqual(0, code, err[-3000:])
    for replicas, schedule in ((2, 'zb_h1'), (4, 'gpipe')):
      logs = [os.path.join(tmp, f'{replicas}_{schedule}_{shard}')
              for shard in (False, True)]
      with self.subTest(replicas=replicas, schedule=schedule):
        plain, sharded = (summary_utils.ReadScalars(os.path.join(
            d, 'train'))['grad_norm'] for d in logs)
        self.assertEqual([s for s, _ in plain], [s for s, _ in sharded])
        self.assertGreaterEqual(len(plain), _LM_STEPS - 1)
        for (step, want), (_, got) in zip(plain, sharded):
          if step == _LM_NAN_STEP + 1:
            self.assertFalse(np.isfinite(want) or np.isfinite(got))
            continue
          self.assertGreater(want, _LM_CLIP, step)   # Clipped.
          self.assertLess(abs(got - want), 1e-6 * want, step)
        want, got = (_Trained(os.path.join(d, 'train', f'ckpt-{_LM_STEPS}'))
                     for d in logs)
        self.assertEqual(sorted(want), sorted(got))
        # Step 3 skipped: 4 updates.
        self.assertEqual(
            4, want['optimizer/num_updates/.ATTRIBUTES/VARIABLE_VALUE'])
        for key in want:   # Every tensor, the attention's key bias too.
          np.testing.assert_array_equal(want[key], got[key], err_msg=key)
    self.assertIn('4 replica(s) (4 on this host) x 2 stage(s); gradients '
                  'all-reduced, optimizer state sharded,', err)


if __name__ == '__main__':
  tf.test.main()
