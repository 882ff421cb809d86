"""Tests for layers/transformer.py against a numpy composition."""
import numpy as np
import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import shapes
from cadence.layers import transformer
from cadence.tests import test_utils

EPS = 1e-6


def _NpLayerNorm(x, scale, bias):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean)**2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + EPS) * scale + bias


def _NpAttention(w, x, num_heads, paddings, causal):
  b, t, d = x.shape
  dh = d // num_heads

  def Proj(name):
    y = x @ w[f'{name}_w'] + w[f'{name}_b']
    return y.reshape(b, t, num_heads, dh).transpose(0, 2, 1, 3)

  logits = Proj('query') @ Proj('key').transpose(0, 1, 3, 2) / np.sqrt(dh)
  visible = np.ones([b, 1, t, t], bool)
  if paddings is not None:
    visible &= (paddings < 0.5)[:, None, None, :]
  if causal:
    visible &= np.tril(np.ones([t, t], bool))
  logits = np.where(visible, logits, -1e30)
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  ctx = (probs @ Proj('value')).transpose(0, 2, 1, 3).reshape(b, t, d)
  return ctx @ w['post_w'] + w['post_b']


def _NpTransformerLayer(v, x, num_heads, paddings, causal):
  """v: numpy copy of the layer's vars."""
  h = _NpLayerNorm(x, v['ln_atten']['scale'], v['ln_atten']['bias'])
  x = x + _NpAttention(v['atten'], h, num_heads, paddings, causal)
  h = _NpLayerNorm(x, v['ln_ffn']['scale'], v['ln_ffn']['bias'])
  fc0, fc1 = v['ffn']['fc']
  h = np.maximum(h @ fc0['w'] + fc0['b'], 0.0)
  return x + h @ fc1['w'] + fc1['b']


def _Numpy(tree):
  return tf.nest.map_structure(lambda t: t.numpy(), dict(tree))


def _Randomize(layer, seed=0):
  """Gives every variable (biases, norm scales too) random values."""
  rng = np.random.default_rng(seed)
  for var in layer.vars.Flatten():
    var.assign(var + 0.3 * rng.normal(size=var.shape).astype(np.float32))


def _Params(**kw):
  p = transformer.TransformerLayer.Params().Set(
      name='xformer', input_dim=8, hidden_dim=12, num_heads=2)
  return p.Set(**kw)


class TransformerLayerTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    rng = np.random.default_rng(1)
    self.x = rng.normal(size=[2, 5, 8]).astype(np.float32)
    self.pads = np.array([[0, 0, 0, 0, 0], [0, 0, 0, 1, 1]], np.float32)

  def testMatchesNumpyComposition(self):
    for causal in (False, True):
      layer = _Params(mask_self_atten=causal).Instantiate()
      _Randomize(layer)
      for pads in (None, self.pads):
        out = layer(tf.constant(self.x), pads)
        ref = _NpTransformerLayer(_Numpy(layer.vars), self.x, 2, pads, causal)
        self.assertAllClose(ref, out, atol=1e-4)

  def testEagerEqualsFunctionWithDropout(self):
    layer = _Params(atten_dropout_prob=0.1, residual_dropout_prob=0.1,
                    relu_dropout_prob=0.1, mask_self_atten=True).Instantiate()
    theta = test_utils.Seeded(layer, 5)
    x, pads = tf.constant(self.x), tf.constant(self.pads)
    eager = layer.FProp(theta, x, pads)
    graph = tf.function(layer.FProp)(theta, x, pads)
    self.assertAllClose(eager, graph, atol=1e-6)

  def testDropoutSeeded(self):
    layer = _Params(atten_dropout_prob=0.2, residual_dropout_prob=0.2,
                    relu_dropout_prob=0.2).Instantiate()
    x = tf.constant(self.x)
    run = lambda step: layer.FProp(test_utils.Seeded(layer, step), x).numpy()
    self.assertAllEqual(run(1), run(1))
    self.assertGreater(np.abs(run(1) - run(2)).max(), 1e-3)

  def testGradientsFiniteForEveryVariable(self):
    layer = _Params(atten_dropout_prob=0.1, residual_dropout_prob=0.1,
                    relu_dropout_prob=0.1, mask_self_atten=True).Instantiate()
    theta = test_utils.Seeded(layer, 2)
    with tf.GradientTape() as tape:
      out = layer.FProp(theta, tf.constant(self.x), tf.constant(self.pads))
      loss = tf.reduce_sum(out**2)
    variables = layer.vars.Flatten()
    self.assertLen(variables, 4 + 8 + 4)  # two norms, attention, ffn
    for var, grad in zip(variables, tape.gradient(loss, variables)):
      self.assertIsNotNone(grad, var.name)
      self.assertAllEqual(True, np.isfinite(grad.numpy()).all())

  def testBfloat16CloseToFloat32(self):
    x, pads = tf.constant(self.x), tf.constant(self.pads)
    out32 = _Params(mask_self_atten=True).Instantiate()(x, pads)
    out16 = _Params(mask_self_atten=True,
                    fprop_dtype=tf.bfloat16).Instantiate()(x, pads)
    self.assertEqual(tf.bfloat16, out16.dtype)
    # |out| is O(3) here; bfloat16 keeps ~3 significant digits per op.
    self.assertAllClose(out32, tf.cast(out16, tf.float32), atol=0.1)

  def testBfloat16GradientsReachFloat32Variables(self):
    # Mixed precision: float32 variables read as bfloat16 (a cast in FProp),
    # so their gradients come back through the cast as float32. GELU, not
    # ReLU: at a ReLU's kink a rounding difference of a pre-activation near
    # 0 switches a whole unit's gradient on or off.
    rng = np.random.default_rng(2)
    x, pads = tf.constant(self.x), tf.constant(self.pads)
    w = tf.constant(rng.normal(size=self.x.shape).astype(np.float32))
    grads = {}
    for dtype in (tf.float32, tf.bfloat16):
      layer = _Params(mask_self_atten=True, activation='GELU',
                      fprop_dtype=dtype).Instantiate()
      _Randomize(layer)
      self.assertEqual({v.dtype for v in layer.vars.Flatten()}, {tf.float32})
      with tf.GradientTape() as tape:
        tape.watch(x)
        out = layer(x, pads)
        loss = tf.reduce_sum(tf.cast(out, tf.float32) * w)
      self.assertEqual(out.dtype, dtype)
      grads[dtype] = tape.gradient(loss, layer.vars.Flatten() + [x])
    scale = max(np.abs(g).max() for g in grads[tf.float32])
    for g32, g16 in zip(grads[tf.float32], grads[tf.bfloat16]):
      self.assertEqual(g16.dtype, tf.float32)
      # bfloat16 keeps 8 significant bits (a rounding is at most 2^-9
      # relative); the gradients pass some 10 roundings (attention, two
      # norms, the feed-forward net): 2^-5 of the largest gradient
      # (measured: up to 1.7%).
      self.assertAllClose(g32, g16, atol=2**-5 * scale, rtol=0)

  def testFPropMetaHandCount(self):
    b, t, d, ff, h = 2, 3, 8, 12, 2
    n = b * t
    p = _Params(residual_dropout_prob=0.1, relu_dropout_prob=0.1)
    ln = n * (7 * d + 3)                          # LayerNorm docstring
    atten = (n * (2 * d * d + d + d) + n * 2 * (2 * d * d + d) +
             2 * 2 * d * b * t * t + 5 * b * h * t * t + n * (2 * d * d + d))
    ffn = (n * (2 * d * ff + ff + ff) + 3 * n * ff +  # fc0 + relu, dropout
           n * (2 * ff * d + d))                    # fc1
    residual = 2 * 3 * n * d + 2 * n * d            # 2 dropouts, 2 adds
    meta = transformer.TransformerLayer.FPropMeta(p, [b, t, d], [b, t])
    self.assertEqual(2 * ln + atten + ffn + residual, meta.flops)
    # In inference dropout costs nothing.
    p_inf = p.Copy().Set(is_inference=True)
    meta = transformer.TransformerLayer.FPropMeta(p_inf, [b, t, d])
    self.assertEqual(2 * ln + atten + ffn - 3 * n * ff + 2 * n * d,
                     meta.flops)

  def testFPropMetaShapes(self):
    p = _Params()
    layer = p.Instantiate()
    for b, t in ((1, 1), (2, 5), (3, 4)):
      out = layer(tf.zeros([b, t, 8]), tf.zeros([b, t]))
      meta = transformer.TransformerLayer.FPropMeta(p, [b, t, 8], [b, t])
      self.assertEqual(meta.out_shapes, (shapes.AsShape(out),))
    fn = tf.function(layer.FPropDefaultTheta).get_concrete_function(
        tf.TensorSpec([None, 4, 8]), tf.TensorSpec([None, 4]))
    meta = transformer.TransformerLayer.FPropMeta(p, [None, 4, 8], [None, 4])
    self.assertIsNone(meta.flops)
    self.assertEqual(meta.out_shapes, (shapes.AsShape(fn.outputs[0].shape),))

  def testBadParams(self):
    with self.assertRaisesRegex(
        ValueError, r"TransformerLayer 'xformer': num_heads=3 must divide "
        r'input_dim=8; 8 % 3 = 2'):
      _Params(num_heads=3).Instantiate()
    with self.assertRaisesRegex(
        ValueError, r"TransformerLayer 'xformer': relu_dropout_prob=1.5 must "
        r'be a probability in \[0, 1\)'):
      _Params(relu_dropout_prob=1.5).Instantiate()
    with self.assertRaisesRegex(
        ValueError, r"TransformerLayer 'xformer': hidden_dim=0 must be an "
        'int >= 1'):
      _Params(hidden_dim=0).Instantiate()
    with self.assertRaisesRegex(
        ValueError, r"TransformerLayer 'xformer': activation='RELLU' is "
        "invalid: .* Did you mean 'RELU'"):
      _Params(activation='RELLU').Instantiate()
    with self.assertRaisesRegex(
        ValueError, r"TransformerLayer 'xformer': inputs shape \[2, 3, 4\] "
        r'must be \[batch, time, input_dim=8\]'):
      transformer.TransformerLayer.FPropMeta(_Params(), [2, 3, 4])


