"""Optimizer state sharded over the replicas of each stage (ZeRO-1).

With `learner.shard_optimizer_state`, each of the R data-parallel replicas
(of every host) keeps 1/R of every optimizer slot instead of a whole copy:
replica r holds shard r of each trained variable's slots, flat, c =
ceil(N / R) of its N elements (optimizer.ShardSize; the last shard is
zero-padded, so every replica's collectives take one shape). The weights
stay whole on every replica. One step, per pipeline stage (its device in
every replica forms one collective group, as for the all-reduce,
replicas.py), in the cross-replica context:

  1. all-reduce: the stage's gradients are mean-reduced by the unsharded
     step's own all-reduce (replicas.StageAllReduce: its mode, its packs),
     so the mean gradient has the same bits as unsharded at every R;
  2. shard: each replica keeps its shard of each variable's mean gradient,
     c elements of it flat (the last zero-padded);
  3. the global norm: each replica's sum of squares over its shards (in
     float64, as learner.GlobalNorm), all-reduced; clipping and the skip
     read it, as unsharded;
  4. update: each replica applies the rule to its shard of the weights and
     its slot shards (learner.ShardStep, ApplyShard; a skipped step changes
     nothing), a stage's packs one after the other;
  5. all-gather: the stage's updated shards, gathered, are every replica's
     new weights.

What a device holds at the update: the all-reduced gradient (as
unsharded), then the gathered [R, c] of each variable (a pack's
concatenation adds one more); the rule runs as TensorFlow's ops, which
round as the unsharded step's fused kernels do (optimizer._ShardRule says
why not XLA), holding a few shard-sized buffers while it runs, and returns
the new weight shard. So the update needs about what the unsharded one
needs, and (R-1)/R of the slots less all the time.

Exact: a sharded step's weights and slots equal the unsharded step's bit
for bit (the same mean gradient, the same norm, the same rule's rounding;
an embedding's sparse gradient is summed dense before the all-reduce,
gradient_sync.OnDevice). The price is the wire: an all-reduce sends 2(R-1)/R
of the gradient where a reduce-scatter would send (R-1)/R, so a step moves
3(R-1)/R of the stage's bytes instead of 2(R-1)/R. A reduce-scatter sums
each shard's R parts in another order than the all-reduce's ring does,
and Adam with a small epsilon turns a last-bit difference into a
different update wherever a gradient is near zero: the Tiny LM with 4
replicas drifted apart by 1e-4 (relative) within 2 steps.

Checkpoints hold whole slots, under the keys an unsharded run writes
(`ShardedSlot`): a checkpoint written with R replicas resumes with any
other R, sharded or not, and export reads it unchanged. On one host every
shard is local, and a save concatenates them; across hosts the chief
writes, so before a save every host gathers the slots (`GatherForSave`,
which the runner's CombineOnRead runs on every host before a checkpoint).

Example:
  update = ShardedUpdate(state, strategy, cluster)
  means = reducer.Mean(strategy, per_replica_grads)     # cross-replica
  stats = update.Apply(step, means, loss)
"""
import tensorflow as tf

from cadence.framework import learner as learner_lib
from cadence.framework import optimizer as optimizer_lib
from cadence.framework.nested_map import NestedMap
from cadence.framework.train import replicas
# The collectives tf.distribute's all-reduce runs on, with the all-gather
# the sharded step needs, and a Trackable's checkpoint hooks.
from cadence.framework.train import tf_internals

_GROUP_KEY_START = 20000   # Without a strategy's key allocator.


def _DeviceOrder(device):
  """The order TensorFlow ranks a collective group's devices in."""
  spec = tf.DeviceSpec.from_string(device)
  return (spec.job or '', spec.replica or 0, spec.task or 0,
          spec.device_type or '', spec.device_index or 0)


def NumShards(strategy):
  """R: the replicas a sharded slot is cut over (every host's)."""
  return strategy.num_replicas_in_sync


