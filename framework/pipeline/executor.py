"""The pipeline executor: one engine that runs any schedule's actions.

S stages (stage s runs its cell on device `devices[stage_devices[s]]`) run
M micro-batches. Stage s computes, for micro-batch j,

  out_s[j] = cell_fn_s(theta_s, out_s[j-1], out_{s-1}[j])

where out_s[-1] is `init_states[s]` and out_{-1}[j] is the pipeline's input
j: a stage consumes the previous stage's output of the same micro-batch and
may carry state from micro-batch to micro-batch (`StackedRecurrent`'s
recurrent cells; a GPipe cell ignores it). A `schedules.Schedule` says which
action each device runs in which order; `_Run` runs actions:

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
A kind of one's own (actions.Kind) runs by the handler registered for it
(`RegisterHandler`), from these three.

Two front doors, one engine:
  `StackedRecurrent`: the loss is outside the pipeline. A tf.custom_gradient
    whose forward runs the schedule's forward-phase actions (actions.
    IsForward) and whose gradient function the others (each device's list
    must put its forwards first:
    `schedule.loss_inside` False, e.g. GPipe).
  `PipelineLoss`: the last stage ends in a per-micro-batch loss, so a
    backward can start as soon as its micro-batch leaves the last stage:
    the custom gradient's forward runs every action of any schedule in one
    pass, seeding d loss_j / d out = 1 right after F(S-1, j); its gradient
    function only scales the gradients by the upstream one.
Both take the schedule's name; the registry (schedules.py) builds it.

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
from cadence.framework.pipeline import schedules
from cadence.framework import step_seed as step_seed_lib

REMAT_MODES = ('except_last', 'always', 'never', 'selective')
LOSS_KEY = 'loss'


def _NumMicroBatches(inputs, owner):
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


class Pipeline:
  """What one call fixes before it runs: the schedule, the S traced cells,
  the layouts of the flat arguments.

  The executor's tf.custom_gradient takes and returns flat lists of tensors.
  Flat arguments: every stage's theta leaves, every stage's init_state
  leaves, then stage 0's input leaves ([M, ...] each, or micro-batch by
  micro-batch). Flat results: the last stage's output leaves ([M, ...]
  each, or per micro-batch), then every stage's final state leaves.
  """

  def __init__(self, schedule, devices, cell_fns, thetas, init_states, inputs,
               step_seed, remat, backward_window, owner, side_inputs=None,
               trace_actions=False, recurrent=False):
    self.schedule = schedule
    # Whether stage s's state before micro-batch j > 0 is its output of
    # j - 1 (else init_states[s] for every micro-batch).
    self.recurrent = recurrent
    # Device string of each stage.
    self.devices = [devices[d] for d in schedule.stage_devices]
    self.k = len(self.devices)
    self.m, self.stacked = _NumMicroBatches(inputs, owner)
    # Side inputs: the last stage's, per micro-batch (e.g. a loss's
    # labels), given like `inputs`; no gradient flows to them.
    self.side = side_inputs
    self.side_stacked = None
    if side_inputs is not None and tf.nest.flatten(side_inputs):
      m, self.side_stacked = _NumMicroBatches(side_inputs, owner)
      if m != self.m:
        raise ValueError(f'{owner}: side_inputs have {m} steps; the inputs '
                         f'have M={self.m}.')
    seed = None
    if step_seed is not None:
      seed = step_seed_lib.CheckStepSeed(step_seed, owner)
    self.remat = remat
    self.backward_window = backward_window
    # B computes the input gradients, W later the weights' (zero bubble).
    self.defer_w = schedule.defers_w
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
    self.nts = [len(t) for t in self._theta_flat]   # Leaves per stage.
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
          in_template, device=self.devices[i], has_seed=seed is not None,
          owner=f'{owner} cell {i}', inline=trace_actions))

  def _SideTemplate(self):
    if not self.side_stacked:   # A list of M structures (or empty).
      return self.side if self.side_stacked is None else self.side[0]
    return tf.nest.map_structure(
        lambda x: tf.TensorSpec(x.shape[1:], x.dtype), self.side)

  def SideSteps(self):
    """The side inputs' flat leaves per micro-batch."""
    if self.side_stacked is None:
      return [[] for _ in range(self.m)]
    if not self.side_stacked:
      return [[tf.stop_gradient(x) for x in cell_program.ToTensors(step)]
              for step in self.side]
    per_leaf = [tf.unstack(tf.stop_gradient(x), num=self.m)
                for x in cell_program.ToTensors(self.side)]
    return [[leaf[j] for leaf in per_leaf] for j in range(self.m)]

  def NumInputs(self, s):
    """Leaves of stage s's input that come from the previous stage (or the
    pipeline's inputs), side inputs excluded."""
    return self.nx if s == 0 else self.nss[s - 1]

  def Keep(self, j):
    """The remat_policy of what the forward of micro-batch j keeps for its
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

  def ArgDevices(self):
    """The device of each flat argument (its stage's; inputs: stage 0's)."""
    return ([d for d, n in zip(self.devices, self.nts) for _ in range(n)] +
            [d for d, n in zip(self.devices, self.nss) for _ in range(n)] +
            [self.devices[0]] * len(self._x_flat))

  def SplitArgs(self, args):
    """Flat arguments -> (S theta lists, S init_state lists, input list)."""
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


class _Run:
  """One run of a pipeline's actions: outputs, kept activations, the
  gradients in flight and the accumulated ones.

  `Forward(s, j)` and `Backward(s, j)` are the units a schedule orders;
  the schedule must run B(s, j) after every action that adds to the
  gradient of (s, j)'s output (`Add`).
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
    self.out = [[None] * m for _ in range(pipe.k)]   # [stage][mb] leaves.
    self._kept = {}   # (stage, mb) -> gradient function of kept activations.
    self._after = {}   # (stage, mb) -> control inputs of its forward.
    self._loss_index = None   # RunActions' loss_index.
    self.StartBackward()

  def StartBackward(self):
    """Forgets the gradients of an earlier backward walk: TF may call a
    custom gradient more than once (e.g. a tape, then tf.gradients through
    it), and each call must give the whole gradients once. (A kept
    forward's activations serve the first walk; later ones re-run.)"""
    pipe = self.pipe
    self._pending = {}   # (stage, mb, leaf) -> [gradient terms]
    self._weights = {}   # (stage, mb) -> its deferred W, after its B.
    self._d_thetas = [[None] * n for n in pipe.nts]
    self._d_inits = [[None] * n for n in pipe.nss]
    self._d_inputs = [[None] * pipe.nx for _ in range(pipe.m)]

  # --- forward ---------------------------------------------------------------

  def _Args(self, i, j):
    """(theta, previous state, inputs, seed) of stage i on micro-batch j."""
    x = self.step_inputs[j] if i == 0 else self.out[i - 1][j]
    s = (self.out[i][j - 1] if j > 0 and self.pipe.recurrent else
         self._inits[i])
    if self.side is not None and i == self.pipe.k - 1:
      x = list(x) + self.side[j]
    after = self._after.get((i, j))
    if after:
      with cluster_lib.DeviceScope(self.pipe.devices[i]):
        with tf.control_dependencies(after):
          x = [tf.identity(a) for a in x]
    return self._thetas[i], s, x, self.pipe.seeds[j]

  def Forward(self, i, j, after=()):
    """F(i, j): runs stage i on micro-batch j, keeping its activations as
    `Keep(j)` says; returns ops that mark it done (in a graph). With the
    loss inside, the last stage's seeds d loss_j / d loss_j = 1.

    `after`: ops the micro-batch's inputs wait for (in a graph), here and
    in a re-run.
    """
    graph = not tf.executing_eagerly()
    if after and graph:
      with cluster_lib.DeviceScope(self.pipe.devices[i]):
        self._after[(i, j)] = list(after)
    program = self.pipe.programs[i]
    policy = self.pipe.Keep(j)
    if policy:
      self._kept[(i, j)], self.out[i][j] = program.ForwardKeep(
          *self._Args(i, j), policy=policy, defer_w=self.pipe.defer_w)
    else:
      self.out[i][j] = program.Forward(*self._Args(i, j))
    if self._loss_index is not None and i == self.pipe.k - 1:
      with cluster_lib.DeviceScope(self.pipe.devices[i]):
        out = self.out[i][j][self._loss_index]
        self.Add(i, j, self._loss_index, tf.ones_like(out))
    if not graph:
      return []
    with cluster_lib.DeviceScope(self.pipe.devices[i]):
      return [tf.identity(x) for x in self.out[i][j]]

  def _CellGradients(self, i, j, d_out):
    """(d_theta, d_state, d_inputs) of F(i, j) given its output's d_out;
    with a deferred W d_theta is the W still to run (a function)."""
    defer_w = self.pipe.defer_w
    if (i, j) in self._kept:
      return self._kept.pop((i, j))(d_out, defer_w=defer_w)
    return self.pipe.programs[i].Backward(*self._Args(i, j), d_out,
                                          defer_w=defer_w)

  def ForwardResults(self):
    """The flat results (see `Pipeline`); stacks on the last device."""
    pipe = self.pipe
    last = [self.out[-1][j] for j in range(pipe.m)]
    if pipe.stacked:
      with cluster_lib.DeviceScope(pipe.devices[-1]):
        acc = [tf.stack([o[n] for o in last]) for n in range(pipe.nss[-1])]
    else:
      acc = [x for o in last for x in o]
    return acc + [x for cell in self.out for x in cell[-1]]

  # --- backward --------------------------------------------------------------

  def Add(self, i, j, n, g):
    """Adds a term to the gradient of leaf n of (i, j)'s output."""
    if g is not None:
      self._pending.setdefault((i, j, n), []).append(g)

  def AddResultGradients(self, dys):
    """Adds the gradients of the flat results (see `Pipeline`)."""
    pipe = self.pipe
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
             for n in range(self.pipe.nss[i])]
    if not any(terms):
      return None
    d_out = [(tf.add_n(t) if len(t) > 1 else t[0]) if t else
             tf.zeros_like(o)
             for t, o in zip(terms, self.out[i][j])
             if cell_program.IsDifferentiable(o)]
    if after and not tf.executing_eagerly():
      with tf.control_dependencies(after):
        d_out = [tf.identity(d) for d in d_out]
    return d_out

  def Backward(self, i, j, after=()):
    """B(i, j): back-propagates through stage i on micro-batch j.

    Args:
      i, j: the stage and the micro-batch.
      after: ops the backward (and its re-run) waits for (in a graph).

    Returns:
      Ops that mark this backward done (in a graph; [] eagerly or when no
      gradient flows into (i, j)).
    """
    device = self.pipe.devices[i]
    with cluster_lib.DeviceScope(device):
      d_out = self._OutputGradients(i, j, after)
    if d_out is None:
      return []   # Nothing flows back into this (stage, micro-batch).
    g_th, g_s, g_x = self._CellGradients(i, j, d_out)
    g_x = g_x[:self.pipe.NumInputs(i)]   # Side inputs get no gradient.
    if self.pipe.defer_w:
      self._weights[(i, j)], g_th = g_th, []
    done = []
    with cluster_lib.DeviceScope(device):
      if g_th:
        done = self._AddWeightGradients(i, g_th)
      if not tf.executing_eagerly():
        # Ops that consume the gradients: a control dependency on the
        # outputs of an inlined function call itself would not wait.
        done += [tf.identity(g) for g in g_s + g_x if g is not None]
    for n, g in enumerate(g_s):
      if j > 0 and self.pipe.recurrent:
        self.Add(i, j - 1, n, g)
      elif g is not None:   # Every micro-batch starts from init_states.
        d_init = self._d_inits[i][n]
        self._d_inits[i][n] = g if d_init is None else d_init + g
    for n, g in enumerate(g_x):
      if i > 0:
        self.Add(i - 1, j, n, g)
      else:
        self._d_inputs[j][n] = g
    return done

  def _AddWeightGradients(self, i, g_th):
    """Adds a micro-batch's weight gradients to stage i's sums; returns the
    sums (ops that consume them, in a graph)."""
    self._d_thetas[i] = [
        a if g is None else (tf.identity(g) if a is None else a + g)
        for a, g in zip(self._d_thetas[i], g_th)]
    if tf.executing_eagerly():
      return []
    return [g for g in self._d_thetas[i] if g is not None]

  def Weight(self, i, j, after=()):
    """W(i, j): the weight gradients of stage i on micro-batch j, from what
    its B kept; returns ops that mark it done (in a graph)."""
    weights = self._weights.pop((i, j), None)
    if weights is None:
      return []   # No gradient flowed back into (i, j).
    g_th = weights(after=after)
    with cluster_lib.DeviceScope(self.pipe.devices[i]):
      return self._AddWeightGradients(i, g_th)

  def GradientResults(self):
    """Gradients of the flat arguments (see `Pipeline`), None if none."""
    pipe = self.pipe
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
              tf.zeros_like(self.step_inputs[j][n]) if g is None else g
              for j, g in enumerate(col)]))
    return grads

  # --- running actions -------------------------------------------------------

  def RunActions(self, actions, loss_index=None):
    """Runs `actions` (in an order that respects their needs), each device's
    chained as the module docstring says, each by its kind's handler
    (`RegisterHandler`).

    Args:
      actions: `schedules.Action`s.
      loss_index: with the loss inside, the flat index of the last stage's
        `loss` leaf: its gradient is seeded with 1 right after the forward.
    """
    pipe = self.pipe
    window = pipe.backward_window
    stage_devices = pipe.schedule.stage_devices
    marks = {}   # Device index -> the marks of each action it ran.
    self._loss_index = loss_index
    for action in actions:
      i, j = action.stage, action.micro_batch
      ran = marks.setdefault(stage_devices[i], [])
      after = ran[-window] if window and len(ran) >= window else ()
      with tf.name_scope(action.scope):   # Profiles name each op's action.
        mark = _HANDLERS[action.kind](self, i, j, after=after)
      ran.append(mark or (ran[-1] if ran else []))


