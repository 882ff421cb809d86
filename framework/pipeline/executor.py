"""The pipeline executor: one engine that runs any schedule's actions.

S stages (stage s runs its cell on device `devices[stage_devices[s]]`) run
M micro-batches. Stage s computes, for micro-batch j,

  out_s[j] = cell_fn_s(theta_s, out_s[j-1], out_{s-1}[j])

where out_s[-1] is `init_states[s]` and out_{-1}[j] is the pipeline's input
j: a stage consumes the previous stage's output of the same micro-batch and
may carry state from micro-batch to micro-batch (`StackedRecurrent`'s
recurrent cells; a GPipe stage takes its template instead). A
`schedules.Schedule` says which action each device runs in which order; a
pipeline_run.PipelineRun runs actions:

  F(s, j)  runs the cell and keeps what its backward needs (`remat`);
  B(s, j)  sums the gradients flowing into (s, j)'s output, back-propagates
           through the cell (from the kept activations or by re-running it)
           and hands the gradients on to (s, j-1) and (s-1, j); the weight
           gradients accumulate per stage on its device;
  W(s, j)  in a schedule that defers W (zero bubble), B computes
           only the input gradients and keeps what the weight gradients
           need (deferred_w.py: the inputs of the weight products and
           the gradients of their outputs); W computes and accumulates the
           weight gradients later. B and W together run the ops of one
           backward, each once: the gradients are those of the whole backward.
Every kind, these three too, runs by the handler registered for it
(`RegisterHandler`), through PipelineRun's public interface: a kind of
one's own (actions.Kind), with work of its own (actions.Work) if it likes.

One entry point, `Run`; where the loss runs is the schedule's property:
  loss outside (`schedule.loss_inside` False, e.g. GPipe): a
    tf.custom_gradient whose forward runs the schedule's forward-phase
    actions (actions.IsForward) and returns each micro-batch's output,
    and whose gradient function runs the others (each device's list puts
    its forwards first); the caller runs its loss on those outputs;
  loss inside: the last stage ends in a per-micro-batch loss, so a
    backward can start as soon as its micro-batch leaves the last stage:
    the custom gradient's forward runs every action in one pass, seeding
    d loss_j / d out = 1 right after F(S-1, j); its gradient function only
    scales the gradients by the upstream one.
`StackedRecurrent` (Lingvo's name: recurrent cells, the loss outside) and
`PipelineLoss` (the loss inside, any schedule) are Run with those
settings.

Order in a graph (tf.function), where TF runs any op whose inputs are
ready: a device runs its actions one at a time, as the schedule orders
them. Each action's inputs wait (control dependencies) for ops that
consume the results of the action `backward_window` W places before it on
the same device (W=1: the previous one; None: no wait). So a re-run waits
for the backward before it and a stage holds the activations of at most W
micro-batches being re-run (GPipe with remat), or of the micro-batches the
schedule keeps in flight (1F1B: min(S - s, M)). The marks are ops that
consume the results: a control dependency on an inlined call's outputs
does not wait for them.

Memory (rematerialisation) by `remat`, what F(s, j) keeps for B(s, j):
  'except_last' (default): nothing, the backward re-runs the cell, except
    for the last micro-batch, whose activations are kept (its backward comes
    first in GPipe);
  'always': nothing: every backward re-runs its cell;
  'never': every activation (plain back-propagation);
  'selective': the outputs of the matrix products with a weight (taken
    after their bias, layout ops or activation when that is all the
    backward reads); the backward recomputes the rest (attention scores,
    norms, residual sums, dropout masks) from them (remat_policy.py
    'weights'; eagerly it keeps all, as 'never').
A re-run waits for its output gradients (control dependencies inside the
cell's backward function), or TF would run it during the forward and keep
its activations: with W=1 a step's peak grows by about a third of what
the unpipelined step's does per layer (bench/gpipe_memory.py prints it).

Each cell is traced once (cell_program.CellProgram) and called per action;
`trace_actions` inlines a copy per call instead, named in the action's scope
(`schedules.Action.scope`), so a profile says which action each op
belonged to (timeline.py).

Example:
  acc, finals = StackedRecurrent(
      devices=['/device:CPU:0', '/device:CPU:1'],
      cell_fns=[cell0, cell1], thetas=[theta0, theta1],
      init_states=[NestedMap(x=tf.zeros([b, d]))] * 2,
      inputs=NestedMap(x=xs),                # [M, b, d]
      step_seed=step_seed.MakeStepSeed(step))
  # acc.x: [M, b, d], the last stage's output per micro-batch.
  loss, per_mb = PipelineLoss(
      devices, [cell0, loss_cell], [theta0, theta1],
      out_templates=[NestedMap(x=tf.TensorSpec([b, d])),
                     NestedMap(loss=tf.TensorSpec([]))],
      inputs=NestedMap(x=xs), side_inputs=NestedMap(y=ys), schedule='1f1b')
"""
import tensorflow as tf

