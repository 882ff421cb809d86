"""Tasks and models: what the trainer trains, evaluates and decodes.

A *task* is a layer with a loss. Its params carry, beside the network's own
templates, the dataset it reads (`input`), how it trains (`train`: learner,
steps, checkpoint and summary intervals, EMA, the skip limit) and how it is
evaluated (`eval`). The trainer calls

  metrics, per_example = task.FPropTower(theta, batch)

inside its train/eval steps, where `metrics` is a NestedMap of
`name=(value, weight)` scalar pairs (it must hold `loss`, the training
objective) and `per_example` a NestedMap of [batch, ...] tensors. A task
implements `ComputePredictions` and `ComputeLoss` (or overrides
`FPropTower`), and optionally `Decode` / `PostProcessDecodeOut` for the
decoder job, `FPropMeta` for FLOP accounting and `Inference` for an export
to serve (framework/inference.py).

A *model* holds the tasks of an experiment; `SingleTaskModel` holds one.
"""
import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import cluster as cluster_lib
from cadence.framework import hyperparams
from cadence.framework import learner as learner_lib
from cadence.framework.nested_map import NestedMap
from cadence.framework import validation

# The choices of train.allreduce (run by framework/train/replicas.py) and of
# train.ps_placement (framework/distribute/ps_placement.py), declared beside
# the knobs: every task checks them when built, whatever the run's layout.
ALLREDUCE_MODES = ('auto', 'ring', 'nccl', 'hierarchical_copy', 'one_device')
PS_PLACEMENTS = ('least_loaded', 'round_robin')


def _TrainParams():
  p = hyperparams.Params()
  p.Define('learner', learner_lib.Learner.Params(), 'Learner params: '
           'optimizer, learning rate and schedule, gradient clipping '
           '(clip_gradient_norm_to_value, grad_norm_to_clip_to_zero), L2, '
           'which variables train.')
  p.Define('max_steps', 1000, 'Train until the global step reaches this.')
  p.Define('save_interval_steps', 100, 'Write a checkpoint every this many '
           'steps (and at max_steps).')
  p.Define('save_max_to_keep', 5, 'Checkpoints kept; older ones are '
           'deleted.')
  p.Define('summary_interval_steps', 20, 'Write train summaries (averages '
           'over the steps since the last ones) every this many steps.')
  p.Define('log_interval_steps', 100, 'Log a progress line every this many '
           'steps.')
  p.Define('log_interval_secs', 30.0, 'Also log a progress line at least '
           'every this many seconds of training, a number >= 0 (as far as '
           "one step's time allows; 0: by steps only): slow steps get "
           'lines between the log_interval_steps ones. One host only: '
           'several hosts training together log by steps.')
  p.Define('ema_decay', 0.0, 'Decay of an exponential moving average of the '
           'trained variables, in [0, 1); 0 disables it. With it, eval and '
           'decode use the averaged weights.')
  p.Define('max_consecutive_skips', 10, 'Stop training (exit code 3) after '
           'this many consecutive steps whose loss or gradient norm was '
           'non-finite (or above grad_norm_to_clip_to_zero).')
  p.Define('debug_nan_steps', [], 'Testing aid: global steps whose loss is '
           'multiplied by NaN, exercising the skip path.')
  p.Define('gradient_sync', 'auto', "How the data-parallel replicas' "
           "gradients become every copy's update "
           '(framework/train/gradient_sync.py): auto (none with one replica; '
           'else sharded_state with learner.shard_optimizer_state, else '
           'stage_all_reduce), stage_all_reduce (the gradients all-reduced '
           'stage by stage, by train.allreduce), sharded_state (the same, '
           'then each replica updates its shard of the optimizer state), '
           'none (one replica), or the NAME of a scheme a module registers '
           '(gradient_sync.Register).')
  p.Define('allreduce', 'auto', 'How gradients of data-parallel replicas '
           'are all-reduced, stage by stage (framework/train/replicas.py): '
           'ring '
           '(collective ops; across hosts), nccl (GPUs), hierarchical_copy, '
           'one_device (sum on one device, broadcast), or auto (nccl on '
           'GPUs, else ring).')
  p.Define('allreduce_bytes_per_pack', 0, 'Pack gradients into chunks of '
           'about this many bytes for the all-reduce, an int >= 0 (0: no '
           'packing).')
  p.Define('ps_placement', 'least_loaded', 'Parameter-server training: '
           'which server holds each variable '
           '(framework/distribute/ps_placement.py): '
           'least_loaded (the server with the fewest bytes so far, '
           "tensorpack's policy) or round_robin (TensorFlow's default).")
  return p


