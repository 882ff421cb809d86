"""Tests for cadence.layers.linear."""
import numpy as np
import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import shapes
from cadence.framework import step_seed
from cadence.layers import linear
from cadence.tests import test_utils


def _Proj(**kwargs):
  return linear.ProjectionLayer.Params().Set(name='proj', **kwargs)


def _Ffn(**kwargs):
  return linear.FeedForwardNet.Params().Set(name='ffn', **kwargs)


def _OutShapeUnknownBatch(fn, shape, dtype=tf.float32):
  """The static output shape of fn traced with input shape `shape`."""
  traced = tf.function(fn, input_signature=[tf.TensorSpec(shape, dtype)])
  return shapes.Shape(traced.get_concrete_function().structured_outputs.shape)


class ProjectTest(tf.test.TestCase):

  def testMatchesNumpyOnAnyRank(self):
    w, b = test_utils.Rand([3, 4], 20), test_utils.Rand([4], 21)
    relu = lambda v: np.maximum(v, 0.0)
    for shape in ([3], [5, 3], [2, 5, 3]):
      x = test_utils.Rand(shape, 22)
      for bias, act, np_act in ((None, None, lambda v: v),
                                (b, tf.nn.relu, relu)):
        with self.subTest(shape=shape, bias=bias is not None):
          want = np_act(x @ w + (0.0 if bias is None else bias))
          self.assertAllClose(want, linear.Project(
              tf.constant(x), tf.constant(w),
              None if bias is None else tf.constant(bias), act), atol=1e-6)

  def testUnknownLeadingDims(self):
    w = tf.constant(test_utils.Rand([3, 4], 23))
    x = test_utils.Rand([2, 5, 3], 24)
    fn = tf.function(lambda x: linear.Project(x, w),
                     input_signature=[tf.TensorSpec([None, None, 3])])
    self.assertEqual([None, None, 4],
                     fn.get_concrete_function().output_shapes.as_list())
    self.assertAllClose(x @ w.numpy(), fn(tf.constant(x)), atol=1e-6)

  def testGradientsMatchNumpy(self):
    # d(sum(dy * relu(x @ w + b))): the bias gradient is BiasAddGrad's.
    w, b = test_utils.Rand([3, 4], 25), test_utils.Rand([4], 26)
    x, dy = test_utils.Rand([2, 5, 3], 27), test_utils.Rand([2, 5, 4], 28)
    g = dy * (x @ w + b > 0)
    want = (g @ w.T, np.einsum('bti,bto->io', x, g), g.sum((0, 1)))
    args = [tf.constant(v) for v in (x, w, b)]
    with tf.GradientTape() as tape:
      tape.watch(args)
      y = linear.Project(*args, tf.nn.relu)
    got = tape.gradient(y, args, output_gradients=tf.constant(dy))
    for name, want_g, got_g in zip('xwb', want, got):
      self.assertAllClose(want_g, got_g, atol=1e-5, msg=name)


