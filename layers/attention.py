"""Multi-headed dot-product attention (Vaswani et al., 2017, arXiv:1706.03762).

Batch-major throughout: queries are [batch, target_time, dim], keys and values
[batch, source_time, source_dim]. Self-attention when no key/value is given;
cross-attention over a memory otherwise.
"""
import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import cost
from cadence.framework import op_cost
from cadence.framework import shapes
from cadence.framework import validation
from cadence.layers import linear

WeightInit = base_layer.WeightInit
WeightParams = base_layer.WeightParams

# FLOPs counted per softmax logit: max, subtract, exp, sum, divide.
SOFTMAX_FLOPS_PER_LOGIT = 5


def _Dims(x, n):
  """The first n dims of x: static ints where known, else scalar tensors."""
  dynamic = tf.shape(x)
  return [d if d is not None else dynamic[i]
          for i, d in enumerate(x.shape.as_list()[:n])]


def _MaskedLogitValue(dtype):
  """A very negative logit that stays finite in `dtype` (no NaN if all masked).

  Masking uses tf.where rather than adding this value, so it never overflows.
  """
  return tf.constant(-0.7 * dtype.max, dtype)


def AttentionMask(paddings, causal, query_len, key_len):
  """Boolean mask of the keys each query may attend to, or None.

  Args:
    paddings: None or [batch, key_len] floats, 1.0 marks a padded key.
    causal: bool; if True query i attends only to keys j <= i.
    query_len: int or scalar tensor, the query length.
    key_len: int or scalar tensor, the key length.

  Returns:
    None (everything visible) or a bool tensor broadcastable to
    [batch, heads, query_len, key_len]: [batch, 1, 1, key_len],
    [query_len, key_len] or [batch, 1, query_len, key_len].
  """
  mask = None
  if paddings is not None:
    mask = (paddings < 0.5)[:, tf.newaxis, tf.newaxis, :]
  if causal:
    q_pos = tf.range(query_len)[:, tf.newaxis]
    k_pos = tf.range(key_len)[tf.newaxis, :]
    causal_mask = k_pos <= q_pos  # [query_len, key_len]
    mask = causal_mask if mask is None else tf.logical_and(mask, causal_mask)
  return mask