class ShardedSlot(tf_internals.Trackable):
  """One slot of one variable, held as this host's shards, checkpointed
  whole under the key of an unsharded slot variable.

  Args:
    shards: the local replicas' shard variables (flat, c elements each).
    indices: their shard indices.
    num_shards: R.
    shape: the variable's (and the whole slot's) shape.
  """

  def __init__(self, shards, indices, num_shards, shape):
    self.shards = list(shards)
    self.indices = list(indices)
    self.num_shards = num_shards
    self.shape = tf.TensorShape(shape)
    # The whole slot gathered from every host before a save (several hosts).
    self.gathered = None

  def Whole(self):
    """The whole slot from the local shards (all R of them local)."""
    order = sorted(range(len(self.shards)), key=self.indices.__getitem__)
    flat = tf.concat([self.shards[i].read_value() for i in order], 0)
    return tf.reshape(flat[:self.shape.num_elements()], self.shape)

  def _serialize_to_tensors(self):
    if len(self.shards) == self.num_shards:
      whole = self.Whole()
    elif self.gathered is not None:
      whole = self.gathered
    else:
      # A host without every shard that has not gathered them: a restore,
      # which reads only the shape and dtype of what it would save. (The
      # chief saves after GatherForSave, which the runner's CombineOnRead
      # runs on every host before each checkpoint; the others never save.)
      whole = tf.zeros(self.shape, self.shards[0].dtype)
    return {tf_internals.VARIABLE_VALUE_KEY: whole}

  def _restore_from_tensors(self, restored_tensors):
    whole = tf.reshape(restored_tensors[tf_internals.VARIABLE_VALUE_KEY],
                       [-1])
    c = self.shards[0].shape[0]
    whole = tf.pad(whole, [[0, c * self.num_shards - whole.shape[0]]])
    return tf.group([s.assign(tf.cast(whole[i * c:(i + 1) * c], s.dtype))
                     for s, i in zip(self.shards, self.indices)])


class ShardedOptimizerState(tf.Module):
  """What a checkpoint holds of sharded learners: the slots by variable
  path, each a ShardedSlot, and the update counter; the same keys as one
  learner's unsharded state (optimizer._OptimizerState)."""

  def __init__(self, learners, first_index, num_shards):
    super().__init__(name=learners[0].optimizer.params.name)
    optimizers = [learner.optimizer for learner in learners]
    self.num_updates = optimizers[0].num_updates
    self.slots = {}
    for i, (_, var) in enumerate(learners[0].trainable):
      copies = [learner.trainable[i][1] for learner in learners]
      first = optimizers[0].Slots(var)
      self.slots[optimizers[0].Path(var)] = {
          name: ShardedSlot(
              [opt.Slots(v)[name] for opt, v in zip(optimizers, copies)],
              [first_index + r for r in range(len(learners))], num_shards,
              var.shape) for name in first}

  @property
  def variables(self):
    """The update counter and every local shard variable (the checkpoint's
    finite check reads them; they are not the checkpoint's own keys)."""
    return (self.num_updates,) + tuple(
        shard for named in self.slots.values() for slot in named.values()
        for shard in slot.shards)


