"""Tests for cadence.tasks.synthetic.keras_regression: a keras.Model trained
replicated by Cadence's replica machinery (framework/train/replicas.py).

As in tests/framework/train/replicas_test.py, each replica count runs in its own
subprocess (a MirroredStrategy fixes its collective group size for the
process): R replicas train 3 steps on R x 8 examples a step and must equal
one replica on the same global batch.
"""
import json
import textwrap

import tensorflow as tf

from cadence.framework import model_registry
from cadence.tests import test_utils

_KEY = 'keras.regression.KerasMlpTiny'
_BATCH = 8   # Per replica.

_SCRIPT = textwrap.dedent("""
    import json, os, sys, tempfile
    import numpy as np
    import tensorflow as tf
    R = int(sys.argv[1])
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices('CPU')[0],
        [tf.config.LogicalDeviceConfiguration()] * 4)
    from cadence.framework import base_layer, step_seed
    from cadence.framework import cluster as cluster_lib
    from cadence.framework import model_registry
    from cadence.framework.train import programs, replicas

    def Params(batch):
      p = model_registry.GetParams(%(key)r, 'Train')
      p.input.Set(batch_size=batch, fixed_input_shape=True)
      p.task.train.Set(max_steps=3, save_interval_steps=3,
                       summary_interval_steps=1, log_interval_steps=3)
      return p

    def Train(r, strategy, params, name):
      cluster = cluster_lib.Cluster.Params().Set(
          num_devices=r, worker_split_size=1).Instantiate()
      with cluster:
        tasks = replicas.BuildReplicas(params, cluster)
        programs.TrainProgram(tasks, os.path.join(tempfile.mkdtemp(), name),
                              strategy, peak_flops=1e12, cluster=cluster,
                              steps_per_loop=1).Run()
      return cluster, tasks

    def Weights(task):
      return {k: v.numpy() for k, v in task.vars.FlattenItems()}

    plain = Weights(Train(1, tf.distribute.get_strategy(),
                          Params(R * %(batch)d), 'plain')[1][0])
    strategy = tf.distribute.MirroredStrategy(
        ['/device:CPU:%%d' %% i for i in range(R)])
    cluster, tasks = Train(R, strategy, Params(%(batch)d), 'replicated')
    out = dict(
        error=max(float(np.abs(Weights(t)[k] - plain[k]).max())
                  for t in tasks for k in plain),
        moved=max(float(np.abs(plain[k] - Weights(
            Params(1).Instantiate().task)[k]).max()) for k in plain),
        traces_after_training=[t.net.num_traces for t in tasks])

    # One compiled forward program per input shape (the seed's compilation
    # cache): shapes A, A, B, B, A trace twice in all.
    @tf.function(autograph=False)
    def Forward(x):
      def _Replica(x):
        ctx = tf.distribute.get_replica_context()
        task = tasks[tf.get_static_value(ctx.replica_id_in_sync_group)]
        return task.net.FProp(task.net.theta, x)
      return strategy.run(_Replica, args=(x,))

    before = [t.net.num_traces for t in tasks]
    counts = []
    with cluster:
      for rows in (4, 4, 6, 6, 4):
        dist = strategy.experimental_distribute_values_from_function(
            lambda ctx, rows=rows: tf.ones([rows, 8]))
        Forward(dist)
        counts.append(Forward.experimental_get_tracing_count())
    out['function_traces'] = counts
    out['layer_traces'] = [t.net.num_traces - b for t, b in
                           zip(tasks, before)]
    print(json.dumps(out))
""") % dict(key=_KEY, batch=_BATCH)


class KerasRegressionTest(tf.test.TestCase):

  def testReplicatedEqualsOneReplicaOnTheGlobalBatch(self):
    procs = {r: test_utils.StartPython(_SCRIPT, r) for r in (2, 4)}
    for r, proc in procs.items():
      out = json.loads(test_utils.FinishPython(proc).strip().splitlines()[-1])
      with self.subTest(replicas=r):
        # Adam on float32 means over differently ordered sums.
        self.assertLess(out['error'], 1e-5, out)
        self.assertGreater(out['moved'], 1e-3, out)   # It did train.
        # The train loop traced once (3 calls of it): per replica, once.
        self.assertEqual([1] * r, out['traces_after_training'])
        self.assertEqual([1, 1, 2, 2, 2], out['function_traces'])
        self.assertEqual([2] * r, out['layer_traces'])

  def testParamsPrintTheModelFunction(self):
    p = model_registry.GetParams(_KEY, 'Train')
    text = p.ToText()
    self.assertIn("task.net_tpl.layer : function('cadence.tasks.synthetic."
                  "keras_regression.Mlp')", text)
    self.assertIn("task.net_tpl.kwargs : {'input_dim': 8, 'hidden_dims': "
                  '[16]}', text)


if __name__ == '__main__':
  tf.test.main()
