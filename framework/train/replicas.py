"""Data-parallel replicas of a (pipelined) model on tf.distribute.

A replica that spans a model split of K devices (a pipeline inside it) is
not something tf.distribute's mirrored variables model: a MirroredVariable
keeps one copy per replica on the replica's one device. Cadence keeps one
copy of the task per local replica instead (`BuildReplicas`):

  * replica r's task is built inside `cluster.WithReplica(r)`, so its layers
    put stage s on `DevicesInModelSplit(r)[s]` (variables, forward and
    backward); optimizer slots are created beside their variables. A device
    holds its stage's variables and slots and nothing more;
  * the copies start equal (weights are seeded by their path, which is the
    same in every replica) and stay equal: every copy applies the same
    all-reduced gradients with the same update;
  * corresponding gradients are reduced across the replicas (of every host)
    by tf.distribute's cross-device ops, with one instance per pipeline
    stage over that stage's devices (`StageAllReduce`): stage s's reduction
    runs on, and returns to, stage s's devices, so no device ever holds
    another stage's gradients.

The strategy (`MirroredStrategy` over each replica's first device on one
host, `MultiWorkerMirroredStrategy` across hosts) runs the replicas
(`strategy.run`), distributes the input and reduces the metrics. Measured
on 4 logical CPUs (the probes behind this design): 2 replicas x 2 stages of
per-replica variables reduced this way equal single-device SGD on the
global batch within 6e-8 after 3 steps, with every mode below and across
two MultiWorkerMirroredStrategy processes; the placement log shows each
stage's CollectiveReduceV2 and update on that stage's devices. Reduced by
the strategy's own (lead-device) collectives instead, every stage's
gradients would pass through each replica's first device.

`train.allreduce` picks the cross-device ops (tensorpack's names in
brackets): 'ring' (collective: all-reduce by collective ops, the only one
across hosts), 'nccl' (NCCL, GPUs only), 'hierarchical_copy' (hierarchical
copy, one host), 'one_device' (naive: sum on the first replica's device of
the stage, then broadcast; one host), 'auto' (NCCL on GPUs, else ring).
`train.allreduce_bytes_per_pack` packs gradients into chunks of about that
many bytes (tensorpack's GradientPacker): CommunicationOptions'
bytes_per_pack for collectives, num_packs for NCCL and hierarchical copy.

Example:
  replicas = BuildReplicas(model_params, cluster)        # [task_0, task_1]
  reducer = StageAllReduce(cluster, replicas, 'ring')
  grads = reducer.Mean(per_replica_grads)   # in the cross-replica context
"""
import math

import tensorflow as tf

from cadence.framework import base_model
from cadence.framework import validation
# tf.distribute's collective all-reduce and its key allocator are not
# exported, but they are the engine MirroredStrategy and
# MultiWorkerMirroredStrategy run on; a per-stage instance needs them.
from cadence.framework.train import tf_internals

# Declared beside the knob `train.allreduce`, which every task checks.
ALLREDUCE_MODES = base_model.ALLREDUCE_MODES
# Group keys of a reducer without a strategy's allocator start here.
_STAGE_GROUP_KEY_START = 10000


def _Short(device):
  """'/job:w/replica:0/task:1/device:CPU:2' -> '/device:CPU:2'."""
  spec = tf.DeviceSpec.from_string(device)
  return spec.replace(job=None, replica=None, task=None).to_string()


def CheckAllReduce(mode, bytes_per_pack, num_workers, device_type, where):
  """Raises ValueError if this machine cannot run `mode` (at start-up).

  Args:
    mode: one of ALLREDUCE_MODES.
    bytes_per_pack: int >= 0 (0: no packing).
    num_workers: hosts in the job.
    device_type: 'CPU' or 'GPU' (the replicas' devices).
    where: the params path for messages, e.g. 'task.train'.
  """
  validation.CheckOneOf(where, 'allreduce', mode, ALLREDUCE_MODES)
  validation.CheckInt(where, 'allreduce_bytes_per_pack', bytes_per_pack, 0)
  if mode == 'nccl' and device_type != 'GPU':
    raise validation.Error(
        where, 'allreduce', mode, f'needs GPUs; the replicas run on '
        f'{device_type}s. Use ring, hierarchical_copy, one_device or auto.')
  if num_workers > 1 and mode not in ('auto', 'ring'):
    raise validation.Error(
        where, 'allreduce', mode, f'works within one host; {num_workers} '
        'hosts need ring (collective ops) or auto.')


def StageOfVariable(cluster, replica, var):
  """The pipeline stage of `var` of replica `replica`: its device's index in
  the replica's model split."""
  split = cluster.DevicesInModelSplit(replica)
  device = _Short(var.device)
  for s, d in enumerate(split):
    if _Short(d) == device:
      return s
  raise ValueError(
      f'Replica {replica}: variable {var.name!r} lives on {var.device!r}, '
      f'outside its model split {split}; build each replica inside '
      'cluster.WithReplica(r).')


