"""PipelineLoss: a pipeline that ends in a per-step loss, run as 1F1B.

K cells (cell i on `devices[i]`) run M steps (micro-batches) as a pipeline,
as in `stacked_recurrent.py`, but the last cell ends in a loss: its output
for step j is a NestedMap holding a scalar `loss` (the step's summed loss)
and anything else the caller wants per step (metric sums, per-example
values). The pipeline returns the sum of the steps' losses; its gradient is
the sum of the steps' gradients, so a caller's `tape.gradient` at the top
equals the sequential model's.

Why the loss moves inside: behind a tf.custom_gradient no backward can start
before the caller's whole forward, so a 1F1B schedule (after a warm-up,
each cell alternates the forward of a new step with the backward of an old
one; `schedules.OneFOneBSchedule`) needs the gradient of each
step's loss as soon as that step leaves the last cell. Here the custom
gradient's *forward* walks the whole tick table once: F(i, j) runs the
cell; right after F(K-1, j) the step's loss seeds d loss_j / d out = 1;
B(i, j) back-propagates (from the kept activations, or by re-running the
cell: `remat`); weight and input gradients accumulate per cell on its
device. The gradient function only scales them by the upstream gradient of
the total loss.

Order in a graph (tf.function), where the executor runs any op whose
inputs are ready: each cell's actions are chained in the table's order (an
action's inputs wait for ops that consume the previous action's results),
so cell i holds the activations of at most `InFlight(table)[i]` steps:
min(K - i, M) for 1F1B, M for GPipe ('never' remat).

Cells carry no state from step to step (`cell_fn(theta, inputs)`); the last
cell's inputs are `(inputs, side)` where `side` is the step's slice of
`side_inputs` (e.g. the labels), which gets no gradient.

Example:
  loss, per_step = PipelineLoss(
      devices=['/device:CPU:0', '/device:CPU:1'],
      cell_fns=[lambda th, x: NestedMap(h=tf.tanh(x.h @ th.w)),
                lambda th, xs: NestedMap(loss=tf.reduce_sum(
                    (xs[0].h @ th.w - xs[1].y) ** 2))],
      thetas=[NestedMap(w=w0), NestedMap(w=w1)],
      out_templates=[NestedMap(h=tf.TensorSpec([b, d])),
                     NestedMap(loss=tf.TensorSpec([]))],
      inputs=NestedMap(h=xs),            # [M, b, d]
      side_inputs=NestedMap(y=ys),       # [M, b, d]
      schedule='1f1b')
  # loss: sum of the M steps' losses; per_step.loss: [M] (no gradient).
"""
import tensorflow as tf

from cadence.framework import cluster as cluster_lib
from cadence.framework.nested_map import NestedMap
from cadence.framework.pipeline import schedules
from cadence.framework.pipeline import stacked_recurrent

SCHEDULES = {'gpipe': schedules.GPipeSchedule,
             '1f1b': schedules.OneFOneBSchedule}
LOSS_KEY = 'loss'


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


def _Marks(device, tensors):
  """Ops that consume `tensors` on `device`: what a next action waits for
  (a control dependency on an inlined call's outputs would not wait)."""
  with cluster_lib.DeviceScope(device):
    return [tf.identity(x) for x in tensors]


