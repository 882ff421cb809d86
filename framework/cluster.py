"""Cluster: which devices the model uses, grouped into model splits.

A *model split* is the group of devices that together hold one copy of the
model: a pipelined model puts its stages on the K devices of a split. With
N devices and `worker_split_size` K, there are N / K splits, and each split
is one data-parallel replica (Lingvo's split id): replica r runs on
`DevicesInModelSplit(r)`, stage s of it on the split's device s.

The cluster also knows the *current replica*: `cluster.WithReplica(r)` is
the same cluster with replica r current, and layers built or run inside
`with cluster.WithReplica(r):` place themselves on `ReplicaDevices()`, the
devices of replica r (replica 0 when none was chosen).

Every local device is checked when the cluster is built: a device that
does not exist here is an error then, not a hang at the first step.

The current cluster is scoped, never a hidden global that FProp mutates:
`with cluster:` makes it `Cluster.Current()` for the code inside, and the
previous one comes back on exit. The scopes form a stack kept on the class
(`Cluster._stack`), shared by all threads of the process; enter and exit
them from the thread that builds the model. Outside every scope,
`Cluster.Current()` is a one-device cluster on '/device:CPU:0'.

Example:
  p = Cluster.Params().Set(device_type='CPU', num_devices=4,
                           worker_split_size=2)
  cluster = p.Instantiate()
  cluster.num_splits                      # 2
  cluster.WorkerDeviceInModelSplit(1)     # '/device:CPU:1'
  cluster.DevicesInModelSplit(1)          # ['/device:CPU:2', '/device:CPU:3']
  with cluster:
    assert Cluster.Current() is cluster
    layer = PipeliningLayer.Params().Set(...).Instantiate()
  with cluster.WithReplica(1):
    Cluster.Current().ReplicaDevices()    # ['/device:CPU:2', '/device:CPU:3']
"""
import contextlib
import copy
import os
import re

import tensorflow as tf

from cadence.framework import hyperparams

LOGICAL_CORE_TYPE = 'TPU_REPLICATED_CORE'
_LOGICAL_CORE_RE = re.compile(rf'/device:{LOGICAL_CORE_TYPE}:(\d+)$')


def LogicalCore(index):
  """The device string of logical core `index` of every replica."""
  return f'/device:{LOGICAL_CORE_TYPE}:{index}'


def LogicalCoreIndex(device):
  """The logical core index of a `LogicalCore` device string, else None."""
  match = _LOGICAL_CORE_RE.search(device or '')
  return int(match.group(1)) if match else None


def LogicalCoreScope(index):
  """Places variables and ops on logical core `index` of each replica.

  Under a TPUStrategy: its `experimental_logical_device(index)`. Under any
  other strategy (a TPU cluster used off a TPU) there is one core: a no-op
  scope.
  """
  strategy = tf.distribute.get_strategy()
  if isinstance(strategy, tf.distribute.TPUStrategy):
    return strategy.extended.experimental_logical_device(index)
  return contextlib.nullcontext()


def DeviceLabel(device):
  """How a log line names `device`: as it is, but a TPU replica's logical
  core off a TPUStrategy (where it places nothing, LogicalCoreScope) as
  'no device (unplaced)', e.g. an export's graph, which the loading process
  places."""
  if (LogicalCoreIndex(device) is not None and not isinstance(
      tf.distribute.get_strategy(), tf.distribute.TPUStrategy)):
    return 'no device (unplaced)'
  return device


def DeviceScope(device):
  """`tf.device(device)`, or a no-op scope for None (the device in scope).

  The one placement helper: layers place their variables and ops with it,
  on the devices the current Cluster gives them. A TPU logical core
  (`LogicalCore(s)`, the stages of a TPU replica) is placed through the
  TPUStrategy (`LogicalCoreScope`).
  """
  if not device:
    return contextlib.nullcontext()
  core = LogicalCoreIndex(device)
  if core is not None:
    return LogicalCoreScope(core)
  return tf.device(device)


def BesideVariable(var):
  """The scope that creates variables beside `var` (its optimizer slots, its
  EMA copy): `tf.device(var.device)`, or under a ParameterServerStrategy's
  or TPUStrategy's scope, colocation with `var` (those strategies place
  variables by colocation and ignore tf.device)."""
  strategy = tf.distribute.get_strategy()
  if tf.distribute.has_strategy() and isinstance(
      strategy, (tf.distribute.experimental.ParameterServerStrategy,
                 tf.distribute.TPUStrategy)):
    return strategy.extended.colocate_vars_with(var)
  return tf.device(var.device)


def _Canonical(device):
  """'/cpu:0' -> '/device:CPU:0' (job/replica/task kept as given)."""
  return tf.DeviceSpec.from_string(device).to_string()


