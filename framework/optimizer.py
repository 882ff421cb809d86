"""Optimizers: SGD, Momentum, Adam and Adafactor over plain tf.Variables.

Each optimizer is a per-variable rule, given one of two ways:
  * `_Fused(var, grad, slots, step) -> op`: TF's fused training kernel for
    the rule (`ResourceApplyAdam`, ...), one op that updates the variable and
    its slots in place (SGD, Momentum, Adam);
  * `_Update(var, grad, slots, step) -> (new_var, new_slots)`: the rule as
    pure ops, for rules TF has no kernel of (Adafactor).
`step` holds the update's scalars (`_StepScalars(lr, t)`: the learning rate,
the update index and what the rule derives from them, e.g. Adam's
bias-corrected step size), computed once per `Apply` and dtype rather than
once per variable. The fused kernels make the update cheap: on the Tiny
LM's 69 variables, Adam as pure ops (skipping by a `tf.where` per variable
and slot, as Cadence did) was ~30 graph ops a variable, half of its train
step's graph; fused, the update alone traces in 0.4x the time, its first
call (grappler) takes 0.5x and each step 0.56x (bench/optimizer_bench.py,
where Keras's Adam is the baseline). The machinery that applies a rule:

  * `Build(variables)` creates the slot variables eagerly, each on its
    variable's device (call it before any `tf.function` traces).
  * `Apply(lr, grads_and_vars, skip=None)` updates every variable and its
    slots. `lr` may be a tensor that changes every step (no retracing).
    When the boolean tensor `skip` is true nothing changes, bit for bit: not
    the variables, not the slots, not the update counter.
  * `checkpointables` is a trackable holding the slots and the update counter,
    keyed by variable path: `tf.train.Checkpoint(opt=o.checkpointables)`.
  * Sharded (ZeRO-1, framework/train/sharded_update.py): `Build(variables,
    num_shards=R, shard_index=r)` gives each variable's slots as its shard
    r of R: flat, ceil(N / R) elements of the variable's N (the last shard
    zero-padded); `ApplyShards` updates such shards of the weights and
    slots by the rule as pure ops (`_Update`) and returns the new weight
    shards. Only rules that update every element on its own can run on a
    shard (`ELEMENTWISE`: SGD, Momentum, Adam; Adafactor reads whole rows,
    columns and the variable's RMS).

Why not the Keras optimizers: Keras 3 does update raw tf.Variables, but its
`apply_gradients` does a `merge_call` under tf.distribute, which cannot sit
inside a `tf.cond` that skips a non-finite step; and its checkpoint keys are
slot indices (`_variables/3`) plus a second copy of every model variable.
Here a skipped step is one `tf.cond` per device around that device's
updates, the checkpoint keys are variable paths, and each rule is a few
lines that the tests check against numpy.

Example:
  v = tf.Variable([1.0, 2.0])
  opt = Adam.Params().Set(beta1=0.9).Instantiate()
  opt.Build([('w', v)])
  opt.Apply(0.1, [(tf.constant([1.0, -1.0]), v)])
"""
import re

import tensorflow as tf

from cadence.framework import cluster as cluster_lib
from cadence.framework import hyperparams
from cadence.framework.nested_map import NestedMap
from cadence.framework import validation


def _VarName(name):
  """`name` with the characters TF rejects in variable names replaced."""
  return re.sub(r'[^A-Za-z0-9_./-]', '_', name)


class _OptimizerState(tf.Module):
  """The trackable part of an optimizer: slots by variable path, a counter."""

  def __init__(self, name):
    super().__init__(name=name)
    self.slots = {}  # path -> {slot name: tf.Variable}
    self.num_updates = None  # int64 tf.Variable, created by Build().


