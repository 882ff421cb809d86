"""The train program on a TPU: the whole step inside the replicated program.

`TpuTrainProgram` is `programs.TrainProgram` with one task for all
replicas and the step runner `TpuRunner`: the TPUStrategy
(framework/distribute/tpu.py) mirrors the task's variables on every replica
(stage s of a pipelined model on logical core s) and compiles one
replica's step with XLA. Differences from the synchronous runner
(framework/train/runners.py SyncRunner):

  * the step runs whole in the replica context (`strategy.run`): forward,
    backward, `all_reduce(MEAN)` of the gradients across replicas, the
    learner's update of the replica's copy of the variables (every copy
    gets the same update, as the seed's TPU mirrored variables) and the
    summed stats; the host only counts the step;
  * variables a layer updates itself are combined by tf.distribute as their
    `aggregation` declares (SUM, MEAN, ONLY_FIRST_REPLICA) when the layer
    assigns them in the replica context (the seed's TPUMirroredVariable
    aggregation), instead of the synchronous runner's per-copy combine
    (with one task copy it has nothing to combine);
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
from cadence.framework.train import runners


def TpuTrainProgram(model_params, logdir, strategy=None, **kwargs):
  """A TrainProgram of a task replicated by a TPUStrategy; see the module
  docstring.

  Args:
    model_params: the model's params (`model_registry.GetParams(key,
      'Train')`); the task is built here, in the strategy's scope.
    logdir: the experiment's logdir.
    strategy: a tf.distribute.TPUStrategy (or, off a TPU, None: the
      default strategy).
    **kwargs: TrainProgram's other arguments (peak_flops, on_checkpoint,
      start_time, cluster, steps_per_loop, watcher, xla).

  Returns:
    A programs.TrainProgram whose runner is a TpuRunner.
  """
  strategy = strategy or tf.distribute.get_strategy()
  kwargs.pop('num_workers', None)
  kwargs.pop('worker_index', None)
  with strategy.scope():
    task = model_params.Instantiate().task
    return programs.TrainProgram([task], logdir, strategy, runner=TpuRunner,
                                 **kwargs)


class TpuRunner(runners.SyncRunner):
  """The whole step of each replica inside `strategy.run`; see the module
  docstring. Args: runners.SyncRunner's."""

  NO_SHARDS = ('is not built for TPUs: TPUStrategy mirrors one task, whose '
               'slots are whole on every core; train without it there.')

  def __init__(self, state, **kwargs):
    super().__init__(state, **kwargs)
    # A TPU compiles the whole replicated step; --xla compiles it off one.
    self.static_shapes = True
    if isinstance(self.strategy, tf.distribute.TPUStrategy):
      self.forwards = [self.Forward]

  @classmethod
  def TaskCopies(cls, strategy, num_workers):
    del strategy, num_workers  # One task; the strategy mirrors it.
    return 1

  def Batches(self, start):
    """The batches of one host's input (`Iterator` builds each host's
    itself); the static-shape check reads their spec."""
    return self.input_generator.Dataset(start_batch=start)

  def Iterator(self, dataset, start):
    """Per-host infeed: each input pipeline reads its shard of the data and
    cuts host batches into its replicas' consecutive batches."""
    del dataset
    params = self.state.task.params.input

    def _HostDataset(ctx):
      p = params.Copy()
      hosts = ctx.num_input_pipelines
      if hosts > 1:
        p.Set(num_input_shards=hosts, input_shard_index=ctx.input_pipeline_id)
      local = ctx.num_replicas_in_sync // hosts
      return runners.ReplicaBatches(p.Instantiate().Dataset(
          start_batch=start, num_replicas=local), local)

    return iter(self.strategy.distribute_datasets_from_function(
        _HostDataset))

  def _InReplicaStep(self, batch, step):
    """The whole step of one replica; returns its summed stats (the same
    on every replica)."""
    ctx = tf.distribute.get_replica_context()
    out = self.forwards[0](batch, step, ctx.replica_id_in_sync_group)
    mean, total = tf.distribute.ReduceOp.MEAN, tf.distribute.ReduceOp.SUM
    grads = ctx.all_reduce(mean, out.grads)
    loss = ctx.all_reduce(mean, out.loss)
    learner = self.state.learner
    stats = learner.ApplyGradients(
        step, learner.trainable_vars.Pack(grads), loss=loss)
    summed = ctx.all_reduce(total, NestedMap(examples=out.examples,
                                             metrics=out.metrics))
    return NestedMap(stats=stats, examples=summed.examples,
                     metrics=summed.metrics)

  def Step(self, iterator):
    step = self.state.global_step.read_value()
    per_replica = self.strategy.run(self._InReplicaStep,
                                    args=(next(iterator), step))
    first = tf.nest.map_structure(
        lambda x: self.strategy.experimental_local_results(x)[0],
        per_replica)
    return self.state.CountStep(first.stats, first.examples, first.metrics)
