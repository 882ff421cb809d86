"""What the layout planner knows of a model, from its params alone.

A model the planner can lay out has one pipeline: a stack of `num_layers`
layers cut into cells by its `splits` param (an int K, or the layer
indices where cells 1.. start), whose `pipeline_tpl` holds the pipeline's
settings (num_micro_batches, schedule, remat), as
`gpipe_transformer.GPipeTransformerStack` does for the LM. What runs
before the stack (an embedding) goes with the first cell, what runs after
it (a softmax and the loss) with the last, as the LM task places them.

From params alone, without weights or data:
  * the forward FLOPs of each layer, with the first cell's and the last
    cell's extras folded into the first and the last layer: the task's
    FPropMeta `partitions` with every layer a cell of its own;
  * the bytes of each layer's weights, gradients and optimizer slots
    (extras folded likewise): the model built symbolically
    (`symbolic_task`, whose layers' params --plan_measure builds for real)
    (inspect_lib.BuildSymbolically) with every layer a cell on a device of
    its own (devices of a placeholder job: nothing is placed);
  * a layout's activation memory: the task's FPropMeta `memory`, which
    memory_estimate turns into bytes per device at each moment.

A `Layout` is written back as params overrides (`Overrides`) and trainer
flags (`Flags`).

Example:
  model = PlanModel(model_registry.GetParams(key, 'Train'))
  model.num_layers, model.batch_size, model.item_flops[:2]
  model.Overrides(layout)   # [('task.stack_tpl.splits', 2), ...]
"""
import collections

import tensorflow as tf

from cadence.framework import cluster as cluster_lib
from cadence.framework.jobs import inspect_lib
from cadence.framework.pipeline import memory_estimate
from cadence.framework.pipeline import schedules


class Layout(collections.namedtuple('Layout', [
    'replicas', 'devices', 'stages', 'micro_batches', 'schedule', 'remat',
    'bounds'])):
  """One way to run the model.

  Attributes:
    replicas: R, data-parallel copies (--worker_replicas).
    devices: K, devices per replica (--worker_split_size).
    stages: S = K x v pipeline cells (v cells per device).
    micro_batches: M.
    schedule: a registered schedule name.
    remat: a remat mode (executor.REMAT_MODES).
    bounds: the cut, S + 1 layer indices [0, b_1, ..., L]; None: the
      stack's even cut (splits=S).
  """
  __slots__ = ()

  @property
  def per_device(self):
    return self.stages // self.devices

  def Name(self):
    cut = 'even' if self.bounds is None else '/'.join(
        str(b - a) for a, b in zip(self.bounds, self.bounds[1:]))
    return (f'R={self.replicas} K={self.devices} v={self.per_device} '
            f'M={self.micro_batches} {self.schedule} {self.remat} '
            f'cut={cut}')


class NotPlannable(ValueError):
  """The model has no pipeline the planner knows how to lay out."""


def _Bytes(shape, dtype):
  return shape.num_elements() * dtype.size


