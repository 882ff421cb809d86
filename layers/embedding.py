"""Embeddings: token lookup and positional signals.

`EmbeddingLayer` maps ids to vectors with `tf.gather`. The positional layers
take either a sequence length (positions 0..t-1, output [t, dim], to be
broadcast over the batch) or explicit positions [...] (output [..., dim],
e.g. [batch, time, dim] for packed inputs or decoding at an offset):

  pos.FProp(theta, seq_length=t)          # [t, dim]
  pos.FProp(theta, positions=ids)         # ids [b, t] -> [b, t, dim]

`FPropMeta` mirrors this: pass an int (the seq length) or the positions
shape. A lookup is data movement, so it counts 0 FLOPs.
"""
import math

import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import cost
from cadence.framework import hyperparams
from cadence.framework import op_cost
from cadence.framework import shapes
from cadence.framework import validation

WeightInit = base_layer.WeightInit
WeightParams = base_layer.WeightParams


def _Positions(layer, seq_length, positions):
  """The positions tensor from exactly one of seq_length or positions."""
  if (seq_length is None) == (positions is None):
    raise ValueError(
        f"{type(layer).__name__} '{layer.path}': pass exactly one of "
        'seq_length (an int) or positions (an int tensor [...]).')
  if positions is not None:
    return tf.convert_to_tensor(positions)
  return tf.range(seq_length)


