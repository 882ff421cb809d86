"""The train program on a TPU: the whole step inside the replicated program.

`TpuTrainProgram` is `programs.TrainProgram` with one task for all
replicas: the TPUStrategy (framework/distribute/tpu.py) mirrors its variables on
every replica (stage s of a pipelined model on logical core s) and compiles one
replica's step with XLA. Differences from the base program:

  * the step runs whole in the replica context (`strategy.run`): forward,
    backward, `all_reduce(MEAN)` of the gradients across replicas, the
    learner's update of the replica's copy of the variables (every copy
    gets the same update, as the seed's TPU mirrored variables) and the
    summed stats; the host only counts the step;
  * variables a layer updates itself are combined by tf.distribute as their
    `aggregation` declares (SUM, MEAN, ONLY_FIRST_REPLICA) when the layer
    assigns them in the replica context (the seed's TPUMirroredVariable
    aggregation), instead of the base program's per-copy combine;
  * per-host infeed: `distribute_datasets_from_function` calls the dataset
    function once per host (input pipeline); each host reads its own shard
    (`num_input_shards` = hosts) and feeds its replicas consecutive
    batches;
  * before the first step the program is checked statically (input batches
    and every FProp tensor fully defined, framework/train/xla_step.py).

`--steps_per_loop` steps run in one call of the compiled loop (the seed's
`steps_per_run`): the host loop (a tf.while_loop calling `strategy.run`)
stays on the TPU host; the summaries written at a loop boundary are the
loop's sums and the learning rate of its last step.

Off a TPU the same program runs under the default strategy (one replica),
which is how it is tested here
(tests/framework/distribute/tpu_programs_test.py).

Example:
  setup = distribution.Create(tpu='my-tpu', worker_split_size=2)
  with setup.cluster:
    TpuTrainProgram(model_params, '/tmp/run', setup.strategy).Run()
"""
import tensorflow as tf

from cadence.framework.nested_map import NestedMap
from cadence.framework.train import programs


class TpuTrainProgram(programs.TrainProgram):
  """Trains a task replicated by a TPUStrategy; see the module docstring.

  Args:
    model_params: the model's params (`model_registry.GetParams(key,
      'Train')`); the task is built here, in the strategy's scope.
    logdir: the experiment's logdir.
    strategy: a tf.distribute.TPUStrategy (or, off a TPU, None: the
      default strategy).
    **kwargs: TrainProgram's other arguments (peak_flops, on_checkpoint,
      start_time, cluster, steps_per_loop, watcher, xla).
  """

  def __init__(self, model_params, logdir, strategy=None, **kwargs):
    strategy = strategy or tf.distribute.get_strategy()
    kwargs.pop('num_workers', None)
    kwargs.pop('worker_index', None)
    with strategy.scope():
      task = model_params.Instantiate().task
      super().__init__([task], logdir, strategy, **kwargs)
    # A TPU compiles the whole replicated step; --xla compiles it off one.
    self._static_shapes = True
    if isinstance(strategy, tf.distribute.TPUStrategy):
      self._forwards = [self._Forward]

  def _TaskCopies(self, num_workers):
    del num_workers  # One task; the strategy mirrors its variables.
    return 1

  def _Combine(self, synced, per_replica_sent, per_replica_before):
    del synced, per_replica_sent, per_replica_before  # tf.distribute's.

  def _ReplicaBatches(self, start):
    """Unused: `_Iterator` builds each host's batches itself."""
    return self._input.Dataset(start_batch=start)

  def _Iterator(self, dataset, start):
    """Per-host infeed: each input pipeline reads its shard of the data and
    cuts host batches into its replicas' consecutive batches."""
    del dataset
    params = self._task.params.input

    def _HostDataset(ctx):
      p = params.Copy()
      hosts = ctx.num_input_pipelines
      if hosts > 1:
        p.Set(num_input_shards=hosts, input_shard_index=ctx.input_pipeline_id)
      local = ctx.num_replicas_in_sync // hosts
      host_batches = p.Instantiate().Dataset(start_batch=start,
                                             num_replicas=local)
      if local == 1:
        return host_batches
      return host_batches.map(lambda batch: NestedMap(batch).Transform(
          lambda x: tf.stack(tf.split(x, local)))).unbatch()

    return iter(self._strategy.distribute_datasets_from_function(
        _HostDataset))

  def _InReplicaStep(self, batch, step):
    """The whole step of one replica; returns its summed stats (the same
    on every replica)."""
    ctx = tf.distribute.get_replica_context()
    out = self._forwards[0](batch, step, ctx.replica_id_in_sync_group)
    mean, total = tf.distribute.ReduceOp.MEAN, tf.distribute.ReduceOp.SUM
    grads = ctx.all_reduce(mean, out.grads)
    loss = ctx.all_reduce(mean, out.loss)
    stats = self._learner.ApplyGradients(
        step, self._learner.trainable_vars.Pack(grads), loss=loss)
    summed = ctx.all_reduce(total, NestedMap(examples=out.examples,
                                             metrics=out.metrics))
    return NestedMap(stats=stats, examples=summed.examples,
                     metrics=summed.metrics)

  def _Step(self, iterator):
    step = self._global_step.read_value()
    per_replica = self._strategy.run(self._InReplicaStep,
                                     args=(next(iterator), step))
    first = tf.nest.map_structure(
        lambda x: self._strategy.experimental_local_results(x)[0],
        per_replica)
    return self._StepDone(first.stats, first.examples, first.metrics)
