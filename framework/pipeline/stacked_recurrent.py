"""StackedRecurrent: K recurrent cells on K devices, run as a pipeline.

Cell i (on `devices[i]`) computes

  state_i[j] = cell_fn_i(theta_i, state_i[j-1], state_{i-1}[j])

for steps j = 0 .. M-1, where state_i[-1] is `init_states[i]` and
state_{-1}[j] is `inputs[j]`: cell i consumes cell i-1's output of the same
step. In GPipe the steps are micro-batches and the cells are the model's
partitions; a cell ignores its own previous state.

Schedule: a pure table from `pipeline_schedule` says which (cell, step)
runs forward (F) or backward (B) at which tick; the code here runs it.
StackedRecurrent runs `GPipeSchedule`: the wavefront (`WavefrontSchedule`:
at tick t, cell i works on step t - i, so the K cells overlap and the whole
run takes M + K - 1 ticks), then the backward, walking the ticks in reverse.
The forward and the backward of every (cell, step) are built under
`tf.device(devices[i])`, and so is the accumulation of cell i's weight
gradients: no op of cell i lands on another device (TF's own while-loop
gradient would put them all on device 0).

Code: `Pipeline` holds what a call fixes (the K traced cells, the layout
of the flat arguments); `ForwardPass.Forward(i, j)` runs an F action and
keeps what the backward needs; `BackwardPass.Backward(i, j)` runs a B
action: it sums the gradients flowing into (i, j)'s output, back-propagates
through the cell and hands the gradients on to (i, j-1) and (i-1, j).
`_RunForwardThenBackward` is the executor: a tf.custom_gradient whose
forward runs the schedule's F actions and whose gradient function runs its
B actions.

Memory (rematerialisation): the forward keeps only each cell's output per
step. The backward re-runs cell i on step j (under a GradientTape) before
back-propagating through it, so one extra forward is the price. `remat`
picks which (cell, step) pairs are re-run:
  'except_last' (default): all but the last step of each cell, whose
    activations are kept from the forward and used at once (its backward
    starts right after the forward ends); as torchgpipe does;
  'always': every pair is re-run;
  'never': none (plain back-propagation; activations of all steps live);
  'selective': none is re-run whole: each step keeps only the outputs of
    its matrix products with a weight (taken after their bias, layout ops
    or activation when that is all the backward reads), and the backward
    recomputes the rest (attention scores, norms, residual sums, dropout
    masks) from them (framework/pipeline/remat_policy.py 'weights'; eagerly it
    keeps all, as 'never').

Ordering, so that the memory bound holds in a graph (tf.function), where the
executor runs any op whose inputs are ready:
  * a re-run waits for its output gradients (control dependencies inside
    the cell's backward function), or it would run during the forward pass
    and keep its activations (and grappler could even merge it with the
    forward's identical ops);
  * with `backward_window` W, a cell's re-run also waits until the
    backward W before it in the cell's order (in GPipe's, step j+W's for
    step j) is done, so a cell holds the activations of at most W steps:
    W=1 (default) one at a time (as a device that runs one op at a time
    would); W=2 lets the next step's re-run overlap the current
    back-propagation (on a CPU that fills idle cores); None: no bound. The
    dependency is on ops that consume those gradients: a control dependency
    on an inlined function call's outputs does not wait for them.
Measured (bench/gpipe_memory.py, d 256 Transformer, batch 32, M=8): peak
tensor memory of a training step grows by 10 MiB per layer with W=1 (K=1
and K=4), 18 MiB (K=1) and 13 MiB (K=4) with W=2, 33 MiB unpipelined.

Each cell is traced once (cell_program.CellProgram) and called per step, one
body per cell; `trace_actions` inlines a copy per call instead, named in the
action's scope (`schedules.Action.scope`), so that a profile says
which action each op belonged to (pipeline_timeline).

1F1B: `pipeline_loss.PipelineLoss` runs a second executor over these
units: cells without state between steps and a per-step loss in the last
cell, so each step's backward can start as soon as its forward leaves the
last cell; it walks any tick table (GPipeSchedule or OneFOneBSchedule) in
one pass, chaining each cell's actions with the `after` arguments of
`ForwardPass.Forward` and `BackwardPass.Backward`.

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

from cadence.framework import cluster as cluster_lib
from cadence.framework.pipeline import cell_program
from cadence.framework.pipeline import schedules
from cadence.framework import step_seed as step_seed_lib

REMAT_MODES = ('except_last', 'always', 'never', 'selective')

# The forward's tick table; it lives with the other schedules.
WavefrontSchedule = schedules.WavefrontSchedule

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


def CheckArgs(owner, devices, cell_fns, thetas, init_states, remat,
               backward_window):
  """Raises ValueError for mismatched per-cell lists or a bad knob."""
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


class Pipeline:
  """What one call fixes before it runs: K traced cells, flat layouts.

  The executor's tf.custom_gradient takes and returns flat lists of tensors.
  Flat arguments: every cell's theta leaves, every cell's init_state
  leaves, then cell 0's input leaves ([M, ...] each, or step by step).
  Flat results: the last cell's output leaves ([M, ...] each, or step by
  step), then every cell's final state leaves.
  """

  def __init__(self, devices, cell_fns, thetas, init_states, inputs,
               step_seed, remat, backward_window, owner, side_inputs=None,
               trace_actions=False):
    self.devices = list(devices)
    self.k = len(devices)
    self.m, self.stacked = _NumSteps(inputs, owner)
    # Side inputs: the last cell's, per step (e.g. a loss's labels), given
    # like `inputs`; no gradient flows to them.
    self.side = side_inputs
    self.side_stacked = None
    if side_inputs is not None and tf.nest.flatten(side_inputs):
      m, self.side_stacked = _NumSteps(side_inputs, owner)
      if m != self.m:
        raise ValueError(f'{owner}: side_inputs have {m} steps; the inputs '
                         f'have M={self.m}.')
    seed = None
    if step_seed is not None:
      seed = step_seed_lib.CheckStepSeed(step_seed, owner)
    self.remat = remat
    self.backward_window = backward_window
    self.seeds = [None if seed is None else
                  step_seed_lib.MicroBatchSeed(seed, j) for j in range(self.m)]
    self._init_states = init_states
    self._theta_flat = [cell_program.ToTensors(t) for t in thetas]
    self._init_flat = [cell_program.ToTensors(s) for s in init_states]
    if self.stacked:
      x_struct = inputs
      self._x_flat = cell_program.ToTensors(inputs)
      x_step = [tf.TensorSpec(x.shape[1:], x.dtype) for x in self._x_flat]
    else:
      x_struct = inputs[0]
      self._x_flat = [x for step in inputs
                      for x in cell_program.ToTensors(step)]
      x_step = cell_program.ToTensors(inputs[0])
    self.nx = len(x_step)
    self.nts = [len(t) for t in self._theta_flat]   # Leaves per cell.
    self.nss = [len(s) for s in self._init_flat]
    self.programs = []
    for i in range(self.k):
      in_template = (tf.nest.pack_sequence_as(x_struct, x_step) if i == 0
                     else tf.nest.pack_sequence_as(init_states[i - 1],
                                                   self._init_flat[i - 1]))
      if self.side is not None and i == self.k - 1:
        in_template = (in_template, self._SideTemplate())
      self.programs.append(cell_program.CellProgram(
          cell_fns[i],
          tf.nest.pack_sequence_as(thetas[i], self._theta_flat[i]),
          tf.nest.pack_sequence_as(init_states[i], self._init_flat[i]),
          in_template, device=devices[i], has_seed=seed is not None,
          owner=f'{owner} cell {i}', inline=trace_actions))

  def _SideTemplate(self):
    if not self.side_stacked:   # A list of M structures (or empty).
      return self.side if self.side_stacked is None else self.side[0]
    return tf.nest.map_structure(
        lambda x: tf.TensorSpec(x.shape[1:], x.dtype), self.side)

  def SideSteps(self):
    """The side inputs' flat leaves per step (on the caller's device)."""
    if self.side_stacked is None:
      return [[] for _ in range(self.m)]
    if not self.side_stacked:
      return [[tf.stop_gradient(x) for x in cell_program.ToTensors(step)]
              for step in self.side]
    per_leaf = [tf.unstack(tf.stop_gradient(x), num=self.m)
                for x in cell_program.ToTensors(self.side)]
    return [[leaf[j] for leaf in per_leaf] for j in range(self.m)]

  def NumInputs(self, i):
    """Leaves of cell i's input that come from the previous cell (or the
    pipeline's inputs), side inputs excluded."""
    return self.nx if i == 0 else self.nss[i - 1]

  def Keep(self, j):
    """The remat_policy of what the forward of step j keeps for its
    backward, or None: nothing (the backward re-runs the cell)."""
    if self.remat == 'selective':
      return 'weights'
    if self.remat == 'never' or (self.remat == 'except_last' and
                                 j == self.m - 1):
      return 'all'
    return None

  def FlatArgs(self):
    return ([x for t in self._theta_flat for x in t] +
            [x for s in self._init_flat for x in s] + self._x_flat)

  def SplitArgs(self, args):
    """Flat arguments -> (K theta lists, K init_state lists, input list)."""
    args = iter(args)
    thetas = [[next(args) for _ in range(n)] for n in self.nts]
    inits = [[next(args) for _ in range(n)] for n in self.nss]
    return thetas, inits, list(args)

  def PackResults(self, res):
    """Flat results -> (acc_state, final_states) as StackedRecurrent's."""
    ns_last = self.nss[-1]
    if self.stacked:
      acc_state = tf.nest.pack_sequence_as(self._init_states[-1],
                                           res[:ns_last])
      rest = res[ns_last:]
    else:
      acc_state = [
          tf.nest.pack_sequence_as(self._init_states[-1],
                                   res[j * ns_last:(j + 1) * ns_last])
          for j in range(self.m)]
      rest = res[self.m * ns_last:]
    finals, offset = [], 0
    for i in range(self.k):
      finals.append(tf.nest.pack_sequence_as(
          self._init_states[i], rest[offset:offset + self.nss[i]]))
      offset += self.nss[i]
    return acc_state, finals