def _PositionalMeta(cls, p, seq_length_or_positions, flops_per_element):
  cls.CheckParams(p, validation.Owner(p))
  x = seq_length_or_positions
  if x is None or (isinstance(x, int) and not isinstance(x, bool)):
    shape = shapes.Shape([x])
  else:
    shape = shapes.AsShape(x)
  out = shape + (p.embedding_dim,)
  n, ops = out.num_elements(), None
  if n is not None:   # A sine or cosine per element, or a table's rows.
    size = base_layer.FPropDtype(p).size
    ops = ([op_cost.Elementwise(n, size, flops_per_element)]
           if flops_per_element else
           [op_cost.Gather(n // p.embedding_dim, p.embedding_dim, size)])
  return cost.Cost(
      flops=shapes.Mul(flops_per_element, n), out_shapes=(out,), ops=ops)


class EmbeddingLayer(base_layer.BaseLayer):
  """Looks up ids in a [vocab_size, embedding_dim] table `emb`.

  The table is initialised with params_init. With scale_sqrt_depth the
  output is multiplied by sqrt(embedding_dim) (Vaswani et al., 2017). With
  `position_tpl` (a positional layer of this file) the position signal of
  each id's place along the last dim of `ids` (time) is added: the input
  of a Transformer, one layer (what runs before a pipelined stack).

  Example:
    p = EmbeddingLayer.Params().Set(name='emb', vocab_size=100,
                                    embedding_dim=8)
    layer = p.Instantiate()
    y = layer(tf.constant([[1, 2, 3]]))   # [1, 3, 8]
    p.position_tpl = PositionalEmbedding.Params()
    z = p.Instantiate()(tf.constant([[1, 2, 3]]))  # y + positions 0..2
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('vocab_size', 0, 'Number of rows of the table, an int > 0.')
    p.Define('embedding_dim', 0, 'Depth of an embedding, an int > 0.')
    p.Define('scale_sqrt_depth', False, 'Whether to multiply the output by '
             'sqrt(embedding_dim).')
    p.Define('position_tpl', None, 'None, or a positional layer\'s params '
             '(PositionalEmbedding, LearnedPositionalEmbedding) whose signal '
             'for positions 0..t-1 of the ids\' last dim is added (its '
             'embedding_dim is set to this one\'s); the child `position`.')
    return p

  @classmethod
  def _PositionParams(cls, p):
    """The child `position`'s params, or None."""
    if p.position_tpl is None:
      return None
    return p.position_tpl.Copy().Set(name='position',
                                     embedding_dim=p.embedding_dim)

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CheckParams(p, validation.Owner(self))
    self.CreateVariable('emb', WeightParams([p.vocab_size, p.embedding_dim]))
    position = self._PositionParams(p)
    if position is not None:
      self.CreateChild('position', position)

  @classmethod
  def CheckParams(cls, p, owner):
    super().CheckParams(p, owner)
    validation.CheckInt(owner, 'vocab_size', p.vocab_size)
    validation.CheckInt(owner, 'embedding_dim', p.embedding_dim)
    validation.CheckBool(owner, 'scale_sqrt_depth', p.scale_sqrt_depth)
    position = p.position_tpl
    if position is not None and not (
        isinstance(position, hyperparams.InstantiableParams) and
        issubclass(position.cls, (PositionalEmbedding,
                                  LearnedPositionalEmbedding))):
      raise validation.Error(owner, 'position_tpl', position,
                             'must be None or the Params() of '
                             'PositionalEmbedding or '
                             'LearnedPositionalEmbedding.')

  def FProp(self, theta, ids):
    """Looks up `ids`.

    Args:
      theta: NestedMap with `emb` [vocab_size, embedding_dim].
      ids: int tensor [...] with values in [0, vocab_size).

    Returns:
      [..., embedding_dim] in fprop_dtype (plus the position signal of the
      last dim of ids, with position_tpl).
    """
    p = self.params
    # Gathered, then cast: the rows only, and their gradient reaches the
    # table in its own dtype.
    out = self.CastToFPropDtype(tf.gather(theta.emb, ids))  # [..., dim]
    if p.scale_sqrt_depth:
      out *= tf.cast(math.sqrt(p.embedding_dim), out.dtype)
    if p.position_tpl is not None:   # [t, dim], broadcast over the rows.
      out += tf.cast(self.children.position.FProp(
          theta.position, seq_length=tf.shape(ids)[-1]), out.dtype)
    return out

  @classmethod
  def FPropMeta(cls, p, ids):
    """Shapes and FLOPs.

    FLOPs = N * embedding_dim if scale_sqrt_depth else 0 (N = number of
    ids), and with position_tpl the positions' and their add's (N *
    embedding_dim). out_shapes: ([..., embedding_dim],). Bytes (int32 ids;
    held to the real gradient by tests/layers/layer_contract_test.py): act
    and act_weights the ids (the table's gradient scatters by them);
    residuals the ids and the output's gradient (the positions and their
    add keep nothing).
    """
    cls.CheckParams(p, validation.Owner(p))
    shape = shapes.AsShape(ids)
    out = shape + (p.embedding_dim,)
    flops = out.num_elements() if p.scale_sqrt_depth else 0
    ops = None
    if flops is not None:
      size = base_layer.FPropDtype(p).size
      ops = (op_cost.Gather(shape.num_elements(), p.embedding_dim, size),)
      if flops:
        ops += (op_cost.Elementwise(out.num_elements(), size),)
    ids = shapes.Mul(4, shape.num_elements())
    record = cost.Cost(flops=flops, out_shapes=(out,), ops=ops, act=ids,
                       act_weights=ids, residuals=shapes.Add(ids, shapes.Mul(
                           base_layer.FPropDtype(p).size, out.num_elements())))
    position = cls._PositionParams(p)
    if position is None:
      return record
    position = base_layer.InheritParams(p, position)
    signal = base_layer.FPropCost(position, shape[-1] if shape.rank else
                                  None)
    added = cost.Cost(flops=out.num_elements(), out_shapes=(out,), act=0,
                      act_weights=0, residuals=0)
    return cost.Chain([record, signal.Replace(out_shapes=(out,)), added])


class PositionalEmbedding(base_layer.BaseLayer):
  """Sinusoidal position signal (Vaswani et al., 2017); no variables.

  For position pos and i in [0, dim/2), with timescales spaced
  geometrically from min_timescale to max_timescale:
    out[..., i]         = sin(pos / timescale_i)
    out[..., dim/2 + i] = cos(pos / timescale_i)

  Example:
    p = PositionalEmbedding.Params().Set(name='pos', embedding_dim=8)
    layer = p.Instantiate()
    y = layer(seq_length=5)                             # [5, 8]
    z = layer(positions=tf.constant([[0, 1], [7, 8]]))  # [2, 2, 8]
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('embedding_dim', 0, 'Depth of the signal, an even int > 0.')
    p.Define('min_timescale', 1.0, 'Shortest wavelength / 2pi, > 0.')
    p.Define('max_timescale', 1.0e4, 'Longest wavelength / 2pi, >= '
             'min_timescale.')
    return p

  def __init__(self, params):
    super().__init__(params)
    self.CheckParams(self.params, validation.Owner(self))

  @classmethod
  def CheckParams(cls, p, owner):
    super().CheckParams(p, owner)
    validation.CheckInt(owner, 'embedding_dim', p.embedding_dim)
    if p.embedding_dim % 2:
      raise validation.Error(owner, 'embedding_dim', p.embedding_dim,
                             'must be even (half sin, half cos).')
    validation.CheckNumber(owner, 'min_timescale', p.min_timescale, 0,
                           low_open=True)
    validation.CheckNumber(owner, 'max_timescale', p.max_timescale)
    if not p.min_timescale <= p.max_timescale:
      raise ValueError(
          f'{owner}: min_timescale={p.min_timescale!r}, max_timescale='
          f'{p.max_timescale!r} must satisfy 0 < min_timescale <= '
          'max_timescale.')

  def FProp(self, theta, seq_length=None, positions=None):
    """The position signal.

    Args:
      theta: unused (no variables).
      seq_length: int or scalar int tensor t: positions 0..t-1.
      positions: int or float tensor [...] of positions.

    Returns:
      [t, embedding_dim] for seq_length, [..., embedding_dim] for positions;
      in fprop_dtype.
    """
    del theta
    p = self.params
    pos = _Positions(self, seq_length, positions)
    half = p.embedding_dim // 2
    log_inc = math.log(p.max_timescale / p.min_timescale) / max(half - 1, 1)
    inv_timescales = (1.0 / p.min_timescale) * tf.exp(
        -log_inc * tf.range(half, dtype=tf.float32))          # [dim/2]
    scaled = tf.cast(pos, tf.float32)[..., None] * inv_timescales
    out = tf.concat([tf.sin(scaled), tf.cos(scaled)], axis=-1)  # [..., dim]
    return tf.cast(out, self.fprop_dtype)

  @classmethod
  def FPropMeta(cls, p, seq_length_or_positions):
    """Shapes and FLOPs.

    Args:
      p: params.
      seq_length_or_positions: an int (or None) seq length t, or the
        positions' shape [...].

    FLOPs = 2 per output element (a multiply and a sin or cos).
    out_shapes: ([t, embedding_dim],) or ([..., embedding_dim],). No
    bytes kept: no variable, and no gradient reaches the positions.
    """
    return _PositionalMeta(cls, p, seq_length_or_positions, 2).Replace(
        act=0, act_weights=0, residuals=0)


class LearnedPositionalEmbedding(base_layer.BaseLayer):
  """A learned table `emb` [max_seq_len, embedding_dim] indexed by position.

  Example:
    p = LearnedPositionalEmbedding.Params().Set(name='pos', max_seq_len=16,
                                                embedding_dim=8)
    layer = p.Instantiate()
    y = layer(seq_length=5)   # [5, 8]
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('max_seq_len', 0, 'Number of positions in the table, an int > '
             '0; positions must lie in [0, max_seq_len).')
    p.Define('embedding_dim', 0, 'Depth of an embedding, an int > 0.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CheckParams(p, validation.Owner(self))
    self.CreateVariable('emb', WeightParams([p.max_seq_len, p.embedding_dim]))

  @classmethod
  def CheckParams(cls, p, owner):
    super().CheckParams(p, owner)
    validation.CheckInt(owner, 'max_seq_len', p.max_seq_len)
    validation.CheckInt(owner, 'embedding_dim', p.embedding_dim)

  def FProp(self, theta, seq_length=None, positions=None):
    """Looks up the positions.

    Args:
      theta: NestedMap with `emb` [max_seq_len, embedding_dim].
      seq_length: int or scalar int tensor t <= max_seq_len.
      positions: int tensor [...] with values in [0, max_seq_len).

    Returns:
      [t, embedding_dim] or [..., embedding_dim], in fprop_dtype.
    """
    p = self.params
    if (isinstance(seq_length, int) and not isinstance(seq_length, bool) and
        not 0 < seq_length <= p.max_seq_len):
      raise ValueError(
          f"LearnedPositionalEmbedding '{self.path}': seq_length="
          f'{seq_length} must be in [1, max_seq_len={p.max_seq_len}].')
    pos = _Positions(self, seq_length, positions)
    return self.CastToFPropDtype(tf.gather(theta.emb, pos))

  @classmethod
  def FPropMeta(cls, p, seq_length_or_positions):
    """Shapes and FLOPs: as PositionalEmbedding's, with 0 FLOPs (a lookup)."""
    # The bytes are cost.Complete's defaults (the positions and the
    # output), over the real figures: measured (tests/layers/
    # layer_contract_test.py, seq_length 4, dim 8) act 144 stated, 16 kept
    # (the positions); act_weights 144, 0; residuals 144, 128 (the output
    # gradient).
    return _PositionalMeta(cls, p, seq_length_or_positions, 0)
