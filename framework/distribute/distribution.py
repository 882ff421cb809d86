"""The trainer's devices, cluster and tf.distribute strategy, from its flags.

Lingvo's flags say how a job spreads over devices:

  --worker_replicas     data-parallel replicas on this host;
  --worker_split_size   devices per replica (its pipeline stages; default:
                        the experiment's WORKER_SPLIT_SIZE);
  --worker_gpus         GPUs of this host to use (--run_locally=gpu; 0: all);
  TF_CONFIG             several hosts (or --cluster_spec, --task_type and
                        --task_index, which say the same; checked by
                        framework/distribute/tf_config.py).

On CPU (`--run_locally=cpu`) this process gets worker_replicas x
worker_split_size logical CPUs. Replica r runs on devices
[r * S, (r + 1) * S) of the host (S = worker_split_size), stage s of it on
device r * S + s (`cluster.Cluster`). The strategy:

  one replica in all      the default strategy (no tf.distribute overhead);
  several on one host     MirroredStrategy over each replica's first device;
  several hosts           MultiWorkerMirroredStrategy from TF_CONFIG (the
                          same command on every host; the role and index
                          come from TF_CONFIG); 'chief' or worker 0 writes
                          the checkpoints and summaries;
  parameter servers       a TF_CONFIG with a "ps" job: the 'chief' runs
                          ParameterServerStrategy and its coordinator
                          (framework/distribute/ps_programs.py), 'worker'
                          and 'ps' tasks start a tf.distribute.Server and serve
                          (`Setup.server`). One device per worker: no
                          pipeline, one replica.
  --tpu=<name or address> TPUStrategy over the TPU's cores, replicas of
                          worker_split_size cores each, stage s on logical
                          core s (framework/distribute/tpu.py).

Either way the replicas' variables are per-replica copies, and gradients are
reduced stage by stage by tf.distribute's cross-device ops
(framework/train/replicas.py). MultiWorkerMirroredStrategy must exist before any
other TF op, so `Setup` runs first in the trainer.

Example (two hosts, the same command on each):
  TF_CONFIG='{"cluster": {"worker": ["h0:2222", "h1:2222"]},
              "task": {"type": "worker", "index": 0}}' \\
    python trainer.py --model=... --logdir=/shared/run --job=trainer
"""
import dataclasses

import tensorflow as tf

from cadence.framework import cluster as cluster_lib
from cadence.framework.distribute import tf_config
from cadence.framework.distribute import tpu as tpu_lib

TF_CONFIG = tf_config.TF_CONFIG


class SetupError(ValueError):
  """A device or cluster flag that cannot work; the trainer exits 2."""


@dataclasses.dataclass
class Setup:
  """What the trainer runs on: the cluster, the strategy, this host's place.

  Attributes:
    cluster: the Cluster of this host's devices (model splits = replicas).
    strategy: the tf.distribute strategy over the replicas.
    num_workers: hosts training together.
    worker_index: this host's index (0: the chief, which writes); with
      parameter servers, the task's index in its TF_CONFIG job.
    task_type: 'worker' (or 'chief'), or 'ps', 'evaluator' from TF_CONFIG;
      '' for a local run.
    num_ps: parameter servers (0: no parameter-server training).
    server: this task's tf.distribute.Server, for the 'worker' and 'ps'
      tasks of parameter-server training (they only serve); else None.
    tpu: True on a TPU: the strategy replicates the cluster's one model
      split (the logical cores of a replica) over all replicas.
  """
  cluster: cluster_lib.Cluster
  strategy: object
  num_workers: int = 1
  worker_index: int = 0
  task_type: str = ''
  num_ps: int = 0
  server: object = None
  tpu: bool = False

  @property
  def num_local_replicas(self):
    if self.tpu:
      return self.strategy.num_replicas_in_sync
    return self.cluster.num_splits

  @property
  def num_replicas(self):
    return self.num_local_replicas * self.num_workers

  @property
  def is_chief(self):
    if self.num_ps:  # Parameter servers: the coordinator.
      return self.task_type == 'chief'
    return self.worker_index == 0

  def __str__(self):
    if self.num_ps:
      role = ('the chief (coordinator)' if self.task_type == 'chief' else
              f'{self.task_type} {self.worker_index}')
      return (f'parameter-server training (1 chief, {self.num_workers} '
              f'worker(s), {self.num_ps} parameter server(s)): this task is '
              f'{role}')
    where = (f'{self.task_type} {self.worker_index} of {self.num_workers} '
             'hosts' if self.task_type else 'one host')
    return (f'{self.cluster!r}: {self.num_replicas} replica(s) of '
            f'{self.cluster.num_devices_per_split} device(s), {where}')