class MultiHeadedAttention(base_layer.BaseLayer):
  """Multi-headed scaled dot-product attention with its own projections.

  Variables (hidden = hidden_dim or input_dim, dh = hidden / num_heads):
    query_w [input_dim, hidden], key_w / value_w [source_dim, hidden],
    post_w [hidden, input_dim]; with use_bias also query_b, key_b, value_b
    [hidden] and post_b [input_dim] (initialised to zero).

  The heads split the hidden dim into num_heads contiguous slices of dh.
  Logits are (q / sqrt(dh)) . k; masked logits are replaced (not offset) by a
  very negative finite value, so a fully masked row gives a uniform
  distribution and no NaN. Attention dropout zeroes probabilities with a
  stateless mask seeded by `OpSeed(theta, 0)` and rescales by 1/keep; the
  returned `atten_probs` are before dropout.

  Example:
    p = MultiHeadedAttention.Params().Set(name='atten', input_dim=8,
                                          num_heads=2)
    atten = p.Instantiate()
    x = tf.ones([2, 5, 8])
    out, probs = atten(x, paddings=tf.zeros([2, 5]), causal=True)
    # out: [2, 5, 8]; probs: [2, 2, 5, 5]
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('input_dim', 0, 'Depth of the query input and of the output.')
    p.Define('source_dim', 0, 'Depth of the key/value inputs; 0 means '
             'input_dim.')
    p.Define('hidden_dim', 0, 'Total depth of the projected queries, keys '
             'and values over all heads; 0 means input_dim.')
    p.Define('num_heads', 1, 'Number of attention heads; must divide '
             'hidden_dim.')
    p.Define('atten_dropout_prob', 0.0, 'Probability of dropping an '
             'attention probability in training.')
    p.Define('use_bias', True, 'Whether the four projections add a bias.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CheckParams(p, validation.Owner(self))
    hidden, source_dim = self._HiddenDim(p), p.source_dim or p.input_dim
    self.CreateVariable('query_w', WeightParams([p.input_dim, hidden]))
    self.CreateVariable('key_w', WeightParams([source_dim, hidden]))
    self.CreateVariable('value_w', WeightParams([source_dim, hidden]))
    self.CreateVariable('post_w', WeightParams([hidden, p.input_dim]))
    if p.use_bias:
      zero = WeightInit.Constant(0.0)
      for name, dim in (('query_b', hidden), ('key_b', hidden),
                        ('value_b', hidden), ('post_b', p.input_dim)):
        self.CreateVariable(name, WeightParams([dim], init=zero))

  @classmethod
  def CheckParams(cls, p, owner):
    super().CheckParams(p, owner)
    validation.CheckInt(owner, 'input_dim', p.input_dim)
    validation.CheckInt(owner, 'num_heads', p.num_heads)
    validation.CheckInt(owner, 'source_dim', p.source_dim, 0)
    validation.CheckInt(owner, 'hidden_dim', p.hidden_dim, 0)
    validation.CheckProb(owner, 'atten_dropout_prob', p.atten_dropout_prob)
    validation.CheckBool(owner, 'use_bias', p.use_bias)
    which = 'hidden_dim' if p.hidden_dim else 'input_dim (the hidden_dim)'
    validation.CheckDivides(owner, 'num_heads', p.num_heads,
                            cls._HiddenDim(p), which)

  @staticmethod
  def _HiddenDim(p):
    return p.hidden_dim or p.input_dim

  def _Project(self, theta, name, x):
    """[b, t, in] -> [b, t, out] with theta.<name>_w (and _b)."""
    return linear.Project(x, theta[f'{name}_w'],
                          theta[f'{name}_b'] if self.params.use_bias else None)

  def _SplitHeads(self, x):
    """[b, t, hidden] -> [b, heads, t, dh]."""
    p = self.params
    dh = self._HiddenDim(p) // p.num_heads
    x = tf.reshape(x, _Dims(x, 2) + [p.num_heads, dh])
    return tf.transpose(x, [0, 2, 1, 3])

  def FProp(self, theta, query_vec, key_vec=None, value_vec=None,
            paddings=None, causal=False):
    """Attends from `query_vec` to the keys/values.

    Args:
      theta: NestedMap of this layer's variables (plus `step_seed` when
        atten_dropout_prob > 0 in training).
      query_vec: [batch, tq, input_dim].
      key_vec: [batch, tk, source_dim]; None means `query_vec`.
      value_vec: [batch, tk, source_dim]; None means `key_vec`.
      paddings: None or [batch, tk], 1.0 marks padded (ignored) keys.
      causal: Python bool; if True query i sees only keys j <= i.

    Returns:
      (encoded [batch, tq, input_dim], atten_probs [batch, heads, tq, tk]),
      both in fprop_dtype.
    """
    p = self.params
    dtype = self.fprop_dtype
    w = self.CastToFPropDtype(theta)
    query_vec = self.CastToFPropDtype(query_vec)
    key_vec = query_vec if key_vec is None else self.CastToFPropDtype(key_vec)
    value_vec = (key_vec if value_vec is None else
                 self.CastToFPropDtype(value_vec))
    dh = self._HiddenDim(p) // p.num_heads

    q = self._SplitHeads(self._Project(w, 'query', query_vec))  # [b,h,tq,dh]
    q *= tf.constant(dh**-0.5, dtype)
    k = self._SplitHeads(self._Project(w, 'key', key_vec))      # [b,h,tk,dh]
    v = self._SplitHeads(self._Project(w, 'value', value_vec))  # [b,h,tk,dh]

    logits = tf.matmul(q, k, transpose_b=True)                  # [b,h,tq,tk]
    mask = AttentionMask(paddings, causal, _Dims(query_vec, 2)[1],
                         _Dims(key_vec, 2)[1])
    if mask is not None:
      logits = tf.where(mask, logits, _MaskedLogitValue(dtype))
    probs = tf.nn.softmax(logits, axis=-1)

    dropped = probs
    if p.atten_dropout_prob > 0.0 and not p.is_inference:
      keep_prob = 1.0 - p.atten_dropout_prob
      rand = tf.random.stateless_uniform(tf.shape(probs),
                                         seed=self.OpSeed(theta, 0))
      keep = tf.cast(rand < keep_prob, dtype)
      dropped = probs * keep * tf.constant(1.0 / keep_prob, dtype)

    ctx = tf.transpose(tf.matmul(dropped, v), [0, 2, 1, 3])    # [b,tq,h,dh]
    ctx = tf.reshape(ctx, _Dims(ctx, 2) + [self._HiddenDim(p)])
    encoded = self._Project(w, 'post', ctx)                     # [b,tq,d]
    return encoded, probs

  @classmethod
  def FPropMeta(cls, p, query_shape, key_shape=None, value_shape=None,
                paddings_shape=None):
    """Output shapes and FLOPs.

    With b = batch, tq/tk = query/key lengths, d = input_dim,
    s = source_dim, n = hidden_dim, h = num_heads, and bias = 1 if use_bias:
      flops = (2*d*n + bias*n + n) * b*tq          # query proj, bias, scale
            + 2 * (2*s*n + bias*n) * b*tk          # key and value proj
            + 2 * (2*n) * b*tq*tk                  # q.k logits and probs.v
            + 5 * b*h*tq*tk                        # softmax
            + (2*n*d + bias*d) * b*tq              # post proj
    Masking and dropout are not counted. None if b, tq or tk is unknown.

    Args:
      p: the layer params.
      query_shape: [batch, tq, input_dim].
      key_shape: [batch, tk, source_dim] or None (self-attention).
      value_shape: ignored besides validation (same as key_shape).
      paddings_shape: ignored ([batch, tk]).

    Returns:
      cost.Cost(flops, out_shapes=(Shape[b, tq, d], Shape[b, h, tq, tk]),
      ops: the projections, the heads' transposes and one attention op
      (op_cost.Attention) of the core's products, mask, softmax and
      dropout, as FProp runs them: a cluster that fuses attention times
      the core as FlashAttention runs it); the bytes are cost.Complete's
      defaults, which under-estimate what its backward keeps (x, q, k, v,
      the context and the probabilities, and with dropout its mask and
      output): measured (tests/layers/layer_contract_test.py, self-
      attention [2, 4, 8], 2 heads, dropout 0.1) act 768 stated, 2,048
      kept; act_weights 768, 1,024; residuals 768, 1,808. Its holder
      states them: TransformerLayer.ActBytes.
    """
    del value_shape, paddings_shape
    cls.CheckParams(p, validation.Owner(p))
    query_shape = shapes.AsShape(query_shape)
    key_shape = query_shape if key_shape is None else shapes.AsShape(key_shape)
    if query_shape.rank != 3 or query_shape[-1] not in (None, p.input_dim):
      raise ValueError(
          f'MultiHeadedAttention.FPropMeta: query shape {query_shape} must be '
          f'[batch, time, input_dim={p.input_dim}].')
    b, tq, d = query_shape
    d = p.input_dim
    tk = key_shape[1]
    s = p.source_dim or p.input_dim
    n = cls._HiddenDim(p)
    h = p.num_heads
    bias = 1 if p.use_bias else 0
    m = shapes.Mul
    flops = shapes.Add(
        m(2 * d * n + bias * n + n, b, tq),
        m(2 * (2 * s * n + bias * n), b, tk),
        m(2 * 2 * n, b, tq, tk),
        m(SOFTMAX_FLOPS_PER_LOGIT, b, h, tq, tk),
        m(2 * n * d + bias * d, b, tq))
    return cost.Cost(
        flops=flops,
        out_shapes=(shapes.Shape([b, tq, d]), shapes.Shape([b, h, tq, tk])),
        ops=cls._Ops(p, b, tq, tk, d, s, n, h))

  @classmethod
  def _Ops(cls, p, b, tq, tk, d, s, n, h):
    """The forward's ops (op_cost), as FProp runs them; None if b, tq or
    tk is unknown."""
    if None in (b, tq, tk):
      return None
    size = base_layer.FPropDtype(p).size
    mm, ew = op_cost.MatMul, op_cost.Elementwise
    dh, logits = n // h, b * h * tq * tk
    ops = [mm(1, b * tq, d, n, size), mm(1, b * tk, s, n, size),
           mm(1, b * tk, s, n, size)]
    if p.use_bias:
      ops += [ew(b * t * n, size, reads=2) for t in (tq, tk, tk)]
    # The heads' transposes of q, k and v, and q's scale.
    ops += [ew(b * t * n, size, 0) for t in (tq, tk, tk)]
    ops.append(ew(b * tq * n, size))
    # The core, scores to context: one attention op of its parts.
    core = [mm(b * h, tq, dh, tk, size, weight=False),
            ew(logits, size, reads=2),                    # the mask
            op_cost.Softmax(logits, size, SOFTMAX_FLOPS_PER_LOGIT)]
    if p.atten_dropout_prob > 0.0 and not p.is_inference:
      core.append(ew(logits, 4, 3, reads=2, streams=2))  # its random bits
    core.append(mm(b * h, tq, tk, dh, size, weight=False))
    ops += [op_cost.Attention(b * h, tq, tk, dh, size, core),
            ew(b * tq * n, size, 0),                      # heads back
            mm(1, b * tq, n, d, size)]
    if p.use_bias:
      ops.append(ew(b * tq * d, size, reads=2))
    return tuple(ops)
