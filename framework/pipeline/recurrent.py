"""Recurrent: a cell over time with rematerialised, exact gradients.

`Recurrent(theta, state0, inputs, cell_fn)` runs

  state[t] = cell_fn(theta, state[t-1], inputs[t])      t = 0 .. T-1

as a `tf.while_loop` that keeps only each step's state (not the activations
inside the cell). Its gradient is a custom one: a second while loop walks the
steps in reverse, re-runs `cell_fn` for step t under a GradientTape and
back-propagates through that one step. The gradient is exact (the same
arithmetic as back-propagating an unrolled loop) and memory holds one
step's activations at a time instead of T.

Randomness: with `step_seed`, step t's theta carries the seed
`step_seed.MicroBatchSeed(step_seed, t)` (see `base_layer.WithStepSeed`);
the seed is a function of the loop counter, so the re-run step draws the
forward's masks exactly. A cell with a stateful random op is rejected.

Variables: gradients reach the cell's weights through `theta`. A cell that
reads a trainable tf.Variable not passed in theta is rejected with a
ValueError (it would silently get no gradient); pass the layer's theta.
Non-trainable variables (counters) may be read or updated.

`StackedRecurrent` (S cells on S devices as a pipeline wavefront) lives in
the pipeline executor (`executor.py`) and is re-exported here.

Example:
  def cell_fn(theta, state, inputs):                 # a tanh RNN
    h = tf.tanh(tf.matmul(state.h, theta.w) + inputs.x)
    return NestedMap(h=h)

  theta = NestedMap(w=w)                              # [d, d]
  state0 = NestedMap(h=tf.zeros([batch, d]))
  inputs = NestedMap(x=xs)                            # [T, batch, d]
  acc_state, final_state = Recurrent(theta, state0, inputs, cell_fn)
  # acc_state.h: [T, batch, d]; final_state.h: [batch, d]
"""
import tensorflow as tf

from cadence.framework.pipeline import cell_program
from cadence.framework.pipeline import executor
from cadence.framework import step_seed as step_seed_lib

StackedRecurrent = executor.StackedRecurrent


def _StepTemplate(inputs_flat, owner):
  """Per-step templates (shape[1:]) of [T, ...] inputs; checks T agrees."""
  lengths = {x.shape[0] for x in inputs_flat if x.shape.rank}
  if any(x.shape.rank == 0 for x in inputs_flat):
    raise ValueError(f'{owner}: every input must have a leading time axis '
                     '[T, ...]; got a scalar.')
  lengths.discard(None)
  if len(lengths) > 1:
    raise ValueError(f'{owner}: inputs disagree on the number of steps T: '
                     f'leading dims {sorted(lengths)}.')
  return [tf.TensorSpec(x.shape[1:], x.dtype) for x in inputs_flat]