class PlanModel:
  """A model's costs by layer, and its layouts' params; see the module
  docstring.

  Args:
    params: the model's params (model_registry.GetParams(key, 'Train'),
      overrides applied).

  Raises:
    NotPlannable: no pipeline with `splits` and `num_layers` beside it, or
      no static batch shapes.
  """

  def __init__(self, params):
    self.params = params
    pipelines = inspect_lib.PipelineKeys(params)
    if not pipelines:
      raise NotPlannable(
          f'model {params.name!r} runs no pipeline (no params with '
          'pipeline_tpl.trace_actions); --mode=plan lays out a pipelined '
          'stack such as the LM\'s GPipeTransformerStack.')
    self.pipeline_key = pipelines[0]
    self.stack_key = self.pipeline_key.rsplit('.', 1)[0]
    stack = params.Get(self.stack_key)
    if 'splits' not in stack or 'num_layers' not in stack:
      raise NotPlannable(
          f'{self.stack_key} has no splits and num_layers beside its '
          f'pipeline {self.pipeline_key}; --mode=plan cuts a stack of '
          'layers (GPipeTransformerStack).')
    self.num_layers = stack.num_layers
    self.task_cls = params.task.cls
    if params.input is None or 'batch_size' not in params.input:
      raise NotPlannable(f'model {params.name!r} has no input batch_size.')
    self.batch_size = params.input.batch_size
    try:
      self._shapes = params.input.cls.BatchShapes(params.input)
    except NotImplementedError as e:
      raise NotPlannable(f'--mode=plan needs static batch shapes: {e}'
                         ) from None
    pipe = params.Get(self.pipeline_key)
    self.current = Layout(1, None, None, pipe.num_micro_batches,
                          pipe.schedule, pipe.remat, None)
    every = self.LayoutParams(Layout(1, self.num_layers, self.num_layers, 1,
                                     schedules.DEFAULT, 'never', None))
    meta = self.Meta(every, self.batch_size)
    self.item_flops = list(meta.partitions)
    self.flops = sum(self.item_flops)
    self.item_weights = self._ItemWeights(every)

  def BatchShapes(self, batch):
    """The input's batch shapes with `batch` examples."""
    return self._shapes.Transform(
        lambda s: s.WithDim(0, batch) if s.rank else s)

  def Meta(self, params, batch):
    """The task's FPropMeta of model params on a batch of `batch`."""
    return self.task_cls.FPropMeta(params.task, self.BatchShapes(batch))

  def _ItemWeights(self, params):
    """Per layer (extras folded): [weight bytes, gradient bytes, slot
    bytes], from the model built with every layer on a device of its own."""
    n = self.num_layers
    cluster = cluster_lib.Cluster.Params().Set(
        job='plan', num_devices=n, worker_split_size=n).Instantiate()
    with cluster:
      model, _ = inspect_lib.BuildSymbolically(params)
    task = self.symbolic_task = model.task
    optimizer = task.params.train.learner.optimizer.Instantiate()
    index = {d: i for i, d in enumerate(cluster.devices)}
    out = [[0, 0, 0] for _ in range(n)]
    for _, v in task.vars.FlattenItems():
      spec = tf.DeviceSpec.from_string(v.device or cluster.devices[0])
      item = out[index.get(spec.to_string(), 0)]
      item[0] += _Bytes(v.shape, v.dtype)
      if v.trainable and v.dtype.is_floating:
        item[1] += _Bytes(v.shape, v.dtype)
        item[2] += sum(tf.TensorShape(s).num_elements() for s in
                       optimizer.SlotShapes(v.shape).values()) * v.dtype.size
    return out

  # --- layouts ---------------------------------------------------------------

  def EvenBounds(self, num_stages):
    """The stack's own cut of splits=S: layers as even as can be."""
    return self.params.Get(self.stack_key).cls.Boundaries(
        self.params.Get(self.stack_key).Copy().Set(splits=num_stages))

  def Bounds(self, layout):
    return list(layout.bounds or self.EvenBounds(layout.stages))

  def PerReplicaBatch(self, layout):
    return self.batch_size // layout.replicas

  def Overrides(self, layout):
    """[(params key, value)] that run `layout` (with the trainer flags
    --worker_replicas=R --worker_split_size=K); the global batch stays
    the input's batch_size, so each replica takes batch_size / R."""
    # An int splits is the devices K (the stack cuts K x v stages); a list
    # is the stages' boundaries.
    per_device = layout.stages // layout.devices
    splits = layout.devices if layout.bounds is None else list(
        layout.bounds[1:-1])
    out = [(f'{self.stack_key}.splits', splits),
           (f'{self.pipeline_key}.num_micro_batches', layout.micro_batches),
           (f'{self.pipeline_key}.schedule', layout.schedule),
           (f'{self.pipeline_key}.remat', layout.remat)]
    if per_device > 1:
      out.insert(3, (f'{self.pipeline_key}.stages_per_device', per_device))
    if layout.replicas > 1:
      out.append(('input.batch_size', self.PerReplicaBatch(layout)))
    return out

  def LayoutParams(self, layout):
    """A copy of the model params with `layout`'s overrides."""
    params = self.params.Copy()
    for key, value in self.Overrides(layout):
      params.Set(**{key: value})
    return params

  def Flags(self, layout, key, params_file=None):
    """The trainer command line that runs `layout` of experiment `key`."""
    flags = [f'--model={key}', f'--worker_replicas={layout.replicas}',
             f'--worker_split_size={layout.devices}']
    if params_file:
      flags.append(f'--model_params_file_override={params_file}')
    else:
      items = ';'.join(f'{k}={_Text(v)}' for k, v in self.Overrides(layout))
      flags.append(f'--model_params_override="{items}"')
    return ' '.join(flags)

  def OverridesText(self, layout):
    """The overrides as Params text ('key : value' lines), for a params
    file (--model_params_file_override)."""
    return ''.join(f'{k} : {_Text(v)}\n' for k, v in self.Overrides(layout))

  # --- memory ----------------------------------------------------------------

  def StageWeights(self, bounds):
    """Per stage [weight, gradient, slot] bytes of a cut."""
    return [[sum(w[i] for w in self.item_weights[a:b]) for i in range(3)]
            for a, b in zip(bounds, bounds[1:])]

  def ActivationMeta(self, layout):
    """The task's FPropMeta `memory` of `layout` (one replica's batch)."""
    meta = self.Meta(self.LayoutParams(layout), self.PerReplicaBatch(layout))
    return meta.memory

  def DeviceMemory(self, layout, memory=None):
    """(per device of a replica its bytes at its worst moment, one
    replica's devices together at the step's worst moment).

    A device holding several stages holds their sum at each moment
    (memory_estimate.DeviceMemory, over the schedule's ticks).
    """
    memory = memory or self.ActivationMeta(layout)
    weights = self.StageWeights(self.Bounds(layout))
    args = (memory, [w[0] for w in weights], [w[2] for w in weights],
            [w[1] for w in weights])
    return ([d.total for d in memory_estimate.DeviceMemory(*args)],
            memory_estimate.SharedMemory(*args).total)


def _Text(value):
  return repr(value) if isinstance(value, str) else str(value)