class ProjectionLayerTest(tf.test.TestCase):

  def _Layer(self, **kwargs):
    layer = _Proj(input_dim=3, output_dim=4, **kwargs).Instantiate()
    w = test_utils.Rand([3, 4], 0)
    layer.vars.w.assign(w)
    b = None
    if 'b' in layer.vars:
      b = test_utils.Rand([4], 1)
      layer.vars.b.assign(b)
    return layer, w, b

  def testNumpyReference(self):
    x = test_utils.Rand([2, 5, 3], 2)
    for act, ref in (('NONE', lambda v: v), ('RELU', lambda v: np.maximum(v, 0)),
                     ('TANH', np.tanh)):
      for has_bias in (True, False):
        layer, w, b = self._Layer(activation=act, has_bias=has_bias)
        want = x @ w + (b if has_bias else 0.0)
        self.assertAllClose(layer(tf.constant(x)), ref(want), atol=1e-6)
    self.assertEqual(sorted(layer.vars.keys()), ['w'])

  def testVariableShapesAndBiasInit(self):
    layer = _Proj(input_dim=3, output_dim=4).Instantiate()
    self.assertEqual(layer.vars.w.shape, [3, 4])
    self.assertAllEqual(layer.vars.b, np.zeros([4]))

  def testEagerEqualsFunction(self):
    layer, _, _ = self._Layer(activation='GELU')
    x = tf.constant(test_utils.Rand([4, 3], 3))
    self.assertAllClose(layer(x), tf.function(layer.FProp)(layer.theta, x),
                        atol=1e-6)

  def testGradientsFiniteForEveryVariable(self):
    layer, _, _ = self._Layer(activation='RELU')
    x = tf.constant(test_utils.Rand([2, 3, 3], 4))
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(layer(x) ** 2)
    grads = tape.gradient(loss, layer.vars)
    for name, g in grads.FlattenItems():
      self.assertIsNotNone(g, msg=name)
      self.assertTrue(np.all(np.isfinite(g)), msg=name)

  def testNumericGradient(self):
    layer = _Proj(input_dim=3, output_dim=2, activation='TANH',
                  dtype=tf.float64).Instantiate()
    theta = layer.theta
    x = tf.constant(test_utils.Rand([4, 3], 5, np.float64))

    def _Fn(w, b, inputs):
      return layer.FProp(base_layer.NestedMap(w=w, b=b), inputs)

    theoretical, numerical = tf.test.compute_gradient(
        _Fn, [tf.convert_to_tensor(theta.w), tf.convert_to_tensor(theta.b), x])
    for t, n in zip(theoretical, numerical):
      self.assertAllClose(t, n, atol=1e-7)

  def testBfloat16CloseToFloat32(self):
    x = tf.constant(test_utils.Rand([4, 6, 3], 6))
    ref, _, _ = self._Layer(activation='RELU')
    bf, _, _ = self._Layer(activation='RELU', fprop_dtype=tf.bfloat16)
    self.assertEqual(bf.vars.w.dtype, tf.float32)
    y = bf(x)
    self.assertEqual(y.dtype, tf.bfloat16)
    # bfloat16 has an 8-bit mantissa (relative step 2^-8 ~ 0.004); with
    # |x|, |w|, |b| <= 1 and 3 products per output, |y| <= 4, so the rounding
    # of inputs, weights and sums stays below 0.05.
    self.assertAllClose(tf.cast(y, tf.float32), ref(x), atol=5e-2)

  def testBadParams(self):
    with self.assertRaisesRegex(
        ValueError, r"ProjectionLayer 'proj': input_dim=0 must be an int "
        '>= 1'):
      _Proj(input_dim=0, output_dim=2).Instantiate()
    with self.assertRaisesRegex(
        ValueError, r"ProjectionLayer 'proj': output_dim=-3 must be an "
        'int >= 1'):
      _Proj(input_dim=2, output_dim=-3).Instantiate()
    with self.assertRaisesRegex(
        ValueError, r"ProjectionLayer 'proj': activation='GLEU' is invalid: "
        r"Unknown "
        r"activation 'GLEU'.*Did you mean 'GELU'\?"):
      _Proj(input_dim=2, output_dim=3, activation='GLEU').Instantiate()
    with self.assertRaisesRegex(
        ValueError, r"ProjectionLayer 'proj': inputs shape \[2, 5\] must end "
        'in input_dim=3'):
      linear.ProjectionLayer.FPropMeta(_Proj(input_dim=3, output_dim=2),
                                       [2, 5])

  def testFPropMeta(self):
    p = _Proj(input_dim=3, output_dim=4, activation='RELU')
    layer = p.Instantiate()
    for shape in ([5, 3], [2, 5, 3], [3], [2, 1, 2, 3]):
      meta = linear.ProjectionLayer.FPropMeta(p, shape)
      self.assertEqual(meta.out_shapes,
                       (shapes.Shape(layer(tf.ones(shape)).shape),))
    # Hand count for [2, 5, 3] -> [2, 5, 4] with bias and RELU: 10 rows,
    # each 3*4 multiply-adds (24 FLOPs) + 4 bias adds + 4 RELUs = 32.
    self.assertEqual(linear.ProjectionLayer.FPropMeta(p, [2, 5, 3]).flops,
                     10 * 32)
    no_bias = p.Copy().Set(has_bias=False, activation='NONE')
    self.assertEqual(
        linear.ProjectionLayer.FPropMeta(no_bias, [2, 5, 3]).flops, 10 * 24)
    # Unknown batch: shapes agree with the traced function, flops unknown.
    meta = linear.ProjectionLayer.FPropMeta(p, shapes.Shape([None, 5, 3]))
    self.assertEqual(meta.out_shapes,
                     (_OutShapeUnknownBatch(layer, [None, 5, 3]),))
    self.assertIsNone(meta.flops)


