"""CellProgram: one recurrent cell traced once, run forward and backward.

`Recurrent` and `StackedRecurrent` call a user's `cell_fn(theta, state_prev,
inputs) -> state` many times (once per step or micro-batch). Tracing it once
into a graph function and calling that function is cheaper than re-building
its ops per step (in eager mode it also runs as one graph instead of op by
op), and the traced graph is where the cell is checked:

  * no stateful random op (tf.random.uniform, tf.nn.dropout, ...): the
    backward pass re-runs the cell and must replay the forward's random
    numbers, which only stateless ops seeded from the step seed can do;
  * no trainable tf.Variable read around theta: gradients reach a cell's
    weights through theta only, so a captured trainable variable would
    silently get no gradient; it is rejected (non-trainable variables, e.g.
    counters, are allowed and get no gradient).

The backward function re-runs the cell under an inner GradientTape that
watches fresh `tf.identity` copies of its inputs (rematerialisation) and
returns the gradients with respect to theta, the previous state and the
inputs; on `device`, both functions place every op of the cell there.

Example:
  prog = CellProgram(cell_fn, theta, state0, inputs_t, device='/device:CPU:1',
                     has_seed=True, owner='StackedRecurrent cell 1')
  state1 = prog.Forward(theta, state0, inputs_t, seed)
  d_theta, d_state0, d_inputs = prog.Backward(theta, state0, inputs_t, seed,
                                              d_state1)
"""
from absl import logging
import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import cluster as cluster_lib
from cadence.framework.nested_map import NestedMap
from cadence.framework.pipeline import deferred_w
from cadence.framework.pipeline import remat_policy

# Op types that draw random numbers from hidden state (kernel or resource).
STATEFUL_RANDOM_OPS = frozenset([
    'Multinomial', 'ParameterizedTruncatedNormal', 'RandomCrop',
    'RandomGamma', 'RandomPoisson', 'RandomPoissonV2', 'RandomShuffle',
    'RandomStandardNormal', 'RandomUniform', 'RandomUniformInt',
    'TruncatedNormal', 'RandomIndexShuffle', 'StatefulRandomBinomial',
    'StatefulStandardNormal', 'StatefulStandardNormalV2',
    'StatefulTruncatedNormal', 'StatefulUniform', 'StatefulUniformFullInt',
    'StatefulUniformInt', 'RngSkip', 'RngReadAndSkip',
    'RandomShuffleQueue', 'RandomShuffleQueueV2', 'ExperimentalRandomDataset',
    'RandomDataset', 'RandomDatasetV2',
])


# One body per traced function, called per step (not inlined per call).
_NOINLINE = {'_noinline': True}


def _NeededNodes(graph_def, fetches, fed):
  """The NodeDefs of `graph_def` that `fetches` (tensor names) need, in
  graph order: walking back through data and control inputs, but not past
  a tensor in `fed` (tensor names) nor a control input on a fed op."""
  nodes = {n.name: n for n in graph_def.node}
  seen, todo = set(), [_OpName(t) for t in fetches if t not in fed]
  while todo:
    name = todo.pop()
    if name in seen:
      continue
    seen.add(name)
    todo += [_OpName(i) for i in nodes[name].input
             if _FeedKey(i) not in fed]
  return [n for n in graph_def.node if n.name in seen]


def _OpName(name):
  """'op:1', 'op' and '^op' -> 'op'."""
  return name.lstrip('^').split(':')[0]


def _FeedKey(name):
  """A NodeDef input's key into `_NeededNodes`'s `fed`: 'op' -> 'op:0'
  (its first output), 'op:1' as it is, a control input '^op' -> 'op:0'
  (the op of a fed placeholder)."""
  return f'{_OpName(name)}:0' if ':' not in name else name


