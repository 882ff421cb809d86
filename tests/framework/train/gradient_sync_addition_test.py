"""A gradient-sync scheme of one's own, added without editing Cadence.

`MeanOnOneDeviceSync` mean-reduces every gradient with tf.distribute's own
`strategy.reduce`, variable by variable, to one device (not stage by stage
on the stages' devices, as the built-in stage_all_reduce does), and every
task copy applies that mean. This module is all it takes: the class (the
GradientSync interface: NAME, Apply, Describe) and its registration
(`gradient_sync.Register`); `train.gradient_sync='mean_on_one_device'`
chooses it. Trained through the train program, 2 replicas x 2 pipeline
stages of the pipelined MLP (Adam, clipping, one step skipped on a NaN
loss), it must give the built-in all-reduce's weights within 1e-6 of each
tensor's largest value, on every copy. A MirroredStrategy fixes its
collective groups per process, so the run is a subprocess, which imports
this module and registers the scheme; the test process never does (the
registry's names stay the built-in ones here).
"""
import json
import textwrap

import tensorflow as tf

from cadence.framework.train import gradient_sync
from cadence.tests import test_utils


class MeanOnOneDeviceSync(gradient_sync.GradientSync):
  """Every gradient mean-reduced to one device by `strategy.reduce`, then
  applied by every copy (the same update, the same skip)."""

  NAME = 'mean_on_one_device'

  def Describe(self):
    return 'mean-reduced on one device, variable by variable.'

  def Apply(self, step, grads, loss):
    mean_op = tf.distribute.ReduceOp.MEAN
    means = [self.strategy.reduce(mean_op, g, axis=None) for g in grads]
    loss = gradient_sync.MeanLoss(self.strategy, loss)
    stats = None
    for learner in self.state.learners:
      copy_stats = learner.ApplyGradients(
          step, learner.trainable_vars.Pack(means), loss=loss,
          skip=None if stats is None else stats.skipped)
      stats = stats or copy_stats
    return stats


_SCRIPT = textwrap.dedent("""
    import json, os, sys, tempfile
    import numpy as np
    import tensorflow as tf
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices('CPU')[0],
        [tf.config.LogicalDeviceConfiguration()] * 4)
    from cadence.framework import cluster as cluster_lib
    from cadence.framework import model_registry, optimizer
    from cadence.framework.train import gradient_sync, programs, replicas
    from cadence.tests.framework.train import gradient_sync_addition_test

    gradient_sync.Register(gradient_sync_addition_test.MeanOnOneDeviceSync)
    STEPS, ROOT = 4, tempfile.mkdtemp()
    strategy = tf.distribute.MirroredStrategy(['/device:CPU:0',
                                               '/device:CPU:2'])

    def Train(sync):
      p = model_registry.GetParams('examples.pipelined_mlp.PipelinedMlp',
                                   'Train')
      p.task.net_tpl.splits = 2
      p.input.batch_size = 8
      p.task.train.learner.Set(
          learning_rate=1e-2, optimizer=optimizer.Adam.Params(),
          clip_gradient_norm_to_value=0.5)
      p.task.train.Set(max_steps=STEPS, save_interval_steps=STEPS,
                       summary_interval_steps=STEPS,
                       log_interval_steps=STEPS, debug_nan_steps=[1],
                       gradient_sync=sync)
      cluster = cluster_lib.Cluster.Params().Set(
          num_devices=4, worker_split_size=2).Instantiate()
      with cluster:
        tasks = replicas.BuildReplicas(p, cluster)
        first = {n: v.numpy() for n, v in tasks[0].vars.FlattenItems()}
        program = programs.TrainProgram(
            tasks, os.path.join(ROOT, sync), strategy, peak_flops=1e12,
            cluster=cluster)
        program.Run()
      copies = [{n: v.numpy() for n, v in t.vars.FlattenItems()}
                for t in tasks]
      return dict(
          sync=type(program.runner.sync).__name__,
          line=program.runner.sync.Describe(),
          updates=int(program.learner.optimizer.num_updates.numpy()),
          first=first, copies=copies)

    def Worst(got, want):
      # max |got - want| / max |want| over the tensors.
      assert sorted(got) == sorted(want), sorted(set(got) ^ set(want))
      return max(float(np.abs(got[n] - w).max() / max(np.abs(w).max(), 1e-30))
                 for n, w in want.items())

    mine, built_in = Train('mean_on_one_device'), Train('auto')
    print(json.dumps(dict(
        syncs=[mine['sync'], built_in['sync']],
        line=mine['line'],
        updates=[mine['updates'], built_in['updates']],
        copies=Worst(mine['copies'][1], mine['copies'][0]),
        moved=max(float(np.abs(w - built_in['first'][n]).max())
                  for n, w in built_in['copies'][0].items()),
        error=max(Worst(c, built_in['copies'][0])
                  for c in mine['copies']))))
""")


class GradientSyncAdditionTest(tf.test.TestCase):

  def testASchemeOfOnesOwnTrainsAsTheBuiltInAllReduce(self):
    out = json.loads(test_utils.RunPython(_SCRIPT).stdout.strip()
                     .splitlines()[-1])
    # The name chose the scheme; 'auto' the built-in all-reduce.
    self.assertEqual(['MeanOnOneDeviceSync', 'StageAllReduceSync'],
                     out['syncs'])
    self.assertEqual('mean-reduced on one device, variable by variable.',
                     out['line'])
    # Step 1's NaN loss was skipped by both, on every copy.
    self.assertEqual([3, 3], out['updates'])
    # The copies stayed one model, and it trained to the built-in's
    # weights, which moved from the initial ones by far more.
    self.assertEqual(0.0, out['copies'])
    self.assertGreater(out['moved'], 1e-3)
    self.assertLess(out['error'], 1e-6)


if __name__ == '__main__':
  tf.test.main()
