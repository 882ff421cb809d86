"""The trainer's devices, cluster and strategy: the registry of options.

Lingvo's flags say how a job spreads over devices:

  --worker_replicas     data-parallel replicas on this host;
  --worker_split_size   devices per replica (its pipeline stages; default:
                        the experiment's WORKER_SPLIT_SIZE);
  --worker_gpus         GPUs of this host to use (--run_locally=gpu; 0: all);
  TF_CONFIG             several hosts (or --cluster_spec, --task_type and
                        --task_index, which say the same; checked by
                        framework/distribute/tf_config.py);
  --peer_timeout_s      with TF_CONFIG, the longest wait for the peer
                        tasks before the strategy starts (peer_wait.py);
  --tpu                 a Cloud TPU (with --tpu_zone, --tpu_project).

A *distribution option* turns them into devices, a cluster and a
tf.distribute strategy, and says how the trainer runs on them (its train
program, the tasks that only serve, how the hosts agree to stop): a
`option.Setup` subclass in a module of its own (framework/distribute/
option.py says what it holds). The registry below lists the options in the
order they are tried; `Create` runs the first whose `Applies(flags)` holds:

  tpu               --tpu=<name or address>: TPUStrategy over the TPU's
                    cores, replicas of worker_split_size cores each, stage
                    s on logical core s (tpu.py, tpu_programs.py);
  parameter_server  a TF_CONFIG with a "ps" job: the 'chief' runs
                    ParameterServerStrategy and its coordinator, 'worker'
                    and 'ps' tasks serve (parameter_server.py,
                    ps_programs.py);
  multi_worker      a TF_CONFIG without one: MultiWorkerMirroredStrategy,
                    the same command on every host (multi_worker.py);
  local             this host alone: the default strategy for one replica,
                    MirroredStrategy over several (local.py).

Either way the replicas' variables are per-replica copies, and gradients are
reduced stage by stage by tf.distribute's cross-device ops
(framework/train/replicas.py). MultiWorkerMirroredStrategy must exist before
any other TF op, so `Create` runs first in the trainer.

Adding an option is one module and one registry line: a Setup subclass
with its name, `Applies` and `Create` (and whatever it runs differently:
`TrainProgram`, `CheckJob`, `Serve`...; the base class's defaults are
synchronous data parallelism), and a `Register` line below, before the
options it must win over. A toy: one replica on this host's first CPU,
under the default strategy and the plain train program, chosen instead of
`local` when the flags ask for one device (tests/framework/distribute/
distribution_test.py registers and trains it):

  class OneDeviceSetup(option.Setup):
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

  Register(OneDeviceSetup, before='local')

Example (two hosts, the same command on each):
  TF_CONFIG='{"cluster": {"worker": ["h0:2222", "h1:2222"]},
              "task": {"type": "worker", "index": 0}}' \\
    python trainer.py --model=... --logdir=/shared/run --job=trainer
"""
from cadence.framework.distribute import local
from cadence.framework.distribute import multi_worker
from cadence.framework.distribute import option
from cadence.framework.distribute import parameter_server
from cadence.framework.distribute import peer_wait
from cadence.framework.distribute import tf_config
from cadence.framework.distribute import tpu

TF_CONFIG = tf_config.TF_CONFIG
Flags = option.Flags
Setup = option.Setup
SetupError = option.SetupError
# SIGTERM/SIGINT while a host waited for its peers; nothing was built.
Stopped = peer_wait.Stopped
PEER_TIMEOUT_S = peer_wait.DEFAULT_TIMEOUT_S


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


# --- the registry ------------------------------------------------------------

_OPTIONS = []   # Setup subclasses, in the order they are tried.


def Register(setup_cls, before=None):
  """Adds the option `setup_cls` (a Setup subclass) to the registry.

  Args:
    setup_cls: the option; its `name` must be new.
    before: the name of an option it is tried before (None: after all).
  """
  if not setup_cls.name or setup_cls.name in Names():
    raise ValueError(f'Distribution option {setup_cls.__name__}: name '
                     f'{setup_cls.name!r} is empty or registered already.')
  _OPTIONS.insert(len(_OPTIONS) if before is None else _Index(before),
                  setup_cls)


def Unregister(name):
  """Removes option `name` from the registry (for tests)."""
  del _OPTIONS[_Index(name)]


def _Index(name):
  if name not in Names():
    raise KeyError(f'Distribution option {name!r}; expected one of '
                   f'{list(Names())}.')
  return Names().index(name)


def Names():
  """The registered options' names, in the order they are tried."""
  return tuple(cls.name for cls in _OPTIONS)


def Choose(flags):
  """The option (Setup subclass) that runs `flags`: the first that applies.

  Raises:
    SetupError: none applies.
  """
  for setup_cls in _OPTIONS:
    if setup_cls.Applies(flags):
      return setup_cls
  raise SetupError(f'No distribution option runs {flags}; the options are '
                   f'{", ".join(Names())}.')


# The options, in the order they are tried: one line each.
Register(tpu.TpuSetup)
Register(parameter_server.ParameterServerSetup)
Register(multi_worker.MultiWorkerSetup)
Register(local.LocalSetup)


def Create(run_locally='cpu', worker_replicas=1, worker_split_size=1,
           worker_gpus=0, tf_config=None, tpu='', tpu_zone='', tpu_project='',
           peer_timeout_s=peer_wait.DEFAULT_TIMEOUT_S):
  """Configures devices and creates the strategy; call before any TF op.

  Args:
    run_locally: 'cpu' or 'gpu'.
    worker_replicas: replicas on this host, an int >= 1.
    worker_split_size: devices per replica, an int >= 1.
    worker_gpus: GPUs to use (0: all visible).
    tf_config: the multi-host configuration (`ReadTfConfig`), or None.
    tpu: a TPU's name or grpc address ('': no TPU); with tpu_zone and
      tpu_project (framework/distribute/tpu.py).
    peer_timeout_s: with tf_config, the longest wait for the peers the
      strategy needs before it starts (peer_wait.py); 0: no limit.

  Returns:
    The Setup of the option that applies (`Choose`).

  Raises:
    SetupError: a flag value this machine or cluster cannot run, or a peer
      that never accepted a connection within peer_timeout_s.
    Stopped: SIGTERM or SIGINT while waiting for the peers.
  """
  for flag, value in (('worker_replicas', worker_replicas),
                      ('worker_split_size', worker_split_size)):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise SetupError(f'--{flag}={value!r} must be an int >= 1.')
  flags = Flags(run_locally=run_locally, worker_replicas=worker_replicas,
                worker_split_size=worker_split_size, worker_gpus=worker_gpus,
                tf_config=tf_config, tpu=tpu, tpu_zone=tpu_zone,
                tpu_project=tpu_project, peer_timeout_s=peer_timeout_s)
  return Choose(flags).Create(flags)