def _BuildInCallerGraph(fn, args):
  """Builds the ops of traced function `fn` into the caller's graph (in its
  name scope) on `args`; returns its outputs.

  What calling `fn` computes, but as ops a profile names by the caller's
  scope (a called function's ops keep the names they were traced with).
  Only the ops the outputs need from the inputs are built: a pruned
  function's graph still holds what its inputs were computed from (the
  other half of a cut backward). An input's uses become uses of its arg,
  its control uses control dependencies on the arg's op.
  """
  feeds = {t.name: a for t, a in zip(fn.inputs, args)}
  fetches = [t.name for t in fn.outputs]
  graph_def = fn.graph.as_graph_def()
  needed = tf.compat.v1.GraphDef()
  needed.node.extend(_NeededNodes(graph_def, fetches, feeds))
  needed.library.CopyFrom(graph_def.library)
  input_map = {}
  for node in needed.node:
    for name in node.input:
      if _FeedKey(name) in feeds:
        input_map[name if name.startswith('^') else _FeedKey(name)] = (
            feeds[_FeedKey(name)])
  built = iter(tf.graph_util.import_graph_def(
      needed, input_map=input_map,
      return_elements=[n for n in fetches if n not in feeds], name='cell'))
  return [feeds[n] if n in feeds else next(built) for n in fetches]


def IsDifferentiable(x):
  """True for floating (and complex) tensors, the ones gradients flow to."""
  return x.dtype.is_floating or x.dtype.is_complex


def ToTensors(structure):
  """Flattens a nested structure into a list of tensors (reads variables)."""
  return [tf.convert_to_tensor(x) for x in tf.nest.flatten(structure)]


def _Spec(x):
  return tf.TensorSpec(x.shape, x.dtype)


def _LeafPaths(structure):
  """Dotted names of the leaves of a structure, in tf.nest order."""
  if isinstance(structure, NestedMap):
    return [k for k, _ in structure.FlattenItems()]
  return [f'leaf {i}' for i in range(len(tf.nest.flatten(structure)))]


def FindStatefulRandomOps(graph):
  """Returns 'name (Type)' for each stateful random op of a graph.

  Looks into every function of the graph's library too, so random ops in
  nested tf.functions are found.
  """
  graph_def = graph.as_graph_def()
  found = [f'{n.name} ({n.op})' for n in graph_def.node
           if n.op in STATEFUL_RANDOM_OPS]
  for fn in graph_def.library.function:
    found += [f'{n.name} ({n.op})' for n in fn.node_def
              if n.op in STATEFUL_RANDOM_OPS]
  return found