def _EvalParams():
  p = hyperparams.Params()
  p.Define('samples_per_summary', 1000, 'Examples the evaler averages '
           'over per checkpoint; 0: the whole (non-repeating) dataset.')
  p.Define('decoder_samples', 100, 'Examples the decoder decodes per '
           'checkpoint; 0: the whole (non-repeating) dataset.')
  return p


def CheckMetrics(metrics, owner):
  """Validates a metrics NestedMap of (value, weight) pairs; returns it.

  Raises:
    ValueError: naming `owner` when a metric is not a (value, weight) pair
      of scalars or `loss` is missing.
  """
  if not isinstance(metrics, dict) or 'loss' not in metrics:
    raise ValueError(f'{owner}: FPropTower must return metrics with a '
                     f"'loss' entry; got {type(metrics).__name__} with keys "
                     f'{sorted(metrics) if isinstance(metrics, dict) else []}.')
  for name, pair in metrics.items():
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
      raise ValueError(f'{owner}: metric {name!r} must be a (value, weight) '
                       f'pair; got {pair!r}.')
    for part, x in zip(('value', 'weight'), pair):
      rank = getattr(x, 'shape', ())
      if rank is not None and len(rank) != 0:
        raise ValueError(f'{owner}: metric {name!r} {part} must be a scalar; '
                         f'got shape {list(rank)}.')
  return metrics


class AverageMetric:
  """A weighted running mean, for decoder metrics.

  Example:
    m = AverageMetric()
    m.Update(2.0, weight=3.0)
    m.Update(6.0)
    m.value  # (2 * 3 + 6) / 4 = 3.0
  """

  def __init__(self):
    self._total = 0.0
    self._weight = 0.0

  def Update(self, value, weight=1.0):
    self._total += float(value) * float(weight)
    self._weight += float(weight)

  @property
  def total_weight(self):
    return self._weight

  @property
  def value(self):
    return self._total / self._weight if self._weight else float('nan')