class BaseOptimizer:
  """Applies a per-variable update rule; subclasses define the rule."""

  # Whether the rule updates each element of a variable from that element
  # alone (and its slots' elements): then it can run on a shard.
  ELEMENTWISE = False

  @classmethod
  def Params(cls):
    p = hyperparams.InstantiableParams(cls)
    p.Define('name', cls.__name__.lower(), 'Name of the optimizer; prefixes '
             'its slot variables.')
    return p

  def __init__(self, params):
    self._params = params.Copy().Freeze()
    self._Validate()
    self.checkpointables = _OptimizerState(self._params.name)
    self._path_by_ref = {}
    self.num_shards, self.shard_index = 1, 0   # Build's.

  @property
  def params(self):
    return self._params

  def _CheckRange(self, field, low, high, low_open=False, high_open=False):
    validation.CheckNumber(validation.Owner(self), field,
                           self._params.Get(field), low, high, low_open,
                           high_open)

  def _Validate(self):
    """Raises ValueError for bad params; subclasses extend."""

  def SlotShapes(self, shape):
    """{slot name: shape} of the slots a variable of static `shape` gets
    (memory estimates read it; nothing is built): whole, or this
    optimizer's flat shard of each when it holds one of num_shards R > 1
    (Build's, or `ForShards` for an estimate)."""
    slots = self._SlotShapes(shape)
    if self.num_shards > 1:
      size = ShardSize(tf.TensorShape(shape).num_elements(), self.num_shards)
      slots = {name: [size] for name in slots}
    return slots

  def ForShards(self, num_shards):
    """This optimizer, its `SlotShapes` those of one shard of R (for a
    memory estimate of sharded slots; 1: whole); returns it."""
    self.num_shards = num_shards
    return self

  # -- rule (subclasses) --
  def _SlotShapes(self, shape):
    """{slot name: shape} for a variable of static `shape`."""
    del shape  # Unused.
    return {}

  def _StepScalars(self, lr, t):
    """The scalars of one update that every variable of a dtype shares.

    Args:
      lr: the learning rate, a scalar of the variables' dtype.
      t: this update's 1-based index (updates applied so far + 1), a float
        scalar of the variables' dtype.

    Returns:
      NestedMap with `lr` and `t`; subclasses add what their rule derives
      from them (computed once per Apply, not once per variable).
    """
    return NestedMap(lr=lr, t=t)

  # A subclass defines `_Fused` or `_Update` (see the module docstring).
  _Fused = None

  def _Update(self, var, grad, slots, step):
    """The update rule as pure ops (for rules without a fused kernel).

    Args:
      var: the variable's current value, a tensor.
      grad: its gradient, same shape and dtype.
      slots: {slot name: current slot value}.
      step: the `_StepScalars` of var's dtype.

    Returns:
      (new var value, {slot name: new slot value}).
    """
    raise NotImplementedError(f'{type(self).__name__}._Update')

  # -- machinery --
  @property
  def num_updates(self):
    """int64 variable: the updates applied (skipped steps not counted)."""
    return self.checkpointables.num_updates

  def Slots(self, var):
    """{slot name: tf.Variable} of a built variable."""
    return self.checkpointables.slots[self._Path(var)]

  def Path(self, var):
    """The path that names a built variable's slots in checkpoints."""
    return self._Path(var)

  def _Path(self, var):
    path = self._path_by_ref.get(var.ref())
    if path is None:
      raise ValueError(
          f'{type(self).__name__} {self._params.name!r}: variable '
          f'{var.name!r} was not built; call Build() with every variable '
          'before the first Apply (and before any tf.function traces)')
    return path

  def Build(self, variables, num_shards=None, shard_index=None):
    """Creates the slots of `variables` eagerly; built ones are kept.

    Args:
      variables: tf.Variables, or (path, tf.Variable) pairs; the path names
        the slots in checkpoints (default: the variable's name).
      num_shards: R > 1: each slot is this optimizer's shard of it, flat,
        ShardSize(N, R) elements (an ELEMENTWISE rule only); None: as
        built before (1 at first).
      shard_index: which shard, in [0, R).
    """
    num_shards = self.num_shards if num_shards is None else num_shards
    shard_index = self.shard_index if shard_index is None else shard_index
    if num_shards > 1 and not self.ELEMENTWISE:
      raise ValueError(f'{type(self).__name__} {self._params.name!r}: its '
                       'update reads more than each element (rows, columns '
                       'or the whole variable), so its slots cannot be '
                       'sharded; use SGD, Momentum or Adam.')
    self.num_shards, self.shard_index = num_shards, shard_index
    state = self.checkpointables
    with tf.init_scope():
      if state.num_updates is None:
        state.num_updates = tf.Variable(
            tf.constant(0, tf.int64), trainable=False,
            name=f'{self._params.name}/num_updates')
      for item in variables:
        path, var = item if isinstance(item, tuple) else (item.name, item)
        if var.ref() in self._path_by_ref:
          continue
        base, n = path, 1
        while path in state.slots:
          path, n = f'{base}_{n}', n + 1
        slots = {}
        with cluster_lib.BesideVariable(var):
          for slot_name, shape in self._SlotShapes(var.shape).items():
            if num_shards > 1:
              shape = [ShardSize(var.shape.num_elements(), num_shards)]
            slots[slot_name] = tf.Variable(
                tf.zeros(shape, var.dtype), trainable=False,
                name=_VarName(f'{self._params.name}/{path}/{slot_name}'))
        state.slots[path] = slots
        self._path_by_ref[var.ref()] = path

  def Apply(self, lr, grads_and_vars, skip=None):
    """Updates each variable from its gradient, unless `skip` is true.

    Callable eagerly and in a tf.function. The variables are plain ones,
    each updated on its own device (replicas keep their own copies, see
    framework/train/replicas.py: every copy's optimizer applies the same reduced
    gradients).

    Args:
      lr: the learning rate, a float or a float scalar tensor.
      grads_and_vars: (gradient, variable) pairs; None gradients are ignored.
      skip: optional bool scalar tensor; true leaves everything unchanged.
    """
    pairs = [(g, v) for g, v in grads_and_vars if g is not None]
    for _, v in pairs:
      self._Path(v)  # Fails early for unbuilt variables.
    if self.num_updates is None:
      self.Build([])
    lr = tf.cast(lr, tf.float32)
    skip = tf.constant(False) if skip is None else tf.cast(skip, tf.bool)
    grads = [g for g, _ in pairs]
    variables = [v for _, v in pairs]

    scalars = {}   # (device, dtype) -> _StepScalars, shared by variables.
    by_device = {}   # device -> [(grad, var, scalars)], in order.
    t = self.num_updates + 1
    for g, v in zip(grads, variables):
      # The update runs where the variable (and its slots) live.
      with tf.device(v.device):
        key = (v.device, v.dtype)
        if key not in scalars:
          scalars[key] = self._StepScalars(tf.cast(lr, v.dtype),
                                           tf.cast(t, v.dtype))
      by_device.setdefault(v.device, []).append((g, v, scalars[key]))
    for device, items in by_device.items():
      with tf.device(device):
        tf.cond(skip, tf.no_op,
                lambda items=items: tf.group([self._ApplyOne(*x)
                                              for x in items]))
    self.num_updates.assign_add(tf.cast(~skip, tf.int64))

  def _ApplyOne(self, grad, var, step):
    """Updates one variable (one device's copy) and its slots; an op.

    The variable and its slots are read once the gradient exists: read
    before, the reads and what the rule computes of them alone (Adam's
    `beta1 * m`, `beta2 * v`) ran at the start of the step and held two
    more copies of every variable's bytes while the forward and backward
    ran (measured per device, bench/planner_bench.py's memory table). A
    fused kernel reads them itself, and takes the gradient as an input.
    """
    slots = self.Slots(var)
    grad = tf.cast(tf.convert_to_tensor(grad), var.dtype)  # Dense.
    if self._Fused is not None:
      return self._Fused(var, grad, slots, step)
    # An op of this graph (a cond's branch): a control edge from a tensor
    # of the graph around it would be dropped.
    grad = tf.identity(grad)
    with tf.control_dependencies([grad]):
      old_var = var.value()
      old_slots = {k: s.value() for k, s in slots.items()}
    new_var, new_slots = self._Update(old_var, grad, old_slots, step)
    return tf.group([var.assign(new_var)] +
                    [slots[k].assign(new_slots[k]) for k in slots])


  def ApplyShards(self, lr, items, skip):
    """Updates this optimizer's slot shards; returns the new weight shards.

    Args:
      lr: the learning rate, a float scalar.
      items: (gradient shard, weight shard, variable) triples: the shards
        (flat, this optimizer's `shard_index`) of each built variable's
        gradient and current value.
      skip: bool scalar tensor; true leaves the slots and the update counter
        unchanged, and the returned shards are the weight shards given.

    Returns:
      The new weight shards, in `items`' order.
    """
    out = [self.ApplyShard(lr, g, w, v, skip) for g, w, v in items]
    with tf.control_dependencies(out):
      self.CountUpdate(skip)
      return [tf.identity(w) for w in out]

  def ApplyShard(self, lr, grad, weight, var, skip):
    """The rule on one variable's shards (see ApplyShards): writes its slot
    shards and returns the new weight shard. After every variable's,
    CountUpdate once."""
    with tf.device(var.device):
      step = self._StepScalars(tf.cast(lr, var.dtype),
                               tf.cast(self.num_updates + 1, var.dtype))
      return self._ShardRule(weight, tf.cast(grad, var.dtype),
                             self.Slots(var), step, tf.cast(skip, tf.bool))

  def CountUpdate(self, skip):
    """Counts an update of shards (ApplyShard), unless `skip`."""
    return self.num_updates.assign_add(tf.cast(~tf.cast(skip, tf.bool),
                                               tf.int64))

  def _ShardRule(self, weight, grad, slots, step, skip):
    """The rule on one shard: updates the slot variables `slots` and
    returns the new weight shard (the old values when `skip`).

    TensorFlow's ops, not XLA: they round as the fused kernels do, bit for
    bit, so a sharded step equals the unsharded one. XLA fuses the rule
    into one pass but contracts its products and sums into fused
    multiply-adds, which round once: Adam's moments then differ in the
    last bit, and with a small epsilon Adam turns that into a different
    sign of an update wherever a gradient is near zero (the LM drifted
    apart by 1e-4 relative in 5 steps).
    """
    old = {k: v.read_value() for k, v in slots.items()}
    new_weight, new_slots = self._Update(weight, grad, old, step)
    for k, v in slots.items():
      v.assign(tf.where(skip, old[k], new_slots[k]))
    return tf.where(skip, weight, new_weight)