from cadence.framework import cluster as cluster_lib
from cadence.framework.nested_map import NestedMap
from cadence.framework.pipeline import cell_program
from cadence.framework.pipeline import pipeline_run
from cadence.framework.pipeline import schedules
from cadence.framework import step_seed as step_seed_lib

REMAT_MODES = ('except_last', 'always', 'never', 'selective')
LOSS_KEY = 'loss'


def CheckArgs(owner, devices, cell_fns, thetas, init_states, remat,
              backward_window):
  """Raises ValueError for mismatched per-stage lists or a bad knob."""
  k = len(devices)
  if k < 1 or not (len(cell_fns) == len(thetas) == len(init_states) == k):
    raise ValueError(
        f'{owner}: need one device, cell_fn, theta and init_state per cell '
        f'(>= 1); got {len(devices)} devices, {len(cell_fns)} cell_fns, '
        f'{len(thetas)} thetas, {len(init_states)} init_states.')
  if backward_window is not None and (
      isinstance(backward_window, bool) or
      not isinstance(backward_window, int) or backward_window < 1):
    raise ValueError(f'{owner}: backward_window={backward_window!r} must be '
                     'None or an int >= 1.')
  if remat not in REMAT_MODES:
    raise ValueError(f'{owner}: remat={remat!r}; expected one of '
                     f'{REMAT_MODES}.')


def BuildSchedule(owner, name, stage_devices, num_micro_batches,
                  recurrent=False, table=None):
  """The checked schedule for stages on device strings `stage_devices` (one
  per stage; repeats share a device): (schedule, the distinct device
  strings in index order).

  Args:
    owner: names the pipeline in errors.
    name: a registered schedule name (`table`: its text, for
      schedules.TABLE), or a `schedules.Schedule` already built (a
      PipelinePlan's), which must place its stages as `stage_devices` do
      and run `num_micro_batches`.
    stage_devices, num_micro_batches, recurrent, table: see above.
  """
  unique = list(dict.fromkeys(stage_devices))
  if isinstance(name, schedules.Schedule):
    placed = [unique.index(d) for d in stage_devices]
    if (list(name.stage_devices) != placed or
        name.num_micro_batches != num_micro_batches):
      raise ValueError(
          f'{owner}: the plan\'s schedule {name.name!r} places its '
          f'{name.num_stages} stages on devices {list(name.stage_devices)} '
          f'for {name.num_micro_batches} micro-batches; this call has '
          f'{placed} and {num_micro_batches}.')
    if recurrent:
      schedules.Check(name, recurrent=True)
    _CheckHandlers(owner, name)
    return name, unique
  try:
    schedule = schedules.Build(
        name, len(stage_devices), len(unique), num_micro_batches,
        stage_devices=[unique.index(d) for d in stage_devices],
        recurrent=recurrent, table=table)
  except (KeyError, ValueError) as e:
    message = e.args[0] if isinstance(e, KeyError) else str(e)
    raise ValueError(f'{owner}: {message}') from None
  _CheckHandlers(owner, schedule)
  return schedule, unique



# How the executor runs each action kind: fn(run, stage, micro_batch,
# after=ops) -> ops that mark the action done (in a graph; [] or None: none
# of its own), `run` a pipeline_run.PipelineRun.
_HANDLERS = {}


def RegisterHandler(letter, fn):
  """Makes `fn(run, stage, micro_batch, after=ops) -> marks` the executor's
  handler of action kind `letter` (actions.Kind). `run` is a
  pipeline_run.PipelineRun: its Forward, Backward and Weight do the
  built-in work, `(stage, micro_batch, after=ops) -> marks`; Output,
  SetOutput and StageDevice let a handler do work of its own (e.g. move a
  stage's output to the next stage's device). The built-in kinds are
  registered here the same way.

  Example (a kind that does a stage's forward, then its backward):
    def RunForwardBackward(run, i, j, after=()):
      run.Forward(i, j, after=after)
      return run.Backward(i, j)
    RegisterHandler('P', RunForwardBackward)
  """
  if letter in _HANDLERS:
    raise ValueError(f'Action kind {letter!r} has an executor handler '
                     'already.')
  _HANDLERS[letter] = fn


