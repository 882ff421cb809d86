"""Tests for cadence.framework.train.sharded_update: optimizer state sharded
over the replicas (ZeRO-1).

Sharded runs must equal unsharded ones within 1e-6 (relative to each
tensor's largest value, weights and slots) after 5 Adam steps with 2 and 4
replicas x 1 and 2 stages x GPipe and ZB-H1 (1 replica: two of them), one
step skipped (a NaN loss), clipping on; and checkpoints must not depend on
the layout. MirroredStrategy fixes its collective groups per process, so
each replica count runs in a subprocess on 8 logical CPUs: R=2, and R=4
(with R=1 beside it, under the default strategy). (The sharded step is
exact, bit for bit: tests/trainer_sharded_test.py holds the LM, whose
clipping bites and whose Adam amplifies a last-bit difference, to that.)
"""
import json
import os
import textwrap

import tensorflow as tf

from cadence.framework.train import checkpointer
from cadence.framework.train import sharded_update
from cadence.tests import test_utils

_KEY = 'examples.pipelined_mlp.PipelinedMlp'
_BF16_KEY = 'synthetic.linear_regression.RegressionGPipeTiny'
_BATCH = 16   # Global: R replicas take 16 / R each.

_SCRIPT = textwrap.dedent("""
    import json, os, shutil, sys, time
    import numpy as np
    import tensorflow as tf
    R, ROOT = int(sys.argv[1]), sys.argv[2]
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices('CPU')[0],
        [tf.config.LogicalDeviceConfiguration()] * 8)
    from cadence.framework import cluster as cluster_lib
    from cadence.framework import model_registry, optimizer
    from cadence.framework.train import checkpointer, programs, replicas

    def Params(r, k, schedule, shard, steps, task=None, **train):
      if task:   # The regression's own pipeline (bf16: its layers cast).
        p = model_registry.GetParams(%(bf16_key)r, 'Train')
        p.task.Set(pipeline_cells=k, **task)
        p.task.pipeline_tpl.schedule = schedule
      else:
        p = model_registry.GetParams(%(key)r, 'Train')
        p.task.net_tpl.splits = k
        p.task.net_tpl.pipeline_tpl.schedule = schedule
      p.input.batch_size = %(batch)d // r
      p.task.train.learner.Set(
          learning_rate=1e-3, optimizer=optimizer.Adam.Params(),
          clip_gradient_norm_to_value=0.5, shard_optimizer_state=shard)
      p.task.train.Set(max_steps=steps, save_interval_steps=3,
                       summary_interval_steps=3, log_interval_steps=3,
                       debug_nan_steps=[1], **train)
      return p

    STRATEGIES = {1: tf.distribute.get_strategy()}

    def Train(r, k, schedule, shard, logdir, steps=5, loop=0, task=None,
              **train):
      if r not in STRATEGIES:
        STRATEGIES[r] = tf.distribute.MirroredStrategy(
            ['/device:CPU:%%d' %% (i * k) for i in range(r)])
      cluster = cluster_lib.Cluster.Params().Set(
          num_devices=r * k, worker_split_size=k).Instantiate()
      with cluster:
        tasks = replicas.BuildReplicas(
            Params(r, k, schedule, shard, steps, task, **train), cluster)
        program = programs.TrainProgram(
            tasks, logdir, STRATEGIES[r], peak_flops=1e12, cluster=cluster,
            steps_per_loop=loop)
        program.Run()
      copies = [{n: v.numpy() for n, v in t.vars.FlattenItems()}
                for t in tasks]
      for other in copies[1:]:   # Every replica holds the same weights.
        assert all((other[n] == copies[0][n]).all() for n in copies[0])
      assert program.state.sharded == (shard and r > 1)
      return checkpointer.ReadValues(
          program.checkpointer.latest_checkpoint, '')

    def Errors(got, want):
      # max |got - want| / max |want| per float tensor; the keys must match.
      assert sorted(got) == sorted(want), sorted(set(got) ^ set(want))
      out = {}
      for n, w in want.items():
        if isinstance(w, np.ndarray) and w.dtype.kind == 'f':
          out[n] = float(np.abs(got[n] - w).max() /
                         max(np.abs(w).max(), 1e-30))
      return out

    def Worst(got, want):
      errors = Errors(got, want)
      return max(errors.values())

    out = {'equal': {}, 'updates': {}}
    cases = [(k, s) for k in (1, 2) for s in ('gpipe', 'zb_h1')]
    for k, schedule in cases:
      want = Train(R, k, schedule, False, f'{ROOT}/{R}_{k}_{schedule}_plain')
      # The sharded run also calls its loop 2 steps at a time and packs
      # its gradients in about 1 KiB pieces.
      got = Train(R, k, schedule, True, f'{ROOT}/{R}_{k}_{schedule}_shard',
                  loop=2, allreduce_bytes_per_pack=1024)
      out['equal'][f'{k} {schedule}'] = Worst(got, want)
      out['updates'][f'{k} {schedule}'] = [
          int(v['optimizer/num_updates/.ATTRIBUTES/VARIABLE_VALUE'])
          for v in (want, got)]
    if R == 2:
      # bf16 activations: the slots and weights stay float32.
      bf16 = dict(fprop_dtype=tf.bfloat16)
      out['bf16'] = Worst(
          Train(2, 2, 'gpipe', True, f'{ROOT}/bf16_shard', task=bf16),
          Train(2, 2, 'gpipe', False, f'{ROOT}/bf16_plain', task=bf16))
      # Checkpoints: sharded R=2 -> unsharded R=1, and unsharded R=1 ->
      # sharded R=2, each resumed at step 3 against its uninterrupted run
      # to 6 (the same global batches).
      whole = Train(2, 2, 'gpipe', True, f'{ROOT}/whole', steps=6)
      Train(2, 2, 'gpipe', True, f'{ROOT}/half', steps=3)
      shutil.copytree(f'{ROOT}/half', f'{ROOT}/to_one')
      out['2_to_1'] = Worst(Train(1, 2, 'gpipe', False, f'{ROOT}/to_one',
                                  steps=6), whole)
      plain = Train(1, 2, 'gpipe', False, f'{ROOT}/plain_whole', steps=6)
      Train(1, 2, 'gpipe', False, f'{ROOT}/plain_half', steps=3)
      out['1_to_2'] = Worst(Train(2, 2, 'gpipe', True, f'{ROOT}/plain_half',
                                  steps=6), plain)
      with open(f'{ROOT}/half.ready', 'w') as f:   # For R=4.
        f.write('')
    if R == 4:
      # R=1 (the default strategy, beside R=4's, while R=2 trains): the
      # knob changes nothing (one replica syncs nothing, whatever the
      # scheme), unpipelined and pipelined.
      out['one'] = max(
          Worst(Train(1, k, schedule, True, f'{ROOT}/1_{k}_{schedule}_s'),
                Train(1, k, schedule, False, f'{ROOT}/1_{k}_{schedule}_p'))
          for k, schedule in ((1, 'gpipe'), (2, 'zb_h1')))
      deadline = time.time() + 600
      while not os.path.exists(f'{ROOT}/half.ready'):
        assert time.time() < deadline, 'R=2 wrote no checkpoint'
        time.sleep(0.5)
      shutil.copytree(f'{ROOT}/half', f'{ROOT}/to_four')
      whole = checkpointer.ReadValues(f'{ROOT}/whole/train/ckpt-6', '')
      out['2_to_4'] = Worst(Train(4, 2, 'gpipe', True, f'{ROOT}/to_four',
                                  steps=6), whole)
    print(json.dumps(out))
""") % dict(key=_KEY, batch=_BATCH, bf16_key=_BF16_KEY)


