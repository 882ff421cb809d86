"""What one call of the executor runs: a Pipeline, and a PipelineRun of
its actions.

`Pipeline` is what a call fixes before it runs: the schedule, the S traced
cells (cell_program.CellProgram), the layouts of the flat arguments the
executor's tf.custom_gradient takes and returns. `PipelineRun` is one run
of the schedule's actions in a graph: each stage's outputs per
micro-batch, what F kept for B, the gradients in flight and the summed
weight gradients. Its Forward, Backward and Weight, and what a handler may
read and write besides, are the public interface of an action kind's
handler (executor.RegisterHandler); the executor (executor.py) drives the
rest.

Example (a handler of a kind that does a stage's forward, then copies its
output to the next stage's device, the transfer of
tests/framework/pipeline/transfer_work_test.py):
  def RunForwardAndSend(run, stage, micro_batch, after=()):
    marks = run.Forward(stage, micro_batch, after=after)
    with tf.device(run.StageDevice(stage + 1)):
      copy = [tf.identity(x) for x in run.Output(stage, micro_batch)]
    run.SetOutput(stage, micro_batch, copy)
    return marks + copy
"""
import tensorflow as tf

from cadence.framework import cluster as cluster_lib
from cadence.framework.pipeline import cell_program
from cadence.framework import step_seed as step_seed_lib


def NumMicroBatches(inputs, owner):
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
    self.num_stages = len(self.devices)
    self.m, self.stacked = NumMicroBatches(inputs, owner)
    # Side inputs: the last stage's, per micro-batch (e.g. a loss's
    # labels), given like `inputs`; no gradient flows to them.
    self.side = side_inputs
    self.side_stacked = None
    if side_inputs is not None and tf.nest.flatten(side_inputs):
      m, self.side_stacked = NumMicroBatches(side_inputs, owner)
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
    for i in range(self.num_stages):
      in_template = (tf.nest.pack_sequence_as(x_struct, x_step) if i == 0
                     else tf.nest.pack_sequence_as(init_states[i - 1],
                                                   self._init_flat[i - 1]))
      if self.side is not None and i == self.num_stages - 1:
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
    for i in range(self.num_stages):
      finals.append(tf.nest.pack_sequence_as(
          self._init_states[i], rest[offset:offset + self.nss[i]]))
      offset += self.nss[i]
    return acc_state, finals


