"""distribution: flags and TF_CONFIG that cannot run are SetupErrors.

Only the checks that fail before TensorFlow is touched run here (a strategy
or a server changes the process for good); the clusters that work are
tests/trainer_multihost_test.py and tests/trainer_ps_test.py.
"""
import tensorflow as tf

from cadence.framework.distribute import distribution

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


if __name__ == '__main__':
  tf.test.main()