def UnregisterHandler(letter):
  """Removes the handler of kind `letter` (for tests)."""
  del _HANDLERS[letter]


# The built-in kinds' handlers: PipelineRun's own work.
RegisterHandler(schedules.FORWARD, pipeline_run.PipelineRun.Forward)
RegisterHandler(schedules.BACKWARD, pipeline_run.PipelineRun.Backward)
RegisterHandler(schedules.WEIGHT, pipeline_run.PipelineRun.Weight)


def _CheckHandlers(owner, schedule):
  """Raises ValueError naming a kind of `schedule` the executor cannot run."""
  missing = sorted({a.kind for device in schedule.actions for a in device}
                   - set(_HANDLERS))
  if missing:
    raise ValueError(f'{owner}: schedule {schedule.name!r} has actions of '
                     f'kind(s) {missing}, which the executor has no handler '
                     'for (executor.RegisterHandler).')


def _InOrder(schedule):
  """Every action of a schedule in an order that respects its needs: by
  the tick it runs in with unit costs, then by device."""
  return [a for tick in schedule.Ticks() for a in tick]


def _RunForwardThenBackward(pipe, args):
  """The tf.custom_gradient body with the loss outside: the forward-phase
  actions now, the others in its gradient (after the caller's whole
  forward).

  Returns:
    (flat results, gradient function), see `Pipeline` for the layouts.
  """
  order = _InOrder(pipe.schedule)
  run = pipeline_run.PipelineRun(pipe, args)
  run._RunActions([a for a in order if schedules.IsForward(a)], _HANDLERS)  # pylint: disable=protected-access

  def _Grad(*dys, variables=None):
    # pylint: disable=protected-access
    run._StartBackward()
    run._AddResultGradients(dys)
    run._RunActions([a for a in order if not schedules.IsForward(a)],
                    _HANDLERS)
    if variables:
      return run._GradientResults(), [None] * len(variables)
    return run._GradientResults()

  return run._ForwardResults(), _Grad  # pylint: disable=protected-access


def _RunWithLoss(pipe, loss_index, args):
  """The tf.custom_gradient body with the loss inside: every action, in one
  pass.

  Returns:
    ([total loss] + the last stage's output leaves stacked [M, ...], the
    gradient function).
  """
  # pylint: disable=protected-access
  run = pipeline_run.PipelineRun(pipe, args)
  run._RunActions(_InOrder(pipe.schedule), _HANDLERS, loss_index=loss_index)
  last = pipe.num_stages - 1
  with cluster_lib.DeviceScope(pipe.devices[last]):
    outs = run.out[last]
    total = tf.add_n([o[loss_index] for o in outs])
    per_step = [tf.stack([o[n] for o in outs])
                for n in range(pipe.nss[last])]
  grads = run._GradientResults()
  devices = pipe.ArgDevices()

  def _Grad(dy, *unused_dys, variables=None):
    scaled = []
    for g, device in zip(grads, devices):
      if g is None:
        scaled.append(None)
      else:
        with cluster_lib.DeviceScope(device):
          scaled.append(g * tf.cast(dy, g.dtype))
    if variables:
      return scaled, [None] * len(variables)
    return scaled

  return [total] + per_step, _Grad


def _LossIndex(owner, template):
  """The flat index of the scalar float `loss` leaf of the last output."""
  if not isinstance(template, NestedMap) or LOSS_KEY not in template:
    raise ValueError(f'{owner}: the last cell must return a NestedMap with '
                     f'a scalar {LOSS_KEY!r}; its template is {template!r}.')
  keys = [k for k, _ in template.FlattenItems()]
  spec = template[LOSS_KEY]
  if tf.TensorShape(spec.shape).rank != 0 or not spec.dtype.is_floating:
    raise ValueError(f'{owner}: the last cell\'s {LOSS_KEY!r} must be a '
                     f'float scalar; its template is {spec!r}.')
  return keys.index(LOSS_KEY)