class PipelineRun:
  """One run of a pipeline's actions: outputs, kept activations, the
  gradients in flight and the accumulated ones.

  The interface an action kind's handler works with (executor.
  RegisterHandler; the built-in F, B and W handlers use it too):

    Forward(stage, micro_batch, after=())    F's work
    Backward(stage, micro_batch, after=())   B's work (and W's, unless the
                                             schedule defers W)
    Weight(stage, micro_batch, after=())     W's work, deferred from B
    Output(stage, micro_batch)               the stage's output for the
                                             micro-batch (flat tensors)
    SetOutput(stage, micro_batch, tensors)   replaces it (e.g. with a copy
                                             on the next stage's device:
                                             the next stage's forward reads
                                             the copy)
    StageDevice(stage)                       the stage's device string
    num_stages, num_micro_batches

  Each of the three returns ops that mark it done in a graph ([] eagerly),
  which the executor chains each device's actions on. The schedule must
  run B(s, j) after every action that adds to the gradient of (s, j)'s
  output. The rest of the class is the executor's.
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
    self.out = [[None] * m for _ in range(pipe.num_stages)]   # [stage][mb] leaves.
    self._kept = {}   # (stage, mb) -> gradient function of kept activations.
    self._after = {}   # (stage, mb) -> control inputs of its forward.
    self._loss_index = None   # RunActions' loss_index.
    self._StartBackward()

  def _StartBackward(self):
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

  # --- what a handler reads and writes besides the work -----------------------

  @property
  def num_stages(self):
    return self.pipe.num_stages

  @property
  def num_micro_batches(self):
    return self.pipe.m

  def StageDevice(self, stage):
    """The device string stage `stage` runs on."""
    return self.pipe.devices[stage]

  def Output(self, stage, micro_batch):
    """Stage `stage`'s output for `micro_batch`: its flat tensors (the next
    stage's input), or None before its forward."""
    out = self.out[stage][micro_batch]
    return None if out is None else list(out)

  def SetOutput(self, stage, micro_batch, tensors):
    """Replaces stage `stage`'s output for `micro_batch` with `tensors`
    (flat, the same shapes and dtypes: a copy, e.g. on the next stage's
    device); what reads it afterwards (the next stage's forward, this
    stage's backward) reads these."""
    old = self.out[stage][micro_batch]
    if old is None or len(old) != len(tensors) or any(
        a.shape != b.shape or a.dtype != b.dtype
        for a, b in zip(old, tensors)):
      raise ValueError(
          f'SetOutput({stage}, {micro_batch}): the new output must have the '
          f'old one\'s shapes and dtypes, {[(a.shape, a.dtype) for a in old or []]}; '
          f'got {[(b.shape, b.dtype) for b in tensors]}.')
    self.out[stage][micro_batch] = list(tensors)

  # --- forward ---------------------------------------------------------------

  def _Args(self, i, j):
    """(theta, previous state, inputs, seed) of stage i on micro-batch j."""
    x = self.step_inputs[j] if i == 0 else self.out[i - 1][j]
    s = (self.out[i][j - 1] if j > 0 and self.pipe.recurrent else
         self._inits[i])
    if self.side is not None and i == self.pipe.num_stages - 1:
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
    if self._loss_index is not None and i == self.pipe.num_stages - 1:
      with cluster_lib.DeviceScope(self.pipe.devices[i]):
        out = self.out[i][j][self._loss_index]
        self._Add(i, j, self._loss_index, tf.ones_like(out))
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

  def _ForwardResults(self):
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

  def _Add(self, i, j, n, g):
    """Adds a term to the gradient of leaf n of (i, j)'s output."""
    if g is not None:
      self._pending.setdefault((i, j, n), []).append(g)

  def _AddResultGradients(self, dys):
    """Adds the gradients of the flat results (see `Pipeline`)."""
    pipe = self.pipe
    k, m, ns_last = pipe.num_stages, pipe.m, pipe.nss[-1]
    n_acc = ns_last if pipe.stacked else m * ns_last
    d_acc, d_final = list(dys[:n_acc]), list(dys[n_acc:])
    if pipe.stacked:
      with cluster_lib.DeviceScope(pipe.devices[-1]):
        for n, d in enumerate(d_acc):
          if d is not None:
            for j, dj in enumerate(tf.unstack(d, num=m)):
              self._Add(k - 1, j, n, dj)
    else:
      for idx, d in enumerate(d_acc):
        self._Add(k - 1, idx // ns_last, idx % ns_last, d)
    offset = 0
    for i in range(k):
      for n in range(pipe.nss[i]):
        self._Add(i, m - 1, n, d_final[offset + n])
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
        self._Add(i, j - 1, n, g)
      elif g is not None:   # Every micro-batch starts from init_states.
        d_init = self._d_inits[i][n]
        self._d_inits[i][n] = g if d_init is None else d_init + g
    for n, g in enumerate(g_x):
      if i > 0:
        self._Add(i - 1, j, n, g)
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

  def _GradientResults(self):
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

  def _RunActions(self, actions, handlers, loss_index=None):
    """Runs `actions` (in an order that respects their needs), each device's
    chained as the executor's docstring says, each by its kind's handler.

    Args:
      actions: `schedules.Action`s.
      handlers: {kind letter: fn(run, stage, micro_batch, after=ops) ->
        marks} (executor.RegisterHandler's).
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
        mark = handlers[action.kind](self, i, j, after=after)
      ran.append(mark or (ran[-1] if ran else []))
