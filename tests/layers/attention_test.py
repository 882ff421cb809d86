"""Tests for layers/attention.py against a numpy reference."""
import numpy as np
import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import op_cost
from cadence.framework import shapes
from cadence.framework import step_seed
from cadence.layers import attention

MHA = attention.MultiHeadedAttention


def _Params(**kw):
  p = MHA.Params().Set(name='atten', input_dim=8, num_heads=2)
  return p.Set(**kw)


def _NpProject(x, w, b):
  return x @ w + (0.0 if b is None else b)


def _NpAttention(theta, q_in, k_in, v_in, num_heads, paddings=None,
                 causal=False):
  """Plain numpy multi-headed attention; returns (out, probs)."""
  get = lambda n: theta.get(n)
  q = _NpProject(q_in, theta['query_w'], get('query_b'))
  k = _NpProject(k_in, theta['key_w'], get('key_b'))
  v = _NpProject(v_in, theta['value_w'], get('value_b'))
  b, tq, n = q.shape
  tk = k.shape[1]
  dh = n // num_heads
  split = lambda x: x.reshape(b, -1, num_heads, dh).transpose(0, 2, 1, 3)
  q, k, v = split(q), split(k), split(v)                 # [b, h, t, dh]
  logits = q @ k.transpose(0, 1, 3, 2) / np.sqrt(dh)     # [b, h, tq, tk]
  visible = np.ones([b, 1, tq, tk], bool)
  if paddings is not None:
    visible &= (paddings < 0.5)[:, None, None, :]
  if causal:
    visible &= np.tril(np.ones([tq, tk], bool))[None, None]
  logits = np.where(visible, logits, -1e30)
  logits -= logits.max(-1, keepdims=True)
  probs = np.exp(logits)
  probs /= probs.sum(-1, keepdims=True)
  ctx = (probs @ v).transpose(0, 2, 1, 3).reshape(b, tq, n)
  return _NpProject(ctx, theta['post_w'], get('post_b')), probs


def _NpTheta(layer):
  return {k: v.numpy() for k, v in layer.vars.items()}


def _RandomizeBiases(layer, rng):
  for name, var in layer.vars.items():
    if name.endswith('_b'):
      var.assign(rng.normal(size=var.shape).astype(np.float32))


class MultiHeadedAttentionTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    self.rng = np.random.default_rng(0)

  def _Inputs(self, b=2, t=5, d=8):
    return self.rng.normal(size=[b, t, d]).astype(np.float32)

  def testSelfAttentionMatchesNumpy(self):
    layer = _Params().Instantiate()
    _RandomizeBiases(layer, self.rng)
    x = self._Inputs()
    paddings = np.array([[0, 0, 0, 0, 0], [0, 0, 0, 1, 1]], np.float32)
    for causal in (False, True):
      for pads in (None, paddings):
        out, probs = layer(tf.constant(x), paddings=pads, causal=causal)
        ref_out, ref_probs = _NpAttention(_NpTheta(layer), x, x, x, 2,
                                          pads, causal)
        self.assertAllClose(ref_out, out, atol=1e-5)
        self.assertAllClose(ref_probs, probs, atol=1e-6)
    # Padded keys get exactly zero probability.
    _, probs = layer(tf.constant(x), paddings=paddings, causal=True)
    self.assertAllEqual(np.zeros([2, 5, 2]), probs[1, :, :, 3:])

  def testCrossAttentionMatchesNumpy(self):
    layer = _Params(source_dim=6, hidden_dim=12, num_heads=3).Instantiate()
    _RandomizeBiases(layer, self.rng)
    q = self._Inputs(2, 4, 8)
    k = self._Inputs(2, 7, 6)
    v = self._Inputs(2, 7, 6)
    pads = np.zeros([2, 7], np.float32)
    pads[0, 5:] = 1.0
    out, probs = layer(tf.constant(q), tf.constant(k), tf.constant(v),
                       paddings=pads)
    ref_out, ref_probs = _NpAttention(_NpTheta(layer), q, k, v, 3, pads)
    self.assertEqual((2, 4, 8), tuple(out.shape))
    self.assertEqual((2, 3, 4, 7), tuple(probs.shape))
    self.assertAllClose(ref_out, out, atol=1e-5)
    self.assertAllClose(ref_probs, probs, atol=1e-6)

  def testNoBias(self):
    layer = _Params(use_bias=False).Instantiate()
    self.assertEqual({'query_w', 'key_w', 'value_w', 'post_w'},
                     set(layer.vars.keys()))
    x = self._Inputs()
    out, _ = layer(tf.constant(x))
    ref_out, _ = _NpAttention(_NpTheta(layer), x, x, x, 2)
    self.assertAllClose(ref_out, out, atol=1e-5)

  def testFullyPaddedRowIsFinite(self):
    layer = _Params().Instantiate()
    out, probs = layer(tf.constant(self._Inputs()), paddings=tf.ones([2, 5]))
    self.assertAllEqual(True, np.isfinite(out.numpy()).all())
    self.assertAllClose(np.full([2, 2, 5, 5], 0.2), probs, atol=1e-6)

  def testEagerEqualsFunction(self):
    layer = _Params().Instantiate()
    x = tf.constant(self._Inputs())
    pads = tf.constant([[0, 0, 0, 0, 1], [0, 0, 0, 0, 0]], tf.float32)
    eager = layer(x, paddings=pads, causal=True)
    graph = tf.function(lambda x, p: layer(x, paddings=p, causal=True))(x,
                                                                        pads)
    self.assertAllClose(eager[0], graph[0], atol=1e-6)
    self.assertAllClose(eager[1], graph[1], atol=1e-6)

  def testFPropMetaShapesMatchFProp(self):
    p = _Params(source_dim=6)
    layer = p.Instantiate()
    for b, tq, tk in ((1, 3, 3), (2, 5, 7), (3, 1, 4)):
      q, k = tf.zeros([b, tq, 8]), tf.zeros([b, tk, 6])
      meta = MHA.FPropMeta(p, q.shape, k.shape, k.shape, [b, tk])
      out = layer(q, k, k, tf.zeros([b, tk]))
      self.assertEqual(meta.out_shapes, tuple(shapes.AsShape(o) for o in out))
    # Unknown batch: static shapes of a traced FProp equal FPropMeta's.
    spec_q = tf.TensorSpec([None, 4, 8])
    spec_k = tf.TensorSpec([None, 6, 6])
    fn = tf.function(lambda q, k: layer(q, k, k)).get_concrete_function(
        spec_q, spec_k)
    meta = MHA.FPropMeta(p, [None, 4, 8], [None, 6, 6])
    self.assertIsNone(meta.flops)
    self.assertEqual(meta.out_shapes,
                     tuple(shapes.AsShape(o.shape) for o in fn.outputs))

  def testFPropMetaFlopsHandCount(self):
    # b=2, tq=3, tk=5, d=8, s=6, n=12, h=3, with bias.
    p = _Params(source_dim=6, hidden_dim=12, num_heads=3)
    meta = MHA.FPropMeta(p, [2, 3, 8], [2, 5, 6])
    q_proj = 2 * 3 * (2 * 8 * 12 + 12 + 12)   # matmul + bias + scaling
    kv_proj = 2 * 2 * 5 * (2 * 6 * 12 + 12)   # key and value
    dots = 2 * 2 * 3 * 5 * 2 * 12             # logits and context
    softmax = 5 * 2 * 3 * 3 * 5
    post = 2 * 3 * (2 * 12 * 8 + 8)
    self.assertEqual(q_proj + kv_proj + dots + softmax + post, meta.flops)
    p_nb = _Params(use_bias=False)
    meta = MHA.FPropMeta(p_nb, [1, 2, 8])
    self.assertEqual(2 * (2 * 8 * 8 + 8) + 2 * 2 * 2 * 8 * 8 +
                     2 * 2 * 2 * 2 * 8 + 5 * 2 * 2 * 2 + 2 * 2 * 8 * 8,
                     meta.flops)

  def testFPropMetaStatesTheCoreAsOneAttentionOp(self):
    # b=2, tq=3, tk=5, h=3, dh=4: the scores' product, the mask, the
    # softmax, the dropout's random bits and the context's product, in
    # one attention op a cluster may run fused (hardware's fuse).
    p = _Params(source_dim=6, hidden_dim=12, num_heads=3,
                atten_dropout_prob=0.1)
    ops = MHA.FPropMeta(p, [2, 3, 8], [2, 5, 6]).ops
    (core,) = [op for op in ops if op.kind == op_cost.ATTENTION]
    self.assertEqual((6, 3, 5, 4, 4, False), core.dims[:6])
    self.assertEqual(
        [(op_cost.MATMUL, (6, 3, 4, 5, False, 4)), (op_cost.ELEMENTWISE, None),
         (op_cost.SOFTMAX, None), (op_cost.ELEMENTWISE, None),
         (op_cost.MATMUL, (6, 3, 5, 4, False, 4))],
        [(o.kind, o.dims if o.kind == op_cost.MATMUL else None)
         for o in core.dims.parts])
    self.assertEqual(op_cost.Sum(core.dims.parts), core.flops)
    # In inference, no dropout.
    ops = MHA.FPropMeta(p.Copy().Set(is_inference=True), [2, 3, 8]).ops
    (core,) = [op for op in ops if op.kind == op_cost.ATTENTION]
    self.assertEqual(4, len(core.dims.parts))

  def testGradientsFiniteForEveryVariable(self):
    layer = _Params(atten_dropout_prob=0.2).Instantiate()
    theta = base_layer.WithStepSeed(layer.theta, step_seed.MakeStepSeed(3))
    x = tf.constant(self._Inputs())
    with tf.GradientTape() as tape:
      out, _ = layer.FProp(theta, x, paddings=tf.zeros([2, 5]), causal=True)
      loss = tf.reduce_sum(out**2)
    variables = layer.vars.Flatten()
    grads = tape.gradient(loss, variables)
    self.assertLen(variables, 8)
    for var, grad in zip(variables, grads):
      self.assertIsNotNone(grad, var.name)
      self.assertAllEqual(True, np.isfinite(grad.numpy()).all())

  def testNumericGradient(self):
    layer = _Params(dtype=tf.float64, input_dim=4, num_heads=2).Instantiate()
    _RandomizeBiases(layer, self.rng)
    x = tf.constant(self.rng.normal(size=[1, 3, 4]))
    pads = tf.constant([[0.0, 0.0, 1.0]], tf.float64)
    w = layer.vars

    def Loss(xq, wq, wk, wv, wo):
      theta = w.Transform(lambda v: v)
      theta.query_w, theta.key_w, theta.value_w, theta.post_w = wq, wk, wv, wo
      out, _ = layer.FProp(theta, xq, paddings=pads, causal=True)
      return tf.reduce_sum(tf.sin(out))

    args = [x] + [tf.convert_to_tensor(w[n]) for n in
                  ('query_w', 'key_w', 'value_w', 'post_w')]
    analytic, numeric = tf.test.compute_gradient(Loss, args, delta=1e-6)
    for a, n in zip(analytic, numeric):
      self.assertAllClose(n, a, atol=1e-7)

  def testBfloat16CloseToFloat32(self):
    x = tf.constant(self._Inputs())
    pads = tf.constant([[0, 0, 0, 0, 1], [0, 0, 0, 0, 0]], tf.float32)
    ref = _Params().Instantiate()
    bf = _Params(fprop_dtype=tf.bfloat16).Instantiate()
    out32, probs32 = ref(x, paddings=pads, causal=True)
    out16, probs16 = bf(x, paddings=pads, causal=True)
    self.assertEqual(tf.bfloat16, out16.dtype)
    # Same seeds give the same float32 weights; bfloat16 keeps 8 bits.
    self.assertAllClose(out32, tf.cast(out16, tf.float32), atol=0.1)
    self.assertAllClose(probs32, tf.cast(probs16, tf.float32), atol=0.02)

  def testDropoutSeeded(self):
    layer = _Params(atten_dropout_prob=0.5).Instantiate()
    x = tf.constant(self._Inputs())

    def Run(step):
      theta = base_layer.WithStepSeed(layer.theta,
                                      step_seed.MakeStepSeed(step))
      return layer.FProp(theta, x)[0].numpy()

    self.assertAllEqual(Run(1), Run(1))
    self.assertGreater(np.abs(Run(1) - Run(2)).max(), 1e-3)
    # Probabilities returned are pre-dropout; inference mode is exact.
    infer = _Params(atten_dropout_prob=0.5, is_inference=True).Instantiate()
    plain = _Params().Instantiate()
    self.assertAllClose(plain(x)[0], infer(x)[0], atol=1e-6)
    with self.assertRaisesRegex(ValueError, "'atten'.*no step seed"):
      layer(x)

  def testBadParams(self):
    with self.assertRaisesRegex(
        ValueError, r"MultiHeadedAttention 'atten': num_heads=3 must divide "
        r'input_dim \(the hidden_dim\)=8; 8 % 3 = 2'):
      _Params(num_heads=3).Instantiate()
    with self.assertRaisesRegex(
        ValueError, r"MultiHeadedAttention 'atten': num_heads=4 must divide "
        r'hidden_dim=6'):
      _Params(num_heads=4, hidden_dim=6).Instantiate()
    with self.assertRaisesRegex(
        ValueError, r"MultiHeadedAttention 'atten': atten_dropout_prob=1.0 "
        r'must be a probability in \[0, 1\)'):
      _Params(atten_dropout_prob=1.0).Instantiate()
    with self.assertRaisesRegex(
        ValueError, r"MultiHeadedAttention 'atten': input_dim=0 must be an "
        'int >= 1'):
      _Params(input_dim=0).Instantiate()
    with self.assertRaisesRegex(ValueError, r'input_dim=8\]'):
      MHA.FPropMeta(_Params(), [2, 3, 5])


if __name__ == '__main__':
  tf.test.main()