class CellProgram:
  """A cell function traced once for given structures, shapes and device.

  Args to the constructor:
    cell_fn: `cell_fn(theta, state_prev, inputs) -> state`; `state` has the
      structure, dtypes and shapes of `state`. Pure: no stateful random ops,
      randomness seeded from `theta.step_seed`.
    theta, state, inputs: nested structures of tensors (or anything with
      `.shape` and `.dtype`) used as templates of one step's arguments.
    device: device string for every op of the cell, or None to inherit.
    has_seed: whether calls pass a step seed ([2] int64), attached to theta
      with `base_layer.WithStepSeed` before `cell_fn` sees it.
    owner: a name for error messages, e.g. "Recurrent 'rnn'".
    inline: False (default): each call runs the one traced body (the
      caller's graph stays small; the body's ops are not named in the
      caller's scope); True: each call builds the cell's ops in the caller's
      graph (as eagerly; a kept forward cut by a remat policy, see
      `_KeepFunctions`, by importing the cut trace), named in its scope:
      what a profile of pipeline actions needs (timeline.py).
  """

  def __init__(self, cell_fn, theta, state, inputs, device, has_seed, owner,
               inline=False):
    self._cell_fn = cell_fn
    self._theta = theta
    self._state = state
    self._inputs = inputs
    self._device = device
    self._has_seed = has_seed
    self._owner = owner
    # Called functions keep one body per cell (a small graph); inline, the
    # cell's ops are built in the caller's graph per call, in its scope.
    self._inline = inline
    self._theta_flat = tf.nest.flatten(theta)
    self._state_flat = tf.nest.flatten(state)
    self._inputs_flat = tf.nest.flatten(inputs)
    self._n = (len(self._theta_flat), len(self._state_flat),
               len(self._inputs_flat))
    specs = [_Spec(x) for x in
             self._theta_flat + self._state_flat + self._inputs_flat]
    if has_seed:
      specs.append(tf.TensorSpec([2], tf.int64))
    self._specs = specs
    self._fwd = self._Function(self._FwdFlat, specs)
    self._CheckGraph(self._fwd.graph)
    self._bwd = None
    self._bwd_mask = None   # [bool] per (theta, state, inputs) float leaf.
    self._keep = {}   # policy -> (forward, backward, grad mask) or None.
    self._traces = {}   # policy -> (traced fwd+bwd, feeds of its backward).
    # policy (None: re-run) -> B and a deferred W (deferred_w.py).
    self._cut_backwards = {}

  # --- structure helpers ---------------------------------------------------

  @property
  def state_template(self):
    return self._state

  def FloatMask(self, which):
    """[bool] per leaf of 'theta', 'state' or 'inputs': differentiable?"""
    flat = {'theta': self._theta_flat, 'state': self._state_flat,
            'inputs': self._inputs_flat}[which]
    return [IsDifferentiable(x) for x in flat]

  def _Split(self, flat):
    nt, ns, nx = self._n
    theta = flat[:nt]
    state = flat[nt:nt + ns]
    inputs = flat[nt + ns:nt + ns + nx]
    seed = flat[nt + ns + nx] if self._has_seed else None
    return theta, state, inputs, seed

  def _CallCell(self, theta, state, inputs, seed):
    """Runs the python cell_fn on flat lists; returns the flat new state."""
    theta = tf.nest.pack_sequence_as(self._theta, theta)
    if seed is not None:
      theta = base_layer.WithStepSeed(theta, seed)
    state = tf.nest.pack_sequence_as(self._state, state)
    inputs = tf.nest.pack_sequence_as(self._inputs, inputs)
    out = self._cell_fn(theta, state, inputs)
    try:
      tf.nest.assert_same_structure(self._state, out, check_types=False)
    except (ValueError, TypeError) as e:
      raise ValueError(
          f'{self._owner}: cell_fn must return a state with the structure of '
          f'its state0/init_state; {e}') from None
    out_flat = [tf.convert_to_tensor(x) for x in tf.nest.flatten(out)]
    for i, (got, want) in enumerate(zip(out_flat, self._state_flat)):
      if (got.dtype != want.dtype or
          not tf.TensorShape(want.shape).is_compatible_with(got.shape)):
        path = _LeafPaths(self._state)[i]
        raise ValueError(
            f'{self._owner}: cell_fn returned state leaf {path!r} as '
            f'{got.dtype.name}{got.shape.as_list()}, but the state is '
            f'{want.dtype.name}{tf.TensorShape(want.shape).as_list()}; the '
            'state must keep its dtype and shape at every step.')
    return out_flat

  def _CheckGraph(self, graph):
    random_ops = FindStatefulRandomOps(graph)
    if random_ops:
      raise ValueError(
          f'{self._owner}: cell_fn contains stateful random ops '
          f'{random_ops[:5]}; the backward pass re-runs the cell and could '
          'not replay them. Use tf.random.stateless_* ops seeded from '
          'theta.step_seed (BaseLayer.OpSeed) instead.')
    captured = [v for v in graph.variables if v.trainable]
    if captured:
      names = sorted({v.name for v in captured})
      raise ValueError(
          f'{self._owner}: cell_fn reads trainable variables {names} that are '
          'not passed through theta; they would get no gradient. Pass them in '
          'theta (e.g. the layer theta) and read theta.<name> in cell_fn.')

  # --- traced functions ----------------------------------------------------

  def _Function(self, fn, specs):
    """fn traced on specs, one body that each call runs."""
    return tf.function(
        fn, autograph=False,
        experimental_attributes=_NOINLINE).get_concrete_function(*specs)

  def _FwdFlat(self, *flat):
    theta, state, inputs, seed = self._Split(list(flat))
    with cluster_lib.DeviceScope(self._device):
      return self._CallCell(theta, state, inputs, seed)

  def _BwdFlat(self, *flat):
    flat = list(flat)
    nt, ns, nx = self._n
    n_in = nt + ns + nx + (1 if self._has_seed else 0)
    theta, state, inputs, seed = self._Split(flat[:n_in])
    d_out = flat[n_in:]
    with cluster_lib.DeviceScope(self._device):
      grads, _ = self.TapeForward(theta, state, inputs, seed, d_out=d_out)
    self._bwd_mask = [g is not None for g in grads]
    return [g for g in grads if g is not None]

  def TapeForward(self, theta, state, inputs, seed, d_out=None):
    """Runs the cell under a tape; returns (grads or tape closure, state).

    With `d_out` (gradients of the float state leaves), returns the list of
    gradients w.r.t. the float leaves of theta, state, inputs (None where
    unconnected) and the new state. Without, returns a function
    `d_out -> grads` (call it once) and the new state: the forward's
    activations stay alive until then (no rematerialisation).
    """
    sources = []

    def _Watch(flat, copy):
      out = []
      for x in flat:
        if IsDifferentiable(x):
          x = tf.identity(x) if copy else x
          sources.append(x)
        out.append(x)
      return out

    # The re-run must wait for its output gradients: once the backward
    # function is inlined into the caller's graph, nothing else stops the
    # executor from re-running every step early (during the forward pass)
    # and holding all their activations, which would undo the remat. Fresh
    # copies of state and inputs carry that dependency (theta, read-only
    # weights, is watched as it is).
    theta = _Watch(theta, copy=False)
    with tf.control_dependencies(d_out or []):
      state, inputs = _Watch(state, copy=True), _Watch(inputs, copy=True)
    with tf.GradientTape(watch_accessed_variables=False) as tape:
      tape.watch(sources)
      out = self._CallCell(theta, state, inputs, seed)
    targets = [o for o in out if IsDifferentiable(o)]

    def _Grads(d_targets):
      return tape.gradient(
          targets, sources, output_gradients=list(d_targets),
          unconnected_gradients=tf.UnconnectedGradients.NONE)

    if d_out is not None:
      return _Grads(d_out), out
    return _Grads, out

  def _EnsureBackward(self):
    if self._bwd is None:
      d_specs = [_Spec(x) for x in self._state_flat if IsDifferentiable(x)]
      self._bwd = self._Function(self._BwdFlat, self._specs + d_specs)

  # --- calls ---------------------------------------------------------------

  def Forward(self, theta, state, inputs, seed=None):
    """One step: flat lists in, the flat new state out (no activations)."""
    if tf.executing_eagerly() or self._inline:
      # Eagerly, running the ops directly is cheaper than instantiating
      # the traced function (a per-call cost, as each call traces anew).
      with cluster_lib.DeviceScope(self._device):
        return self._CallCell(theta, state, inputs, seed)
    args = list(theta) + list(state) + list(inputs)
    if self._has_seed:
      args.append(seed)
    with cluster_lib.DeviceScope(self._device):
      return list(self._fwd(*args))

  def _KeepFunctions(self, policy):
    """(forward, backward, grad mask) that keep `policy`'s tensors, or None.

    One trace of the cell's forward and gradient (a v1 graph function) is
    cut in two (`prune`): the forward returns the new state and the tensors
    remat_policy.KeptTensors picks; the backward takes them (and the
    step's inputs and d_out) and recomputes the rest. None when the cell
    captures variables or runs stateful ops, which a cut graph could drop.
    """
    if policy in self._keep:
      return self._keep[policy]
    n_in = len(self._specs)
    d_specs = [_Spec(x) for x in self._state_flat if IsDifferentiable(x)]
    mask = []

    def _FwdBwd(*flat):
      theta, state, inputs, seed = self._Split(list(flat[:n_in]))
      with cluster_lib.DeviceScope(self._device):
        grads_fn, out = self.TapeForward(theta, state, inputs, seed)
        grads = grads_fn(list(flat[n_in:]))
      mask[:] = [g is not None for g in grads]
      return out, [g for g in grads if g is not None]

    traced = tf.compat.v1.wrap_function(_FwdBwd, self._specs + d_specs)
    graph = traced.graph
    n_out = len(self._state_flat)
    outputs = traced.outputs[:n_out]
    forward = remat_policy.ForwardOps(outputs)
    if graph.captures or any(op._is_stateful for op in forward):  # pylint: disable=protected-access
      if policy != 'all':
        logging.warning(
            '%s: remat policy %r cannot cut this cell (it captures '
            'variables or runs stateful ops); it keeps all its '
            'activations instead.', self._owner, policy)
      self._keep[policy] = None
      return None
    args = traced.inputs[:n_in]
    kept = remat_policy.KeptTensors(graph, outputs,
                                    [t.op for t in args[:self._n[0]]], policy)
    fwd_cut = traced.prune(feeds=args, fetches=outputs + kept)
    cut = traced.prune(feeds=args + kept + traced.inputs[n_in:],
                       fetches=traced.outputs[n_out:])
    self._traces[policy] = (traced, args + kept + traced.inputs[n_in:],
                            traced.outputs[n_out:], mask)
    n_keep = len(args) + len(kept)
    build = _BuildInCallerGraph if self._inline else (
        lambda fn, flat: fn(*flat))

    def _Bwd(*flat):
      # The recomputation waits for the output gradients: inlined into the
      # caller's graph, it would otherwise run as soon as the forward ends
      # and hold what it recomputes (control dependencies on d_out).
      d_out = flat[n_keep:]
      with tf.control_dependencies(d_out):
        held = [tf.identity(x) for x in flat[:n_keep]]
      return build(cut, held + list(d_out))

    if self._inline:
      fwd = lambda *a: _BuildInCallerGraph(fwd_cut, a)
      bwd = _Bwd
    else:
      fwd = self._Function(lambda *a: fwd_cut(*a), [_Spec(x) for x in args])
      bwd = self._Function(
          _Bwd, [_Spec(x) for x in args + kept + traced.inputs[n_in:]])
    self._keep[policy] = (fwd, bwd, mask, len(kept))
    return self._keep[policy]

  def ForwardKeep(self, theta, state, inputs, seed=None, policy='all',
                  defer_w=False):
    """One step that keeps activations; returns (grad_fn, new state).

    `grad_fn(d_out)` (once) gives what `Backward` gives, computed from the
    kept activations on `device` instead of by re-running the cell: all of
    them (policy 'all'), or those remat_policy.KeptTensors' `policy` picks,
    the backward recomputing the rest. Eagerly (or for a cell that cannot
    be cut, see `_KeepFunctions`) a GradientTape keeps all of them. With
    `defer_w` the backward will defer its W (`Backward`'s `defer_w`), so
    even an inlined cell keeps its activations in a graph that can be cut.
    """
    eager = tf.executing_eagerly() or (
        self._inline and policy == 'all' and not defer_w)
    keep = None if eager else self._KeepFunctions(policy)
    if keep is None:
      with cluster_lib.DeviceScope(self._device):
        grads_fn, out = self.TapeForward(theta, state, inputs, seed)

      def _GradFn(d_out, defer_w=False):
        with cluster_lib.DeviceScope(self._device):
          return self._Deferred(self._Unpack(grads_fn(d_out)), defer_w)

      return _GradFn, out
    fwd, bwd, mask, _ = keep
    args = list(theta) + list(state) + list(inputs)
    if self._has_seed:
      args.append(seed)
    n_out = len(self._state_flat)
    with cluster_lib.DeviceScope(self._device):
      res = fwd(*args)
    out, kept = list(res[:n_out]), list(res[n_out:])

    def _GradFnKept(d_out, defer_w=False):
      if defer_w:
        return self._SplitCall(policy, args + kept, d_out)
      with cluster_lib.DeviceScope(self._device):
        got = iter(bwd(*(args + kept + list(d_out))))
      return self._Unpack([next(got) if m else None for m in mask])

    return _GradFnKept, out

  def _Unpack(self, grads):
    """Float-leaf grads -> (d_theta, d_state, d_inputs) per flat leaf."""
    it = iter(grads)
    out = []
    for flat in (self._theta_flat, self._state_flat, self._inputs_flat):
      out.append([next(it) if IsDifferentiable(x) else None for x in flat])
    return tuple(out)

  def BackwardMask(self):
    """(theta, state, inputs) lists of bools: which gradients `Backward`
    returns (float leaves the new state depends on); traces if needed."""
    self._EnsureBackward()
    parts = self._Unpack([True if m else None for m in self._bwd_mask])
    return tuple([m is True for m in part] for part in parts)

  def Backward(self, theta, state, inputs, seed, d_out, defer_w=False):
    """Re-runs the step and returns its gradients (rematerialisation).

    Args:
      theta, state, inputs: flat lists, as given to `Forward`.
      seed: the step's seed (or None without seeds).
      d_out: gradients of the float leaves of the new state, in order.
        The re-run starts only once they are computed.
      defer_w: compute only the input gradients now (B), and the weight
        gradients when asked (W; deferred_w.py).

    Returns:
      (d_theta, d_state, d_inputs): flat lists matching theta, state and
      inputs; None for integer leaves and for leaves the output does not
      depend on. With `defer_w`, d_theta is a function `weights(after=())`
      that computes it (after the ops `after`, in a graph).
    """
    args = list(theta) + list(state) + list(inputs)
    if self._has_seed:
      args.append(seed)
    if defer_w and not tf.executing_eagerly():
      return self._SplitCall(None, args, d_out)
    if tf.executing_eagerly() or self._inline:
      with cluster_lib.DeviceScope(self._device):
        grads, _ = self.TapeForward(theta, state, inputs, seed, d_out=d_out)
      if self._bwd_mask is not None:   # Keep BackwardMask's promise.
        sources = [x for x in list(theta) + list(state) + list(inputs)
                   if IsDifferentiable(x)]
        grads = [(g if g is not None else tf.zeros_like(x)) if m else None
                 for g, m, x in zip(grads, self._bwd_mask, sources)]
      return self._Deferred(self._Unpack(grads), defer_w)
    self._EnsureBackward()
    with cluster_lib.DeviceScope(self._device):
      got = iter(self._bwd(*(args + list(d_out))))
    grads = [next(got) if m else None for m in self._bwd_mask]
    return self._Unpack(grads)

  # --- the backward cut into B and a deferred W -------------------------------

  @staticmethod
  def _Deferred(grads, defer_w):
    """(d_theta, d_state, d_inputs), d_theta as a function with `defer_w`:
    eagerly the whole backward runs at once and W hands over its part."""
    if not defer_w:
      return grads
    d_theta, d_state, d_inputs = grads
    return (lambda after=(): d_theta), d_state, d_inputs

  def _DeferredWFunctions(self, policy):
    """(b, w, cut, grad mask) of the backward cut into B and W
    (deferred_w.CutBackward): of a re-run of the whole cell (policy None) or
    of what remat policy `policy` kept (`_KeepFunctions`). b takes the
    cut's feeds (the step's args, the kept tensors, d_out) and returns the
    input gradients and the residuals B computes; w takes the residuals."""
    if policy in self._cut_backwards:
      return self._cut_backwards[policy]
    if policy is None:
      mask = []
      n_in = len(self._specs)
      d_specs = [_Spec(x) for x in self._state_flat if IsDifferentiable(x)]

      def _Grads(*flat):
        theta, state, inputs, seed = self._Split(list(flat[:n_in]))
        with cluster_lib.DeviceScope(self._device):
          grads, _ = self.TapeForward(theta, state, inputs, seed,
                                      d_out=list(flat[n_in:]))
        mask[:] = [g is not None for g in grads]
        return [g for g in grads if g is not None]

      traced = tf.compat.v1.wrap_function(_Grads, self._specs + d_specs)
      feeds, grads = list(traced.inputs), list(traced.outputs)
    else:
      traced, feeds, grads, mask = self._traces[policy]
    n_theta = sum(mask[:sum(map(IsDifferentiable, self._theta_flat))])
    cut = deferred_w.CutBackward(traced, feeds, grads[:n_theta],
                               grads[n_theta:])
    if self._inline:
      b = lambda *a: _BuildInCallerGraph(cut.b, a)
      w = lambda *a: _BuildInCallerGraph(cut.w, a)
    else:
      b = self._Function(lambda *a: cut.b(*a), [_Spec(t) for t in feeds])
      w = self._Function(lambda *a: cut.w(*a),
                         [_Spec(t) for t in cut.residuals])
    self._cut_backwards[policy] = (b, w, cut, list(mask))
    return self._cut_backwards[policy]

  def _SplitCall(self, policy, args, d_out):
    """B now: (weights(after=()) -> d_theta, d_state, d_inputs).

    args: the step's args (and the kept tensors, for a `policy`); the
    recomputation in B waits for d_out (control dependencies).
    """
    b, w, cut, mask = self._DeferredWFunctions(policy)
    n_theta = sum(map(IsDifferentiable, self._theta_flat))
    feeds = deferred_w.Hold(args, d_out) + list(d_out)
    with cluster_lib.DeviceScope(self._device):
      outs = list(b(*feeds))
    got = iter(outs[:cut.num_input_grads])
    _, d_state, d_inputs = self._Unpack(
        [None] * n_theta + [next(got) if m else None for m in mask[n_theta:]])

    def _Weights(after=()):
      residuals = deferred_w.Hold(cut.WeightArgs(feeds, outs), after)
      with cluster_lib.DeviceScope(self._device):
        got = iter(w(*residuals))
      return self._Unpack([next(got) if m else None for m in mask[:n_theta]]
                          + [None] * (len(mask) - n_theta))[0]

    return _Weights, d_state, d_inputs
