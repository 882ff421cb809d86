"""Several hosts: trainer.py under TF_CONFIG, two localhost worker processes.

MultiWorkerMirroredStrategy over 2 processes, each one replica of the
2-stage Tiny GPipe LM (shrunk) on its own 2 logical CPUs, must train to the
weights one process gets with 2 replicas x 2 stages on 4 logical CPUs (the
same global batch: LmInput shards batches of one stream), and finish
without a log line that reads as a crash. Killing one
worker makes the other stop on its own with exit code 4 and one line; the
same command on both then resumes from the latest checkpoint.
"""
import os
import time

import tensorflow as tf

from cadence.framework.jobs import trainer_lib
from cadence.framework.train import checkpointer
from cadence.tests import test_utils

_KEY = 'lm.one_billion_wds.OneBWdsGPipeTransformerTiny'
# What TensorFlow logs when a host's peer stops its heartbeats unannounced.
_CRASH = r'E0000|StartAbort|crashed|coordination service'
_SHRUNK = ('task.model_dim=32;task.stack_tpl.num_layers=2;'
           'task.stack_tpl.transformer_tpl.num_heads=2;'
           'task.stack_tpl.transformer_tpl.hidden_dim=64;'
           'task.stack_tpl.pipeline_tpl.num_micro_batches=2;'
           'input.max_seq_len=8;input.batch_size=4;'
           'task.train.save_interval_steps=3;task.train.log_interval_steps=3;'
           'task.train.summary_interval_steps=3')


def _Overrides(tmp):
  """The shrunk model on a small corpus (made once, by `_MakeCorpus`)."""
  return (f'{_SHRUNK};input.data_dir={tmp}/data;'
          f'input.tokenizer.cache_dir={tmp}/spm;'
          'input.synthetic.num_train_shards=2;'
          'input.synthetic.sentences_per_shard=2000;'
          'input.synthetic.num_heldout_sentences=64')


def _MakeCorpus(tmp):
  params = trainer_lib.LoadParams(trainer_lib.TrainerOptions(
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



class MultiHostTest(tf.test.TestCase):

  def testTwoHostsEqualOneHostThenSurviveAPeerDeath(self):
    tmp = self.get_temp_dir()
    _MakeCorpus(tmp)
    one_host = _Trainer(os.path.join(tmp, 'one'), 6, '--worker_replicas=2')
    workers = _Workers(os.path.join(tmp, 'two'), 6)
    code, _, err = one_host.Finish()
    self.assertEqual(0, code, err[-3000:])
    for i, run in enumerate(workers):
      code, _, err = run.Finish()
      self.assertEqual(0, code, err[-3000:])
      self.assertIn(f'2 replica(s) of 2 device(s), worker {i} of 2 hosts',
                    err)
      # A normal finish: neither host reads the other's exit as a crash.
      self.assertNotRegex(err, _CRASH)
    want = checkpointer.ReadValues(os.path.join(tmp, 'one', 'train',
                                                'ckpt-6'))
    got = checkpointer.ReadValues(os.path.join(tmp, 'two', 'train',
                                               'ckpt-6'))
    self.assertCountEqual(want, got)
    for key in want:
      self.assertAllClose(want[key], got[key], atol=1e-5, msg=key)

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
