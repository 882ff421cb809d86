"""Residual network pieces: the stem and the basic residual block.

He et al., 2016, "Deep Residual Learning for Image Recognition",
arXiv:1512.03385 (the "basic" block of ResNet-18/34, with a projection
shortcut, option B, where the shape changes).

Both layers hold BatchNormLayers, so they follow layers/batch_norm.py's
protocol (batch_norm.BatchStatsLayer): `FPropStats(theta, x) -> (y, stats)` is pure and returns the
batch statistics of their BatchNormLayers as a NestedMap keyed by child
name (None in inference); `UpdateMovingStats(stats)` applies them, each
leaf [micro_batches, 2, dim]. `FProp` returns y alone.
"""
import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import cost
from cadence.framework import op_cost
from cadence.framework.nested_map import NestedMap
from cadence.framework import shapes
from cadence.framework import validation
from cadence.layers import batch_norm
from cadence.layers import conv


def _Conv(name, kernel, dim_in, dim_out, stride):
  """A bias-free SAME conv (a BatchNormLayer follows it)."""
  return conv.Conv2DLayer.Params().Set(
      name=name, filter_shape=[kernel, kernel, dim_in, dim_out],
      filter_stride=[stride, stride], padding='SAME', has_bias=False)


def _Bn(p, name, dim):
  return p.bn_tpl.Copy().Set(name=name, dim=dim)


def _ChainMeta(steps, shape, ops=None):
  """Chains the FPropMeta of layer params `steps`; returns (flops,
  act (a layer that leaves it None: its float32 input), out shape). Their
  ops are appended to the list `ops` (set to None where one has none)."""
  flops, act = 0, 0
  for sub in steps:
    meta = sub.cls.FPropMeta(sub, shape)
    flops = shapes.Add(flops, meta.flops)
    act = shapes.Add(act, meta.act if meta.act is not None else
                     shapes.Mul(4, shapes.AsShape(shape).num_elements()))
    _AddOps(ops, meta.ops)
    shape = meta.out_shapes[0]
  return flops, act, shape


def _AddOps(ops, more):
  """Appends `more` (a list of ops, or None: unknown) to `ops` in place;
  an unknown part makes the whole unknown (`ops` cleared, its first item
  None)."""
  if ops is None or (ops and ops[0] is None):
    return
  if more is None:
    ops[:] = [None]
  else:
    ops.extend(more)


def _OpsOrNone(ops):
  return None if ops and ops[0] is None else ops


def _ReluMeta(shape):
  return shapes.AsShape(shape).num_elements()


def _ReluOps(shape, count=1):
  """`count` element-wise passes (a relu, an add) over a float32 tensor of
  `shape`; None if a dim is unknown."""
  n = shapes.AsShape(shape).num_elements()
  return None if n is None else [op_cost.Elementwise(n, 4)] * count


def _BnChannelBytes(*dims):
  """The per-channel vectors a deferred W of BatchNormLayers of these dims
  reads besides their normalised inputs (two each, float32)."""
  return 4 * 2 * sum(dims)


