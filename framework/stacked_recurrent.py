"""StackedRecurrent: K recurrent cells on K devices, run as a wavefront.

Cell i (on `devices[i]`) computes

  state_i[j] = cell_fn_i(theta_i, state_i[j-1], state_{i-1}[j])

for steps j = 0 .. M-1, where state_i[-1] is `init_states[i]` and
state_{-1}[j] is `inputs[j]`: cell i consumes cell i-1's output of the same
step. In GPipe the steps are micro-batches and the cells are the model's
partitions; a cell ignores its own previous state.

Schedule (`WavefrontSchedule`): at tick t, cell i works on step t - i, so the
K cells overlap and the whole run takes M + K - 1 ticks; the backward pass
walks the ticks in reverse. The forward and the backward of every (cell,
step) are built under `tf.device(devices[i])`, and so is the accumulation of
cell i's weight gradients: no op of cell i lands on another device (TF's
own while-loop gradient would put them all on device 0).

Memory (rematerialisation): the forward keeps only each cell's output per
step. The backward re-runs cell i on step j (under a GradientTape) before
back-propagating through it, so one extra forward is the price. `remat`
picks which (cell, step) pairs are re-run:
  'except_last' (default): all but the last step of each cell, whose
    activations are kept from the forward and used at once (its backward
    starts right after the forward ends); as torchgpipe does;
  'always': every pair is re-run;
  'never': none (plain back-propagation; activations of all steps live).

Ordering, so that the memory bound holds in a graph (tf.function), where the
executor runs any op whose inputs are ready:
  * a re-run waits for its output gradients (control dependencies inside
    the cell's backward function), or it would run during the forward pass
    and keep its activations (and grappler could even merge it with the
    forward's identical ops);
  * with `backward_window` W, step j's re-run also waits until the
    backward of step j+W of the same cell is done, so a cell holds the
    activations of at most W steps: W=1 (default) one at a time (as a
    device that runs one op at a time would); W=2 lets the next step's
    re-run overlap the current back-propagation (on a CPU that fills idle
    cores); None: no bound. The dependency is on ops that consume those
    gradients: a control dependency on an inlined function call's outputs
    does not wait for them.
Measured (bench/gpipe_memory.py, d 256 Transformer, batch 32, M=8): peak
tensor memory of a training step grows by 10 MiB per layer with W=1 (K=1
and K=4), 18 MiB (K=1) and 13 MiB (K=4) with W=2, 33 MiB unpipelined.

Example:
  acc, finals = StackedRecurrent(
      devices=['/device:CPU:0', '/device:CPU:1'],
      cell_fns=[cell0, cell1], thetas=[theta0, theta1],
      init_states=[NestedMap(x=tf.zeros([b, d]))] * 2,
      inputs=NestedMap(x=xs),                # [M, b, d]
      step_seed=step_seed.MakeStepSeed(step))
  # acc.x: [M, b, d], the last cell's output per step.
"""
import tensorflow as tf

from cadence.framework import cell_program
from cadence.framework import cluster as cluster_lib
from cadence.framework import step_seed as step_seed_lib

REMAT_MODES = ('except_last', 'always', 'never')


def WavefrontSchedule(num_cells, num_steps):
  """The tick table of the wavefront.

  Args:
    num_cells: K >= 1.
    num_steps: M >= 1.

  Returns:
    A list of M + K - 1 ticks; tick t is the list of (cell, step) pairs that
    run at t, i.e. (i, t - i) for every cell i with 0 <= t - i < M, in
    increasing cell order.
  """
  if num_cells < 1 or num_steps < 1:
    raise ValueError(f'WavefrontSchedule: num_cells={num_cells} and '
                     f'num_steps={num_steps} must both be >= 1.')
  return [[(i, t - i) for i in range(num_cells) if 0 <= t - i < num_steps]
          for t in range(num_steps + num_cells - 1)]


def _NumSteps(inputs, owner):
  """(M, stacked) for inputs given stacked [M, ...] or as a list of M."""
  if isinstance(inputs, (list, tuple)):
    if not inputs:
      raise ValueError(f'{owner}: inputs is an empty list; need >= 1 step.')
    return len(inputs), False
  flat = cell_program.ToTensors(inputs)
  if not flat:
    raise ValueError(f'{owner}: inputs must hold at least one [M, ...] '
                     'tensor.')
  dims = {x.shape[0] if x.shape.rank else None for x in flat}
  if None in dims or len(dims) != 1:
    raise ValueError(
        f'{owner}: every input needs the same static leading dim M (steps); '
        f'got leading dims {[x.shape.as_list()[:1] for x in flat]}.')
  m = dims.pop()
  if m < 1:
    raise ValueError(f'{owner}: inputs have M=0 steps; need >= 1.')
  return m, True


