"""Tests for cadence.framework.train.replicas: replicas x pipeline stages.

Transparency (the data-parallel, pipelined model equals the plain one) runs
in subprocesses: a MirroredStrategy fixes collective group sizes for its
process, so 2 and 4 replicas cannot share one. Each subprocess trains the
smallest pipelined experiment (RegressionGPipeTiny: 2 cells, 4
micro-batches) for 3 SGD steps, one of them skipped (a NaN loss), with every
all-reduce mode this machine runs, and compares every replica's weights with
the reference on the same global batch.
"""
import json
import textwrap

import tensorflow as tf

from cadence.framework import cluster as cluster_lib
from cadence.framework import model_registry
from cadence.framework.train import replicas
from cadence.tests import test_utils

_KEY = 'synthetic.linear_regression.RegressionGPipeTiny'
_BATCH = 8   # Per replica.

_TRANSPARENCY = textwrap.dedent("""
    import json, os, sys, tempfile
    import numpy as np
    import tensorflow as tf
    R, K = int(sys.argv[1]), int(sys.argv[2])
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices('CPU')[0],
        [tf.config.LogicalDeviceConfiguration()] * 4)
    from cadence.framework import base_layer, cluster as cluster_lib
    from cadence.framework import model_registry, optimizer
    from cadence.framework.nested_map import NestedMap
    from cadence.framework import step_seed
    from cadence.framework.train import programs
    from cadence.framework.train import replicas

    LR, STEPS, NAN_STEP = 0.05, 3, 1
    logdir = tempfile.mkdtemp()

    def Params(batch, dropout=0.0, mode='auto'):
      p = model_registry.GetParams(%(key)r, 'Train')
      p.input.batch_size = batch
      p.task.dropout_prob = dropout
      p.task.train.learner.Set(learning_rate=LR,
                               optimizer=optimizer.SGD.Params())
      p.task.train.Set(max_steps=STEPS, save_interval_steps=STEPS,
                       summary_interval_steps=1, log_interval_steps=STEPS,
                       debug_nan_steps=[NAN_STEP], allreduce=mode)
      return p

    def Train(r, k, strategy, params, name):
      cluster = cluster_lib.Cluster.Params().Set(
          num_devices=r * k, worker_split_size=k).Instantiate()
      with cluster:
        tasks = replicas.BuildReplicas(params, cluster)
        program = programs.TrainProgram(
            tasks, os.path.join(logdir, name), strategy, peak_flops=1e12,
            cluster=cluster)
        program.Run()
      copies = [{k: v.numpy() for k, v in t.vars.FlattenItems()}
                for t in tasks]
      for other in copies[1:]:   # Every replica holds the same weights.
        assert all((other[k] == copies[0][k]).all() for k in copies[0]), name
      assert int(program.learner.optimizer.num_updates.numpy()) == STEPS - 1
      return copies[0]

    def Reference(params, r):
      # One task on one device; replica j's slice of the global batch runs
      # with replica j's seed, the gradients are averaged, SGD by hand.
      cluster = cluster_lib.Cluster.Params().Set(
          num_devices=1, worker_split_size=1).Instantiate()
      with cluster:
        task = params.Instantiate().task
      batches = iter(params.input.Instantiate().Dataset(num_replicas=r))
      seed0 = task.params.random_seed or 0
      for step in range(STEPS):
        batch = next(batches)
        parts = [NestedMap({k: v[j * %(batch)d:(j + 1) * %(batch)d]
                            for k, v in batch.items()}) for j in range(r)]
        grads = None
        for j, part in enumerate(parts):
          seed = step_seed.MakeStepSeed(step, seed0)
          if r > 1:
            seed = step_seed.MicroBatchSeed(seed, j)
          with tf.GradientTape() as tape:
            metrics, _ = task.FPropTower(
                base_layer.WithStepSeed(task.theta, seed), part)
          g = tape.gradient(metrics.loss[0], task.vars.Flatten())
          grads = g if grads is None else [a + b for a, b in zip(grads, g)]
        if step != NAN_STEP:
          for v, g in zip(task.vars.Flatten(), grads):
            v.assign_sub(LR * g / r)
      return {k: v.numpy() for k, v in task.vars.FlattenItems()}

    from cadence.framework import base_layer as bl
    from cadence.tasks.synthetic import regression

    class CountingModel(regression.RegressionModel):
      # Variables the replicas update themselves, one per aggregation.
      def __init__(self, params):
        super().__init__(params)
        agg, sync = tf.VariableAggregation, tf.VariableSynchronization
        for name, a, s in (('seen', agg.SUM, sync.ON_READ),
                           ('seen_now', agg.SUM, sync.ON_WRITE),
                           ('mean_x', agg.MEAN, sync.ON_WRITE),
                           ('first_x', agg.ONLY_FIRST_REPLICA, sync.AUTO)):
          self.CreateVariable(name, bl.WeightParams(
              [], init=bl.WeightInit.Constant(0.0), trainable=False,
              aggregation=a, synchronization=s))

      def FPropTower(self, theta, batch):
        n = tf.cast(tf.shape(batch.x)[0], tf.float32)
        theta.seen.assign_add(n)
        theta.seen_now.assign_add(n)
        theta.mean_x.assign(tf.reduce_mean(batch.x))
        theta.first_x.assign(batch.x[0, 0])
        return super().FPropTower(theta, batch)

    def Counting(strategy):
      p = model_registry.GetParams('synthetic.linear_regression.'
                                   'RegressionTiny', 'Train')
      p.task.cls = CountingModel
      p.input.batch_size = 4
      p.task.train.Set(max_steps=3, save_interval_steps=3,
                       summary_interval_steps=1, log_interval_steps=3)
      cluster = cluster_lib.Cluster.Params().Set(
          num_devices=4, worker_split_size=2).Instantiate()
      with cluster:
        tasks = replicas.BuildReplicas(p, cluster)
        program = programs.TrainProgram(
            tasks, os.path.join(logdir, 'counting'), strategy,
            peak_flops=1e12, cluster=cluster)
        program.Run()
      batches = iter(p.input.Instantiate().Dataset(num_replicas=2))
      for _ in range(3):
        last = next(batches).x.numpy()
      return dict(
          copies=[{k: float(v.numpy()) for k, v in t.vars.FlattenItems()
                   if k in ('seen', 'seen_now', 'mean_x', 'first_x')}
                  for t in tasks],
          mean_x=float(last.mean()), first_x=float(last[0, 0]))

    strategy = tf.distribute.MirroredStrategy(
        ['/device:CPU:%%d' %% (i * K) for i in range(R)])
    results = {}
    plain = Train(1, 1, tf.distribute.get_strategy(),
                  Params(R * %(batch)d), 'plain')
    # Each all-reduce implementation in one of the two layouts (one_device,
    # the default, in both).
    for mode in ('one_device', 'ring' if R == 2 else 'hierarchical_copy'):
      got = Train(R, K, strategy, Params(%(batch)d, mode=mode), mode)
      results[mode] = max(float(np.abs(got[k] - plain[k]).max())
                          for k in plain)
    # With dropout each replica draws its own masks (its own step seed).
    got = Train(R, K, strategy, Params(%(batch)d, 0.3, 'one_device'),
                'dropout')
    want = Reference(Params(%(batch)d, 0.3), R)
    results['dropout'] = max(float(np.abs(got[k] - want[k]).max())
                             for k in want)
    results['moved'] = max(float(np.abs(got[k] - plain[k]).max())
                           for k in plain)
    if R == 2:
      results['counted'] = Counting(strategy)
    print(json.dumps(results))
""") % dict(key=_KEY, batch=_BATCH)