# How the executor runs each action kind: fn(run, stage, micro_batch,
# after=ops) -> ops that mark the action done (in a graph; [] or None: none
# of its own), `run` a `_Run`.
_HANDLERS = {schedules.FORWARD: _Run.Forward,
             schedules.BACKWARD: _Run.Backward,
             schedules.WEIGHT: _Run.Weight}


def RegisterHandler(letter, fn):
  """Makes `fn(run, stage, micro_batch, after=ops) -> marks` the executor's
  handler of action kind `letter` (actions.Kind). `run` offers what the
  built-in kinds' handlers are: `run.Forward`, `run.Backward` and
  `run.Weight`, each `(stage, micro_batch, after=ops) -> marks`.

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
  """The tf.custom_gradient body with the loss outside: F actions now, B
  actions in its gradient (after the caller's whole forward).

  Returns:
    (flat results, gradient function), see `Pipeline` for the layouts.
  """
  order = _InOrder(pipe.schedule)
  run = _Run(pipe, args)
  run.RunActions([a for a in order if schedules.IsForward(a)])

  def _Grad(*dys, variables=None):
    run.StartBackward()
    run.AddResultGradients(dys)
    run.RunActions([a for a in order if not schedules.IsForward(a)])
    if variables:
      return run.GradientResults(), [None] * len(variables)
    return run.GradientResults()

  return run.ForwardResults(), _Grad


def _RunWithLoss(pipe, loss_index, args):
  """The tf.custom_gradient body with the loss inside: every action, in one
  pass.

  Returns:
    ([total loss] + the last stage's output leaves stacked [M, ...], the
    gradient function).
  """
  run = _Run(pipe, args)
  run.RunActions(_InOrder(pipe.schedule), loss_index=loss_index)
  last = pipe.k - 1
  with cluster_lib.DeviceScope(pipe.devices[last]):
    outs = run.out[last]
    total = tf.add_n([o[loss_index] for o in outs])
    per_step = [tf.stack([o[n] for o in outs])
                for n in range(pipe.nss[last])]
  grads = run.GradientResults()
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


@tf.autograph.experimental.do_not_convert
def StackedRecurrent(devices, cell_fns, thetas, init_states, inputs,
                     step_seed=None, remat='except_last',
                     backward_window=1, name='StackedRecurrent',
                     trace_actions=False, schedule=schedules.DEFAULT,
                     schedule_table=None, recurrent=True):
  """Runs S cells as a pipeline with the loss outside; see the module
  docstring.

  Args:
    devices: S device strings; stage s runs on devices[s] (stages may share
      a device).
    cell_fns: S functions `cell_fn(theta, state_prev, inputs) -> state`,
      pure (stateless randomness from theta.step_seed, weights from theta).
    thetas: S nested structures (NestedMaps) of the cells' weights.
    init_states: S nested structures: stage s's state before micro-batch 0;
      also the template (structure, dtypes, shapes) of stage s's output,
      which is stage s+1's input.
    inputs: stage 0's inputs: a nested structure of [M, ...] tensors
      (static M), or a list of M nested structures (one per micro-batch).
    step_seed: optional int64 [2]; micro-batch j's theta (in every stage)
      carries `MicroBatchSeed(step_seed, j)` as `step_seed`.
    remat: one of REMAT_MODES, see the module docstring.
    backward_window: an int W >= 1 or None: each action waits for the one W
      places before it on its device (see the module docstring).
    name: used in error messages.
    trace_actions: inline the cells' traced functions into the caller's
      graph per call, so that a profile names each op's action (timeline);
      by default each call runs the cell's one traced body (a smaller
      graph, faster tracing).
    schedule: a registered schedule whose devices run their forwards
      first (`schedules.LossInside(name)` False), or one built already;
      with `recurrent` its dependencies include the cells' state from
      micro-batch to micro-batch.
    schedule_table: the action lists as text, for schedules.TABLE.
    recurrent: whether a stage's state carries from micro-batch j-1 to j.
      False (a GPipe stack, whose cells ignore it): every micro-batch
      starts from `init_states`, so a stage's backward of micro-batch j
      waits for no other micro-batch's, and a schedule may order them
      freely (a table in GPipe's order, B(s, 0) first).

  Returns:
    (acc_state, final_states): acc_state is the last stage's output per
    micro-batch, stacked like `inputs` (a structure of [M, ...] tensors, or
    a list of M structures); final_states is the list of the S stages'
    states after micro-batch M-1.
  """
  owner = f'StackedRecurrent {name!r}'
  CheckArgs(owner, devices, cell_fns, thetas, init_states, remat,
            backward_window)
  m, _ = _NumMicroBatches(inputs, owner)
  plan, unique = BuildSchedule(owner, schedule, list(devices), m,
                               recurrent=recurrent, table=schedule_table)
  if plan.loss_inside:
    raise ValueError(
        f'{owner}: schedule={schedule!r} starts backwards before the forward '
        'ends, so it needs the loss inside the pipeline (PipelineLoss).')
  pipe = Pipeline(plan, unique, cell_fns, thetas, init_states, inputs,
                  step_seed, remat, backward_window, owner,
                  trace_actions=trace_actions, recurrent=recurrent)

  @tf.custom_gradient
  def _Call(*args):
    return _RunForwardThenBackward(pipe, args)

  return pipe.PackResults(_Call(*pipe.FlatArgs()))


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


@tf.autograph.experimental.do_not_convert
def PipelineLoss(devices, cell_fns, thetas, out_templates, inputs,
                 side_inputs, step_seed=None, schedule=schedules.DEFAULT,
                 remat='never', name='PipelineLoss', trace_actions=False,
                 backward_window=1, schedule_table=None):
  """Runs S cells over M micro-batches ending in a per-micro-batch loss, as
  any registered schedule; see the module docstring.

  The pipeline returns the sum of the micro-batches' losses; its gradient is
  the sum of theirs, so a caller's `tape.gradient` at the top equals the
  sequential model's. Cells carry no state between micro-batches
  (`cell_fn(theta, inputs)`); the last cell's inputs are `(inputs, side)`
  where `side` is the micro-batch's slice of `side_inputs` (e.g. the
  labels), which gets no gradient.

  Args:
    devices: S device strings; stage s runs on devices[s] (stages may
      share a device).
    cell_fns: S functions `cell_fn(theta, inputs) -> outputs`, pure
      (stateless randomness from theta.step_seed); the last one takes
      `(inputs, side)` and returns a NestedMap with a float scalar `loss`
      (the micro-batch's summed loss) and anything else the caller wants
      per micro-batch (metric sums, per-example values).
    thetas: S nested structures of the cells' weights (tensors).
    out_templates: S nested structures of tf.TensorSpec (or tensors): stage
      s's output for one micro-batch (stage s+1's input).
    inputs: stage 0's inputs, a nested structure of [M, ...] tensors.
    side_inputs: the last stage's side inputs, [M, ...] tensors (no
      gradient).
    step_seed: optional int64 [2]; micro-batch j's theta carries
      `MicroBatchSeed(step_seed, j)`.
    schedule: a registered schedule name (schedules.Names()).
    remat: one of REMAT_MODES; 'never' keeps each micro-batch's activations
      until its backward (1F1B bounds them by S).
    name: used in error messages.
    trace_actions: as StackedRecurrent's.
    backward_window: as StackedRecurrent's.
    schedule_table: the action lists as text, for schedules.TABLE.

  Returns:
    (loss, per_step): loss, the sum over micro-batches of the last stage's
    `loss` (its gradient flows to thetas and inputs); per_step, the last
    stage's outputs stacked [M, ...] (no gradient).
  """
  owner = f'PipelineLoss {name!r}'
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
  CheckArgs(owner, devices, cell_fns, thetas, init_states, remat,
            backward_window)
  m, _ = _NumMicroBatches(inputs, owner)
  plan, unique = BuildSchedule(owner, schedule, list(devices), m,
                               table=schedule_table)
  stateless = [lambda th, unused_s, x, fn=fn: fn(th, x) for fn in cell_fns]
  pipe = Pipeline(plan, unique, stateless, thetas, init_states, inputs,
                  step_seed, remat, backward_window, owner,
                  side_inputs=side_inputs, trace_actions=trace_actions)

  @tf.custom_gradient
  def _Call(*args):
    return _RunWithLoss(pipe, loss_index, args)

  res = _Call(*pipe.FlatArgs())
  per_step = tf.nest.pack_sequence_as(
      out_templates[-1], [tf.stop_gradient(x) for x in res[1:]])
  return res[0], per_step
