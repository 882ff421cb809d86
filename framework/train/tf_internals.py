"""TensorFlow's internals that the gradient sync runs on, behind one adapter.

tf.distribute's public API runs a collective over a strategy's replicas,
each on its one device. A replica that spans pipeline stages needs one
collective group per stage instead (that stage's device in every replica,
framework/train/replicas.py), and the sharded update needs an all-gather of
equal shards and an all-reduce of one device's norm
(framework/train/sharded_update.py). TensorFlow exports neither, though
MirroredStrategy and MultiWorkerMirroredStrategy run on both. A checkpoint
of sharded slots writes each slot whole under an unsharded slot's key, which
needs a Trackable's serialisation hooks. This module is the only one of the
gradient sync that imports `tensorflow.python` (tests/framework/train/
tf_internals_test.py holds the tree to that): a TensorFlow release that
moves these is fixed here.

  CollectiveKeys(strategy, start)
                the collective key allocator of `strategy`, or a new one;
  GroupKey(keys, devices)
                the group key of a collective over `devices`;
  CrossDeviceOps(devices, group_size, options, keys)
                tf.distribute's collective all-reduce over `devices` (a
                `tf.distribute.CrossDeviceOps`: batch_reduce, ...);
  Launcher(group_key, group_size, keys, device, options)
                one device's collectives: AllReduce (sum), AllGather;
  Trackable, VARIABLE_VALUE_KEY
                what an object that checkpoints a tensor of its own
                subclasses, and the key it saves the tensor under.

Example:
  keys = CollectiveKeys(strategy, 20000)
  group = GroupKey(keys, ['/device:CPU:0', '/device:CPU:2'])
  launcher = Launcher(group, 2, keys, '/device:CPU:0',
                      tf.distribute.experimental.CommunicationOptions())
  rows = launcher.AllGather(shard)      # in a tf.function, on CPU:0
"""
# pylint: disable=g-direct-tensorflow-import
from tensorflow.python.distribute import cross_device_ops
from tensorflow.python.distribute import cross_device_utils
from tensorflow.python.trackable import base as trackable_base
# pylint: enable=g-direct-tensorflow-import

Trackable = trackable_base.Trackable
VARIABLE_VALUE_KEY = trackable_base.VARIABLE_VALUE_KEY


def CollectiveKeys(strategy, group_key_start):
  """The collective key allocator of `strategy` (MirroredStrategy and
  MultiWorkerMirroredStrategy keep one, privately), else a new one whose
  group keys start at `group_key_start`.

  TF's collective runtime keys every collective by (group, instance) for
  the whole process, so the groups of one strategy take their keys from its
  allocator: they never clash with each other or with the strategy's own.
  """
  keys = getattr(getattr(strategy, 'extended', None), '_collective_keys',
                 None)
  return keys or cross_device_utils.CollectiveKeys(
      group_key_start=group_key_start)


def GroupKey(keys, devices):
  """The group key of a collective over `devices` (a list of device
  strings), from the allocator `keys`: the same devices, the same key."""
  return keys.get_group_key(devices)


def CrossDeviceOps(devices, group_size, options, keys):
  """tf.distribute's collective all-reduce over `devices` (this host's),
  in a group of `group_size` devices over every host.

  Args:
    devices: this host's devices of the group, one per local replica.
    group_size: the group's devices over every host.
    options: a tf.distribute.experimental.CommunicationOptions.
    keys: the allocator (`CollectiveKeys`).

  Returns:
    A tf.distribute.CrossDeviceOps (`batch_reduce`, `reduce`).
  """
  return cross_device_ops.CollectiveAllReduce(
      devices=devices, group_size=group_size, options=options,
      collective_keys=keys)


class Launcher:
  """One device's collectives in a group: what tf.distribute's collective
  all-reduce launches on each device, with its equal-shape all-gather.

  Args:
    group_key: the group's key (`GroupKey`).
    group_size: the group's devices over every host.
    keys: the allocator (`CollectiveKeys`) that hands out instance keys.
    device: this device.
    options: a tf.distribute.experimental.CommunicationOptions.
  """

  def __init__(self, group_key, group_size, keys, device, options):
    self._launcher = cross_device_utils.CollectiveReplicaLauncher(
        group_key, group_size, keys, device, options)

  def AllReduce(self, x):
    """The sum of the group's `x` (one shape on every device)."""
    return self._launcher.all_reduce(x)

  def AllGather(self, x):
    """The group's `x` (one shape on every device) concatenated on axis 0,
    in the order TensorFlow ranks the group's devices."""
    return self._launcher._all_gather(x, None)  # pylint: disable=protected-access