class Cluster:
  """Devices grouped into model splits; see the module docstring."""

  _stack = []   # The scoped "current cluster" stack (`with cluster:`).

  @classmethod
  def Params(cls):
    p = hyperparams.InstantiableParams(cls)
    p.Define('devices', None, 'Explicit list of device strings, e.g. '
             "['/device:CPU:0', '/device:CPU:1']; None builds the list from "
             'job, device_type and num_devices.')
    p.Define('job', '', "Job name, e.g. 'worker'; '' for the local process.")
    p.Define('task', 0, 'Task index within the job (with job set).')
    p.Define('device_type', 'CPU', "Device type: 'CPU', 'GPU' or 'TPU'.")
    p.Define('num_devices', None, 'Number of devices of device_type; None '
             'means every logical device of that type visible here.')
    p.Define('worker_split_size', 1, 'Devices per model split, i.e. the '
             'number of pipeline stages one model copy spans.')
    p.Define('split_size_from', '', 'Where worker_split_size came from, as '
             "layout errors name it: the flag as typed ('--worker_split_size"
             "=4') or the experiment's knob (\"the experiment's "
             "WORKER_SPLIT_SIZE=2\"); '': they say nothing of it.")
    return p

  @classmethod
  def Current(cls):
    """The innermost `with cluster:` cluster, else the default CPU one."""
    if cls._stack:
      return cls._stack[-1]
    return cls.Params().Set(devices=['/device:CPU:0']).Instantiate()

  def __init__(self, params):
    p = params.Copy()
    p.Freeze()
    self._params = p
    devices = p.devices
    if devices is None:
      devices = self._DevicesFromType(p)
    if not devices:
      raise ValueError('Cluster: the device list is empty; set devices or '
                       'a num_devices >= 1 of an available device_type.')
    self._devices = [_Canonical(d) for d in devices]
    if len(set(self._devices)) != len(self._devices):
      raise ValueError(f'Cluster: devices={self._devices} lists a device '
                       'twice.')
    size = p.worker_split_size
    if not isinstance(size, int) or size < 1 or len(self._devices) % size:
      raise ValueError(
          f'Cluster: worker_split_size={size!r} must be an int >= 1 that '
          f'divides the number of devices {len(self._devices)}.')
    self._CheckLocalDevicesExist()
    self._replica = 0

  def _CheckLocalDevicesExist(self):
    """Raises ValueError naming any local device that TF does not have."""
    local = {}
    for device in tf.config.list_logical_devices():
      spec = tf.DeviceSpec.from_string(device.name)
      local[spec.replace(job=None, replica=None, task=None).to_string()] = True
    for device in self._devices:
      spec = tf.DeviceSpec.from_string(device)
      if spec.job not in (None, 'localhost'):
        continue  # A remote device: its own process checks it.
      if spec.device_type == LOGICAL_CORE_TYPE:
        continue  # A TPU replica's logical core: the TPUStrategy's.
      short = spec.replace(job=None, replica=None, task=None).to_string()
      if short not in local:
        raise ValueError(
            f'Cluster: device {device!r} does not exist in this process; '
            f'the devices are {sorted(local)}. On CPU, --run_locally=cpu '
            'creates --worker_replicas x --worker_split_size logical CPUs.')

  @staticmethod
  def _DevicesFromType(p):
    dtype = p.device_type.upper()
    n = p.num_devices
    if n is None:
      if p.job:
        raise ValueError(f"Cluster: job={p.job!r} needs num_devices (the "
                         'devices of a remote job cannot be listed here).')
      n = len(tf.config.list_logical_devices(dtype))
    if not isinstance(n, int) or n < 1:
      raise ValueError(f'Cluster: num_devices={n!r} must be an int >= 1 '
                       f'(device_type={dtype!r}).')
    prefix = f'/job:{p.job}/replica:0/task:{p.task}' if p.job else ''
    return [f'{prefix}/device:{dtype}:{i}' for i in range(n)]

  # --- scoping ---------------------------------------------------------------

  def __enter__(self):
    Cluster._stack.append(self)
    return self

  def __exit__(self, *unused_exc):
    if not Cluster._stack or Cluster._stack[-1] is not self:
      raise RuntimeError('Cluster: scopes must be exited in the reverse '
                         'order they were entered.')
    Cluster._stack.pop()

  # --- accessors -------------------------------------------------------------

  @property
  def params(self):
    return self._params

  @property
  def devices(self):
    """Every device, in order; split r holds devices[r*K:(r+1)*K]."""
    return list(self._devices)

  @property
  def num_devices_per_split(self):
    return self._params.worker_split_size

  @property
  def split_size_from(self):
    """Where the model split's size came from, for layout errors (e.g.
    '--worker_split_size=4'); '' when not said."""
    return self._params.split_size_from

  @property
  def num_splits(self):
    return len(self._devices) // self.num_devices_per_split

  @property
  def split_devices(self):
    """List (per split) of the split's device lists."""
    return [self.DevicesInModelSplit(s) for s in range(self.num_splits)]

  @property
  def replica(self):
    """The current replica (model split) index; 0 unless chosen."""
    return self._replica

  def WithReplica(self, replica):
    """This cluster with `replica` current; enter it with `with`."""
    if not 0 <= replica < self.num_splits:
      raise ValueError(f'Cluster: replica={replica} is out of range; there '
                       f'are {self.num_splits} model splits.')
    view = copy.copy(self)
    view._replica = replica  # pylint: disable=protected-access
    return view

  def ReplicaDevices(self):
    """The devices of the current replica: one per pipeline stage."""
    return self.DevicesInModelSplit(self._replica)

  def DevicesInModelSplit(self, split=0):
    """The devices of model split `split`."""
    if not 0 <= split < self.num_splits:
      raise ValueError(f'Cluster: split={split} is out of range; there are '
                       f'{self.num_splits} model splits.')
    size = self.num_devices_per_split
    return self._devices[split * size:(split + 1) * size]

  def WorkerDeviceInModelSplit(self, device_index, split=0):
    """Device `device_index` (0 .. num_devices_per_split-1) of a split."""
    size = self.num_devices_per_split
    if not 0 <= device_index < size:
      raise ValueError(
          f'Cluster: device_index={device_index} is out of range; a model '
          f'split has num_devices_per_split={size} devices.')
    return self.DevicesInModelSplit(split)[device_index]

  def __repr__(self):
    return (f'Cluster(devices={self._devices}, '
            f'num_devices_per_split={self.num_devices_per_split})')


def HostMemoryBytes():
  """This host's physical memory in bytes."""
  return os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE')