class BaseTask(base_layer.BaseLayer):
  """A layer with a loss; see the module docstring.

  Example (a regression task):
    class Regression(BaseTask):
      def __init__(self, params):
        super().__init__(params)
        self.CreateChild('proj', linear.ProjectionLayer.Params().Set(
            input_dim=4, output_dim=1))

      def ComputePredictions(self, theta, batch):
        return NestedMap(y=self.children.proj.FProp(theta.proj, batch.x))

      def ComputeLoss(self, theta, predictions, batch):
        err = tf.squeeze(predictions.y, -1) - batch.y
        n = tf.cast(tf.size(err), tf.float32)
        return NestedMap(loss=(tf.reduce_mean(err**2), n)), NestedMap()
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('input', None, 'Input generator params of the dataset in use; '
             'SingleTaskModel fills it from the experiment.')
    p.Define('train', _TrainParams(), 'Training params.')
    p.Define('eval', _EvalParams(), 'Evaluation and decoding params.')
    return p

  def __init__(self, params):
    super().__init__(params)
    self.CheckTrainParams(self.params, validation.Owner(self))
    self.CheckStaticShapes(self.params)

  @classmethod
  def CheckStaticShapes(cls, params):
    """Checks the task's params against its input's batch shapes, statically.

    Checks the input params (`BaseInputGenerator.CheckParams`), then runs
    `FPropMeta` on the shapes of one batch as they give them
    (`BaseInputGenerator.BatchShapes`, no data read): every layer that
    checks its params against shapes there (dims, a pipeline's micro-batches
    dividing the batch, ...) reports a bad configuration as a ValueError
    when the task is built, before any step. Does nothing when the task has
    no input params, or the input or the task cannot say (no BatchShapes or
    FPropMeta).

    Returns:
      The FPropMeta record (a cost.Cost), or None when nothing was
      checked.
    """
    p = params
    if p.input is None:
      return None
    check = getattr(p.input.cls, 'CheckParams', None)
    if check is not None:   # Shapes are made of the input's params.
      check(p.input)
    try:
      batch_shapes = p.input.cls.BatchShapes(p.input)
      return cls.FPropMeta(p, batch_shapes)
    except NotImplementedError:
      return None

  @classmethod
  def CheckTrainParams(cls, params, owner=None):
    """Checks the task's `train` and `eval` params (the learner's too),
    from params alone: the trainer asks before it builds anything."""
    owner = owner or validation.Owner(params)
    t = params.train
    for field in ('max_steps', 'save_interval_steps', 'save_max_to_keep',
                  'summary_interval_steps', 'log_interval_steps',
                  'max_consecutive_skips'):
      validation.CheckInt(owner, f'train.{field}', t.Get(field),
                          low=0 if field == 'max_steps' else 1)
    validation.CheckNumber(owner, 'train.ema_decay', t.ema_decay, 0, 1,
                           high_open=True)
    validation.CheckNumber(owner, 'train.log_interval_secs',
                           t.log_interval_secs, low=0)
    # Read only with several replicas or parameter servers: checked here so
    # a typo fails on one replica too.
    validation.CheckOneOf(owner, 'train.allreduce', t.allreduce,
                          ALLREDUCE_MODES)
    validation.CheckInt(owner, 'train.allreduce_bytes_per_pack',
                        t.allreduce_bytes_per_pack, low=0)
    validation.CheckOneOf(owner, 'train.ps_placement', t.ps_placement,
                          PS_PLACEMENTS)
    # The learner's too: read before any learner is built (the memory
    # estimate instantiates its optimizer).
    check = getattr(getattr(t.learner, 'cls', None), 'CheckParams', None)
    if check is not None:
      check(t.learner, validation.Owner(t.learner))
    e = params.eval
    for field in ('samples_per_summary', 'decoder_samples'):
      validation.CheckInt(owner, f'eval.{field}', e.Get(field), low=0)

  # --- the forward pass ----------------------------------------------------

  def ComputePredictions(self, theta, input_batch):
    """The network's outputs for a batch; returns a NestedMap."""
    raise NotImplementedError(
        f'{type(self).__name__} must implement ComputePredictions.')

  def ComputeLoss(self, theta, predictions, input_batch):
    """Returns (metrics, per_example) from the predictions; see FPropTower."""
    raise NotImplementedError(
        f'{type(self).__name__} must implement ComputeLoss.')

  def FPropTower(self, theta, input_batch):
    """Forward pass and loss on one replica's batch.

    Args:
      theta: the task's theta (a step seed attached in training).
      input_batch: NestedMap of [batch, ...] tensors from the input
        generator.

    Returns:
      (metrics, per_example): metrics a NestedMap of name -> (scalar value,
      scalar weight), holding at least `loss`; per_example a NestedMap of
      [batch, ...] tensors.
    """
    predictions = self.ComputePredictions(theta, input_batch)
    metrics, per_example = self.ComputeLoss(theta, predictions, input_batch)
    return CheckMetrics(metrics, f"{type(self).__name__} '{self.path}'"), (
        per_example if per_example is not None else NestedMap())

  def FProp(self, theta, input_batch):
    """Same as `FPropTower`."""
    return self.FPropTower(theta, input_batch)

  # --- decoding ------------------------------------------------------------

  def Decode(self, theta, input_batch):
    """Decoder outputs for a batch: a NestedMap of tensors."""
    raise NotImplementedError(
        f'{type(self).__name__} implements no Decode(theta, input_batch); '
        'the decoder job needs it.')

  def CreateDecoderMetrics(self):
    """A dict of name -> AverageMetric, filled by PostProcessDecodeOut."""
    return {}

  def PostProcessDecodeOut(self, decode_out, decoder_metrics):
    """Updates `decoder_metrics` from one decoded batch.

    Args:
      decode_out: NestedMap of numpy arrays (the `Decode` output).
      decoder_metrics: the dict from `CreateDecoderMetrics`.

    Returns:
      A list of strings, one per decoded example, for the decoder's output
      file (may be empty).
    """
    del decode_out, decoder_metrics
    return []

  # --- serving ---------------------------------------------------------------

  def Inference(self, batch_size=None, max_len=None):
    """The task's serving signatures, for `trainer.py --mode=export`.

    Args:
      batch_size: None (a dynamic batch) or the static batch size.
      max_len: None (dynamic) or the static sequence length, for tasks with
        sequences.

    Returns:
      An `inference.InferenceGraph` (framework/inference.py). Build the task
      with is_inference=True.
    """
    del batch_size, max_len
    raise NotImplementedError(
        f'{type(self).__name__} implements no Inference(batch_size, '
        'max_len): it has no export for serving (tasks/lm/model.py, '
        'tasks/image/model.py and tasks/synthetic/keras_regression.py have '
        'one).')

  # --- training set-up -----------------------------------------------------

  def InstantiateLearner(self):
    """The learner of this task's variables, from `train.learner`.

    Call under the strategy's scope; then `Build()` it before tracing.
    """
    p = self.params.train.learner.Copy()
    return p.Instantiate(var_map=self.vars)

  @classmethod
  def FPropMeta(cls, params, input_shapes):
    """Static cost of `FPropTower` on a batch of the given shapes.

    Args:
      params: the task's params.
      input_shapes: NestedMap of `shapes.Shape`, the batch's fields.

    Returns:
      A cost.Cost(flops=int or None, out_shapes=(), and optionally
      breakdown=[(name, flops)] for `inspect_model`, and a pipelined
      task's `plan` (framework/pipeline/plan.py: its stages, schedule and
      memory, which the memory estimate, inspect and the planner read)).
    """
    raise NotImplementedError(
        f'{cls.__name__} implements no FPropMeta(params, input_shapes); '
        'model FLOPs utilisation is not reported without it.')