class ShardedUpdate:
  """The sharded step's all-reduce and update; see the module docstring.

  Args:
    state: the program's train_state.TrainState, sharded (its num_shards
      and first_shard say which shards this host's copies hold).
    strategy: the strategy running the replicas.
    cluster: the Cluster the replicas were built on.
    bytes_per_pack: train.allreduce_bytes_per_pack (0: each variable's
      gradient scattered on its own, no pack).
    mode: train.allreduce, resolved: 'ring' runs the collectives as a
      ring, 'nccl' and the others TensorFlow's choice (the runner refuses
      the modes that are not collectives).
  """

  def __init__(self, state, strategy, cluster, bytes_per_pack=0,
               mode='auto'):
    self._state = state
    self._strategy = strategy
    self._learners = state.learners
    num_local = len(self._learners)
    self.num_shards = state.num_shards
    self._first = state.first_shard
    first = self._learners[0]
    self._sizes = [v.shape.num_elements() for _, v in first.trainable]
    self._shard = [optimizer_lib.ShardSize(n, self.num_shards)
                   for n in self._sizes]
    stage_of = [replicas.StageOfVariable(cluster, 0, v)
                for _, v in first.trainable]
    keys = tf_internals.CollectiveKeys(strategy, _GROUP_KEY_START)
    implementation = tf.distribute.experimental.CommunicationImplementation
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=implementation.RING if mode == 'ring' else
        implementation.AUTO)
    self._gather_slots = None   # GatherForSave's function.
    self._stages = []   # Per stage: (devices, launchers, packs).
    for s in range(cluster.num_devices_per_split):
      devices = [cluster.DevicesInModelSplit(r)[s] for r in range(num_local)]
      if sorted(devices, key=_DeviceOrder) != devices:
        raise ValueError(
            f'shard_optimizer_state: stage {s}\'s devices {devices} are not '
            'in the order TensorFlow ranks a collective group in, so a '
            'replica would update another\'s shard.')
      group = tf_internals.GroupKey(keys, devices)
      launchers = [tf_internals.Launcher(group, self.num_shards, keys, d,
                                         options) for d in devices]
      mine = [i for i, st in enumerate(stage_of) if st == s]
      self._stages.append((devices, launchers,
                           self._Packs(mine, first, bytes_per_pack)))

  @staticmethod
  def _Packs(indices, learner, bytes_per_pack):
    """The stage's variable indices cut into packs of about
    `bytes_per_pack` bytes, whose new weight shards are gathered together
    (0: one a pack: each variable's gathered on its own, without the copy
    a pack's concatenation makes)."""
    if not indices:
      return []
    if not bytes_per_pack:
      return [[i] for i in indices]
    packs, size = [[]], 0
    for i in indices:
      var = learner.trainable[i][1]
      if packs[-1] and size >= bytes_per_pack:
        packs.append([])
        size = 0
      packs[-1].append(i)
      size += var.shape.num_elements() * var.dtype.size
    return packs

  def _Shard(self, value, i, index):
    """Shard `index` of variable i's `value`: c elements, the last zero-
    padded; a slice of it (not a padded copy of the whole)."""
    c, n = self._shard[i], self._sizes[i]
    start = min(index * c, n)
    part = tf.reshape(value, [-1])[start:min(start + c, n)]
    if (index + 1) * c > n:
      part = tf.pad(part, [[0, c - (min(start + c, n) - start)]])
    return part

  def Apply(self, step, means, loss):
    """Updates every local copy's shards from the mean gradient, gathers
    the new weights; in the cross-replica context.

    A stage's packs are updated one after the other (each waits for the
    previous one's new weights to be written), so the update holds one
    pack's rule and gathered block at a time, not every variable's.

    Args:
      step: the global step.
      means: per local replica, per trained variable (learner.trainable
        order), the replicas' mean gradient on the replica's stage device:
        the all-reduce's (replicas.StageAllReduce.Mean), as unsharded.
      loss: the replicas' mean loss (the skip reads it).

    Returns:
      The first copy's learner stats (the same on every copy).
    """
    shards = []
    for r, (learner, mean) in enumerate(zip(self._learners, means)):
      mine = []
      for i, (g, (_, var)) in enumerate(zip(mean, learner.trainable)):
        with tf.device(var.device):
          mine.append(self._Shard(g, i, self._first + r))
      shards.append(mine)
    norms = self._GlobalNorms(shards)
    steps = []
    for r, learner in enumerate(self._learners):
      steps.append(learner.ShardStep(
          step, norms[r], loss=loss,
          skip=None if not steps else steps[0].skipped))
    written = []
    for devices, launchers, packs in self._stages:
      done = [[] for _ in self._learners]   # Per replica: the last pack's.
      for pack in packs:
        new = []
        for r, learner in enumerate(self._learners):
          mine = []
          for i in pack:
            var = learner.trainable[i][1]
            with tf.device(var.device), tf.control_dependencies(done[r]):
              weight = self._Shard(var.value(), i, self._first + r)
              mine.append(learner.ApplyShard(steps[r], shards[r][i], weight,
                                             var))
          new.append(mine)
        done = self._GatherPack(pack, new, devices, launchers)
      written += [op for ops in done for op in ops]
    with tf.control_dependencies(written):
      for r, learner in enumerate(self._learners):
        learner.FinishShards(steps[r])
    return NestedMap(grad_norm=steps[0].grad_norm,
                     skipped=steps[0].skipped,
                     learning_rate=steps[0].learning_rate)

  def _GatherPack(self, pack, new, devices, launchers):
    """Every local copy's variables of `pack` from the replicas' new
    shards (`new`: per local replica, per variable of the pack); returns
    per replica the ops that wrote them."""
    done = []
    for r, learner in enumerate(self._learners):
      with tf.device(devices[r]):
        mine = new[r][0] if len(pack) == 1 else tf.concat(new[r], 0)
      gathered = launchers[r].AllGather(mine)
      ops = []
      with tf.device(devices[r]):
        rows = tf.reshape(gathered, [self.num_shards, -1])
        for i, block in zip(pack, tf.split(
            rows, [self._shard[i] for i in pack], axis=1)):
          var = learner.trainable[i][1]
          whole = tf.reshape(block, [-1])[:self._sizes[i]]
          ops.append(var.assign(tf.reshape(whole, var.shape)))
      done.append(ops)
    return done

  def _GlobalNorms(self, shards):
    """Per local replica: the global norm of the whole mean gradient, from
    every replica's shards (their squares summed in float64, as
    learner.GlobalNorm sums the whole gradient's, then all-reduced over
    stage 0's group), so it is the unsharded step's norm."""
    devices, launchers, _ = self._stages[0]
    out = []
    for r in range(len(self._learners)):
      squares = []
      for stage_devices, _, packs in self._stages:
        mine = [shards[r][i] for pack in packs for i in pack]
        if mine:
          with tf.device(stage_devices[r]):
            squares.append(tf.add_n([learner_lib.SquaredSum(g)
                                     for g in mine]))
      with tf.device(devices[r]):
        total = launchers[r].AllReduce(
            tf.add_n(squares) if squares else tf.constant(0.0, tf.float64))
        out.append(tf.cast(tf.sqrt(total), tf.float32))
    return out

  def GatherForSave(self):
    """On every host before a checkpoint: each sharded slot gathered whole
    for the chief's save (`ShardedSlot.gathered`); nothing on one host,
    where a save concatenates the local shards."""
    if self.num_shards == len(self._learners):
      return
    if self._gather_slots is None:
      self._gather_slots = tf.function(self._GatherSlots, autograph=False)
    slots = [slot for named in self._state.sharded_state.slots.values()
             for slot in named.values()]
    for slot, whole in zip(slots, self._gather_slots()):
      slot.gathered = whole

  def _GatherSlots(self):
    stage_of = {}
    for s, (_, _, packs) in enumerate(self._stages):
      for pack in packs:
        for i in pack:
          stage_of[i] = s
    out = []
    for i, named in enumerate(self._state.sharded_state.slots.values()):
      devices, launchers, _ = self._stages[stage_of[i]]
      for slot in named.values():
        gathered = [launchers[r].AllGather(shard.read_value())
                    for r, shard in enumerate(slot.shards)]
        with tf.device(devices[0]):
          out.append(tf.reshape(gathered[0][:self._sizes[i]], slot.shape))
    return out
