"""Tests for layers/combinators.py."""
import numpy as np
import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import shapes
from cadence.layers import combinators
from cadence.layers import conv
from cadence.layers import linear
from cadence.layers import transformer

Shape = shapes.Shape

NestedMap = base_layer.NestedMap
SequentialLayer = combinators.SequentialLayer


class _DenseLayer(base_layer.BaseLayer):
  """y = x @ w; 2*in*out FLOPs per row."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('input_dim', 0, 'Input depth.')
    p.Define('output_dim', 0, 'Output depth.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CreateVariable('w', base_layer.WeightParams([p.input_dim,
                                                      p.output_dim]))

  def FProp(self, theta, inputs):
    theta = self.CastToFPropDtype(theta)
    return tf.matmul(self.CastToFPropDtype(inputs), theta.w)

  @classmethod
  def FPropMeta(cls, p, inputs):
    s = shapes.AsShape(inputs)
    return NestedMap(flops=shapes.Mul(2 * p.input_dim * p.output_dim, s[0]),
                     out_shapes=(s.WithDim(-1, p.output_dim),))


class _SplitHalves(base_layer.BaseLayer):
  """[b, 2k] -> ([b, k], [b, k]); no FLOPs."""

  def FProp(self, theta, inputs):
    return tuple(tf.split(inputs, 2, axis=-1))

  @classmethod
  def FPropMeta(cls, p, inputs):
    s = shapes.AsShape(inputs)
    half = s.WithDim(-1, None if s[-1] is None else s[-1] // 2)
    return NestedMap(flops=0, out_shapes=(half, half))


class _Mul(base_layer.BaseLayer):
  """(a, b) -> a * b; one FLOP per element."""

  def FProp(self, theta, a, b):
    return a * b

  @classmethod
  def FPropMeta(cls, p, a, b):
    a = shapes.AsShape(a)
    return NestedMap(flops=a.num_elements(), out_shapes=(a,))


def _D(name, i, o):
  return _DenseLayer.Params().Set(name=name, input_dim=i, output_dim=o)


class SequentialLayerTest(tf.test.TestCase):

  def _Gated(self):
    """dense 4->8, split, multiply, dense 4->3."""
    return SequentialLayer.Params().Set(name='seq', sub=[
        _D('up', 4, 8), _SplitHalves.Params().Set(name='split'),
        _Mul.Params().Set(name='mul'), _D('down', 4, 3)])

  def testFPropThreadsTuplesAndMatchesNumpy(self):
    layer = self._Gated().Instantiate()
    self.assertLen(layer.children.sub, 4)
    self.assertEqual('seq.sub[3]', layer.children.sub[3].path)
    x = np.random.default_rng(0).normal(size=[5, 4]).astype(np.float32)
    w_up, w_down = layer.vars.sub[0].w.numpy(), layer.vars.sub[3].w.numpy()
    h = x @ w_up
    ref = (h[:, :4] * h[:, 4:]) @ w_down
    self.assertAllClose(ref, layer(tf.constant(x)), atol=1e-5)
    fn_out = tf.function(layer.FPropDefaultTheta)(tf.constant(x))
    self.assertAllClose(ref, fn_out, atol=1e-5)

  def testRepeatHasSeparateWeights(self):
    p = SequentialLayer.Params().Set(name='seq', repeat=3,
                                     sub=[_D('proj', 4, 4)])
    layer = p.Instantiate()
    ws = [v.w.numpy() for v in layer.vars.sub]
    self.assertLen(ws, 3)
    self.assertGreater(np.abs(ws[0] - ws[1]).max(), 1e-3)
    x = np.ones([2, 4], np.float32)
    self.assertAllClose(x @ ws[0] @ ws[1] @ ws[2], layer(tf.constant(x)),
                        atol=1e-5)
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(layer(tf.constant(x))**2)
    grads = tape.gradient(loss, layer.vars.Flatten())
    self.assertLen(grads, 3)
    for g in grads:
      self.assertAllEqual(True, np.isfinite(g.numpy()).all())

  def testTupleOutputReturnedAsTuple(self):
    p = SequentialLayer.Params().Set(
        name='seq', sub=[_SplitHalves.Params().Set(name='split')])
    out = p.Instantiate()(tf.ones([2, 6]))
    self.assertIsInstance(out, tuple)
    self.assertLen(out, 2)

  def testFPropMeta(self):
    p = self._Gated()
    layer = p.Instantiate()
    for b in (1, 3, 7):
      meta = SequentialLayer.FPropMeta(p, [b, 4])
      self.assertEqual(2 * 4 * 8 * b + 4 * b + 2 * 4 * 3 * b, meta.flops)
      self.assertEqual(meta.out_shapes,
                       (shapes.AsShape(layer(tf.ones([b, 4]))),))
    meta = SequentialLayer.FPropMeta(p, [None, 4])
    self.assertIsNone(meta.flops)
    self.assertEqual((shapes.Shape([None, 3]),), meta.out_shapes)
    rep = SequentialLayer.Params().Set(name='r', repeat=2,
                                       sub=[_D('a', 4, 4)])
    self.assertEqual(2 * (2 * 16 * 5), SequentialLayer.FPropMeta(rep,
                                                                 [5, 4]).flops)

  def testFlatSubParams(self):
    inner = SequentialLayer.Params().Set(
        name='inner', repeat=2, sub=[_D('a', 4, 4), _D('b', 4, 4)])
    outer = SequentialLayer.Params().Set(
        name='outer', fprop_dtype=tf.bfloat16,
        sub=[_D('first', 4, 4), inner, _D('last', 4, 2)])
    flat = SequentialLayer.FlatSubParams(outer)
    self.assertEqual(['first', 'inner_a_0', 'inner_b_0', 'inner_a_1',
                      'inner_b_1', 'last'], [f.name for f in flat])
    for f in flat:
      self.assertIs(f.cls, _DenseLayer)
      self.assertEqual(tf.bfloat16, f.fprop_dtype)
    # The originals are untouched.
    self.assertEqual('a', inner.sub[0].name)
    self.assertIsNone(inner.sub[0].fprop_dtype)
    # Same FLOPs as the nested layer; same number of weights once built.
    flat_flops = sum(f.cls.FPropMeta(f, [3, 4]).flops for f in flat)
    self.assertEqual(SequentialLayer.FPropMeta(outer, [3, 4]).flops,
                     flat_flops)
    nested = outer.Instantiate()
    self.assertLen(nested.vars.Flatten(), len(flat))
    self.assertEqual(tf.bfloat16, nested(tf.ones([3, 4])).dtype)

  def testWithConvLayers(self):
    p = SequentialLayer.Params().Set(name='net', sub=[
        conv.Conv2DLayer.Params().Set(name='conv', filter_shape=[3, 3, 2, 4],
                                      filter_stride=[2, 2], activation='RELU'),
        conv.PoolingLayer.Params().Set(name='pool', pooling_type='AVG'),
        conv.FlattenLayer.Params().Set(name='flat')])
    layer = p.Instantiate()
    x = tf.ones([3, 9, 9, 2])
    out = layer(x)
    meta = SequentialLayer.FPropMeta(p, x.shape)
    self.assertEqual((shapes.AsShape(out),), meta.out_shapes)
    self.assertEqual((shapes.Shape([3, 16]),), meta.out_shapes)
    # conv -> [3, 5, 5, 4]; avg pool 2x2 VALID -> [3, 2, 2, 4]; flatten: 0.
    self.assertEqual(3 * 5 * 5 * 4 * (2 * 9 * 2 + 2) + 3 * 2 * 2 * 4 * 5,
                     meta.flops)

  def testThreadsPipelineTuples(self):
    cell = transformer.GPipeTransformerLayer.Params().Set(
        name='cell', input_dim=4, hidden_dim=8, num_heads=2)
    p = SequentialLayer.Params().Set(name='cells', sub=[cell], repeat=2)
    layer = p.Instantiate()
    x, pads = tf.ones([2, 3, 4]), tf.zeros([2, 3])
    out, out_pads = layer(x, pads)
    c0, c1 = layer.children.sub
    th0, th1 = layer.theta.sub
    self.assertAllClose(c1.FProp(th1, *c0.FProp(th0, x, pads))[0], out,
                        atol=1e-6)
    self.assertIs(pads, out_pads)
    meta = SequentialLayer.FPropMeta(p, x.shape, pads.shape)
    self.assertEqual((shapes.AsShape(x), shapes.AsShape(pads)),
                     meta.out_shapes)
    one = transformer.GPipeTransformerLayer.FPropMeta(cell, x.shape,
                                                      pads.shape)
    self.assertEqual(2 * one.flops, meta.flops)

  def testBadParams(self):
    with self.assertRaisesRegex(
        ValueError, r"SequentialLayer 'seq': repeat=0 must be an int >= 1"):
      SequentialLayer.Params().Set(name='seq', repeat=0,
                                   sub=[_D('a', 1, 1)]).Instantiate()
    with self.assertRaisesRegex(
        ValueError, r"SequentialLayer 'seq': sub=\[\] must be a non-empty"):
      SequentialLayer.Params().Set(name='seq').Instantiate()
    with self.assertRaisesRegex(
        ValueError, r"SequentialLayer 'seq': sub\[1\]=3 must be a layer "
        r'Params\(\)'):
      SequentialLayer.Params().Set(name='seq',
                                   sub=[_D('a', 1, 1), 3]).Instantiate()


class FeatureExtractionLayerTest(tf.test.TestCase):

  def testFetchAndForwardActivations(self):
    def proj(name):
      return linear.ProjectionLayer.Params().Set(
          name=name, input_dim=4, output_dim=4, activation='TANH')

    p = combinators.FeatureExtractionLayer.Params().Set(
        name='fe', sub=[proj('a'), proj('b')], num_act_inputs=1,
        act_fetch_layers=['a'], num_act_outputs=2)
    layer = p.Instantiate()
    x, extra = tf.random.normal([2, 4]), tf.random.normal([3])
    y, passed, fetched = layer(x, extra)
    a = layer.children.a(x)
    self.assertAllClose(layer.children.b(a), y)
    self.assertAllClose(extra, passed)
    self.assertAllClose(a, fetched)
    meta = combinators.FeatureExtractionLayer.FPropMeta(p, Shape([2, 4]),
                                                        Shape([3]))
    self.assertEqual((Shape([2, 4]), Shape([3]), Shape([2, 4])),
                     meta.out_shapes)
    sub_flops = linear.ProjectionLayer.FPropMeta(p.sub[0],
                                                 Shape([2, 4])).flops
    self.assertEqual(2 * sub_flops, meta.flops)

  def testBadParams(self):
    proj = linear.ProjectionLayer.Params().Set(name='a', input_dim=4,
                                               output_dim=4)
    with self.assertRaisesRegex(
        ValueError, r"FeatureExtractionLayer 'fe': num_act_outputs=0 must "
        r'equal num_act_inputs=0 \+ len\(act_fetch_layers\)=1'):
      combinators.FeatureExtractionLayer.Params().Set(
          name='fe', sub=[proj], act_fetch_layers=['a']).Instantiate()
    with self.assertRaisesRegex(ValueError, r"act_fetch_layers has 'z'"):
      combinators.FeatureExtractionLayer.Params().Set(
          name='fe', sub=[proj], act_fetch_layers=['z'],
          num_act_outputs=1).Instantiate()


if __name__ == '__main__':
  tf.test.main()
