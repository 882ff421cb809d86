"""What the layout planner knows of a model: its pipeline plan.

A model the planner can lay out is one whose task's FPropMeta gives a
pipeline `plan` (framework/pipeline/plan.py): a layer made of units
(layers/gpipe_units.py: the LM's GPipeTransformerStack, the ResNet, a
GPipeStack of one's own layers) cut into stages by its `splits` param,
whose `pipeline_tpl` holds the pipeline's settings. The plan says where
those params are (`path`, `splits_path`), what runs before the pipeline
(the LM's embedding, counted with the first unit) and the per-micro-batch
loss (counted with the last).

From params alone, without weights or data:
  * each unit's forward and backward FLOPs on the batch (its layers'
    FPropMeta), with what runs before in the first and the loss in the
    last (`item_flops`, `item_bwd_flops`);
  * each unit's bytes of weights, gradients and optimizer slots (extras
    folded likewise): the model built symbolically
    (base_model.BuildSymbolically) with every unit a stage on a device of
    its own (devices of a placeholder job: nothing is placed), its
    variables counted by unit (gpipe_units.UnitOfVariables) and the
    others by device;
  * a layout's activation memory: the plan re-planned under it
    (`LayoutPlan`: its cut, schedule, micro-batch size and remat), which
    memory_estimate turns into bytes per device at each moment.

A `Layout` is written back as params overrides (`Overrides`) and trainer
flags (`Flags`).

Example:
  model = PlanModel(model_registry.GetParams(key, 'Train'))
  model.num_units, model.batch_size, model.item_flops[:2]
  model.Overrides(layout)   # [('task.stack_tpl.splits', 2), ...]
"""
import collections

import tensorflow as tf

from cadence.framework import base_model
from cadence.framework import cluster as cluster_lib
from cadence.framework.pipeline import memory_estimate
from cadence.framework.pipeline import schedules
from cadence.layers import gpipe_units