class TransparencyTest(tf.test.TestCase):

  def testReplicasTimesStagesEqualOneDevice(self):
    # 2 replicas x 2 stages and 4 replicas x 1 stage (both cells on one
    # device) on 4 logical CPUs, against 1 replica x 1 device on the global
    # batch (2 x 8 or 4 x 8 examples).
    procs = {(r, k): test_utils.StartPython(_TRANSPARENCY, r, k)
             for r, k in ((2, 2), (4, 1))}
    for (r, k), proc in procs.items():
      out = test_utils.FinishPython(proc)
      errors = json.loads(out.strip().splitlines()[-1])
      with self.subTest(replicas=r, stages=k):
        for mode in ('one_device', 'ring' if r == 2 else 'hierarchical_copy',
                     'dropout'):
          self.assertLess(errors[mode], 1e-5, (mode, errors))
        self.assertGreater(errors['moved'], 1e-3)   # Dropout changed them.
      if r != 2:
        continue
      # Variables the 2 replicas updated themselves, combined by
      # aggregation (3 steps of 2 x 4 examples; the last global batch's).
      counted = errors['counted']
      for copy in counted['copies']:
        self.assertEqual(24.0, copy['seen'])      # SUM, ON_READ: at save.
        self.assertEqual(24.0, copy['seen_now'])  # SUM, every step.
        self.assertAllClose(counted['mean_x'], copy['mean_x'], atol=1e-6)
        # ONLY_FIRST_REPLICA: replica 0's, the global batch's first row.
        self.assertEqual(counted['first_x'], copy['first_x'])