def _Zeros(devices, templates):
  """Each stage's template as tensors: TensorSpecs as zeros on its device,
  tensors as they are."""
  out = []
  for device, template in zip(devices, templates):
    with cluster_lib.DeviceScope(device):
      out.append(tf.nest.map_structure(
          lambda s: tf.zeros(s.shape, s.dtype)
          if isinstance(s, tf.TensorSpec) else s, template))
  return out


@tf.autograph.experimental.do_not_convert
def Run(devices, cell_fns, thetas, templates, inputs, side_inputs=None,
        step_seed=None, schedule=schedules.DEFAULT, remat='except_last',
        backward_window=1, owner='Pipeline', trace_actions=False,
        schedule_table=None, recurrent=False, loss_inside=None):
  """The executor's one entry point: S cells over M micro-batches as a
  schedule, its loss inside the pipeline or not as the schedule says
  (`loss_inside`); see the module docstring.

  Args:
    devices: S device strings; stage s runs on devices[s] (stages may share
      a device).
    cell_fns: S functions `cell_fn(theta, state_prev, inputs) -> outputs`,
      pure (stateless randomness from theta.step_seed, weights from
      theta); state_prev is the stage's output of the micro-batch before
      with `recurrent`, else its template (zeros). With the loss inside,
      the last one's inputs are `(inputs, side)` and it returns a
      NestedMap with a float scalar `loss` (the micro-batch's summed loss)
      and anything else per micro-batch.
    thetas: S nested structures (NestedMaps) of the cells' weights.
    templates: S nested structures of tf.TensorSpecs or tensors: stage s's
      output for one micro-batch (stage s+1's input); with `recurrent`,
      stage s's state before micro-batch 0 (specs: zeros).
    inputs: stage 0's inputs: a nested structure of [M, ...] tensors
      (static M), or a list of M nested structures (one per micro-batch).
    side_inputs: with the loss inside, the last stage's side inputs given
      like `inputs` (e.g. labels; no gradient), or None.
    step_seed: optional int64 [2]; micro-batch j's theta (in every stage)
      carries `MicroBatchSeed(step_seed, j)` as `step_seed`.
    schedule: a registered name (`schedule_table`: its text, for
      schedules.TABLE), or a `schedules.Schedule` built already (a
      PipelinePlan's) for these stages' devices and M.
    remat: one of REMAT_MODES, see the module docstring.
    backward_window: an int W >= 1 or None: each action waits for the one W
      places before it on its device (see the module docstring).
    owner: names the pipeline in errors.
    trace_actions: inline the cells' traced functions into the caller's
      graph per call, so that a profile names each op's action (timeline);
      by default each call runs the cell's one traced body.
    schedule_table: the schedule's text, for schedules.TABLE.
    recurrent: whether a stage's state carries from micro-batch j-1 to j
      (StackedRecurrent's cells); a schedule must then run the loss
      outside.
    loss_inside: None: as the schedule says (`Schedule.loss_inside`);
      True: inside whatever the schedule (GPipe's too: every forward with
      its micro-batch's loss, then every backward).

  Returns:
    NestedMap(outputs: the last stage's output per micro-batch, stacked like
    `inputs` (a structure of [M, ...] tensors) or a list of M structures;
    with the loss inside they carry no gradient and `loss` is the sum of
    the micro-batches' (its gradient is the sum of theirs: a caller's
    tape.gradient equals the sequential model's), else `loss` is None and
    `final_states` the S stages' outputs of micro-batch M-1).
  """
  CheckArgs(owner, devices, cell_fns, thetas, templates, remat,
            backward_window)
  m, _ = pipeline_run.NumMicroBatches(inputs, owner)
  plan, unique = BuildSchedule(owner, schedule, list(devices), m,
                               recurrent=recurrent, table=schedule_table)
  init_states = _Zeros(devices, templates)
  if not (plan.loss_inside if loss_inside is None else loss_inside):
    pipe = pipeline_run.Pipeline(
        plan, unique, cell_fns, thetas, init_states, inputs, step_seed,
        remat, backward_window, owner, trace_actions=trace_actions,
        recurrent=recurrent)

    @tf.custom_gradient
    def _Outside(*args):
      return _RunForwardThenBackward(pipe, args)

    outputs, finals = pipe.PackResults(_Outside(*pipe.FlatArgs()))
    return NestedMap(outputs=outputs, loss=None, final_states=finals)
  if recurrent:
    raise ValueError(
        f'{owner}: schedule={plan.name!r} starts backwards before the '
        'forward ends, so it needs the loss inside the pipeline, where cells '
        'carry no state from micro-batch to micro-batch.')
  loss_index = _LossIndex(owner, templates[-1])
  pipe = pipeline_run.Pipeline(
      plan, unique, cell_fns, thetas, init_states, inputs, step_seed, remat,
      backward_window, owner, side_inputs=side_inputs,
      trace_actions=trace_actions)

  @tf.custom_gradient
  def _Inside(*args):
    return _RunWithLoss(pipe, loss_index, args)

  res = _Inside(*pipe.FlatArgs())
  per_step = tf.nest.pack_sequence_as(
      init_states[-1], [tf.stop_gradient(x) for x in res[1:]])
  return NestedMap(outputs=per_step, loss=res[0], final_states=None)