class GPipeTransformerLayerTest(tf.test.TestCase):

  def testTupleInTupleOut(self):
    p = _Params().Set(cls=transformer.GPipeTransformerLayer)
    layer = p.Instantiate()
    plain = _Params().Instantiate()  # Same name and seed: same weights.
    x = tf.random.normal([2, 4, 8])
    pads = tf.constant([[0, 0, 0, 1], [0, 0, 0, 0]], tf.float32)
    out, out_pads = layer(x, pads)
    self.assertAllClose(plain(x, pads), out, atol=1e-6)
    self.assertIs(pads, out_pads)
    meta = transformer.GPipeTransformerLayer.FPropMeta(p, x.shape, pads.shape)
    self.assertEqual((shapes.AsShape(out), shapes.AsShape(out_pads)),
                     meta.out_shapes)
    self.assertEqual(
        transformer.TransformerLayer.FPropMeta(_Params(), x.shape).flops,
        meta.flops)


class TransformerStackTest(tf.test.TestCase):

  def _Params(self, layer_cls=transformer.TransformerLayer, **kw):
    tpl = _Params(mask_self_atten=True).Set(cls=layer_cls, name='')
    return transformer.TransformerStack.Params().Set(
        name='stack', num_layers=2, transformer_tpl=tpl).Set(**kw)

  def testMatchesNumpyComposition(self):
    for layer_cls in (transformer.TransformerLayer,
                      transformer.GPipeTransformerLayer):
      layer = self._Params(layer_cls).Instantiate()
      _Randomize(layer)
      x = np.random.default_rng(2).normal(size=[2, 5, 8]).astype(np.float32)
      pads = np.array([[0, 0, 0, 0, 1], [0, 0, 0, 0, 0]], np.float32)
      v = _Numpy(layer.vars)
      ref = x
      for lv in v['x_layers']:
        ref = _NpTransformerLayer(lv, ref, 2, pads, True)
      ref = _NpLayerNorm(ref, v['final_ln']['scale'], v['final_ln']['bias'])
      self.assertAllClose(ref, layer(tf.constant(x), pads), atol=1e-4)

  def testFPropMetaAndNoFinalNorm(self):
    p = self._Params(final_layer_norm=False)
    layer = p.Instantiate()
    self.assertNotIn('final_ln', layer.children)
    meta = transformer.TransformerStack.FPropMeta(p, [2, 3, 8])
    one = transformer.TransformerLayer.FPropMeta(p.transformer_tpl, [2, 3, 8])
    self.assertEqual(2 * one.flops, meta.flops)
    self.assertEqual((shapes.AsShape(layer(tf.zeros([2, 3, 8]))),),
                     meta.out_shapes)
    with_ln = transformer.TransformerStack.FPropMeta(self._Params(), [2, 3, 8])
    self.assertEqual(2 * one.flops + 6 * (7 * 8 + 3), with_ln.flops)

  def testBadParams(self):
    with self.assertRaisesRegex(
        ValueError, r"TransformerStack 'stack': num_layers=0 must be an "
        'int >= 1'):
      self._Params(num_layers=0).Instantiate()
    with self.assertRaisesRegex(
        ValueError, r"TransformerStack 'stack': transformer_tpl=.*must be a "
        r'TransformerLayer.Params\(\)'):
      self._Params(transformer_tpl=base_layer.BaseLayer.Params()).Instantiate()

  def testFPropMetaNamesTheStackForItsOwnSettings(self):
    # The layers inherit the stack's dtype; a bad one is named at the stack
    # (where it was set), not at transformer_tpl, which says tf.float32.
    want = ("TransformerStack 'stack': dtype='float64' must be one of "
            'tf.float32, tf.float64. Did you mean tf.float64 (a dtype, not a '
            'string)?')
    with self.assertRaisesWithLiteralMatch(ValueError, want):
      transformer.TransformerStack.FPropMeta(
          self._Params(dtype='float64'), [2, 3, 8])
    with self.assertRaisesWithLiteralMatch(
        ValueError, "TransformerStack 'stack': random_seed=-3 must be None or "
        'an int >= 0.'):
      self._Params(random_seed=-3).Instantiate()


if __name__ == '__main__':
  tf.test.main()