_PLACEMENT = textwrap.dedent("""
    import tempfile
    import tensorflow as tf
    tf.debugging.set_log_device_placement(True)
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices('CPU')[0],
        [tf.config.LogicalDeviceConfiguration()] * 4)
    from cadence.framework import cluster as cluster_lib
    from cadence.framework import model_registry
    from cadence.framework.train import programs, replicas
    p = model_registry.GetParams(%(key)r, 'Train')
    # Cell 0 (fc0, fc1) applies Tanh, cell 1 (fc2, fc3) Sigmoid. The cells
    # are inlined per call (trace_actions), so that their ops carry the
    # replica's name scope.
    p.task.activation = ['TANH', 'TANH', 'SIGMOID']
    p.task.pipeline_tpl.trace_actions = True
    p.task.train.Set(max_steps=1, save_interval_steps=1,
                     summary_interval_steps=1, log_interval_steps=1)
    cluster = cluster_lib.Cluster.Params().Set(
        num_devices=4, worker_split_size=2).Instantiate()
    strategy = tf.distribute.MirroredStrategy(['/device:CPU:0',
                                               '/device:CPU:2'])
    with cluster:
      tasks = replicas.BuildReplicas(p, cluster)
      programs.TrainProgram(tasks, tempfile.mkdtemp(), strategy,
                            peak_flops=1e12, cluster=cluster).Run()
""") % dict(key=_KEY)


class PlacementTest(tf.test.TestCase):

  def testReplicaRStageSRunsOnDeviceRTimesKPlusS(self):
    # Replica r's ops carry MirroredStrategy's 'replica_r/' name scope (none
    # for replica 0); stage 0's activation is Tanh, stage 1's Sigmoid, and
    # their gradients TanhGrad / SigmoidGrad (the backward).
    stage_of = {'Tanh': 0, 'TanhGrad': 0, 'Sigmoid': 1, 'SigmoidGrad': 1}
    devices = test_utils.OpDevices(
        _PLACEMENT, stage_of, group=lambda n: int('replica_1/' in n))
    self.assertCountEqual([(op, r) for op in stage_of for r in (0, 1)],
                          devices)
    for (op, r), placed in devices.items():
      self.assertEqual({f'CPU:{r * 2 + stage_of[op]}'}, placed, (op, r))


class BuildReplicasTest(tf.test.TestCase):

  def testEachStageLivesOnItsDeviceOfEachReplica(self):
    params = model_registry.GetParams(_KEY, 'Train')
    cluster = cluster_lib.Cluster.Params().Set(
        num_devices=4, worker_split_size=2).Instantiate()
    with cluster:
      tasks = replicas.BuildReplicas(params, cluster)
    self.assertLen(tasks, 2)
    for r, task in enumerate(tasks):
      learner = task.InstantiateLearner()
      learner.Build()
      for path, var in task.vars.FlattenItems():
        # Cell 0 (fc0, fc1) on the replica's first device, cell 1 on its
        # second; Adam's slots beside their variable.
        stage = 0 if path.startswith('net.cells[0]') else 1
        want = f'CPU:{r * 2 + stage}'
        self.assertEqual(want, var.device.split('device:')[-1], path)
        self.assertEqual(stage, replicas.StageOfVariable(cluster, r, var))
        for slot in learner.optimizer.Slots(var).values():
          self.assertEqual(want, slot.device.split('device:')[-1], path)
    # Equal initial weights in every replica (seeded by path).
    for (k0, v0), (k1, v1) in zip(tasks[0].vars.FlattenItems(),
                                  tasks[1].vars.FlattenItems()):
      self.assertEqual(k0, k1)
      self.assertAllEqual(v0, v1)

  def testAllReduceChoicesThisMachineCannotRun(self):
    for mode, workers, device, regex in (
        ('nccl', 1, 'CPU', r"allreduce='nccl' needs GPUs; the replicas run "
         r'on CPUs\. Use ring, hierarchical_copy, one_device or auto\.'),
        ('one_device', 2, 'CPU', r"allreduce='one_device' works within one "
         r'host; 2 hosts need ring \(collective ops\) or auto\.'),
        ('rnig', 1, 'CPU', r"allreduce='rnig' must be one of 'auto', 'ring'"
         r".*Did you mean 'ring'\?")):
      with self.subTest(mode=mode):
        with self.assertRaisesRegex(ValueError, regex):
          replicas.CheckAllReduce(mode, 0, workers, device, 'task.train')
    with self.assertRaisesRegex(ValueError, r'allreduce_bytes_per_pack=-1 '
                                r'must be an int >= 0'):
      replicas.CheckAllReduce('ring', -1, 1, 'CPU', 'task.train')


if __name__ == '__main__':
  tf.test.main()
