"""distribution: the registry of options; flags that cannot run.

The registry chooses the first option that applies to the flags, and an
option registered from outside (the module docstring's toy) runs through
the trainer exactly as the default path does. Of the flags and TF_CONFIG
that cannot run (SetupErrors), only the checks that fail before TensorFlow
is touched run here (a strategy or a server changes the process for good);
the clusters that work are tests/trainer_multihost_test.py and
tests/trainer_ps_test.py.
"""
import io
import os
import re
import socket
import sys
import time
from unittest import mock

import tensorflow as tf

from cadence.framework import cluster as cluster_lib
from cadence.framework.distribute import distribution
from cadence.framework.distribute import local
from cadence.framework.distribute import option
from cadence.framework.jobs import trainer_lib
from cadence.framework.train import checkpointer
from cadence.tests import test_utils

_PS_CLUSTER = {'chief': ['127.0.0.1:1'], 'ps': ['127.0.0.1:2'],
               'worker': ['127.0.0.1:3', '127.0.0.1:4']}


def _PsConfig(cluster=None, task_type='chief', index=0):
  return {'cluster': cluster or _PS_CLUSTER,
          'task': {'type': task_type, 'index': index}}


class ParameterServerSetupTest(tf.test.TestCase):

  def testPipelineOrReplicasPerWorkerAreRefused(self):
    for flags in (dict(worker_split_size=2), dict(worker_replicas=2)):
      with self.subTest(**flags):
        with self.assertRaisesRegex(
            distribution.SetupError,
            r'^Parameter-server training \(TF_CONFIG with a "ps" job\) runs '
            r'one replica of one device per worker, without a pipeline: '
            rf'--worker_replicas={flags.get("worker_replicas", 1)} and '
            rf'--worker_split_size={flags.get("worker_split_size", 1)} '
            r".*must both be 1\. Pipelined models train on several hosts "
            r'with MultiWorkerMirroredStrategy'):
          distribution.Create(tf_config=_PsConfig(), **flags)

  def testTheClusterNeedsAChiefAndWorkers(self):
    for cluster in ({'ps': ['h:1'], 'worker': ['h:2']},
                    {'chief': ['h:0'], 'ps': ['h:1']}):
      with self.subTest(jobs=sorted(cluster)):
        with self.assertRaisesRegex(
            distribution.SetupError,
            r'needs one "chief" \(the coordinator\) and at least one '
            r'"worker"; it has '):
          distribution.Create(tf_config=_PsConfig(cluster))

  def testOnlyChiefWorkerAndPsTasks(self):
    with self.assertRaisesRegex(
        distribution.SetupError,
        r"task type 'evaluator': parameter-server training runs 'chief', "
        r"'worker' and 'ps' tasks; run evaler and decoder jobs without "
        r'TF_CONFIG\.'):
      distribution.Create(tf_config=_PsConfig(task_type='evaluator'))

  def testClusterSpecFlagNamesPsTasks(self):
    config = distribution.ParseClusterSpec(
        'chief=h:4@ps=h:1,h:2@worker=h:3', 'ps', 1)
    self.assertEqual({'chief': ['h:4'], 'ps': ['h:1', 'h:2'],
                      'worker': ['h:3']}, config['cluster'])
    self.assertEqual({'type': 'ps', 'index': 1}, config['task'])


class OneDeviceSetup(option.Setup):
  """The module docstring's toy option, as written there."""
  name = 'one_device'

  @classmethod
  def Applies(cls, flags):
    return (not flags.tpu and flags.tf_config is None and
            flags.run_locally == 'cpu' and
            flags.worker_replicas * flags.worker_split_size == 1)

  @classmethod
  def Create(cls, flags):
    cluster = cluster_lib.Cluster.Params().Set(
        device_type='CPU', num_devices=1).Instantiate()
    return cls(cluster=cluster, strategy=tf.distribute.get_strategy())


_WORKERS = {'worker': ['127.0.0.1:1', '127.0.0.1:2']}


