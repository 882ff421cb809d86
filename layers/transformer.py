"""Pre-LayerNorm Transformer layers (Vaswani et al., 2017, arXiv:1706.03762;
pre-LN placement as in Xiong et al., 2020, arXiv:2002.04745).

  x = x + Dropout(SelfAttention(LayerNorm(x)))
  x = x + Dropout(FFN(LayerNorm(x)))      FFN: d -> hidden (act, dropout) -> d

Batch-major: inputs [batch, time, dim], paddings [batch, time] (1.0 = pad).
Padded positions are computed like any other (their outputs are garbage the
caller masks); they are never attended to.
"""
import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import cost
from cadence.framework import device_call
from cadence.framework import hyperparams
from cadence.framework import op_cost
from cadence.framework import shapes
from cadence.framework import validation
from cadence.layers import activations
from cadence.layers import attention
from cadence.layers import dropout
from cadence.layers import linear
from cadence.layers import normalization

NestedMap = base_layer.NestedMap
# The cost.Cost field of each remat policy's bytes (ActBytes' `policy`;
# 'residuals', what a deferred W reads, is not a remat policy).
_POLICY_FIELDS = {'all': 'act', 'weights': 'act_weights',
                  'residuals': 'residuals'}


class TransformerLayer(base_layer.BaseLayer):
  """One pre-LN Transformer layer: self-attention, then a feed-forward net.

  Children: `ln_atten`, `atten` (MultiHeadedAttention), `atten_dropout`,
  `ln_ffn`, `ffn` (FeedForwardNet [hidden_dim, input_dim] with activation
  then none, relu dropout in between), `ffn_dropout`.

  Example:
    p = TransformerLayer.Params().Set(name='xformer', input_dim=8,
                                      hidden_dim=32, num_heads=2,
                                      mask_self_atten=True)
    layer = p.Instantiate()
    y = layer(tf.ones([2, 5, 8]), tf.zeros([2, 5]))   # [2, 5, 8]
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('input_dim', 0, 'Model depth d of inputs and outputs.')
    p.Define('hidden_dim', 0, 'Hidden depth of the feed-forward net.')
    p.Define('num_heads', 1, 'Attention heads; must divide input_dim.')
    p.Define('atten_dropout_prob', 0.0, 'Dropout on attention probabilities.')
    p.Define('residual_dropout_prob', 0.0, 'Dropout on each sub-block output '
             'before it is added to the residual.')
    p.Define('relu_dropout_prob', 0.0, 'Dropout on the feed-forward hidden '
             'activations.')
    p.Define('activation', 'RELU', 'Feed-forward hidden activation name '
             '(layers/activations.py).')
    p.Define('mask_self_atten', False, 'If True, causal self-attention: '
             'position i attends only to positions <= i.')
    p.Define('ln_tpl', normalization.LayerNorm.Params(), 'Normalisation '
             'params (LayerNorm or RMSNorm); input_dim is set by the layer.')
    return p

  @classmethod
  def _SubParams(cls, p):
    """The children's params (names set), shared by __init__ and FPropMeta."""
    d = p.input_dim
    ln = p.ln_tpl.Copy().Set(input_dim=d)
    residual = dropout.DropoutLayer.Params().Set(
        keep_prob=1.0 - p.residual_dropout_prob)
    return NestedMap(
        ln_atten=ln.Copy().Set(name='ln_atten'),
        atten=attention.MultiHeadedAttention.Params().Set(
            name='atten', input_dim=d, num_heads=p.num_heads,
            atten_dropout_prob=p.atten_dropout_prob),
        atten_dropout=residual.Copy().Set(name='atten_dropout'),
        ln_ffn=ln.Copy().Set(name='ln_ffn'),
        ffn=linear.FeedForwardNet.Params().Set(
            name='ffn', input_dim=d, hidden_layer_dims=[p.hidden_dim, d],
            activation=[p.activation, 'NONE'],
            dropout_prob=p.relu_dropout_prob),
        ffn_dropout=residual.Copy().Set(name='ffn_dropout'))

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CheckParams(p, validation.Owner(self))
    for name, sub in self._SubParams(p).items():
      self.CreateChild(name, sub)

  @classmethod
  def CheckParams(cls, p, owner):
    super().CheckParams(p, owner)
    validation.CheckInt(owner, 'input_dim', p.input_dim)
    validation.CheckInt(owner, 'hidden_dim', p.hidden_dim)
    validation.CheckInt(owner, 'num_heads', p.num_heads)
    validation.CheckDivides(owner, 'num_heads', p.num_heads, p.input_dim,
                            'input_dim')
    for field in ('atten_dropout_prob', 'residual_dropout_prob',
                  'relu_dropout_prob'):
      validation.CheckProb(owner, field, p.Get(field))
    activations.CheckName(owner, 'activation', p.activation)
    validation.CheckBool(owner, 'mask_self_atten', p.mask_self_atten)

  def FProp(self, theta, inputs, paddings=None):
    """Applies the layer.

    Args:
      theta: NestedMap of the children's thetas (plus `step_seed` when any
        dropout is active in training).
      inputs: [batch, time, input_dim].
      paddings: None or [batch, time], 1.0 marks padded positions.

    Returns:
      [batch, time, input_dim] in fprop_dtype.
    """
    c = self.children
    x = self.CastToFPropDtype(inputs)
    h = c.ln_atten.FProp(theta.ln_atten, x)
    h, _ = c.atten.FProp(theta.atten, h, paddings=paddings,
                         causal=self.params.mask_self_atten)
    x += c.atten_dropout.FProp(theta.atten_dropout, h)
    h = c.ln_ffn.FProp(theta.ln_ffn, x)
    h = c.ffn.FProp(theta.ffn, h)
    x += c.ffn_dropout.FProp(theta.ffn_dropout, h)
    return x

  @classmethod
  def FPropMeta(cls, p, inputs, paddings=None):
    """Shapes and FLOPs.

    flops = sum of the children's FPropMeta flops (two norms, attention, the
    feed-forward net, two residual dropouts) + 2 * b*t*d for the two
    residual additions. None if b or t is unknown. out_shapes: (inputs,).
    ops: the children's, then the two additions.
    act, act_weights, residuals: ActBytes by policy 'all', 'weights',
    'residuals'.
    """
    del paddings
    cls.CheckParams(p, validation.Owner(p))
    shape = shapes.AsShape(inputs)
    if shape.rank != 3 or shape[-1] not in (None, p.input_dim):
      raise ValueError(
          f"{cls.__name__} '{p.name}': inputs shape {list(shape)} must be "
          f'[batch, time, input_dim={p.input_dim}].')
    flops = shapes.Mul(2, shape.num_elements())
    ops = []
    for sub in cls._SubParams(p).values():
      sub = base_layer.InheritParams(p, sub)
      record = base_layer.FPropCost(sub, shape)
      flops = shapes.Add(flops, record.flops)
      ops = None if ops is None or record.ops is None else ops + list(
          record.ops)
    if ops is not None:   # The two residual additions.
      ops += [op_cost.Elementwise(shape.num_elements(),
                                  base_layer.FPropDtype(p).size,
                                  reads=2, streams=1)] * 2
    act = cls.ActBytes(p, shape)
    # The gradients in flight through the layer: its backward frees what
    # it kept as the gradient passes; a device's peak measured about 0.55
    # of a layer's act above what it keeps (bench/planner_bench.py's
    # memory table), so half of it.
    return cost.Cost(flops=flops, out_shapes=(shape,), act=act,
                     act_weights=cls.ActBytes(p, shape, 'weights'),
                     residuals=cls.ActBytes(p, shape, 'residuals'),
                     transient=None if act is None else act // 2, ops=ops)

  @classmethod
  def ActBytes(cls, p, inputs, policy='all'):
    """Bytes of the tensors the backward of one layer needs kept, inputs
    [b, t, d] (None if b or t is unknown), by remat_policy `policy`.

    'all' (what it reads): 2 b*t*d in the norms' compute dtype (float32
    for bfloat16 too: the two norms' normalised inputs), and in
    fprop_dtype 6 b*t*d (q, k, v, the attention context, the two norms'
    outputs) + b*h*t*t (the attention probabilities) + b*t*f (the
    feed-forward activation); in training a residual dropout adds 2 b*t*d
    (the two masks), an attention dropout 2 b*h*t*t, a feed-forward
    dropout 2 b*t*f; with fprop_dtype other than dtype, the weights of the
    six products cast to it (4 d*d + 2 d*f), which their gradients read.
    'weights' (the products with a weight): 5 b*t*d (q, k, v, the two
    output projections) + b*t*f (the first feed-forward product).
    'residuals' (what a deferred W reads, not a remat policy): in
    fprop_dtype the inputs of the six products, 3 b*t*d + b*t*f (2 b*t*f
    with a feed-forward dropout: the activation before and after it), and
    the gradients of their outputs, 5 b*t*d + b*t*f; in the norms'
    compute dtype their normalised inputs and output gradients, 4 b*t*d
    (for the scales' gradients).
    Held to memory_estimate.SavedBytes (ResidualBytes for 'residuals') of
    the real gradient by the tests.
    """
    b, t, d = shapes.AsShape(inputs)
    if b is None or t is None:
      return None
    dtype = base_layer.FPropDtype(p)
    drop = not p.is_inference and p.residual_dropout_prob
    train = not p.is_inference
    btd, bhtt, btf = b * t * d, b * p.num_heads * t * t, b * t * p.hidden_dim
    norm_size = base_layer.AccumulationDtype(dtype).size
    if policy == 'weights':
      return (btd * 5 + btf) * dtype.size
    if policy == 'residuals':
      ffn = btf * (3 if train and p.relu_dropout_prob else 2)
      return (btd * 8 + ffn) * dtype.size + 4 * btd * norm_size
    n = (btd * (6 + (2 if drop else 0)) +
         bhtt * (1 + (2 if train and p.atten_dropout_prob else 0)) +
         btf * (1 + (2 if train and p.relu_dropout_prob else 0)))
    if dtype != tf.as_dtype(p.dtype):
      n += 4 * d * d + 2 * d * p.hidden_dim
    return n * dtype.size + 2 * btd * norm_size


class GPipeTransformerLayer(TransformerLayer):
  """A TransformerLayer as a pipeline cell: (inputs, paddings) in and out.

  The pipeline threads one tuple of tensors from cell to cell, so this
  variant returns its paddings unchanged next to its outputs.

  Example:
    p = GPipeTransformerLayer.Params().Set(name='cell', input_dim=8,
                                           hidden_dim=32, num_heads=2)
    out, pads = p.Instantiate()(tf.ones([2, 5, 8]), tf.zeros([2, 5]))
  """

  def FProp(self, theta, inputs, paddings):
    """Returns (outputs [batch, time, input_dim], paddings [batch, time])."""
    return super().FProp(theta, inputs, paddings), paddings

  @classmethod
  def FPropMeta(cls, p, inputs, paddings):
    """TransformerLayer's record; out_shapes (inputs, paddings)."""
    meta = super().FPropMeta(p, inputs)
    return meta.Replace(out_shapes=(shapes.AsShape(inputs),
                                    shapes.AsShape(paddings)))


class TransformerStack(base_layer.BaseLayer):
  """num_layers Transformer layers, then an optional final norm.

  A pre-LN stack needs the final norm: the residual stream is never
  normalised otherwise.

  Children: `x_layers` (list), `final_ln` (if final_layer_norm). The
  pipelined stack (gpipe_transformer.GPipeTransformerStack) keeps the same
  children, so both read the same weights.

  Example:
    tpl = TransformerLayer.Params().Set(input_dim=8, hidden_dim=32,
                                        num_heads=2)
    p = TransformerStack.Params().Set(name='enc', num_layers=2,
                                      transformer_tpl=tpl)
    y = p.Instantiate()(tf.ones([2, 5, 8]), tf.zeros([2, 5]))  # [2, 5, 8]
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('num_layers', 1, 'Number of Transformer layers, an int >= 1.')
    p.Define('transformer_tpl', TransformerLayer.Params(), 'Params of each '
             'layer (a TransformerLayer or GPipeTransformerLayer).')
    p.Define('final_layer_norm', True, 'Whether to normalise the output '
             "with a copy of transformer_tpl.ln_tpl.")
    return p

  def __init__(self, params):
    super().__init__(params)
    self.CheckStackParams(self.params, validation.Owner(self))
    self._CreateLayers()

  @classmethod
  def CheckStackParams(cls, p, owner):
    """Raises ValueError for bad stack params (used by FPropMeta too)."""
    # The stack's own first: its layers inherit them (InheritParams).
    base_layer.CheckBaseParams(owner, p)
    validation.CheckInt(owner, 'num_layers', p.num_layers)
    tpl = p.transformer_tpl
    if not (isinstance(tpl, hyperparams.InstantiableParams) and
            issubclass(tpl.cls, TransformerLayer)):
      raise validation.Error(owner, 'transformer_tpl', getattr(tpl, 'cls', tpl),
                             'must be a TransformerLayer.Params() (or a '
                             'subclass).')
    validation.CheckBool(owner, 'final_layer_norm', p.final_layer_norm)

  def _CreateLayers(self, layer_devices=None, final_ln_device=None):
    """Builds `x_layers` (and `final_ln`), on the given devices if any."""
    p = self.params
    self.CreateChildren('x_layers', [p.transformer_tpl] * p.num_layers,
                        devices=layer_devices)
    if p.final_layer_norm:
      self.CreateChild('final_ln', self.FinalLnParams(p),
                       device=final_ln_device)

  @property
  def input_device(self):
    """Where a task puts what feeds the stack; None: the device in scope."""
    return None

  @property
  def output_device(self):
    """Where a task puts what reads the stack; None: the device in scope."""
    return None

  def FPropLoss(self, theta, inputs, paddings, loss, side_inputs):
    """The stack, then `loss` on its outputs, on `output_device` (the
    loss's backward there too); what a pipelined stack's FPropLoss does
    per micro-batch, here once on the whole batch.

    Args:
      theta: the stack's theta.
      inputs: [batch, time, dim]; paddings: [batch, time].
      loss: an object with fprop(theta, outputs [batch, time, dim], side)
        -> a NestedMap holding a scalar `loss`, and its theta
        (gpipe.PipelineCell).
      side_inputs: NestedMap of [batch, ...] tensors (e.g. labels).

    Returns:
      The loss's NestedMap.
    """
    outputs = self.FProp(theta, inputs, paddings)
    return device_call.OnDevice(self.output_device, loss.fprop, loss.theta,
                                outputs, side_inputs)

  @staticmethod
  def FinalLnParams(p):
    """Params of the final norm of stack params `p`."""
    tpl = p.transformer_tpl
    return tpl.ln_tpl.Copy().Set(name='final_ln', input_dim=tpl.input_dim)

  def RunLayers(self, start, stop, layer_thetas, x, paddings,
                final_ln_theta=None):
    """Layers [start, stop), then the final norm if `final_ln_theta` is set.

    Args:
      start, stop: the range of `x_layers` to run.
      layer_thetas: their thetas, stop - start of them.
      x: [batch, time, dim].
      paddings: None or [batch, time].
      final_ln_theta: theta of `final_ln`, or None to skip it.

    Returns:
      [batch, time, dim].
    """
    for layer, layer_theta in zip(self.x_layers[start:stop], layer_thetas):
      x = layer.FProp(layer_theta, x, paddings)
      if isinstance(x, tuple):  # A GPipeTransformerLayer.
        x = x[0]
    if final_ln_theta is not None:
      x = self.final_ln.FProp(final_ln_theta, x)
    return x

  def FProp(self, theta, inputs, paddings=None):
    """Applies the stack.

    Args:
      theta: NestedMap with `x_layers` (list) and `final_ln`.
      inputs: [batch, time, input_dim].
      paddings: None or [batch, time], 1.0 marks padded positions.

    Returns:
      [batch, time, input_dim] in fprop_dtype.
    """
    p = self.params
    return self.RunLayers(0, p.num_layers, theta.x_layers, inputs, paddings,
                          theta.final_ln if p.final_layer_norm else None)

  @classmethod
  def LayersFlops(cls, p, inputs, num_layers, final_ln):
    """Forward FLOPs of `num_layers` layers (+ the final norm if `final_ln`)
    of stack params `p` on inputs of shape [batch, time, dim]; the one FLOP
    formula of the stack, its cells and the tasks that cost them."""
    shape = shapes.AsShape(inputs)
    tpl = base_layer.InheritParams(p, p.transformer_tpl)
    flops = shapes.Mul(num_layers,
                       TransformerLayer.FPropMeta(tpl, shape).flops)
    if final_ln:
      ln = base_layer.InheritParams(p, cls.FinalLnParams(p))
      flops = shapes.Add(flops, ln.cls.FPropMeta(ln, shape).flops)
    return flops

  @classmethod
  def LayersActBytes(cls, p, inputs, num_layers, final_ln, policy='all'):
    """Bytes the backward of `num_layers` layers (+ the final norm if
    `final_ln`) of stack params `p` needs kept on inputs [batch, time, dim],
    by remat_policy `policy` ('all' or 'weights'), or what their deferred
    W reads ('residuals'): the cost.Cost fields act, act_weights,
    residuals."""
    shape = shapes.AsShape(inputs)
    tpl = base_layer.InheritParams(p, p.transformer_tpl)
    act = shapes.Mul(num_layers, tpl.cls.ActBytes(tpl, shape, policy))
    if final_ln:
      ln = base_layer.InheritParams(p, cls.FinalLnParams(p))
      meta = base_layer.FPropCost(ln, shape)
      act = shapes.Add(act, meta[_POLICY_FIELDS[policy]])
    return act

  @classmethod
  def FPropMeta(cls, p, inputs, paddings=None):
    """num_layers * TransformerLayer flops + the final norm's; out (inputs,);
    act, act_weights and residuals likewise (LayersActBytes); ops theirs,
    in order."""
    del paddings
    cls.CheckStackParams(p, validation.Owner(p))
    shape = shapes.AsShape(inputs)

    def _Bytes(policy):
      return cls.LayersActBytes(p, shape, p.num_layers, p.final_layer_norm,
                                policy)

    # The ops: each layer's, then the final norm's.
    tpl = base_layer.InheritParams(p, p.transformer_tpl)
    parts = [TransformerLayer.FPropMeta(tpl, shape).ops] * p.num_layers
    if p.final_layer_norm:
      parts.append(base_layer.FPropCost(
          base_layer.InheritParams(p, cls.FinalLnParams(p)), shape).ops)
    ops = None if any(o is None for o in parts) else [
        op for o in parts for op in o]
    return cost.Cost(flops=cls.LayersFlops(p, shape, p.num_layers,
                                           p.final_layer_norm),
                     out_shapes=(shape,), act=_Bytes('all'),
                     act_weights=_Bytes('weights'),
                     residuals=_Bytes('residuals'), ops=ops)