def BuildReplicas(model_params, cluster, num_replicas=None):
  """One task per local replica, replica r on model split r.

  Args:
    model_params: the model's params (`model_registry.GetParams(...)`).
    cluster: the Cluster; replica r gets `DevicesInModelSplit(r)`.
    num_replicas: local replicas (default: cluster.num_splits).

  Returns:
    The list of tasks; their variables are plain (not distributed) and
    equal across replicas.
  """
  tasks = []
  for r in range(num_replicas or cluster.num_splits):
    with cluster.WithReplica(r) as replica_cluster:
      # What places nothing itself lives on the replica's first device.
      with tf.device(replica_cluster.ReplicaDevices()[0]):
        tasks.append(model_params.Instantiate().task)
  return tasks


def _CrossDeviceOps(mode, devices, group_size, bytes_per_pack, stage_bytes,
                    keys):
  """tf.distribute cross-device ops for one stage's devices."""
  num_packs = max(1, math.ceil(stage_bytes / bytes_per_pack)) if (
      bytes_per_pack) else 1
  if mode == 'one_device':
    return tf.distribute.ReductionToOneDevice(reduce_to_device=devices[0])
  if mode == 'hierarchical_copy':
    return tf.distribute.HierarchicalCopyAllReduce(num_packs=num_packs)
  if mode == 'nccl':
    return tf.distribute.NcclAllReduce(num_packs=num_packs)
  options = tf.distribute.experimental.CommunicationOptions(
      bytes_per_pack=bytes_per_pack,
      implementation=tf.distribute.experimental.CommunicationImplementation.RING
      if mode == 'ring' else
      tf.distribute.experimental.CommunicationImplementation.AUTO)
  return tf_internals.CrossDeviceOps(devices, group_size, options, keys)


class StageAllReduce:
  """Reduces corresponding values of the replicas, stage by stage.

  Args to the constructor:
    cluster: the Cluster of the local replicas.
    tasks: the local replicas' tasks (`BuildReplicas`); the devices of the
      variables at `paths` define the stages.
    paths: the variable paths whose values may be reduced (gradients of the
      trained ones, values of synchronised ones).
    mode: one of ALLREDUCE_MODES ('auto' resolved here).
    bytes_per_pack: pack size in bytes (0: no packing).
    num_workers: hosts; the collective groups span all of them.
    strategy: the strategy running the replicas. TF's collective runtime
      keys every collective by (group, instance) for the whole process, so
      the stage groups take their keys from the strategy's own allocator:
      reducers of one strategy (and the strategy itself) never clash.
  """

  def __init__(self, cluster, tasks, paths, mode='auto', bytes_per_pack=0,
               num_workers=1, strategy=None):
    self._num_local = len(tasks)
    self._num_workers = num_workers
    self._paths = list(paths)
    self._index = {p: i for i, p in enumerate(self._paths)}
    var_maps = [dict(task.vars.FlattenItems()) for task in tasks]
    # Stage of each path, the same in every replica (checked).
    self._stage = []
    for path in self._paths:
      stages = {StageOfVariable(cluster, r, var_maps[r][path])
                for r in range(self._num_local)}
      if len(stages) != 1:
        raise ValueError(f'Variable {path!r} is on different stages in '
                         f'different replicas: {sorted(stages)}.')
      self._stage.append(stages.pop())
    num_stages = cluster.num_devices_per_split
    device_type = tf.DeviceSpec.from_string(cluster.devices[0]).device_type
    if mode == 'auto':
      mode = 'nccl' if device_type == 'GPU' and num_workers == 1 else 'ring'
    self._mode = mode
    # A MirroredStrategy or MultiWorkerMirroredStrategy keeps one (private)
    # allocator; without one, this reducer's own.
    keys = tf_internals.CollectiveKeys(strategy, _STAGE_GROUP_KEY_START)
    self._ops = []
    self.stage_bytes = []
    for s in range(num_stages):
      devices = [cluster.DevicesInModelSplit(r)[s]
                 for r in range(self._num_local)]
      nbytes = sum(
          var_maps[0][p].shape.num_elements() * var_maps[0][p].dtype.size
          for p, st in zip(self._paths, self._stage) if st == s)
      self.stage_bytes.append(nbytes)
      self._ops.append(_CrossDeviceOps(
          mode, devices, self._num_local * num_workers, bytes_per_pack,
          nbytes, keys))

  @property
  def mode(self):
    """The cross-device ops in use ('auto' resolved)."""
    return self._mode

  @property
  def num_local(self):
    """The replicas on this host."""
    return self._num_local

  @property
  def active(self):
    """False when there is one replica in all: nothing to reduce."""
    return self._num_local * self._num_workers > 1

  def Mean(self, strategy, values, paths=None):
    """Means of corresponding values over every replica (of every host)."""
    return self.Reduce(strategy, tf.distribute.ReduceOp.MEAN, values, paths)

  def Reduce(self, strategy, reduce_op, values, paths=None):
    """Reduces corresponding values over every replica (of every host).

    Call it in the cross-replica context of `strategy`.

    Args:
      strategy: the strategy that ran the replicas.
      reduce_op: tf.distribute.ReduceOp.MEAN or SUM.
      values: one per path: the per-replica values `strategy.run` returned
        (a plain tensor with one local replica).
      paths: the paths of `values` (default: the constructor's, in order).

    Returns:
      A list (per local replica) of lists (per path) of reduced tensors,
      each on its replica's stage device.
    """
    paths = self._paths if paths is None else list(paths)
    if len(values) != len(paths):
      raise ValueError(f'StageAllReduce: got {len(values)} values for '
                       f'{len(paths)} paths.')
    if not self.active:
      return [list(values)]
    stage = [self._stage[self._index[p]] for p in paths]
    out = [[None] * len(values) for _ in range(self._num_local)]
    for s, ops in enumerate(self._ops):
      index = [i for i, st in enumerate(stage) if st == s]
      if not index:
        continue
      # One destination for the whole stage (its devices in every replica),
      # so the cross-device ops batch (and pack) the stage's values.
      destination = values[index[0]]
      reduced = ops.batch_reduce(
          reduce_op, [(values[i], destination) for i in index])
      for i, red in zip(index, reduced):
        for r, part in enumerate(strategy.experimental_local_results(red)):
          out[r][i] = part
    return out


