"""Full softmax with cross-entropy loss, optionally chunked to bound memory.

With label smoothing ls (Szegedy et al., 2016; Vaswani et al., 2017) the
target distribution of a row with class id k over C classes is
  target = (1 - ls) * onehot(k) + ls / C
and the loss is -sum(target * log_softmax(logits)).

Chunking (`softmax_max_alloc` > 0): the rows (all leading dims flattened,
e.g. batch * time) are processed `softmax_max_alloc // num_classes` at a time
in a loop, so at most [chunk_rows, num_classes] logits exist at once. The
backward pass is a custom gradient that recomputes each chunk's logits and
accumulates d(w), d(b) and writes d(inputs) chunk by chunk; it never keeps
the full logits either. The loss and its gradients equal the unchunked ones.

The cross-entropy is computed in float32 whatever the fprop_dtype (float64
when fprop_dtype is float64).
"""
import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import cost
from cadence.framework import op_cost
from cadence.framework.nested_map import NestedMap
from cadence.framework import shapes
from cadence.framework import validation

WeightInit = base_layer.WeightInit
WeightParams = base_layer.WeightParams

# FLOPs per logit of the softmax cross-entropy: max, subtract, exp, sum,
# and the target dot product (multiply, add).
_XENT_FLOPS_PER_LOGIT = 6
# FLOPs per row: log of the sum, the weight multiply and the total's add.
_XENT_FLOPS_PER_ROW = 3


def _Target(class_ids, num_classes, label_smoothing, dtype):
  """Smoothed one-hot targets, [..., num_classes] of `dtype`."""
  onehot = tf.one_hot(class_ids, num_classes, dtype=dtype)
  if not label_smoothing:
    return onehot
  return onehot * (1.0 - label_smoothing) + label_smoothing / num_classes


def _Xent(logits, class_ids, label_smoothing):
  """Per-row cross-entropy [...] and log-probs [..., C] of the logits."""
  log_probs = tf.nn.log_softmax(logits)
  target = _Target(class_ids, logits.shape[-1], label_smoothing,
                   logits.dtype)
  return -tf.reduce_sum(target * log_probs, axis=-1), log_probs


def _ChunkedXentFn(label_smoothing):
  """Returns f(x_c, w, b, ids_c) -> xent [n, c] with a chunked gradient.

  x_c: [num_chunks, chunk_rows, input_dim]; ids_c: [num_chunks, chunk_rows].
  """

  @tf.custom_gradient
  def _Fn(x_c, w, b, ids_c):
    dtype = base_layer.AccumulationDtype(x_c.dtype)

    def _Logits(x):                               # [chunk_rows, C]
      return tf.cast(tf.matmul(x, w) + b, dtype)

    xent = tf.map_fn(
        lambda a: _Xent(_Logits(a[0]), a[1], label_smoothing)[0],
        (x_c, ids_c), fn_output_signature=dtype)   # [n, chunk_rows]

    def _Grad(d_xent):
      num_chunks = tf.shape(x_c)[0]

      def _Body(i, dw, db, dx_ta):
        x = x_c[i]
        probs = tf.nn.softmax(_Logits(x))
        target = _Target(ids_c[i], probs.shape[-1], label_smoothing, dtype)
        # d xent / d logits = probs - target, as each target row sums to 1.
        d_logits = (probs - target) * d_xent[i][:, None]  # [chunk_rows, C]
        d_logits_x = tf.cast(d_logits, x.dtype)
        dw += tf.cast(tf.matmul(x, d_logits_x, transpose_a=True), dtype)
        db += tf.reduce_sum(d_logits, axis=0)
        dx_ta = dx_ta.write(i, tf.matmul(d_logits_x, w, transpose_b=True))
        return i + 1, dw, db, dx_ta

      _, dw, db, dx_ta = tf.while_loop(
          lambda i, *_: i < num_chunks, _Body,
          (tf.constant(0), tf.zeros(tf.shape(w), dtype),
           tf.zeros(tf.shape(b), dtype),
           tf.TensorArray(x_c.dtype, size=num_chunks,
                          element_shape=x_c.shape[1:])))
      return (dx_ta.stack(), tf.cast(dw, w.dtype), tf.cast(db, b.dtype), None)

    return xent, _Grad

  return _Fn


def _ChunkedXent(x, w, b, class_ids, chunk_rows, label_smoothing):
  """Per-row xent [rows] of x [rows, input_dim], chunk_rows rows at a time."""
  rows = tf.shape(x)[0]
  num_chunks = (rows + chunk_rows - 1) // chunk_rows
  pad = num_chunks * chunk_rows - rows
  x_c = tf.reshape(tf.pad(x, [[0, pad], [0, 0]]),
                   [num_chunks, chunk_rows, x.shape[-1]])
  ids_c = tf.reshape(tf.pad(class_ids, [[0, pad]]), [num_chunks, chunk_rows])
  xent = _ChunkedXentFn(label_smoothing)(x_c, w, b, ids_c)
  return tf.reshape(xent, [-1])[:rows]


