"""Several hosts: trainer.py under TF_CONFIG, two localhost worker processes.

MultiWorkerMirroredStrategy over 2 processes, each one replica of the
2-stage Tiny GPipe LM (shrunk) on its own 2 logical CPUs, must train to the
weights one process gets with 2 replicas x 2 stages on 4 logical CPUs (the
same global batch: each host reads its share of it), and so must
RegressionTiny (whose input builds its batches with tf.data: the same
mechanism, framework/base_input_generator.py); both hosts finish without a
log line that reads as a crash. Killing one worker makes the other stop on
its own with exit code 4 and one line; the same command on both then
resumes from the latest checkpoint. Sharded optimizer state
(learner.shard_optimizer_state): a checkpoint one host writes with 2
replicas resumes on 2 hosts of one replica each (the slots gathered across
them for the chief's saves), to the weights and slots of an unsharded run.
"""
import shutil
import os
import time

import tensorflow as tf

from cadence.framework.jobs import run_params
from cadence.framework.jobs import trainer_lib
from cadence.framework.train import checkpointer
from cadence.tests import test_utils

_KEY = test_utils.TINY_LM
# What TensorFlow logs when a host's peer stops its heartbeats unannounced.
_CRASH = r'E0000|StartAbort|crashed|coordination service'


def _Overrides(tmp):
  """The shrunk model on a small corpus (made once, by `_MakeCorpus`),
  a checkpoint every 3 steps."""
  return (f'{test_utils.SmallLmOverrides(tmp)};'
          'task.train.save_interval_steps=3;task.train.log_interval_steps=3;'
          'task.train.summary_interval_steps=3')


def _MakeCorpus(tmp):
  params = run_params.LoadParams(trainer_lib.TrainerOptions(
      model=_KEY, model_params_override=_Overrides(tmp)), 'Train')
  params.input.Instantiate()   # Writes the corpus, trains SentencePiece.


def _Trainer(logdir, max_steps, *flags, cluster=None, index=0):
  tmp = os.path.dirname(logdir)
  return test_utils.TrainerRun(
      f'--model={_KEY}', f'--logdir={logdir}', '--job=trainer',
      f'--max_steps={max_steps}',
      f'--model_params_override={_Overrides(tmp)}', *flags,
      script=True, cluster=cluster, task=('worker', index))


def _Workers(logdir, max_steps):
  cluster = test_utils.LocalCluster(worker=2)
  return [_Trainer(logdir, max_steps, cluster=cluster, index=i)
          for i in range(2)]


def _RegressionRuns(tmp):
  """RegressionTiny for 20 steps, batch 16 a replica: one host of 2
  replicas, and 2 hosts of one (started at once)."""
  flags = ['--model=synthetic.linear_regression.RegressionTiny',
           '--job=trainer', '--max_steps=20',
           '--model_params_override=input.batch_size=16']
  cluster = test_utils.LocalCluster(worker=2)
  return [test_utils.TrainerRun(
      *flags, f'--logdir={tmp}/reg_one', '--worker_replicas=2',
      script=True)] + [test_utils.TrainerRun(
          *flags, f'--logdir={tmp}/reg_two', script=True, cluster=cluster,
          task=('worker', i)) for i in range(2)]


def _ShardedRun(logdir, max_steps, *flags, cluster=None, index=0,
                shard=True):
  """examples.pipelined_mlp.PipelinedMlp, 2 stages a replica, its
  optimizer state sharded (or not)."""
  return test_utils.TrainerRun(
      '--model=examples.pipelined_mlp.PipelinedMlp', '--job=trainer',
      f'--max_steps={max_steps}', f'--logdir={logdir}',
      '--worker_split_size=2', '--model_params_override=task.train.learner.'
      f'shard_optimizer_state={shard};task.train.save_interval_steps=3',
      *flags, script=True, cluster=cluster, task=('worker', index))