@tf.autograph.experimental.do_not_convert
def StackedRecurrent(devices, cell_fns, thetas, init_states, inputs,
                     step_seed=None, remat='except_last',
                     backward_window=1, name='StackedRecurrent'):
  """Runs K cells on K devices as a pipeline; see the module docstring.

  Args:
    devices: K device strings; cell i runs on devices[i].
    cell_fns: K functions `cell_fn(theta, state_prev, inputs) -> state`,
      pure (stateless randomness from theta.step_seed, weights from theta).
    thetas: K nested structures (NestedMaps) of the cells' weights.
    init_states: K nested structures: cell i's state before step 0; also
      the template (structure, dtypes, shapes) of cell i's output, which is
      cell i+1's input.
    inputs: cell 0's inputs: a nested structure of [M, ...] tensors (static
      M), or a list of M nested structures (one per step).
    step_seed: optional int64 [2]; step j's theta (in every cell) carries
      `MicroBatchSeed(step_seed, j)` as `step_seed`.
    remat: one of REMAT_MODES, see the module docstring.
    backward_window: an int W >= 1 or None: step j's re-run in cell i
      waits for the backward of step j+W of cell i, so a cell holds the
      activations of at most W steps (see the module docstring).
    name: used in error messages.

  Returns:
    (acc_state, final_states): acc_state is the last cell's output per step,
    stacked like `inputs` (a structure of [M, ...] tensors, or a list of M
    structures); final_states is the list of the K cells' states after
    step M-1.
  """
  owner = f'StackedRecurrent {name!r}'
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
  m, stacked = _NumSteps(inputs, owner)
  seed = None
  if step_seed is not None:
    seed = step_seed_lib.CheckStepSeed(step_seed, owner)
  seeds = [None if seed is None else step_seed_lib.MicroBatchSeed(seed, j)
           for j in range(m)]

  theta_flat = [cell_program.ToTensors(t) for t in thetas]
  init_flat = [cell_program.ToTensors(s) for s in init_states]
  if stacked:
    x_struct = inputs
    x_flat = cell_program.ToTensors(inputs)
    x_step = [tf.TensorSpec(x.shape[1:], x.dtype) for x in x_flat]
  else:
    x_struct = inputs[0]
    x_flat = [x for step in inputs for x in cell_program.ToTensors(step)]
    x_step = cell_program.ToTensors(inputs[0])
  nx = len(x_step)

  progs = []
  for i in range(k):
    in_template = (tf.nest.pack_sequence_as(x_struct, x_step) if i == 0
                   else tf.nest.pack_sequence_as(init_states[i - 1],
                                                 init_flat[i - 1]))
    progs.append(cell_program.CellProgram(
        cell_fns[i], tf.nest.pack_sequence_as(thetas[i], theta_flat[i]),
        tf.nest.pack_sequence_as(init_states[i], init_flat[i]), in_template,
        device=devices[i], has_seed=seed is not None,
        owner=f'{owner} cell {i}'))
  schedule = WavefrontSchedule(k, m)
  nts = [len(t) for t in theta_flat]
  nss = [len(s) for s in init_flat]

  def _Keep(j):
    return remat == 'never' or (remat == 'except_last' and j == m - 1)

  @tf.custom_gradient
  def _Run(*args):
    # Stop the outer tape from recording the ops below; the gradient is
    # the custom one, and recording would keep all activations alive.
    args = iter([tf.stop_gradient(a) for a in args])
    th = [[next(args) for _ in range(n)] for n in nts]
    init = [[next(args) for _ in range(n)] for n in nss]
    xs = list(args)
    with cluster_lib.DeviceScope(devices[0]):
      if stacked:
        per_leaf = [tf.unstack(x, num=m) for x in xs]
        mb_x = [[leaf[j] for leaf in per_leaf] for j in range(m)]
      else:
        mb_x = [xs[j * nx:(j + 1) * nx] for j in range(m)]
    for i in range(k):
      with cluster_lib.DeviceScope(devices[i]):
        th[i] = [tf.identity(x) for x in th[i]]

    out = [[None] * m for _ in range(k)]
    kept = {}

    def _Args(i, j):
      x = mb_x[j] if i == 0 else out[i - 1][j]
      s = init[i] if j == 0 else out[i][j - 1]
      return th[i], s, x, seeds[j]

    for tick in schedule:
      for i, j in tick:
        if _Keep(j):
          kept[(i, j)], out[i][j] = progs[i].ForwardKeep(*_Args(i, j))
        else:
          out[i][j] = progs[i].Forward(*_Args(i, j))

    last = [out[k - 1][j] for j in range(m)]
    if stacked:
      with cluster_lib.DeviceScope(devices[-1]):
        acc = [tf.stack([o[n] for o in last]) for n in range(nss[-1])]
    else:
      acc = [x for o in last for x in o]
    finals = [x for i in range(k) for x in out[i][m - 1]]

    def _Grad(*dys, variables=None):
      grads = _Backward(dys, len(acc))
      if variables:
        return grads, [None] * len(variables)
      return grads

    def _Backward(dys, n_acc):
      d_acc, d_final = list(dys[:n_acc]), list(dys[n_acc:])
      pending = {}   # (cell, step, leaf) -> [gradient terms]

      def _Add(i, j, n, g):
        if g is not None:
          pending.setdefault((i, j, n), []).append(g)

      ns_last = nss[-1]
      if stacked:
        with cluster_lib.DeviceScope(devices[-1]):
          for n, d in enumerate(d_acc):
            if d is not None:
              for j, dj in enumerate(tf.unstack(d, num=m)):
                _Add(k - 1, j, n, dj)
      else:
        for idx, d in enumerate(d_acc):
          _Add(k - 1, idx // ns_last, idx % ns_last, d)
      offset = 0
      for i in range(k):
        for n in range(nss[i]):
          _Add(i, m - 1, n, d_final[offset + n])
        offset += nss[i]

      d_th = [[None] * n for n in nts]
      d_init = [[None] * n for n in nss]
      d_x = [[None] * nx for _ in range(m)]
      done = [[] for _ in range(k)]   # Per cell: each backward's grads.
      for tick in reversed(schedule):
        for i, j in tick:
          with cluster_lib.DeviceScope(devices[i]):
            terms = [pending.pop((i, j, n), None) for n in range(nss[i])]
            if not any(terms):
              continue   # Nothing flows back into this (cell, step).
            d_out = [
                (tf.add_n(t) if len(t) > 1 else t[0]) if t else
                tf.zeros_like(o) for t, o in zip(terms, out[i][j])
                if cell_program.IsDifferentiable(o)]
            w = backward_window
            if w and len(done[i]) >= w and done[i][-w]:
              # Step j's re-run starts once step j+w's backward is done, so
              # a cell holds the activations of at most w steps.
              with tf.control_dependencies(done[i][-w]):
                d_out = [tf.identity(d) for d in d_out]
          if (i, j) in kept:
            g_th, g_s, g_x = kept.pop((i, j))(d_out)
          else:
            g_th, g_s, g_x = progs[i].Backward(*_Args(i, j), d_out)
          with cluster_lib.DeviceScope(devices[i]):
            d_th[i] = [a if g is None else (tf.identity(g) if a is None
                                            else a + g)
                       for a, g in zip(d_th[i], g_th)]
            if backward_window and not tf.executing_eagerly():
              # Ops that consume the gradients: a control dependency on the
              # outputs of an inlined function call itself would not wait.
              done[i].append([g for g in d_th[i] if g is not None] + [
                  tf.identity(g) for g in g_s + g_x if g is not None])
          for n, g in enumerate(g_s):
            if j > 0:
              _Add(i, j - 1, n, g)
            else:
              d_init[i][n] = g
          for n, g in enumerate(g_x):
            if i > 0:
              _Add(i - 1, j, n, g)
            else:
              d_x[j][n] = g

      grads = [g for cell in d_th for g in cell]
      grads += [g for cell in d_init for g in cell]
      if stacked:
        with cluster_lib.DeviceScope(devices[0]):
          for n in range(nx):
            col = [d_x[j][n] for j in range(m)]
            if all(g is None for g in col):
              grads.append(None)
            else:
              grads.append(tf.stack([
                  tf.zeros_like(mb_x[j][n]) if g is None else g
                  for j, g in enumerate(col)]))
      else:
        grads += [g for step in d_x for g in step]
      return grads

    return acc + finals, _Grad

  flat_args = [x for t in theta_flat for x in t]
  flat_args += [x for s in init_flat for x in s]
  flat_args += x_flat
  res = _Run(*flat_args)
  ns_last = nss[-1]
  if stacked:
    acc_state = tf.nest.pack_sequence_as(init_states[-1], res[:ns_last])
    rest = res[ns_last:]
  else:
    acc_state = [tf.nest.pack_sequence_as(init_states[-1],
                                          res[j * ns_last:(j + 1) * ns_last])
                 for j in range(m)]
    rest = res[m * ns_last:]
  finals, offset = [], 0
  for i in range(k):
    finals.append(tf.nest.pack_sequence_as(
        init_states[i], rest[offset:offset + nss[i]]))
    offset += nss[i]
  return acc_state, finals