def ParseClusterSpec(spec, task_type, task_index):
  """Lingvo's `--cluster_spec` ('worker=h:p,h:p@ps=h:p') as a TF_CONFIG dict.

  Raises:
    SetupError: a malformed spec or a task not in it (tf_config.py).
  """
  try:
    return tf_config.ParseClusterSpec(spec, task_type, task_index)
  except tf_config.ConfigError as e:
    raise SetupError(str(e)) from None


def ReadTfConfig(cluster_spec='', task_type='', task_index=0):
  """The multi-host configuration: --cluster_spec, else $TF_CONFIG, else None.

  Returns:
    The TF_CONFIG dict, checked (framework/distribute/tf_config.py), or None
    for a local run.

  Raises:
    SetupError: a configuration that cannot describe a cluster.
  """
  try:
    return tf_config.Read(cluster_spec, task_type, task_index)
  except tf_config.ConfigError as e:
    raise SetupError(str(e)) from None


def _LocalDevices(run_locally, worker_replicas, worker_split_size,
                  worker_gpus):
  """(device_type, number of devices) of this host; makes logical CPUs."""
  need = worker_replicas * worker_split_size
  if run_locally == 'cpu':
    if need > 1:
      cpus = tf.config.list_physical_devices('CPU')
      try:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration()] * need)
      except RuntimeError:  # Already initialised (e.g. inside a test).
        have = len(tf.config.list_logical_devices('CPU'))
        if have < need:
          raise SetupError(
              f'--worker_replicas={worker_replicas} x --worker_split_size='
              f'{worker_split_size} needs {need} logical CPUs; TensorFlow '
              f'already runs with {have}.') from None
    return 'CPU', need
  if run_locally == 'gpu':
    gpus = len(tf.config.list_physical_devices('GPU'))
    usable = min(worker_gpus, gpus) if worker_gpus else gpus
    if not gpus or need > usable:
      raise SetupError(
          f'--run_locally=gpu: --worker_replicas={worker_replicas} x '
          f'--worker_split_size={worker_split_size} needs {need} GPUs; '
          f'{gpus} visible, --worker_gpus={worker_gpus}.')
    return 'GPU', need
  raise SetupError(f"--run_locally={run_locally!r} must be 'cpu' or 'gpu'.")


def Create(run_locally='cpu', worker_replicas=1, worker_split_size=1,
           worker_gpus=0, tf_config=None, tpu='', tpu_zone='', tpu_project=''):
  """Configures devices and creates the strategy; call before any TF op.

  Args:
    run_locally: 'cpu' or 'gpu'.
    worker_replicas: replicas on this host, an int >= 1.
    worker_split_size: devices per replica, an int >= 1.
    worker_gpus: GPUs to use (0: all visible).
    tf_config: the multi-host configuration (`ReadTfConfig`), or None.
    tpu: a TPU's name or grpc address ('': no TPU); with tpu_zone and
      tpu_project (framework/distribute/tpu.py).

  Returns:
    A Setup.

  Raises:
    SetupError: a flag value this machine or cluster cannot run.
  """
  for flag, value in (('worker_replicas', worker_replicas),
                      ('worker_split_size', worker_split_size)):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise SetupError(f'--{flag}={value!r} must be an int >= 1.')
  if tpu:
    return _TpuSetup(tpu, tpu_zone, tpu_project, worker_replicas,
                     worker_split_size, tf_config)
  task_type, num_workers, worker_index = '', 1, 0
  if tf_config is not None:
    task = tf_config['task']
    task_type, worker_index = task.get('type', ''), int(task.get('index', 0))
    jobs = tf_config['cluster']
    if 'ps' in jobs:
      return _ParameterServerSetup(tf_config, run_locally, worker_replicas,
                                   worker_split_size, worker_gpus)
    num_workers = len(jobs.get('chief', [])) + len(jobs.get('worker', []))
    if task_type == 'worker' and 'chief' in jobs:
      worker_index += 1   # The chief is host 0.
    if worker_replicas > 1 and run_locally == 'cpu':
      raise SetupError(
          f'--worker_replicas={worker_replicas} with several hosts on CPU: '
          'MultiWorkerMirroredStrategy runs one replica per host on CPU '
          '(several per host need GPUs); use --worker_replicas=1.')
  device_type, num_devices = _LocalDevices(run_locally, worker_replicas,
                                           worker_split_size, worker_gpus)
  if tf_config is not None and task_type in ('worker', 'chief'):
    # Before any other op: the strategy starts this host's server.
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(tf_config['cluster']), task_type=task_type,
        task_id=int(tf_config['task'].get('index', 0)), rpc_layer='grpc')
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        cluster_resolver=resolver,
        communication_options=tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation
            .AUTO))
  else:
    strategy = None
  try:
    cluster = cluster_lib.Cluster.Params().Set(
        device_type=device_type, num_devices=num_devices,
        worker_split_size=worker_split_size).Instantiate()
  except ValueError as e:
    raise SetupError(str(e)) from None
  if strategy is None:
    if cluster.num_splits == 1:
      strategy = tf.distribute.get_strategy()
    else:
      strategy = tf.distribute.MirroredStrategy(
          devices=[devices[0] for devices in cluster.split_devices])
  return Setup(cluster=cluster, strategy=strategy, num_workers=num_workers,
               worker_index=worker_index, task_type=task_type)


