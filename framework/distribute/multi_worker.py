"""The `multi_worker` option: several hosts, MultiWorkerMirroredStrategy.

It applies under a TF_CONFIG (or --cluster_spec) without a "ps" job: the
same command on every host, each its role and index from TF_CONFIG. Each
host's replicas are made as in the `local` option (local.py); the
'chief' and 'worker' tasks all-reduce across hosts with
MultiWorkerMirroredStrategy, which starts this host's server and so must
exist before any other TF op. Before it starts, each of them waits until
every other 'chief' and 'worker' task accepts a TCP connection, listening
on its own port meanwhile (peer_wait.py: a line every 10 s names the
peers not seen yet; --peer_timeout_s ends the wait with exit 2, a signal
with exit 0). The 'chief', or worker 0 without one, is host
0 and writes the checkpoints and summaries; a signal stops every host at
the same step (the base Setup's agreement), and a failed peer stops the
others with one line (exit 4).

On CPU each host runs one replica: MultiWorkerMirroredStrategy runs
several per host only on GPUs.

Example (two hosts, the same command on each):
  TF_CONFIG='{"cluster": {"worker": ["h0:2222", "h1:2222"]},
              "task": {"type": "worker", "index": 0}}' \\
    python trainer.py --model=... --logdir=/shared/run --job=trainer
"""
from absl import logging
import tensorflow as tf

from cadence.framework.distribute import coordinated_exit
from cadence.framework.distribute import local
from cadence.framework.distribute import option
from cadence.framework.distribute import peer_wait


class MultiWorkerSetup(option.Setup):
  """A host of a multi-host run; see the module docstring."""

  name = 'multi_worker'

  @classmethod
  def Applies(cls, flags):
    return (not flags.tpu and flags.tf_config is not None and
            'ps' not in flags.tf_config['cluster'])

  @classmethod
  def Create(cls, flags):
    task = flags.tf_config['task']
    task_type, worker_index = task.get('type', ''), int(task.get('index', 0))
    jobs = flags.tf_config['cluster']
    num_workers = len(jobs.get('chief', [])) + len(jobs.get('worker', []))
    if task_type == 'worker' and 'chief' in jobs:
      worker_index += 1   # The chief is host 0.
    if flags.worker_replicas > 1 and flags.run_locally == 'cpu':
      raise option.SetupError(
          f'--worker_replicas={flags.worker_replicas} with several hosts on '
          'CPU: MultiWorkerMirroredStrategy runs one replica per host on CPU '
          '(several per host need GPUs); use --worker_replicas=1.')
    device_type, num_devices = local.LocalDevices(
        flags.run_locally, flags.worker_replicas, flags.worker_split_size,
        flags.worker_gpus)
    strategy = None   # An 'evaluator' task: this host's replicas only.
    if task_type in ('worker', 'chief'):
      # In Python first, where signals and lines work: the strategy's start
      # blocks in C++ until every peer answers (peer_wait.py).
      try:
        peer_wait.WaitForTasks(flags.tf_config, ('chief', 'worker'),
                               flags.peer_timeout_s, listen=True)
      except peer_wait.WaitError as e:
        raise option.SetupError(str(e)) from None
      # Before any other op: the strategy starts this host's server.
      resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
          tf.train.ClusterSpec(jobs), task_type=task_type,
          task_id=int(task.get('index', 0)), rpc_layer='grpc')
      strategy = tf.distribute.MultiWorkerMirroredStrategy(
          cluster_resolver=resolver,
          communication_options=(
              tf.distribute.experimental.CommunicationOptions(
                  implementation=tf.distribute.experimental
                  .CommunicationImplementation.AUTO)))
    cluster = local.LocalCluster(device_type, num_devices,
                                 flags.worker_split_size)
    if strategy is None:
      strategy = local.LocalStrategy(cluster)
    return cls(cluster=cluster, strategy=strategy, num_workers=num_workers,
               worker_index=worker_index, task_type=task_type)

  def FinishTogether(self):
    """Every host waits for the others at a barrier, host 0 also until
    their servers are gone (framework/distribute/coordinated_exit.py), so
    no host reads another's normal exit as a crash; an evaluator task
    does not take part."""
    if self.task_type not in ('worker', 'chief'):
      return False
    logging.info('Done; waiting for the other host(s) of this %d-host job '
                 'to finish too before exiting.', self.num_workers)
    coordinated_exit.FinishTogether(self)
    return True