class ForwardPass:
  """One run's forward: each (cell, step)'s output and kept activations.

  `Forward(i, j)` is the forward unit of a schedule; `CellGradients(i, j,
  d_out)` gives (cell, step)'s gradients for the backward, from the kept
  activations or by re-running the cell.
  """

  def __init__(self, pipe, args):
    self.pipe = pipe
    # Stop the outer tape from recording the ops below; the gradient is
    # the custom one, and recording would keep all activations alive.
    thetas, self._inits, xs = pipe.SplitArgs(
        [tf.stop_gradient(a) for a in args])
    m, nx = pipe.m, pipe.nx
    with cluster_lib.DeviceScope(pipe.devices[0]):
      if pipe.stacked:
        per_leaf = [tf.unstack(x, num=m) for x in xs]
        self.step_inputs = [[leaf[j] for leaf in per_leaf] for j in range(m)]
      else:
        self.step_inputs = [xs[j * nx:(j + 1) * nx] for j in range(m)]
    self._thetas = []
    for i, theta in enumerate(thetas):
      with cluster_lib.DeviceScope(pipe.devices[i]):
        self._thetas.append([tf.identity(x) for x in theta])
    self.side = None
    if pipe.side is not None:
      with cluster_lib.DeviceScope(pipe.devices[-1]):
        self.side = pipe.SideSteps()
    self.out = [[None] * m for _ in range(pipe.k)]   # [cell][step] leaves.
    self._kept = {}   # (cell, step) -> gradient function of kept activations.
    self._after = {}   # (cell, step) -> control inputs of its forward.

  def _Args(self, i, j):
    """(theta, previous state, inputs, seed) of cell i at step j."""
    x = self.step_inputs[j] if i == 0 else self.out[i - 1][j]
    s = self._inits[i] if j == 0 else self.out[i][j - 1]
    if self.side is not None and i == self.pipe.k - 1:
      x = list(x) + self.side[j]
    after = self._after.get((i, j))
    if after:
      with cluster_lib.DeviceScope(self.pipe.devices[i]):
        with tf.control_dependencies(after):
          x = [tf.identity(a) for a in x]
    return self._thetas[i], s, x, self.pipe.seeds[j]

  def Forward(self, i, j, after=()):
    """F(i, j): runs cell i on step j; keeps its activations if `Keep(j)`.

    `after`: ops the step's inputs wait for (in a graph), here and in a
    re-run.
    """
    if after and not tf.executing_eagerly():
      with cluster_lib.DeviceScope(self.pipe.devices[i]):
        self._after[(i, j)] = list(after)
    program = self.pipe.programs[i]
    policy = self.pipe.Keep(j)
    if policy:
      self._kept[(i, j)], self.out[i][j] = program.ForwardKeep(
          *self._Args(i, j), policy=policy)
    else:
      self.out[i][j] = program.Forward(*self._Args(i, j))

  def CellGradients(self, i, j, d_out):
    """(d_theta, d_state, d_inputs) of F(i, j) given its output's d_out."""
    if (i, j) in self._kept:
      return self._kept.pop((i, j))(d_out)
    return self.pipe.programs[i].Backward(*self._Args(i, j), d_out)

  def Results(self):
    """The flat results (see `Pipeline`); stacks on the last device."""
    pipe = self.pipe
    last = [self.out[-1][j] for j in range(pipe.m)]
    if pipe.stacked:
      with cluster_lib.DeviceScope(pipe.devices[-1]):
        acc = [tf.stack([o[n] for o in last]) for n in range(pipe.nss[-1])]
    else:
      acc = [x for o in last for x in o]
    return acc + [x for cell in self.out for x in cell[-1]]