@tf.autograph.experimental.do_not_convert
def StackedRecurrent(devices, cell_fns, thetas, init_states, inputs,
                     step_seed=None, remat='except_last',
                     backward_window=1, name='StackedRecurrent',
                     trace_actions=False, schedule=schedules.DEFAULT,
                     schedule_table=None, recurrent=True):
  """Lingvo's StackedRecurrent: S recurrent cells as a pipeline with the
  loss outside (`Run`, recurrent by default).

  Args:
    devices, thetas, inputs, step_seed, remat, backward_window,
      trace_actions, schedule, schedule_table, recurrent: as `Run`'s.
    cell_fns: S functions `cell_fn(theta, state_prev, inputs) -> state`.
    init_states: S nested structures: stage s's state before micro-batch 0;
      also the template (structure, dtypes, shapes) of stage s's output,
      which is stage s+1's input.
    name: used in error messages.

  Returns:
    (acc_state, final_states): acc_state is the last stage's output per
    micro-batch, stacked like `inputs` (a structure of [M, ...] tensors, or
    a list of M structures); final_states is the list of the S stages'
    states after micro-batch M-1.
  """
  owner = f'StackedRecurrent {name!r}'
  if schedules.LossInside(schedule, schedule_table) if not isinstance(
      schedule, schedules.Schedule) else schedule.loss_inside:
    raise ValueError(
        f'{owner}: schedule={schedule!r} starts backwards before the forward '
        'ends, so it needs the loss inside the pipeline (PipelineLoss).')
  out = Run(devices, cell_fns, thetas, init_states, inputs,
            step_seed=step_seed, schedule=schedule, remat=remat,
            backward_window=backward_window, owner=owner,
            trace_actions=trace_actions, schedule_table=schedule_table,
            recurrent=recurrent)
  return out.outputs, out.final_states


@tf.autograph.experimental.do_not_convert
def PipelineLoss(devices, cell_fns, thetas, out_templates, inputs,
                 side_inputs, step_seed=None, schedule=schedules.DEFAULT,
                 remat='never', name='PipelineLoss', trace_actions=False,
                 backward_window=1, schedule_table=None):
  """S stateless cells ending in a per-micro-batch loss, as any registered
  schedule, the loss inside the pipeline (`Run`).

  Args:
    devices, thetas, inputs, side_inputs, step_seed, schedule, remat,
      trace_actions, backward_window, schedule_table: as `Run`'s.
    cell_fns: S functions `cell_fn(theta, inputs) -> outputs`; the last one
      takes `(inputs, side)` and returns a NestedMap with a float scalar
      `loss`.
    out_templates: S nested structures of tf.TensorSpec (or tensors): stage
      s's output for one micro-batch (stage s+1's input).
    name: used in error messages.

  Returns:
    (loss, per_step): the sum over micro-batches of the last stage's `loss`
    (its gradient flows to thetas and inputs); the last stage's outputs
    stacked [M, ...] (no gradient).
  """
  owner = f'PipelineLoss {name!r}'
  if len(out_templates) != len(devices):
    raise ValueError(f'{owner}: need one out_template per device; got '
                     f'{len(out_templates)} for {len(devices)} devices.')
  stateless = [lambda th, unused_s, x, fn=fn: fn(th, x) for fn in cell_fns]
  out = Run(devices, stateless, thetas, out_templates, inputs,
            side_inputs=side_inputs, step_seed=step_seed, schedule=schedule,
            remat=remat, backward_window=backward_window, owner=owner,
            trace_actions=trace_actions, schedule_table=schedule_table,
            loss_inside=True)
  return out.loss, out.outputs
