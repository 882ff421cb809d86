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

Its flags (`MultiHostFlags`) are the `local` option's (--worker_gpus: each
host's devices are made as local makes them) and --peer_timeout_s; the
parameter_server option shares them (its FLAGS is this same class), so
each is declared once, here and in local.py. TensorFlow is imported
where it is used: the options' flags are read before it loads.

Example (two hosts, the same command on each):
  TF_CONFIG='{"cluster": {"worker": ["h0:2222", "h1:2222"]},
              "task": {"type": "worker", "index": 0}}' \\
    python trainer.py --model=... --logdir=/shared/run --job=trainer
"""
import dataclasses

from absl import logging

from cadence.framework.distribute import flag_fields
from cadence.framework.distribute import local
from cadence.framework.distribute import option
from cadence.framework.distribute import peer_wait


@dataclasses.dataclass
class MultiHostFlags(local.LocalFlags):
  """The flags of the multi-host options, multi_worker and
  parameter_server: local's (--worker_gpus), and the wait for the peers."""
  peer_timeout_s: float = flag_fields.Flag(
      peer_wait.DEFAULT_TIMEOUT_S, 'With TF_CONFIG (or --cluster_spec): '
      'before TensorFlow starts, a chief or worker of a multi-host job (and '
      'a parameter-server chief) waits until every task it needs accepts a '
      'connection, logging the missing ones every 10 s; after this many '
      'seconds it stops with exit code 2 naming them (0: no limit).')


class MultiWorkerSetup(option.Setup):
  """A host of a multi-host run; see the module docstring."""

  name = 'multi_worker'
  FLAGS = MultiHostFlags
  CHOSEN_BY = 'TF_CONFIG or --cluster_spec without a "ps" job'

  @classmethod
  def CheckFlags(cls, own):
    local.LocalSetup.CheckFlags(own)
    option.CheckNumber('peer_timeout_s', own.peer_timeout_s, 0,
                       'seconds to wait for the peer hosts of a TF_CONFIG '
                       'job; 0: no limit')

  @classmethod
  def Applies(cls, flags):   # After tpu: no --tpu.
    return (flags.tf_config is not None and
            'ps' not in flags.tf_config['cluster'])

  @classmethod
  def Create(cls, flags):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    own = cls.FlagsOf(flags)
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
    split_from = option.SplitSizeFrom(flags)
    device_type, num_devices = local.LocalDevices(
        flags.run_locally, flags.worker_replicas, flags.worker_split_size,
        own.worker_gpus, split_from)
    strategy = None   # An 'evaluator' task: this host's replicas only.
    if task_type in ('worker', 'chief'):
      # In Python first, where signals and lines work: the strategy's start
      # blocks in C++ until every peer answers (peer_wait.py).
      try:
        peer_wait.WaitForTasks(flags.tf_config, ('chief', 'worker'),
                               own.peer_timeout_s, listen=True)
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
                                 flags.worker_split_size, split_from)
    if strategy is None:
      strategy = local.LocalStrategy(cluster)
    return cls(cluster=cluster, strategy=strategy, num_workers=num_workers,
               worker_index=worker_index, task_type=task_type)

  def FinishTogether(self):
    """Every host waits for the others at a barrier, host 0 also until
    their servers are gone (framework/distribute/coordinated_exit.py), so
    no host reads another's normal exit as a crash; an evaluator task
    does not take part."""
    from cadence.framework.distribute import coordinated_exit  # pylint: disable=g-import-not-at-top
    if self.task_type not in ('worker', 'chief'):
      return False
    logging.info('Done; waiting for the other host(s) of this %d-host job '
                 'to finish too before exiting.', self.num_workers)
    coordinated_exit.FinishTogether(self)
    return True