class BackwardPass:
  """One backward walk over a `ForwardPass`: the gradients in flight.

  `Add(i, j, n, g)` adds a term to the gradient of leaf n of (cell i, step
  j)'s output; `Backward(i, j)` is the backward unit of a schedule: it sums
  the terms, back-propagates through F(i, j) and passes the gradients on to
  (i, j-1)'s output (state) and (i-1, j)'s output (inputs). The schedule
  must run B(i, j) after every action that adds to its terms.
  """

  def __init__(self, fwd):
    self._fwd = fwd
    self._pipe = pipe = fwd.pipe
    self._pending = {}   # (cell, step, leaf) -> [gradient terms]
    self._d_thetas = [[None] * n for n in pipe.nts]
    self._d_inits = [[None] * n for n in pipe.nss]
    self._d_inputs = [[None] * pipe.nx for _ in range(pipe.m)]
    self._done = [[] for _ in range(pipe.k)]   # Per cell: each backward's.

  def Add(self, i, j, n, g):
    if g is not None:
      self._pending.setdefault((i, j, n), []).append(g)

  def AddResultGradients(self, dys):
    """Adds the gradients of the flat results (see `Pipeline`)."""
    pipe = self._pipe
    k, m, ns_last = pipe.k, pipe.m, pipe.nss[-1]
    n_acc = ns_last if pipe.stacked else m * ns_last
    d_acc, d_final = list(dys[:n_acc]), list(dys[n_acc:])
    if pipe.stacked:
      with cluster_lib.DeviceScope(pipe.devices[-1]):
        for n, d in enumerate(d_acc):
          if d is not None:
            for j, dj in enumerate(tf.unstack(d, num=m)):
              self.Add(k - 1, j, n, dj)
    else:
      for idx, d in enumerate(d_acc):
        self.Add(k - 1, idx // ns_last, idx % ns_last, d)
    offset = 0
    for i in range(k):
      for n in range(pipe.nss[i]):
        self.Add(i, m - 1, n, d_final[offset + n])
      offset += pipe.nss[i]

  def _OutputGradients(self, i, j, after):
    """The summed d_out of (i, j)'s float leaves, or None if none flows."""
    terms = [self._pending.pop((i, j, n), None)
             for n in range(self._pipe.nss[i])]
    if not any(terms):
      return None
    d_out = [(tf.add_n(t) if len(t) > 1 else t[0]) if t else
             tf.zeros_like(o)
             for t, o in zip(terms, self._fwd.out[i][j])
             if cell_program.IsDifferentiable(o)]
    w, done = self._pipe.backward_window, self._done[i]
    if w and len(done) >= w and done[-w]:
      # Step j's re-run starts once the backward w steps before it (in this
      # cell's order) is done, so a cell holds the activations of at most
      # w steps.
      after = list(after) + done[-w]
    if after and not tf.executing_eagerly():
      with tf.control_dependencies(after):
        d_out = [tf.identity(d) for d in d_out]
    return d_out

  def Backward(self, i, j, after=()):
    """B(i, j): back-propagates through cell i at step j.

    Args:
      i, j: the cell and the step.
      after: ops the backward waits for (in a graph).

    Returns:
      Ops that mark this backward done (in a graph; [] eagerly or when no
      gradient flows into (i, j)).
    """
    device = self._pipe.devices[i]
    with cluster_lib.DeviceScope(device):
      d_out = self._OutputGradients(i, j, after)
    if d_out is None:
      return []   # Nothing flows back into this (cell, step).
    g_th, g_s, g_x = self._fwd.CellGradients(i, j, d_out)
    g_x = g_x[:self._pipe.NumInputs(i)]   # Side inputs get no gradient.
    done = []
    with cluster_lib.DeviceScope(device):
      self._d_thetas[i] = [
          a if g is None else (tf.identity(g) if a is None else a + g)
          for a, g in zip(self._d_thetas[i], g_th)]
      if not tf.executing_eagerly():
        # Ops that consume the gradients: a control dependency on the
        # outputs of an inlined function call itself would not wait.
        done = ([g for g in self._d_thetas[i] if g is not None] +
                [tf.identity(g) for g in g_s + g_x if g is not None])
        if self._pipe.backward_window:
          self._done[i].append(done)
    for n, g in enumerate(g_s):
      if j > 0:
        self.Add(i, j - 1, n, g)
      else:
        self._d_inits[i][n] = g
    for n, g in enumerate(g_x):
      if i > 0:
        self.Add(i - 1, j, n, g)
      else:
        self._d_inputs[j][n] = g
    return done

  def Results(self):
    """Gradients of the flat arguments (see `Pipeline`), None if none."""
    pipe = self._pipe
    grads = [g for cell in self._d_thetas for g in cell]
    grads += [g for cell in self._d_inits for g in cell]
    if not pipe.stacked:
      return grads + [g for step in self._d_inputs for g in step]
    with cluster_lib.DeviceScope(pipe.devices[0]):
      for n in range(pipe.nx):
        col = [self._d_inputs[j][n] for j in range(pipe.m)]
        if all(g is None for g in col):
          grads.append(None)
        else:
          grads.append(tf.stack([
              tf.zeros_like(self._fwd.step_inputs[j][n]) if g is None else g
              for j, g in enumerate(col)]))
    return grads


def _RunForwardThenBackward(pipe, forward, backward, args):
  """The tf.custom_gradient body: F actions now, B actions in its gradient.

  The gradient function runs after the caller's whole forward, so this
  executor needs a schedule whose forwards all precede its backwards.

  Returns:
    (flat results, gradient function), see `Pipeline` for the layouts.
  """
  fwd = ForwardPass(pipe, args)
  for action in forward:
    with tf.name_scope(action.scope):   # Profiles name each op's action.
      fwd.Forward(action.cell, action.step)

  def _Grad(*dys, variables=None):
    bwd = BackwardPass(fwd)
    bwd.AddResultGradients(dys)
    for action in backward:
      with tf.name_scope(action.scope):
        bwd.Backward(action.cell, action.step)
    if variables:
      return bwd.Results(), [None] * len(variables)
    return bwd.Results()

  return fwd.Results(), _Grad


@tf.autograph.experimental.do_not_convert
def StackedRecurrent(devices, cell_fns, thetas, init_states, inputs,
                     step_seed=None, remat='except_last',
                     backward_window=1, name='StackedRecurrent',
                     trace_actions=False):
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
    trace_actions: inline the cells' traced functions into the caller's
      graph per call, so that a profile names each op's action
      (pipeline_timeline); by default each call runs the cell's one traced
      body (a smaller graph, faster tracing).

  Returns:
    (acc_state, final_states): acc_state is the last cell's output per step,
    stacked like `inputs` (a structure of [M, ...] tensors, or a list of M
    structures); final_states is the list of the K cells' states after
    step M-1.
  """
  owner = f'StackedRecurrent {name!r}'
  CheckArgs(owner, devices, cell_fns, thetas, init_states, remat,
            backward_window)
  pipe = Pipeline(devices, cell_fns, thetas, init_states, inputs, step_seed,
                  remat, backward_window, owner,
                  trace_actions=trace_actions)
  forward, backward = schedules.SplitPhases(
      schedules.GPipeSchedule(pipe.k, pipe.m))

  @tf.custom_gradient
  def _Run(*args):
    return _RunForwardThenBackward(pipe, forward, backward, args)

  return pipe.PackResults(_Run(*pipe.FlatArgs()))