def ShardSize(num_elements, num_shards):
  """Elements of each of `num_shards` equal shards of a flat variable of
  `num_elements`: ceil(N / R). Shards are equal so that the all-gather
  of the new weight shards takes one shape from every replica; the last one is zero-padded, and a zero weight with a zero
  gradient and zero slots stays zero under every ELEMENTWISE rule."""
  return -(-int(num_elements) // int(num_shards))


class SGD(BaseOptimizer):
  """Plain gradient descent: `var -= lr * grad`.

  Example:
    opt = SGD.Params().Instantiate()
  """

  ELEMENTWISE = True

  def _Fused(self, var, grad, slots, step):
    del slots  # Unused: SGD keeps none.
    return tf.raw_ops.ResourceApplyGradientDescent(
        var=var.handle, alpha=step.lr, delta=grad)

  def _Update(self, var, grad, slots, step):
    del slots  # Unused: SGD keeps none.
    return var - step.lr * grad, {}


class Momentum(BaseOptimizer):
  """Heavy-ball momentum: `m = alpha * m + grad; var -= lr * m`.

  With `use_nesterov`: `var -= lr * (grad + alpha * m)` (new m).

  Example:
    opt = Momentum.Params().Set(alpha=0.9, use_nesterov=True).Instantiate()
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('alpha', 0.9, 'Momentum decay, a float in [0, 1).')
    p.Define('use_nesterov', False, 'Whether to use Nesterov momentum.')
    return p

  def _Validate(self):
    self._CheckRange('alpha', 0.0, 1.0, high_open=True)
    validation.CheckBool(validation.Owner(self), 'use_nesterov',
                         self._params.use_nesterov)

  def _SlotShapes(self, shape):
    return {'momentum': shape}

  def _StepScalars(self, lr, t):
    scalars = super()._StepScalars(lr, t)
    scalars.alpha = tf.cast(self._params.alpha, lr.dtype)
    return scalars

  ELEMENTWISE = True

  def _Fused(self, var, grad, slots, step):
    return tf.raw_ops.ResourceApplyMomentum(
        var=var.handle, accum=slots['momentum'].handle, lr=step.lr,
        grad=grad, momentum=step.alpha,
        use_nesterov=self._params.use_nesterov)

  def _Update(self, var, grad, slots, step):
    # The fused kernel's arithmetic, in its order.
    m = slots['momentum'] * step.alpha + grad
    if self._params.use_nesterov:
      return var - (grad * step.lr + m * step.alpha * step.lr), {'momentum': m}
    return var - step.lr * m, {'momentum': m}


class Adam(BaseOptimizer):
  """Adam (Kingma & Ba 2015), in the bias-corrected step-size form.

  `m = b1 m + (1 - b1) g`, `v = b2 v + (1 - b2) g^2`,
  `var -= lr * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + epsilon)`.

  Example:
    opt = Adam.Params().Set(beta1=0.9, beta2=0.98, epsilon=1e-9).Instantiate()
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('beta1', 0.9, 'Decay of the first moment, a float in [0, 1).')
    p.Define('beta2', 0.999, 'Decay of the second moment, a float in '
             '[0, 1).')
    p.Define('epsilon', 1e-6, 'Added to sqrt(v) in the denominator, a float '
             '> 0.')
    return p

  def _Validate(self):
    self._CheckRange('beta1', 0.0, 1.0, high_open=True)
    self._CheckRange('beta2', 0.0, 1.0, high_open=True)
    self._CheckRange('epsilon', 0.0, None, low_open=True)

  def _SlotShapes(self, shape):
    return {'m': shape, 'v': shape}

  def _StepScalars(self, lr, t):
    s = super()._StepScalars(lr, t)
    p = self._params
    s.b1, s.b2 = tf.cast(p.beta1, lr.dtype), tf.cast(p.beta2, lr.dtype)
    s.b1_t, s.b2_t = tf.pow(s.b1, t), tf.pow(s.b2, t)
    s.epsilon = tf.cast(p.epsilon, lr.dtype)
    return s

  ELEMENTWISE = True

  def _Fused(self, var, grad, slots, step):
    # The kernel's lr_t = lr * sqrt(1 - b2^t) / (1 - b1^t), and its moment
    # updates m += (g - m)(1 - b1), v += (g^2 - v)(1 - b2): the rule above.
    return tf.raw_ops.ResourceApplyAdam(
        var=var.handle, m=slots['m'].handle, v=slots['v'].handle,
        beta1_power=step.b1_t, beta2_power=step.b2_t, lr=step.lr,
        beta1=step.b1, beta2=step.b2, epsilon=step.epsilon, grad=grad)

  def _Update(self, var, grad, slots, step):
    # The fused kernel's arithmetic, in its order.
    lr_t = step.lr * tf.sqrt(1 - step.b2_t) / (1 - step.b1_t)
    m = slots['m'] + (grad - slots['m']) * (1 - step.b1)
    v = slots['v'] + (tf.square(grad) - slots['v']) * (1 - step.b2)
    return var - m * lr_t / (tf.sqrt(v) + step.epsilon), {'m': m, 'v': v}


class Adafactor(BaseOptimizer):
  """Adafactor (Shazeer & Stern 2018): factored second moments.

  For a variable whose last two dims are both >= `min_dim_size_to_factor`
  the second moment is kept as row and column means (`vr`: shape[:-1],
  `vc`: shape[:-2] + shape[-1:]), else in full (`v`). At update t:
  `d = 1 - t**-decay_exponent`, `g2 = g^2 + epsilon1`, moments decay by d,
  `u = g / sqrt(v_hat)` with `v_hat = vr vc / mean(vr)` when factored;
  `u /= max(1, rms(u) / clipping_threshold)`; optional momentum
  `m = beta1 m + (1 - beta1) u; u = m`; the step size is `lr`, times
  `max(epsilon2, rms(var))` with `multiply_by_parameter_scale`.

  Example:
    opt = Adafactor.Params().Set(min_dim_size_to_factor=32).Instantiate()
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('beta1', 0.0, 'Momentum of the update, a float in [0, 1); 0 '
             'keeps no first moment.')
    p.Define('decay_exponent', 0.8, 'Second-moment decay is 1 - t**-this, a '
             'float in (0, 1].')
    p.Define('epsilon1', 1e-30, 'Added to squared gradients, a float > 0.')
    p.Define('epsilon2', 1e-3, 'Lower bound of the parameter scale, a float '
             '>= 0.')
    p.Define('clipping_threshold', 1.0, 'Caps the update RMS, a float (0: '
             'no clipping).')
    p.Define('multiply_by_parameter_scale', True, 'Scale the step by the '
             'RMS of the variable (relative step size).')
    p.Define('factored', True, 'Factor the second moment of matrices.')
    p.Define('min_dim_size_to_factor', 128, 'Factor only when the last two '
             'dims are both at least this, an int.')
    return p

  def _Validate(self):
    self._CheckRange('beta1', 0.0, 1.0, high_open=True)
    self._CheckRange('decay_exponent', 0.0, 1.0, low_open=True)
    self._CheckRange('epsilon1', 0.0, None, low_open=True)
    self._CheckRange('clipping_threshold', 0.0, None)
    for field in ('multiply_by_parameter_scale', 'factored'):
      validation.CheckBool(validation.Owner(self), field,
                           self._params.Get(field))

  def _Factored(self, shape):
    p = self._params
    return (p.factored and len(shape) >= 2 and
            shape[-1] >= p.min_dim_size_to_factor and
            shape[-2] >= p.min_dim_size_to_factor)

  def _SlotShapes(self, shape):
    shape = shape.as_list()
    slots = {}
    if self._Factored(shape):
      slots['vr'] = shape[:-1]
      slots['vc'] = shape[:-2] + shape[-1:]
    else:
      slots['v'] = shape
    if self._params.beta1 > 0:
      slots['m'] = shape
    return slots

  def _StepScalars(self, lr, t):
    scalars = super()._StepScalars(lr, t)
    scalars.decay = 1.0 - tf.pow(t, -tf.cast(self._params.decay_exponent,
                                             lr.dtype))
    return scalars

  def _Update(self, var, grad, slots, step):
    p = self._params
    dtype = var.dtype
    decay = step.decay
    g2 = tf.square(grad) + tf.cast(p.epsilon1, dtype)
    new = {}
    if 'vr' in slots:
      vr = decay * slots['vr'] + (1.0 - decay) * tf.reduce_mean(g2, -1)
      vc = decay * slots['vc'] + (1.0 - decay) * tf.reduce_mean(g2, -2)
      row_scale = tf.math.rsqrt(
          vr / tf.reduce_mean(vr, -1, keepdims=True))  # shape[:-1]
      update = grad * row_scale[..., None] * tf.math.rsqrt(vc)[..., None, :]
      new.update(vr=vr, vc=vc)
    else:
      v = decay * slots['v'] + (1.0 - decay) * g2
      update = grad * tf.math.rsqrt(v)
      new['v'] = v
    if p.clipping_threshold > 0:
      rms = tf.sqrt(tf.reduce_mean(tf.square(update)))
      update /= tf.maximum(1.0, rms / p.clipping_threshold)
    if p.beta1 > 0:
      update = p.beta1 * slots['m'] + (1.0 - p.beta1) * update
      new['m'] = update
    size = step.lr
    if p.multiply_by_parameter_scale:
      size *= tf.maximum(tf.cast(p.epsilon2, dtype),
                         tf.sqrt(tf.reduce_mean(tf.square(var))))
    return var - size * update, new