class SimpleFullSoftmax(base_layer.BaseLayer):
  """Logits = inputs @ w + b over all classes, and the cross-entropy loss.

  Variables: `w` [input_dim, num_classes] (params_init), `b` [num_classes]
  (zeros).

  Example:
    p = SimpleFullSoftmax.Params().Set(name='softmax', input_dim=8,
                                       num_classes=10, label_smoothing=0.1)
    layer = p.Instantiate()
    out = layer(tf.ones([2, 5, 8]), tf.zeros([2, 5], tf.int32))
    out.avg_xent          # scalar
    out.per_example_xent  # [2, 5]
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('input_dim', 0, 'Depth of the input, an int > 0.')
    p.Define('num_classes', 0, 'Number of classes, an int > 0.')
    p.Define('label_smoothing', 0.0, 'Probability mass in [0, 1) spread '
             'uniformly over all classes in the target.')
    p.Define('softmax_max_alloc', 0, 'If > 0, the most logits elements '
             '(rows * num_classes) FProp computes at once; larger inputs are '
             'chunked and FProp returns no logits/log_probs. 0: off.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CheckParams(p, validation.Owner(self))
    self.CreateVariable('w', WeightParams([p.input_dim, p.num_classes]))
    self.CreateVariable(
        'b', WeightParams([p.num_classes], init=WeightInit.Constant(0.0)))

  @classmethod
  def CheckParams(cls, p, owner):
    super().CheckParams(p, owner)
    for field in ('input_dim', 'num_classes'):
      validation.CheckInt(owner, field, p.Get(field))
    validation.CheckNumber(owner, 'label_smoothing', p.label_smoothing, 0, 1,
                           high_open=True)
    validation.CheckInt(owner, 'softmax_max_alloc', p.softmax_max_alloc, 0)

  def _ChunkRows(self, inputs):
    """Rows per chunk, or None when the logits fit in softmax_max_alloc."""
    p = self.params
    if not p.softmax_max_alloc:
      return None
    rows = shapes.Mul(*shapes.AsShape(inputs.shape)[:-1])
    if rows is not None and rows * p.num_classes <= p.softmax_max_alloc:
      return None
    return max(1, p.softmax_max_alloc // p.num_classes)

  def Logits(self, theta, inputs):
    """Full logits (never chunked).

    Args:
      theta: NestedMap with `w` and `b`.
      inputs: [..., input_dim].

    Returns:
      [..., num_classes] in fprop_dtype.
    """
    inputs = self.CastToFPropDtype(inputs)
    w = self.CastToFPropDtype(theta.w)
    # tensordot, not einsum: einsum's gradient materialises [in, C, ...].
    return tf.tensordot(inputs, w, axes=1) + self.CastToFPropDtype(
        theta.b)

  def FProp(self, theta, inputs, class_ids, class_weights=None):
    """Computes the cross-entropy loss.

    Args:
      theta: NestedMap with `w` and `b`.
      inputs: [..., input_dim].
      class_ids: int [...], the target class of each row.
      class_weights: float [...], weight of each row; None means all 1.

    Returns:
      NestedMap of
        logits: [..., num_classes] fprop_dtype (absent when chunked);
        log_probs: [..., num_classes] (absent when chunked);
        per_example_xent: [...];
        per_example_weight: [...], class_weights;
      all but logits in float32 (float64 if fprop_dtype is float64).
        total_xent: scalar, sum of per_example_xent * per_example_weight;
        total_weight: scalar, sum of per_example_weight;
        avg_xent: scalar, total_xent / total_weight (0 if that is 0).
    """
    p = self.params
    inputs = self.CastToFPropDtype(inputs)
    class_ids = tf.convert_to_tensor(class_ids)
    if class_weights is None:
      class_weights = tf.ones(tf.shape(class_ids))
    xent_dtype = base_layer.AccumulationDtype(inputs.dtype)
    class_weights = tf.cast(class_weights, xent_dtype)
    if not inputs.shape[:-1].is_compatible_with(class_ids.shape):
      raise ValueError(
          f"SimpleFullSoftmax '{self.path}': class_ids shape "
          f'{class_ids.shape} must equal inputs shape {inputs.shape} without '
          'its last dim.')
    out = NestedMap()
    chunk_rows = self._ChunkRows(inputs)
    if chunk_rows is None:
      logits = self.Logits(theta, inputs)
      xent, log_probs = _Xent(tf.cast(logits, xent_dtype), class_ids,
                              p.label_smoothing)
      out.logits = logits
      out.log_probs = log_probs
    else:
      x = tf.reshape(inputs, [-1, p.input_dim])           # [rows, input_dim]
      xent = _ChunkedXent(
          x, self.CastToFPropDtype(theta.w), self.CastToFPropDtype(theta.b),
          tf.reshape(class_ids, [-1]), chunk_rows, p.label_smoothing)
      xent = tf.reshape(xent, tf.shape(class_ids))
      xent.set_shape(class_ids.shape)
    out.per_example_xent = xent
    out.per_example_weight = class_weights
    out.total_xent = tf.reduce_sum(xent * class_weights)
    out.total_weight = tf.reduce_sum(class_weights)
    out.avg_xent = tf.math.divide_no_nan(out.total_xent, out.total_weight)
    return out

  @classmethod
  def FPropMeta(cls, p, inputs, class_ids=None, class_weights=None):
    """Shapes and FLOPs.

    FLOPs = N * (2*input_dim*num_classes + num_classes (bias)
    + 6*num_classes (softmax cross-entropy) + 3 (per row)), N = product of
    the leading dims; None if N is unknown. The chunked backward's
    recomputation is not counted (FPropMeta is the forward).
    out_shapes: (NestedMap,) of FProp's outputs: [..., num_classes]
    logits and log_probs (unless chunked), [...] per_example_xent and
    per_example_weight, scalar total_xent, total_weight and avg_xent.
    act: what the backward reads: the inputs, one [N] 4-byte vector (two
    chunked: a row's log-normaliser and its label), and unless chunked
    (softmax_max_alloc) two [N, num_classes] float32 tensors (the logits'
    log-softmax and the targets); with fprop_dtype other than dtype, the
    copy of `w` cast to it that the product's gradient reads. Chunked, a
    few scalars more (20 bytes measured) are left out.
    act_weights: the inputs, the logits (unless chunked) and one [N]
    4-byte vector
    (remat_policy 'weights' recomputes the rest, the cast copy of `w`
    too, from them).
    residuals (what a deferred W reads): the inputs and the
    logits' gradient in fprop_dtype; chunked, the weights' gradients
    (the chunked gradient computes them with the inputs' in one loop, B).
    transient: the logits' gradient, [N, num_classes] float32.
    """
    del class_ids, class_weights  # Shapes follow from inputs.
    cls.CheckParams(p, validation.Owner(p))
    shape = shapes.AsShape(inputs)
    if shape.rank == 0 or (shape[-1] is not None and
                           shape[-1] != p.input_dim):
      raise ValueError(
          f"SimpleFullSoftmax '{p.name}': inputs shape {list(shape)} must end "
          f'in input_dim={p.input_dim}.')
    c = p.num_classes
    per_row = (2 * p.input_dim * c + c + _XENT_FLOPS_PER_LOGIT * c +
               _XENT_FLOPS_PER_ROW)
    lead = shape[:-1]
    rows = lead.num_elements()
    dtype = base_layer.FPropDtype(p)
    size = dtype.size
    # softmax_max_alloc > 0 is costed as chunked, what the LM's loss on a
    # whole batch runs; FProp computes the logits whole where rows x
    # num_classes fit in it (a small batch), which these figures then
    # under-state by two [N, num_classes] float32 tensors.
    chunked = bool(p.softmax_max_alloc)
    act = weights = residuals = shapes.Mul(rows, p.input_dim * size)
    # Per row, 4 bytes (float32 or int32) each.
    act = shapes.Add(act, shapes.Mul(rows, 8 if chunked else 4))
    weights = shapes.Add(weights, shapes.Mul(rows, 4))
    if chunked:
      residuals = (p.input_dim + 1) * c * tf.as_dtype(p.dtype).size
    else:
      xent_size = base_layer.AccumulationDtype(dtype).size
      act = shapes.Add(act, shapes.Mul(rows, 2 * c * xent_size))
      residuals = shapes.Add(residuals, shapes.Mul(rows, c * size))
      weights = shapes.Add(weights, shapes.Mul(rows, c * size))
    if dtype != tf.as_dtype(p.dtype):
      act = shapes.Add(act, p.input_dim * c * size)
    # The backward's largest temporary: the logits' gradient [N, classes]
    # (float32, the cross-entropy's).
    transient = shapes.Mul(rows, c, base_layer.AccumulationDtype(dtype).size)
    ops = None
    if rows is not None:
      f32 = base_layer.AccumulationDtype(dtype).size
      ops = (op_cost.MatMul(1, rows, p.input_dim, c, size),
             op_cost.Elementwise(rows * c, size, reads=2),          # bias
             op_cost.Softmax(rows * c, f32, _XENT_FLOPS_PER_LOGIT))
    outs = NestedMap() if chunked else NestedMap(logits=lead + (c,),
                                                 log_probs=lead + (c,))
    outs.update(per_example_xent=lead, per_example_weight=lead,
                total_xent=shapes.Shape([]), total_weight=shapes.Shape([]),
                avg_xent=shapes.Shape([]))
    return cost.Cost(flops=shapes.Mul(rows, per_row),
                     out_shapes=(outs,), act=act,
                     act_weights=weights, residuals=residuals,
                     transient=transient, ops=ops)