def CopyFromFirst(tasks, learners, slots=True):
  """Sets every replica's variables and optimizer state to replica 0's.

  Checkpoints hold one copy (replica 0's); after a restore this makes the
  other copies equal to it again. Eager; each assignment runs on the
  destination variable's device. `slots` False: the slots are each
  copy's own shards (sharded_update.py), left as they are.
  """
  first = dict(tasks[0].vars.FlattenItems())
  first_state = learners[0].checkpointables
  for task, learner in zip(tasks[1:], learners[1:]):
    for path, var in task.vars.FlattenItems():
      var.assign(first[path])
    state = learner.checkpointables
    for path, named in state.slots.items() if slots else ():
      for name, slot in named.items():
        slot.assign(first_state.slots[path][name])
    state.num_updates.assign(first_state.num_updates)


def SyncedVariables(task, on_read):
  """[(path, variable)] of `task`'s variables the replicas combine.

  Args:
    task: a replica's task.
    on_read: True for the ON_READ ones (combined before reads), False for
      the others (combined after every step).
  """
  out = []
  for path, var in task.vars.FlattenItems():
    if var.aggregation == tf.VariableAggregation.NONE:
      continue
    if (var.synchronization == tf.VariableSynchronization.ON_READ) == on_read:
      out.append((path, var))
  return out


def ReplicaValues(variables, before, replica_id):
  """What a replica sends to combine its copies (in the replica context):
  SUM: its increment since `before` (the common value); MEAN: its value;
  ONLY_FIRST_REPLICA: its value on global replica 0, zeros elsewhere (so a
  SUM gives replica 0's value on every host)."""
  out = []
  for var, old in zip(variables, before):
    value = var.read_value()
    if var.aggregation == tf.VariableAggregation.SUM:
      value -= old
    elif var.aggregation == tf.VariableAggregation.ONLY_FIRST_REPLICA:
      value *= tf.cast(tf.equal(replica_id, 0), value.dtype)
    out.append(value)
  return out


def CombineCopies(strategy, reducer, paths, aggregations, sent, before):
  """The combined values of replicas' copies of variables they updated.

  Call it in the cross-replica context, with what `ReplicaValues` sent.

  Args:
    strategy: the strategy that ran the replicas.
    reducer: a StageAllReduce over `paths` (active: several replicas).
    paths: the variables' paths.
    aggregations: their tf.VariableAggregation: MEAN, SUM (`before` plus
      the sum of the replicas' increments), ONLY_FIRST_REPLICA.
    sent: per path, the per-replica values sent.
    before: per path, the per-replica common values before the updates.

  Returns:
    Per local replica, per path, the combined value (the same for all).
  """
  means = [a == tf.VariableAggregation.MEAN for a in aggregations]
  out = [[None] * len(paths) for _ in range(reducer.num_local)]
  for op, is_mean in ((tf.distribute.ReduceOp.MEAN, True),
                      (tf.distribute.ReduceOp.SUM, False)):
    index = [i for i, m in enumerate(means) if m == is_mean]
    if not index:
      continue
    reduced = reducer.Reduce(strategy, op, [sent[i] for i in index],
                             [paths[i] for i in index])
    for j, i in enumerate(index):
      olds = strategy.experimental_local_results(before[i])
      for r in range(reducer.num_local):
        plus = (olds[r] if aggregations[i] == tf.VariableAggregation.SUM
                else 0)
        out[r][i] = reduced[r][j] + plus
  return out