class Layout(collections.namedtuple('Layout', [
    'replicas', 'devices', 'stages', 'micro_batches', 'schedule', 'remat',
    'bounds', 'shard'], defaults=[False])):
  """One way to run the model.

  Attributes:
    replicas: R, data-parallel copies (--worker_replicas).
    devices: K, devices per replica (--worker_split_size).
    stages: S = K x v pipeline stages (v stages per device).
    micro_batches: M.
    schedule: a registered schedule name.
    remat: a remat mode (executor.REMAT_MODES).
    bounds: the cut, S + 1 layer indices [0, b_1, ..., L]; None: the
      stack's even cut (splits=S).
    shard: the optimizer slots sharded over the R replicas
      (learner.shard_optimizer_state).
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
            f'cut={cut}' + (' sharded' if self.shard else ''))


# The learner's knob that shards the optimizer slots over the replicas.
SHARD_KEY = 'task.train.learner.shard_optimizer_state'


class NotPlannable(ValueError):
  """The model has no pipeline the planner knows how to lay out."""


def _Bytes(shape, dtype):
  return shape.num_elements() * dtype.size


def _Sum(values):
  return None if any(v is None for v in values) else sum(values)


class PlanModel:
  """A model's costs by unit, and its layouts' params; see the module
  docstring.

  Args:
    params: the model's params (model_registry.GetParams(key, 'Train'),
      overrides applied).

  Raises:
    NotPlannable: no pipeline plan in the task's FPropMeta, or no static
      batch shapes.
  """

  def __init__(self, params):
    self.params = params
    self.task_cls = params.task.cls
    if params.input is None or 'batch_size' not in params.input:
      raise NotPlannable(f'model {params.name!r} has no input batch_size.')
    self.batch_size = params.input.batch_size
    try:
      self._shapes = params.input.cls.BatchShapes(params.input)
    except NotImplementedError as e:
      raise NotPlannable(f'--mode=plan needs static batch shapes: {e}'
                         ) from None
    try:
      plan = self.Meta(params, self.batch_size).get('plan')
    except NotImplementedError:
      plan = None
    if plan is None or plan.schedule is None:
      raise NotPlannable(
          f'model {params.name!r} runs no pipeline (its task\'s FPropMeta '
          'has no pipeline plan); --mode=plan lays out a layer made of '
          'units with a pipeline_tpl (layers/gpipe_units.py), e.g. a '
          'GPipeStack of your own layers, the ResNet or the LM\'s '
          'GPipeTransformerStack.')
    self.plan = plan
    self._even = {}   # {S: the even cut's bounds}
    self.pipeline_key = plan.path
    self.splits_key = plan.splits_path
    self.stack_key = plan.splits_path.rsplit('.', 1)[0]
    self.num_units = len(plan.units)
    self.current = Layout(1, None, None, plan.num_micro_batches,
                          plan.schedule.name, plan.remat, None)
    batch = self.batch_size
    units = plan.UnitsAt(batch)
    before = plan.BeforeAt(batch)
    loss = plan.LossAt(batch)
    self.unit_names = [u.name for u in units]
    # Forward and backward FLOPs of each unit on the whole batch, what runs
    # before the pipeline in the first, the loss in the last.
    extras = [(before, 0), ([loss] if loss else [], -1)]
    self.item_flops = [u.cost.flops for u in units]
    self.item_bwd_flops = [u.cost.bwd_flops for u in units]
    self.before_flops = _Sum([u.cost.flops for u in before])
    self.loss_flops = loss.cost.flops if loss else 0
    for parts, i in extras:
      for u in parts:
        self.item_flops[i] += u.cost.flops
        self.item_bwd_flops[i] += u.cost.bwd_flops
    self.flops = sum(self.item_flops)
    every = Layout(1, self.num_units, self.num_units, 1, schedules.DEFAULT,
                   'never', None)
    self.item_weights = self._ItemWeights(self.LayoutParams(every))

  def BatchShapes(self, batch):
    """The input's batch shapes with `batch` examples."""
    return self._shapes.Transform(
        lambda s: s.WithDim(0, batch) if s.rank else s)

  def Meta(self, params, batch):
    """The task's FPropMeta of model params on a batch of `batch`."""
    return self.task_cls.FPropMeta(params.task, self.BatchShapes(batch))

  def _ItemWeights(self, params):
    """Per unit (extras folded): [weight bytes, gradient bytes, slot
    bytes], from the model built with every unit a stage on a device of
    its own: a unit's variables by unit, the others (an embedding, a
    softmax) by device."""
    n = self.num_units
    cluster = cluster_lib.Cluster.Params().Set(
        job='plan', num_devices=n, worker_split_size=n).Instantiate()
    with cluster:
      model, _ = base_model.BuildSymbolically(params)
    task = model.task
    unit_of = gpipe_units.UnitOfVariables(task)
    optimizer = task.params.train.learner.optimizer.Instantiate()
    index = {d: i for i, d in enumerate(cluster.devices)}
    out = [[0, 0, 0] for _ in range(n)]
    for key, v in task.vars.FlattenItems():
      path = f'{task.path}.{key}'
      if path in unit_of:
        item = out[unit_of[path]]
      else:
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
    """The layer's own cut of splits=S (one stage per device): units as
    even as its `splits` makes them (worked out once per S)."""
    if num_stages not in self._even:
      stack = self.params.Get(self.stack_key).Copy()
      stack.splits = num_stages
      if stack.pipeline_tpl is not None:
        stack.pipeline_tpl.stages_per_device = 1
      self._even[num_stages] = tuple(gpipe_units.Bounds(stack.cls, stack))
    return list(self._even[num_stages])

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
    out = [(self.splits_key, splits),
           (f'{self.pipeline_key}.num_micro_batches', layout.micro_batches),
           (f'{self.pipeline_key}.schedule', layout.schedule),
           (f'{self.pipeline_key}.remat', layout.remat)]
    # v, when it is not what the params say already (an int splits means
    # K x v stages).
    if per_device != self.params.Get(self.pipeline_key).stages_per_device:
      out.insert(3, (f'{self.pipeline_key}.stages_per_device', per_device))
    if layout.replicas > 1:
      out.append(('input.batch_size', self.PerReplicaBatch(layout)))
    if bool(layout.shard) != bool(self.params.task.train.learner.
                                  shard_optimizer_state):
      out.append((SHARD_KEY, bool(layout.shard)))
    return out

  def LayoutParams(self, layout):
    """A copy of the model params with `layout`'s overrides."""
    params = self.params.Copy()
    for key, value in self.Overrides(layout):
      params.Set(**{key: value})
    return params

  def FlagList(self, layout, key, params_file=None):
    """The trainer's flags that run `layout` of experiment `key`, one
    argument each (unquoted: for a subprocess's argv)."""
    flags = [f'--model={key}', f'--worker_replicas={layout.replicas}',
             f'--worker_split_size={layout.devices}']
    if params_file:
      flags.append(f'--model_params_file_override={params_file}')
    else:
      items = ';'.join(f'{k}={_Text(v)}' for k, v in self.Overrides(layout))
      flags.append(f'--model_params_override={items}')
    return flags

  def Flags(self, layout, key, params_file=None):
    """The trainer command line that runs `layout` of experiment `key`
    (for a shell: the overrides quoted)."""
    flags = self.FlagList(layout, key, params_file)
    if not params_file:
      name, items = flags[-1].split('=', 1)
      flags[-1] = f'{name}="{items}"'
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

  def LayoutPlan(self, layout, schedule=None):
    """The plan re-planned under `layout` (one replica's batch): its cut,
    its schedule (`schedule`, or built by name), micro-batch size and
    remat."""
    size = self.PerReplicaBatch(layout) // layout.micro_batches
    schedule = schedule or schedules.Build(
        layout.schedule, layout.stages, layout.devices, layout.micro_batches)
    return self.plan.Replan(bounds=self.Bounds(layout), schedule=schedule,
                            micro_batch_size=size, remat=layout.remat)

  def DeviceMemory(self, layout, memory=None):
    """(per device of a replica its bytes at its worst moment, one
    replica's devices together at the step's worst moment).

    A device holding several stages holds their sum at each moment
    (memory_estimate.DeviceMemory, over the schedule's ticks). Sharded
    slots (layout.shard): 1/R of each stage's. With R > 1 the update's
    all-reduce buffers (memory_estimate.UpdateBytes).
    """
    memory = memory or self.LayoutPlan(layout)
    weights = self.StageWeights(self.Bounds(layout))
    slots = [w[2] for w in weights]
    if layout.shard and layout.replicas > 1:
      slots = [-(-s // layout.replicas) for s in slots]
    grads = [w[1] for w in weights]
    update = memory_estimate.UpdateBytes(grads, layout.replicas)
    args = (memory, [w[0] for w in weights], slots, grads)
    moments = memory_estimate.Moments(*args, update=update)  # Once for both.
    return ([d.total for d in memory_estimate.DeviceMemory(
        *args, moments=moments)],
            memory_estimate.SharedMemory(*args, moments=moments).total)


def _Text(value):
  return repr(value) if isinstance(value, str) else str(value)


def MicroBatchCounts(batch, current=None):
  """The M to try for a replica's `batch`: powers of two dividing it, and
  the experiment's own M if it divides it."""
  out = {m for m in (2 ** i for i in range(batch.bit_length()))
         if batch % m == 0}
  if current and batch % current == 0:
    out.add(current)
  return sorted(out)
