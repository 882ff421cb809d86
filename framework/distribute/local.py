"""The `local` option: one or several replicas on this host alone.

This host gets worker_replicas x worker_split_size devices (`LocalDevices`:
logical CPUs with --run_locally=cpu, GPUs with gpu). Replica r runs on
devices [r * S, (r + 1) * S) of the host (S = worker_split_size), stage s
of it on device r * S + s (`cluster.Cluster`). The strategy:

  one replica      the default strategy (no tf.distribute overhead);
  several          MirroredStrategy over each replica's first device.

It applies when no other option does (no --tpu, no TF_CONFIG): the last
line of the registry. Its flag, --worker_gpus (`LocalFlags`), is read by
the multi-host options too, which make each host's devices as this one
does (`LocalDevices`): their FLAGS extend LocalFlags
(multi_worker.MultiHostFlags).

TensorFlow is imported by the functions that use it, not with the module:
the registry and the options' flags are read before it loads (trainer.py).

Example:
  setup = LocalSetup.Create(option.Flags(worker_replicas=2))
  setup.strategy   # MirroredStrategy over /cpu:0 and /cpu:1
"""
import dataclasses

from cadence.framework.distribute import flag_fields
from cadence.framework.distribute import option


@dataclasses.dataclass
class LocalFlags:
  """The `local` option's own flags (the multi-host options' too)."""
  worker_gpus: int = flag_fields.Flag(
      0, 'GPUs to use with --run_locally=gpu (0: all visible).')


def MakeLogicalCpus(need, what):
  """Cuts this host's CPU into `need` logical CPUs, /device:CPU:0 to
  /device:CPU:<need - 1>, before TensorFlow makes its devices (one CPU
  needs nothing). Options that train on chosen CPUs call it from `Create`.

  Args:
    need: an int >= 1.
    what: the flags that ask for them, for the error, e.g.
      '--one_device_cpu=3'.

  Raises:
    option.SetupError: TensorFlow made its devices already, fewer of them
      (e.g. in a test process).
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if need <= 1:
    return
  cpus = tf.config.list_physical_devices('CPU')
  try:
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration()] * need)
  except RuntimeError:  # Already initialised (e.g. inside a test).
    have = len(tf.config.list_logical_devices('CPU'))
    if have < need:
      raise option.SetupError(
          f'{what} needs {need} logical CPUs; TensorFlow already runs with '
          f'{have}.') from None


def LocalDevices(run_locally, worker_replicas, worker_split_size,
                 worker_gpus, split_size_from=''):
  """(device_type, number of devices) of this host; makes logical CPUs.

  Raises:
    option.SetupError: the devices are not there (naming the split size
      as `split_size_from` says where it came from: option.SplitSizeFrom).
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  need = worker_replicas * worker_split_size
  split = split_size_from or f'--worker_split_size={worker_split_size}'
  if run_locally == 'cpu':
    MakeLogicalCpus(need, f'--worker_replicas={worker_replicas} x {split}')
    return 'CPU', need
  if run_locally == 'gpu':
    gpus = len(tf.config.list_physical_devices('GPU'))
    usable = min(worker_gpus, gpus) if worker_gpus else gpus
    if not gpus or need > usable:
      raise option.SetupError(
          f'--run_locally=gpu: --worker_replicas={worker_replicas} x '
          f'{split} needs {need} GPUs; {gpus} visible, --worker_gpus='
          f'{worker_gpus}.')
    return 'GPU', need
  raise option.SetupError(
      f"--run_locally={run_locally!r} must be 'cpu' or 'gpu'.")


def LocalCluster(device_type, num_devices, worker_split_size,
                 split_size_from=''):
  """The Cluster of this host's devices, in replicas of worker_split_size
  (`split_size_from`: where it came from, which layout errors name).

  Raises:
    option.SetupError: the devices do not cut into such replicas.
  """
  from cadence.framework import cluster as cluster_lib  # pylint: disable=g-import-not-at-top
  try:
    return cluster_lib.Cluster.Params().Set(
        device_type=device_type, num_devices=num_devices,
        worker_split_size=worker_split_size,
        split_size_from=split_size_from).Instantiate()
  except ValueError as e:
    raise option.SetupError(str(e)) from None


def LocalStrategy(cluster):
  """The default strategy for one replica, else MirroredStrategy over each
  replica's first device."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if cluster.num_splits == 1:
    return tf.distribute.get_strategy()
  return tf.distribute.MirroredStrategy(
      devices=[devices[0] for devices in cluster.split_devices])


class LocalSetup(option.Setup):
  """Replicas on this host alone; see the module docstring."""

  name = 'local'
  FLAGS = LocalFlags
  CHOSEN_BY = 'this host alone: no --tpu, TF_CONFIG or --cluster_spec'

  @classmethod
  def CheckFlags(cls, own):
    option.CheckNumber('worker_gpus', own.worker_gpus, 0,
                       'GPUs to use; 0: all visible', integer=True)

  @classmethod
  def Applies(cls, flags):
    return flags.tf_config is None   # After tpu: no --tpu.

  @classmethod
  def Create(cls, flags):
    split_from = option.SplitSizeFrom(flags)
    device_type, num_devices = LocalDevices(
        flags.run_locally, flags.worker_replicas, flags.worker_split_size,
        cls.FlagsOf(flags).worker_gpus, split_from)
    cluster = LocalCluster(device_type, num_devices, flags.worker_split_size,
                           split_from)
    return cls(cluster=cluster, strategy=LocalStrategy(cluster))