class ShardedTransparencyTest(tf.test.TestCase):

  def testShardedEqualsUnshardedAndCheckpointsAnyLayout(self):
    root = self.get_temp_dir()
    procs = {r: test_utils.StartPython(_SCRIPT, r, root) for r in (2, 4)}
    results = {r: json.loads(test_utils.FinishPython(p).strip()
                             .splitlines()[-1]) for r, p in procs.items()}
    print(json.dumps(results))
    for r, res in results.items():
      for case, error in res['equal'].items():
        with self.subTest(replicas=r, case=case):
          self.assertLess(error, 1e-6)
          # Step 1's NaN loss skipped the update, on every copy, sharded
          # or not.
          self.assertEqual([4, 4], res['updates'][case])
    self.assertLess(results[4]['one'], 1e-6)
    self.assertLess(results[2]['bf16'], 1e-6)
    for move in ('2_to_1', '1_to_2'):
      self.assertLess(results[2][move], 1e-6, move)
    self.assertLess(results[4]['2_to_4'], 1e-6)
    # The checkpoint keys are the unsharded ones: slots whole, by path.
    sharded = checkpointer.ReadValues(
        os.path.join(root, 'half', 'train', 'ckpt-3'), '')
    plain = checkpointer.ReadValues(
        os.path.join(root, 'plain_half', 'train', 'ckpt-3'), '')
    self.assertEqual(sorted(plain), sorted(sharded))
    m = 'optimizer/slots/net..units[0]..w1/m/.ATTRIBUTES/VARIABLE_VALUE'
    self.assertEqual((8, 32), plain[m].shape)
    self.assertEqual((8, 32), sharded[m].shape)