class ResNetStem(batch_norm.BatchStatsLayer):
  """conv (kernel x kernel, stride) - BN - relu, then an optional 3x3/2 max
  pool: ResNet's first layers ([b, h, w, input_dim] -> [b, h', w', dim]).

  Children: `conv`, `bn`.

  Example:
    p = ResNetStem.Params().Set(name='stem', input_dim=3, dim=64, kernel=7,
                                stride=2, max_pool=True)
    stem = p.Instantiate()
    y = stem(tf.ones([2, 224, 224, 3]))     # [2, 56, 56, 64]
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('input_dim', 3, 'Channels of the images, an int > 0.')
    p.Define('dim', 64, 'Output channels, an int > 0.')
    p.Define('kernel', 7, 'Size of the square conv filter.')
    p.Define('stride', 2, 'Stride of the conv.')
    p.Define('max_pool', True, 'Whether a 3x3 max pool of stride 2 (SAME) '
             'follows.')
    p.Define('bn_tpl', batch_norm.BatchNormLayer.Params(), 'The '
             'BatchNormLayer settings (decay, epsilon); dim is set here.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CheckParams(p, validation.Owner(self))
    self.CreateChild('conv', _Conv('conv', p.kernel, p.input_dim, p.dim,
                                   p.stride))
    self.CreateChild('bn', _Bn(p, 'bn', p.dim))

  @classmethod
  def CheckParams(cls, p, owner):
    super().CheckParams(p, owner)
    for field in ('input_dim', 'dim', 'kernel', 'stride'):
      validation.CheckInt(owner, field, p.Get(field))
    validation.CheckBool(owner, 'max_pool', p.max_pool)

  @classmethod
  def _PoolParams(cls):
    return conv.PoolingLayer.Params().Set(
        name='pool', window_shape=[3, 3], window_stride=[2, 2],
        pooling_type='MAX', padding='SAME')

  @classmethod
  def StatsShapes(cls, p):
    return NestedMap(bn=shapes.Shape([2, p.dim]))

  def FPropStats(self, theta, inputs):
    """inputs [b, h, w, input_dim] -> (outputs [b, h', w', dim], stats)."""
    x = self.conv.FProp(theta.conv, inputs)
    x, bn_stats = self.bn.FPropStats(theta.bn, x)
    x = tf.nn.relu(x)
    if self.params.max_pool:
      x = tf.nn.max_pool2d(x, 3, 2, 'SAME')
    return x, None if bn_stats is None else NestedMap(bn=bn_stats)

  @classmethod
  def FPropMeta(cls, p, inputs):
    """The conv's, BN's, relu's (1 a element) and pool's FLOPs. Bytes,
    float32, held to memory_estimate's SavedBytes and ResidualBytes of the
    real gradient by the tests (x the input, c the conv's output):
    act each part's inputs (or its own act), the relu's output and the
    pool's (its gradient reads both); act_weights x + c; residuals
    x + 2 c and its BN's two per-channel vectors; act_outputs its output
    (the relu's or the pool's); act_inputs x (the conv's filter gradient
    reads it)."""
    cls.CheckParams(p, validation.Owner(p))
    steps = [base_layer.InheritParams(p, s) for s in (
        _Conv('conv', p.kernel, p.input_dim, p.dim, p.stride),
        _Bn(p, 'bn', p.dim))]
    ops = []
    flops, act, out = _ChainMeta(steps, inputs, ops)
    flops = shapes.Add(flops, _ReluMeta(out))
    _AddOps(ops, _ReluOps(out))
    x, c = (shapes.Mul(4, shapes.AsShape(s).num_elements())
            for s in (inputs, out))
    act = shapes.Add(act, c)
    # Its backward's temporaries: about three tensors of its conv's output
    # size at a time (as ResidualBlock's).
    transient = shapes.Mul(3, c)
    if p.max_pool:
      meta = conv.PoolingLayer.FPropMeta(cls._PoolParams(), out)
      flops, out = shapes.Add(flops, meta.flops), meta.out_shapes[0]
      act = shapes.Add(act, shapes.Mul(4, out.num_elements()))
      _AddOps(ops, meta.ops)
    return cost.Cost(flops=flops, out_shapes=(out,), act=act,
                     act_weights=shapes.Add(x, c),
                     residuals=shapes.Add(x, shapes.Mul(2, c),
                                          _BnChannelBytes(p.dim)),
                     act_outputs=shapes.Mul(4, out.num_elements()),
                     act_inputs=x, transient=transient, ops=_OpsOrNone(ops))


class ResidualBlock(batch_norm.BatchStatsLayer):
  """relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)), 3x3 convs.

  conv1 has stride `stride`; the shortcut is x itself, or a 1x1 conv of
  that stride plus BN (`proj`, `proj_bn`) when the stride is not 1 or the
  depth changes. Children: conv1, bn1, conv2, bn2 [, proj, proj_bn].

  Example:
    p = ResidualBlock.Params().Set(name='block', input_dim=16,
                                   output_dim=32, stride=2)
    block = p.Instantiate()
    y, stats = block.FPropStats(block.theta, tf.ones([2, 8, 8, 16]))
    # y [2, 4, 4, 32]; stats.bn1 [2, 32] ...
    block.UpdateMovingStats(stats.Transform(lambda s: s[tf.newaxis]))
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('input_dim', 0, 'Input channels, an int > 0.')
    p.Define('output_dim', 0, 'Output channels, an int > 0.')
    p.Define('stride', 1, 'Stride of the first conv and the shortcut.')
    p.Define('bn_tpl', batch_norm.BatchNormLayer.Params(), 'The '
             'BatchNormLayer settings (decay, epsilon); dim is set here.')
    return p

  @classmethod
  def HasProjection(cls, p):
    return p.stride != 1 or p.input_dim != p.output_dim

  @classmethod
  def StatsShapes(cls, p):
    names = ['bn1', 'bn2'] + (['proj_bn'] if cls.HasProjection(p) else [])
    return NestedMap({n: shapes.Shape([2, p.output_dim]) for n in names})

  @classmethod
  def _SubParams(cls, p):
    """(name, params) of the children, in order."""
    subs = [('conv1', _Conv('conv1', 3, p.input_dim, p.output_dim, p.stride)),
            ('bn1', _Bn(p, 'bn1', p.output_dim)),
            ('conv2', _Conv('conv2', 3, p.output_dim, p.output_dim, 1)),
            ('bn2', _Bn(p, 'bn2', p.output_dim))]
    if cls.HasProjection(p):
      subs += [('proj', _Conv('proj', 1, p.input_dim, p.output_dim,
                              p.stride)),
               ('proj_bn', _Bn(p, 'proj_bn', p.output_dim))]
    return subs

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CheckParams(p, validation.Owner(self))
    for name, sub in self._SubParams(p):
      self.CreateChild(name, sub)

  @classmethod
  def CheckParams(cls, p, owner):
    super().CheckParams(p, owner)
    for field in ('input_dim', 'output_dim', 'stride'):
      validation.CheckInt(owner, field, p.Get(field))

  def FPropStats(self, theta, inputs):
    """Runs the block.

    Args:
      theta: NestedMap of the children's thetas.
      inputs: [batch, h, w, input_dim].

    Returns:
      (outputs [batch, ceil(h/stride), ceil(w/stride), output_dim],
      stats: NestedMap(bn1, bn2[, proj_bn]) of [2, output_dim] each, or
      None with is_inference).
    """
    stats = NestedMap()
    x = self.conv1.FProp(theta.conv1, inputs)
    x, stats.bn1 = self.bn1.FPropStats(theta.bn1, x)
    x = tf.nn.relu(x)
    x = self.conv2.FProp(theta.conv2, x)
    x, stats.bn2 = self.bn2.FPropStats(theta.bn2, x)
    shortcut = self.CastToFPropDtype(inputs)
    if self.HasProjection(self.params):
      shortcut = self.proj.FProp(theta.proj, inputs)
      shortcut, stats.proj_bn = self.proj_bn.FPropStats(theta.proj_bn,
                                                        shortcut)
    out = tf.nn.relu(x + shortcut)
    return out, None if self.params.is_inference else stats

  @classmethod
  def FPropMeta(cls, p, inputs):
    """Shapes and FLOPs: the children's, one relu after bn1, the add and
    the final relu (1 FLOP an element each). Bytes, float32 (x the
    input, y the output; a projection shortcut, when there is one, adds
    one y to act_weights and residuals), held to memory_estimate's
    SavedBytes and ResidualBytes of the real gradient by the tests:
    act what each conv and BN keep (their inputs; BN also its centred
    input) and the relus' outputs, each tensor once: relu1's output is
    conv2's input, and x is conv1's and the projection's; act_weights
    x + 2 y; residuals x + 5 y and two per-channel vectors of each BN;
    act_outputs y (the final relu's gradient
    reads it); act_inputs x (conv1's filter gradient reads it: the
    previous block's act_outputs, one buffer). transient: what its backward holds beyond act at its peak,
    about one tensor of its output's size: the gradients free what they
    read as they go (the allocator's peak of one block's forward and
    backward on CPU, less act: 0.2-1.4 y; 3.5 y for a projection at
    stride 1)."""
    owner = validation.Owner(p)
    cls.CheckParams(p, owner)
    shape = shapes.AsShape(inputs)
    if shape.rank != 4 or shape[-1] not in (None, p.input_dim):
      raise ValueError(f'{owner}: inputs shape {list(shape)} must be '
                       f'[batch, height, width, {p.input_dim}].')
    subs = {name: base_layer.InheritParams(p, s)
            for name, s in cls._SubParams(p)}
    ops = []
    flops, act, out = _ChainMeta([subs[k] for k in (
        'conv1', 'bn1', 'conv2', 'bn2')], shape, ops)
    flops = shapes.Add(flops, 3 * _ReluMeta(out))          # relu, add, relu
    # The final relu's output (relu1's is conv2's input, counted there).
    act = shapes.Add(act, shapes.Mul(4, out.num_elements()))
    bn_dims = [p.output_dim] * 2
    if 'proj' in subs:
      f, a, _ = _ChainMeta([subs['proj'], subs['proj_bn']], shape, ops)
      flops = shapes.Add(flops, f)
      # x, the projection's input, is conv1's: counted there.
      act = shapes.Add(act, a, shapes.Mul(-4, shape.num_elements()))
      bn_dims.append(p.output_dim)
    _AddOps(ops, _ReluOps(out, 3))
    x, y = shapes.Mul(4, shape.num_elements()), shapes.Mul(
        4, out.num_elements())
    extra = 1 if 'proj' in subs else 0
    return cost.Cost(flops=flops, out_shapes=(out,), act=act,
                     act_weights=shapes.Add(x, shapes.Mul(2 + extra, y)),
                     residuals=shapes.Add(x, shapes.Mul(5 + extra, y),
                                          _BnChannelBytes(*bn_dims)),
                     act_outputs=y, act_inputs=x, transient=y,
                     ops=_OpsOrNone(ops))