class PeerWaitTest(tf.test.TestCase):
  """A peer that never comes is a SetupError after --peer_timeout_s,
  raised before the strategy exists (framework/distribute/peer_wait.py)."""

  def testMultiWorkerAndPsChiefRefuseAfterTheTimeout(self):
    workers = test_utils.LocalCluster(worker=2)
    ps = test_utils.LocalCluster(chief=1, ps=1, worker=1)
    for config, missing in (
        (_PsConfig(workers, 'worker', 0),
         f"worker 1 at {workers['worker'][1]}"),
        (_PsConfig(ps),
         f"ps 0 at {ps['ps'][0]}, worker 0 at {ps['worker'][0]}")):
      with self.subTest(jobs=sorted(config['cluster'])):
        start = time.monotonic()
        with self.assertRaisesRegex(
            distribution.SetupError,
            rf'^\d of \d peer\(s\) never accepted a connection within '
            rf'--peer_timeout_s=0\.5 s: {re.escape(missing)}\. '):
          distribution.Create(tf_config=config, peer_timeout_s=0.5)
        self.assertBetween(time.monotonic() - start, 0.5, 3)
    # The multi-worker host listened on its port while it waited: free now.
    socket.create_server(('', int(workers['worker'][0].split(':')[1]))
                         ).close()


class RegistryTest(tf.test.TestCase):

  def testTheFirstOptionThatAppliesIsChosen(self):
    self.assertEqual(('tpu', 'parameter_server', 'multi_worker', 'local'),
                     distribution.Names())
    table = (
        (dict(), 'local'),
        (dict(worker_replicas=2, worker_split_size=2), 'local'),
        (dict(run_locally='gpu'), 'local'),
        (dict(tf_config=_PsConfig(_WORKERS, 'worker', 1)), 'multi_worker'),
        (dict(tf_config=_PsConfig(dict(_WORKERS, evaluator=['h:3']),
                                  'evaluator')), 'multi_worker'),
        (dict(tf_config=_PsConfig()), 'parameter_server'),
        (dict(tf_config=_PsConfig(task_type='ps', index=0)),
         'parameter_server'),
        (dict(tpu='my-tpu'), 'tpu'),
        # The TPU option refuses a TF_CONFIG itself (tests/trainer_bad_
        # inputs_test.py), so it must be the one chosen.
        (dict(tpu='grpc://h:8470', tf_config=_PsConfig()), 'tpu'),
    )
    for flags, name in table:
      with self.subTest(**flags):
        self.assertEqual(name, distribution.Choose(
            distribution.Flags(**flags)).name)

  def testRegisterNamesTheMistake(self):
    with self.assertRaisesRegex(
        ValueError, r"^Distribution option LocalSetup: name 'local' is "
        r'empty or registered already\.$'):
      distribution.Register(local.LocalSetup)
    with self.assertRaisesRegex(
        KeyError, r"Distribution option 'locale'; expected one of \['tpu', "
        r"'parameter_server', 'multi_worker', 'local'\]\."):
      distribution.Register(OneDeviceSetup, before='locale')
    self.assertNotIn('one_device', distribution.Names())

  def testAToyOptionTrainsThroughTheTrainerAsTheDefaultPathDoes(self):
    tmp = self.get_temp_dir()

    def _Train(logdir):
      with mock.patch.object(sys, 'stderr', io.StringIO()) as err:
        code = trainer_lib.Main(trainer_lib.TrainerOptions(
            model='synthetic.linear_regression.RegressionTiny',
            logdir=logdir, job='trainer', max_steps=5, peak_tflops=1.0))
      self.assertEqual(0, code, err.getvalue())
      return checkpointer.ReadValues(os.path.join(logdir, 'train', 'ckpt-5'))

    distribution.Register(OneDeviceSetup, before='local')
    try:
      self.assertEqual(('tpu', 'parameter_server', 'multi_worker',
                        'one_device', 'local'), distribution.Names())
      self.assertIsInstance(distribution.Create(), OneDeviceSetup)
      self.assertIsInstance(distribution.Create(worker_replicas=2),
                            local.LocalSetup)
      toy = _Train(os.path.join(tmp, 'toy'))
    finally:
      distribution.Unregister('one_device')
    self.assertIsInstance(distribution.Create(), local.LocalSetup)
    default = _Train(os.path.join(tmp, 'default'))
    self.assertCountEqual(default, toy)
    weights = [k for k in default if k.startswith('model/')]
    self.assertNotEmpty(weights)
    for key in default:
      self.assertAllEqual(default[key], toy[key], msg=key)


if __name__ == '__main__':
  tf.test.main()