def _RunTable(pipe, ticks, loss_index, args):
  """The tf.custom_gradient body: every action of `ticks`, in one pass.

  Returns:
    ([total loss] + the last cell's output leaves stacked [M, ...], the
    gradient function).
  """
  fwd = stacked_recurrent.ForwardPass(pipe, args)
  bwd = stacked_recurrent.BackwardPass(fwd)
  k, m, last = pipe.k, pipe.m, pipe.k - 1
  graph = not tf.executing_eagerly()
  marks = [[] for _ in range(k)]   # What each cell's next action waits for.
  for action in [a for tick in ticks for a in tick]:
    i, j = action.cell, action.step
    with tf.name_scope(action.scope):   # Profiles name each op's action.
      if action.kind == schedules.FORWARD:
        fwd.Forward(i, j, after=marks[i])
        out = fwd.out[i][j]
        if i == last:   # d loss_j / d loss_j: the step's backward can start.
          with cluster_lib.DeviceScope(pipe.devices[i]):
            bwd.Add(i, j, loss_index, tf.ones_like(out[loss_index]))
        if graph:
          marks[i] = _Marks(pipe.devices[i], out)
      else:
        marks[i] = bwd.Backward(i, j, after=marks[i]) or marks[i]
  with cluster_lib.DeviceScope(pipe.devices[last]):
    outs = fwd.out[last]
    total = tf.add_n([o[loss_index] for o in outs])
    per_step = [tf.stack([o[n] for o in outs])
                for n in range(pipe.nss[last])]
  grads = bwd.Results()
  devices = ([d for i, d in enumerate(pipe.devices) for _ in range(pipe.nts[i])]
             + [d for i, d in enumerate(pipe.devices)
                for _ in range(pipe.nss[i])] +
             [pipe.devices[0]] * (pipe.nx if pipe.stacked else m * pipe.nx))

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


@tf.autograph.experimental.do_not_convert
def PipelineLoss(devices, cell_fns, thetas, out_templates, inputs,
                 side_inputs, step_seed=None, schedule='1f1b',
                 remat='never', name='PipelineLoss', trace_actions=False):
  """Runs K cells over M steps ending in a per-step loss; see the module
  docstring.

  Args:
    devices: K device strings; cell i runs on devices[i].
    cell_fns: K functions `cell_fn(theta, inputs) -> outputs`, pure
      (stateless randomness from theta.step_seed); the last one takes
      `(inputs, side)` and returns a NestedMap with a float scalar `loss`.
    thetas: K nested structures of the cells' weights (tensors).
    out_templates: K nested structures of tf.TensorSpec (or tensors): cell
      i's output for one step (cell i+1's input).
    inputs: cell 0's inputs, a nested structure of [M, ...] tensors.
    side_inputs: the last cell's side inputs, [M, ...] tensors (no
      gradient).
    step_seed: optional int64 [2]; step j's theta carries
      `MicroBatchSeed(step_seed, j)`.
    schedule: 'gpipe' or '1f1b' (SCHEDULES).
    remat: one of stacked_recurrent.REMAT_MODES; 'never' keeps each
      step's activations until its backward (1F1B bounds them by K).
    name: used in error messages.
    trace_actions: as StackedRecurrent's (inline the cells per call, so a
      profile names each op's action).

  Returns:
    (loss, per_step): loss, the sum over steps of the last cell's `loss`
    (its gradient flows to thetas and inputs); per_step, the last cell's
    outputs stacked [M, ...] (no gradient).
  """
  owner = f'PipelineLoss {name!r}'
  if schedule not in SCHEDULES:
    raise ValueError(f'{owner}: schedule={schedule!r}; expected one of '
                     f'{sorted(SCHEDULES)}.')
  k = len(devices)
  if len(out_templates) != k:
    raise ValueError(f'{owner}: need one out_template per device; got '
                     f'{len(out_templates)} for {k} devices.')
  loss_index = _LossIndex(owner, out_templates[-1])
  init_states = []
  for device, template in zip(devices, out_templates):
    with cluster_lib.DeviceScope(device):
      init_states.append(tf.nest.map_structure(
          lambda s: tf.zeros(s.shape, s.dtype), template))
  stacked_recurrent.CheckArgs(owner, devices, cell_fns, thetas, init_states,
                              remat, None)
  stateless = [lambda th, unused_s, x, fn=fn: fn(th, x) for fn in cell_fns]
  pipe = stacked_recurrent.Pipeline(devices, stateless, thetas, init_states,
                                    inputs, step_seed, remat, None, owner,
                                    side_inputs=side_inputs,
                                    trace_actions=trace_actions)
  ticks = SCHEDULES[schedule](pipe.k, pipe.m)

  @tf.custom_gradient
  def _Run(*args):
    return _RunTable(pipe, ticks, loss_index, args)

  res = _Run(*pipe.FlatArgs())
  per_step = tf.nest.pack_sequence_as(
      out_templates[-1], [tf.stop_gradient(x) for x in res[1:]])
  return res[0], per_step