def _ParameterServerSetup(tf_config, run_locally, worker_replicas,
                          worker_split_size, worker_gpus):
  """The Setup of a task of a TF_CONFIG with a "ps" job."""
  jobs = tf_config['cluster']
  task_type = tf_config['task'].get('type', '')
  index = int(tf_config['task'].get('index', 0))
  if len(jobs.get('chief', [])) != 1 or not jobs.get('worker'):
    raise SetupError(
        'TF_CONFIG with a "ps" job (parameter-server training) needs one '
        '"chief" (the coordinator) and at least one "worker"; it has '
        f'{", ".join(f"{len(v)} {k!r}" for k, v in jobs.items())}.')
  if task_type not in ('chief', 'worker', 'ps'):
    raise SetupError(
        f'TF_CONFIG task type {task_type!r}: parameter-server training runs '
        "'chief', 'worker' and 'ps' tasks; run evaler and decoder jobs "
        'without TF_CONFIG.')
  if worker_replicas != 1 or worker_split_size != 1:
    raise SetupError(
        'Parameter-server training (TF_CONFIG with a "ps" job) runs one '
        'replica of one device per worker, without a pipeline: '
        f'--worker_replicas={worker_replicas} and --worker_split_size='
        f'{worker_split_size} (default: the experiment\'s WORKER_SPLIT_SIZE) '
        'must both be 1. Pipelined models train on several hosts with '
        'MultiWorkerMirroredStrategy (TF_CONFIG without "ps").')
  device_type, num_devices = _LocalDevices(run_locally, 1, 1, worker_gpus)
  spec = tf.train.ClusterSpec(jobs)
  server = strategy = None
  if task_type == 'chief':
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        tf.distribute.cluster_resolver.SimpleClusterResolver(
            spec, task_type='chief', task_id=0, rpc_layer='grpc'))
  else:
    server = tf.distribute.Server(spec, job_name=task_type,
                                  task_index=index, protocol='grpc',
                                  start=True)
  cluster = cluster_lib.Cluster.Params().Set(
      device_type=device_type, num_devices=num_devices).Instantiate()
  return Setup(cluster=cluster, strategy=strategy,
               num_workers=len(jobs['worker']),
               worker_index=index,
               task_type=task_type, num_ps=len(jobs['ps']), server=server)


def _TpuSetup(tpu, zone, project, worker_replicas, worker_split_size,
              tf_config):
  """The Setup of a TPU run (--tpu)."""
  if tf_config is not None:
    raise SetupError(f'--tpu={tpu!r} with $TF_CONFIG or --cluster_spec: a '
                     'TPU run takes its hosts from the TPU; drop one.')
  if worker_replicas != 1:
    raise SetupError(
        f'--tpu={tpu!r} with --worker_replicas={worker_replicas}: on a TPU '
        'the replicas are its cores / --worker_split_size; leave '
        '--worker_replicas at 1.')
  try:
    strategy, devices = tpu_lib.Connect(tpu, zone, project, worker_split_size)
  except tpu_lib.TpuError as e:
    raise SetupError(str(e)) from None
  cluster = cluster_lib.Cluster.Params().Set(
      devices=devices, device_type='TPU',
      worker_split_size=worker_split_size).Instantiate()
  return Setup(cluster=cluster, strategy=strategy, tpu=True)