class SingleTaskModel(tf.Module):
  """The model of a single-task experiment: one task.

  Example:
    p = SingleTaskModel.Params(MyTask.Params().Set(name='reg'))
    p.input = MyInput.Params().Set(file_pattern='/tmp/data-*')
    model = p.Instantiate()   # model.task is a MyTask, its input set.
  """

  @classmethod
  def Params(cls, task_params=None):
    p = hyperparams.InstantiableParams(cls)
    p.Define('name', task_params.name if task_params else 'model',
             'Name of the model.')
    p.Define('task', None, 'Params of the task (a BaseTask subclass); its '
             '`input` is left None and filled from `input`.')
    p.Define('input', None, 'Input generator params of the dataset in use '
             '(set by model_registry.GetParams).')
    if task_params is not None:
      task_params = task_params.Copy()
      task_params.input = None
      p.task = task_params
    return p

  def __init__(self, params):
    super().__init__(name=params.name)
    self._params = params.Copy().Freeze()
    if params.task is None:
      raise ValueError(f'SingleTaskModel {params.name!r}: params.task is '
                       'None; build the params with '
                       'SingleTaskModel.Params(task_params).')
    check = getattr(getattr(params.input, 'cls', None), 'CheckParams', None)
    if check is not None:
      # Here its errors name the key a user overrides ('input.batch_size');
      # the task checks it again as 'task.input'.
      check(params.input)
    task_p = params.task.Copy()
    task_p.input = params.input.Copy() if params.input is not None else None
    self.task = task_p.Instantiate()

  @property
  def params(self):
    return self._params

  @property
  def tasks(self):
    """All tasks of the model, a list."""
    return [self.task]


def BuildSymbolically(params):
  """Builds the model of `params` in a throwaway graph; no weight memory:
  what inspect, the start-up memory check and the planner read (variable
  paths, shapes, dtypes and devices exactly as the trainer's, each layer's
  params checked by its constructor).

  Returns:
    (the model, the graph it lives in). Its variables are graph symbols:
    read their shapes, dtypes and devices, not their values.
  """
  graph = tf.Graph()
  # What places no variable itself gets the cluster's first device, as the
  # eager trainer's default placement does.
  first = cluster_lib.Cluster.Current().devices[0]
  with graph.as_default(), tf.device(first):
    model = params.Instantiate()
  return model, graph