class ShardedSlotTest(tf.test.TestCase):

  def testAWholeSlotUnderAnUnshardedKeyBothWays(self):
    # A [2, 5] slot: 3 shards of 4 (two padding zeros), then 2 of 5.
    whole = tf.Module()
    whole.m = tf.Variable(tf.reshape(tf.range(10.0), [2, 5]))
    path = tf.train.Checkpoint(opt=whole).write(
        os.path.join(self.get_temp_dir(), 'whole'))

    def _Sharded(num, size):
      module = tf.Module()
      module.m = sharded_update.ShardedSlot(
          [tf.Variable(tf.zeros([size])) for _ in range(num)],
          list(range(num)), num, [2, 5])
      return module

    three = _Sharded(3, 4)
    tf.train.Checkpoint(opt=three).read(path).assert_consumed()
    self.assertAllEqual([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 0]],
                        [s.numpy() for s in three.m.shards])
    for s in three.m.shards:
      s.assign(s * 2)
    path = tf.train.Checkpoint(opt=three).write(
        os.path.join(self.get_temp_dir(), 'three'))
    self.assertEqual(
        ['_CHECKPOINTABLE_OBJECT_GRAPH', 'opt/m/.ATTRIBUTES/VARIABLE_VALUE'],
        [n for n, _ in tf.train.list_variables(path)])
    two = _Sharded(2, 5)
    tf.train.Checkpoint(opt=two).read(path).assert_consumed()
    self.assertAllEqual([[0, 2, 4, 6, 8], [10, 12, 14, 16, 18]],
                        [s.numpy() for s in two.m.shards])
    tf.train.Checkpoint(opt=whole).read(path).assert_consumed()
    self.assertAllEqual([[0, 2, 4, 6, 8], [10, 12, 14, 16, 18]],
                        whole.m.numpy())

  def testAHostOfSomeShardsRestoresItsOwnAndSavesTheGathered(self):
    whole = tf.Module()
    whole.m = tf.Variable([1.0, 2.0, 3.0, 4.0, 5.0])
    path = tf.train.Checkpoint(opt=whole).write(
        os.path.join(self.get_temp_dir(), 'whole'))
    # The second host of two: shard 1 of 2 (3 elements, one padding).
    module = tf.Module()
    module.m = sharded_update.ShardedSlot([tf.Variable(tf.zeros([3]))], [1],
                                          2, [5])
    tf.train.Checkpoint(opt=module).read(path).assert_consumed()
    self.assertAllEqual([4, 5, 0], module.m.shards[0].numpy())
    # What GatherForSave gathered from every host is what it saves.
    module.m.gathered = tf.constant([6.0, 7.0, 8.0, 9.0, 10.0])
    path = tf.train.Checkpoint(opt=module).write(
        os.path.join(self.get_temp_dir(), 'gathered'))
    tf.train.Checkpoint(opt=whole).read(path).assert_consumed()
    self.assertAllEqual([6, 7, 8, 9, 10], whole.m.numpy())


if __name__ == '__main__':
  tf.test.main()