class FeedForwardNetTest(tf.test.TestCase):

  def _Layer(self, **kwargs):
    p = _Ffn(input_dim=3, hidden_layer_dims=[5, 2], **kwargs)
    layer = p.Instantiate()
    weights = []
    for i, fc in enumerate(layer.children.fc):
      w = test_utils.Rand(fc.vars.w.shape, 10 + i)
      b = test_utils.Rand(fc.vars.b.shape, 20 + i)
      fc.vars.w.assign(w)
      fc.vars.b.assign(b)
      weights.append((w, b))
    return p, layer, weights

  def testNumpyReference(self):
    _, layer, ((w0, b0), (w1, b1)) = self._Layer(
        activation=['RELU', 'NONE'])
    x = test_utils.Rand([2, 4, 3], 7)
    want = np.maximum(x @ w0 + b0, 0) @ w1 + b1
    self.assertAllClose(layer(tf.constant(x)), want, atol=1e-6)

  def testStringActivationAppliesToEveryLayer(self):
    _, layer, ((w0, b0), (w1, b1)) = self._Layer(activation='RELU')
    x = test_utils.Rand([6, 3], 8)
    want = np.maximum(np.maximum(x @ w0 + b0, 0) @ w1 + b1, 0)
    self.assertAllClose(layer(tf.constant(x)), want, atol=1e-6)

  def testChildren(self):
    _, layer, _ = self._Layer(dropout_prob=0.5)
    self.assertLen(layer.children.fc, 2)
    self.assertLen(layer.children.dropout, 1)
    self.assertEqual(layer.children.fc[1].path, 'ffn.fc[1]')
    self.assertEqual(layer.children.dropout[0].params.keep_prob, 0.5)

  def testDropoutBetweenLayers(self):
    _, layer, ((w0, b0), (w1, b1)) = self._Layer(
        activation=['RELU', 'NONE'], dropout_prob=0.5)
    x = test_utils.Rand([4, 3], 9)
    theta = base_layer.WithStepSeed(layer.theta, step_seed.MakeStepSeed(4))
    y = layer.FProp(theta, tf.constant(x))
    drop = layer.children.dropout[0]
    mask = drop.FProp(theta.dropout[0], tf.ones([4, 5])).numpy()
    want = (np.maximum(x @ w0 + b0, 0) * mask) @ w1 + b1
    self.assertAllClose(y, want, atol=1e-5)
    self.assertAllEqual(y, tf.function(layer.FProp)(theta, tf.constant(x)))
    with self.assertRaisesRegex(ValueError, 'carries no step seed'):
      layer(tf.constant(x))

  def testEagerEqualsFunctionAndGradients(self):
    _, layer, _ = self._Layer(activation=['GELU', 'NONE'])
    x = tf.constant(test_utils.Rand([2, 3, 3], 1))
    self.assertAllClose(layer(x), tf.function(layer.FProp)(layer.theta, x),
                        atol=1e-6)
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(layer(x) ** 2)
    grads = tape.gradient(loss, layer.vars)
    names = [n for n, _ in grads.FlattenItems()]
    self.assertLen(names, 4)
    for name, g in grads.FlattenItems():
      self.assertIsNotNone(g, msg=name)
      self.assertTrue(np.all(np.isfinite(g)), msg=name)

  def testBadParams(self):
    with self.assertRaisesRegex(
        ValueError, r"FeedForwardNet 'ffn': hidden_layer_dims=\[\] must be a "
        'non-empty list'):
      _Ffn(input_dim=3, hidden_layer_dims=[]).Instantiate()
    with self.assertRaisesRegex(
        ValueError, r"FeedForwardNet 'ffn': hidden_layer_dims\[1\]=0 must be "
        'an int >= 1'):
      _Ffn(input_dim=3, hidden_layer_dims=[4, 0]).Instantiate()
    with self.assertRaisesRegex(
        ValueError, r"FeedForwardNet 'ffn': activation=\['RELU'\] has 1 "
        'entries but hidden_layer_dims has 2'):
      _Ffn(input_dim=3, hidden_layer_dims=[4, 2],
           activation=['RELU']).Instantiate()
    with self.assertRaisesRegex(
        ValueError, r"FeedForwardNet 'ffn': activation\[1\]='RELUU'"):
      _Ffn(input_dim=3, hidden_layer_dims=[4, 2],
           activation=['RELU', 'RELUU']).Instantiate()
    with self.assertRaisesRegex(
        ValueError, r"FeedForwardNet 'ffn': dropout_prob=1.0 must be a "
        r'probability in \[0, 1\)'):
      _Ffn(input_dim=3, hidden_layer_dims=[4], dropout_prob=1.0).Instantiate()

  def testFPropMeta(self):
    p, layer, _ = self._Layer(activation=['RELU', 'NONE'], dropout_prob=0.1)
    theta = base_layer.WithStepSeed(layer.theta, step_seed.MakeStepSeed(0))
    for shape in ([4, 3], [2, 4, 3]):
      meta = linear.FeedForwardNet.FPropMeta(p, shape)
      self.assertEqual(meta.out_shapes,
                       (shapes.Shape(layer.FProp(theta, tf.ones(shape)).shape),))
    # [4, 3]: fc0 4*(2*3*5 + 5 + 5) = 160, dropout 3*4*5 = 60,
    # fc1 4*(2*5*2 + 2) = 88.
    self.assertEqual(linear.FeedForwardNet.FPropMeta(p, [4, 3]).flops,
                     160 + 60 + 88)
    meta = linear.FeedForwardNet.FPropMeta(p, shapes.Shape([None, 7, 3]))
    self.assertEqual(meta.out_shapes, (_OutShapeUnknownBatch(
        lambda x: layer.FProp(theta, x), [None, 7, 3]),))
    self.assertIsNone(meta.flops)


if __name__ == '__main__':
  tf.test.main()