@tf.autograph.experimental.do_not_convert
def Recurrent(theta, state0, inputs, cell_fn, step_seed=None,
              name='Recurrent'):
  """Runs `cell_fn` over the leading axis of `inputs`; see module docstring.

  Args:
    theta: nested structure (NestedMap) of the cell's weights, tensors or
      variables; the same at every step.
    state0: nested structure of the initial state tensors.
    inputs: nested structure of [T, ...] tensors, at least one leaf.
    cell_fn: `cell_fn(theta, state_prev, inputs_t) -> state_next`, a pure
      function; `state_next` has state0's structure, dtypes and shapes.
    step_seed: optional int64 [2] step seed; step t's theta carries
      `MicroBatchSeed(step_seed, t)` as `theta.step_seed`.
    name: used in error messages.

  Returns:
    (acc_state, final_state): acc_state has state0's structure with [T, ...]
    leaves (the state after each step); final_state is the state after the
    last step (state0 if T == 0).

  Raises:
    ValueError: bad inputs, a cell with a stateful random op, a cell that
      reads a trainable variable outside theta, or a state that changes
      structure, dtype or shape.
  """
  owner = f'Recurrent {name!r}'
  theta_flat = cell_program.ToTensors(theta)
  state_flat = cell_program.ToTensors(state0)
  inputs_flat = cell_program.ToTensors(inputs)
  if not inputs_flat:
    raise ValueError(f'{owner}: inputs must hold at least one [T, ...] '
                     'tensor (T is read from its leading dim).')
  step_specs = _StepTemplate(inputs_flat, owner)
  seed = None
  if step_seed is not None:
    seed = step_seed_lib.CheckStepSeed(step_seed, owner)
  prog = cell_program.CellProgram(
      cell_fn, tf.nest.pack_sequence_as(theta, theta_flat),
      tf.nest.pack_sequence_as(state0, state_flat),
      tf.nest.pack_sequence_as(inputs, step_specs), device=None,
      has_seed=seed is not None, owner=owner)
  nt, ns = len(theta_flat), len(state_flat)

  def _Seed(t):
    return None if seed is None else step_seed_lib.MicroBatchSeed(seed, t)

  @tf.custom_gradient
  def _Run(*args):
    # The outer tape must not record the loop's ops: the custom gradient
    # below replaces them, and recording would keep every step alive.
    args = [tf.stop_gradient(a) for a in args]
    th, s0, xs = args[:nt], args[nt:nt + ns], args[nt + ns:]
    num_steps = tf.shape(xs[0])[0]
    tas = [tf.TensorArray(s.dtype, size=num_steps, element_shape=s.shape)
           for s in s0]

    def _Body(t, state, tas):
      new_state = prog.Forward(th, state, [x[t] for x in xs], _Seed(t))
      tas = [ta.write(t, v) for ta, v in zip(tas, new_state)]
      return t + 1, new_state, tas

    _, final, tas = tf.while_loop(
        lambda t, *_: t < num_steps, _Body, (tf.constant(0), s0, tas))
    acc = [ta.stack() for ta in tas]

    def _Grad(*dys, variables=None):
      return _Backward(prog, th, s0, xs, acc, final, dys, _Seed, variables)

    return acc + list(final), _Grad

  out = _Run(*(theta_flat + state_flat + inputs_flat))
  acc_state = tf.nest.pack_sequence_as(state0, out[:ns])
  final_state = tf.nest.pack_sequence_as(state0, out[ns:])
  return acc_state, final_state


def _Backward(prog, th, s0, xs, acc, final, dys, seed_fn, variables):
  """Reverse while loop: per step, re-run and back-propagate one cell."""
  ns = len(s0)
  d_acc, d_final = list(dys[:ns]), list(dys[ns:])
  theta_mask, _, inputs_mask = prog.BackwardMask()
  s_float = [cell_program.IsDifferentiable(s) for s in s0]
  num_steps = tf.shape(xs[0])[0]

  def _Or0(d, like):
    return tf.zeros_like(like) if d is None else d

  # Gradient of the state after step t, accumulated from the later steps.
  carry0 = [_Or0(d_final[k], final[k]) for k in range(ns) if s_float[k]]
  d_acc = [_Or0(d_acc[k], acc[k]) for k in range(ns) if s_float[k]]
  dth0 = [tf.zeros_like(x) for x, m in zip(th, theta_mask) if m]
  dx_tas = [tf.TensorArray(x.dtype, size=num_steps, element_shape=x.shape[1:])
            for x, m in zip(xs, inputs_mask) if m]

  def _Body(t, carry, dth, dx_tas):
    prev = tf.maximum(t - 1, 0)
    s_prev = [tf.where(t > 0, a[prev], s) for a, s in zip(acc, s0)]
    d_out = [c + d[t] for c, d in zip(carry, d_acc)]
    g_th, g_s, g_x = prog.Backward(th, s_prev, [x[t] for x in xs],
                                   seed_fn(t), d_out)
    dth = [a + g for a, g in zip(dth, [g for g in g_th if g is not None])]
    carry = [g if g is not None else tf.zeros_like(a)
             for g, a, f in zip(g_s, s0, s_float) if f]
    dx_tas = [ta.write(t, g) for ta, g in
              zip(dx_tas, [g for g in g_x if g is not None])]
    return t - 1, carry, dth, dx_tas

  _, carry, dth, dx_tas = tf.while_loop(
      lambda t, *_: t >= 0, _Body, (num_steps - 1, carry0, dth0, dx_tas))
  dth, carry = iter(dth), iter(carry)
  dxs = iter([ta.stack() for ta in dx_tas])
  grads = [next(dth) if m else None for m in theta_mask]
  # d state0 is the final carry (zeros where no step reads state_prev,
  # d_final itself when T == 0).
  grads += [next(carry) if f else None for f in s_float]
  grads += [next(dxs) if m else None for m in inputs_mask]
  if variables:
    return grads, [None] * len(variables)
  return grads