class MultiHostTest(tf.test.TestCase):

  def _AssertSameWeights(self, one, two, atol, prefix='model/'):
    want = checkpointer.ReadValues(one, prefix)
    got = checkpointer.ReadValues(two, prefix)
    self.assertCountEqual(want, got)
    for key in want:
      self.assertAllClose(want[key], got[key], atol=atol, msg=key)

  def testTwoHostsEqualOneHostThenSurviveAPeerDeath(self):
    tmp = self.get_temp_dir()
    regression = _RegressionRuns(tmp)
    sharded = [_ShardedRun(f'{tmp}/shard_half', 3, '--worker_replicas=2'),
               _ShardedRun(f'{tmp}/plain_whole', 6, '--worker_replicas=2',
                           shard=False)]
    _MakeCorpus(tmp)
    one_host = _Trainer(os.path.join(tmp, 'one'), 6, '--worker_replicas=2')
    workers = _Workers(os.path.join(tmp, 'two'), 6)
    for run in regression:
      code, _, err = run.Finish()
      self.assertEqual(0, code, err[-3000:])
    self._AssertSameWeights(f'{tmp}/reg_one/train/ckpt-20',
                            f'{tmp}/reg_two/train/ckpt-20', atol=1e-6)
    for run in sharded:
      code, _, err = run.Finish()
      self.assertEqual(0, code, err[-3000:])
    shutil.copytree(f'{tmp}/shard_half', f'{tmp}/shard_two')
    cluster = test_utils.LocalCluster(worker=2)
    sharded = [_ShardedRun(f'{tmp}/shard_two', 6, cluster=cluster, index=i)
               for i in range(2)]
    code, _, err = one_host.Finish()
    self.assertEqual(0, code, err[-3000:])
    for i, run in enumerate(workers):
      code, _, err = run.Finish()
      self.assertEqual(0, code, err[-3000:])
      self.assertIn(f'2 replica(s) of 2 device(s), worker {i} of 2 hosts',
                    err)
      # A normal finish: neither host reads the other's exit as a crash.
      self.assertNotRegex(err, _CRASH)
    self._AssertSameWeights(os.path.join(tmp, 'one', 'train', 'ckpt-6'),
                            os.path.join(tmp, 'two', 'train', 'ckpt-6'),
                            atol=1e-5)
    for run in sharded:
      code, _, err = run.Finish()
      self.assertEqual(0, code, err[-3000:])
      self.assertIn('shard_two/train/ckpt-3: global step 3', err)
    # Weights and slots (whole, under the unsharded keys) as unsharded.
    self._AssertSameWeights(f'{tmp}/plain_whole/train/ckpt-6',
                            f'{tmp}/shard_two/train/ckpt-6', atol=1e-6,
                            prefix=('model/', 'optimizer/'))

    # A peer dies after the first checkpoint: the survivor stops on its own.
    logdir = os.path.join(tmp, 'killed')
    workers = _Workers(logdir, 300)
    train_dir = os.path.join(logdir, 'train')
    deadline = time.monotonic() + 300
    while not checkpointer.ListCheckpoints(train_dir):
      self.assertLess(time.monotonic(), deadline, 'no checkpoint in time')
      time.sleep(0.5)
    workers[1].Kill()
    killed_at = time.monotonic()
    code, _, err = workers[0].Finish()
    workers[1].Finish()
    self.assertLess(time.monotonic() - killed_at, 120)
    self.assertEqual(4, code, err[-3000:])
    self.assertNotIn('Traceback', err)
    last = err.strip().splitlines()[-1]
    self.assertRegex(last, r'^Error: a peer host of this 2-host job failed or '
                     r'left \(\w+Error: .+\); this host stops\. The latest '
                     r'checkpoint is .*/train/ckpt-\d+: rerun the same '
                     r'command on every host to resume from it\.$')
    step = checkpointer.StepOf(checkpointer.ListCheckpoints(train_dir)[-1])
    # The same command on both hosts resumes from there.
    workers = _Workers(logdir, step + 3)
    for run in workers:
      code, _, err = run.Finish()
      self.assertEqual(0, code, err[-3000:])
      self.assertIn(f'/train/ckpt-{step}: global step {step}', err)
      self.assertNotRegex(err, _CRASH)
    self.assertEqual(step + 3, checkpointer.StepOf(
        checkpointer.ListCheckpoints(train_dir)[-1]))


if __name__ == '__main__':
  tf.test.main()
