"""Tests for cadence.layers.softmax."""
import numpy as np
import tensorflow as tf

from cadence.framework import shapes
from cadence.layers import softmax
from cadence.tests import test_utils


def _NpXent(x, w, b, ids, ls):
  logits = x @ w + b
  logits = logits - logits.max(-1, keepdims=True)
  log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  c = w.shape[-1]
  target = np.eye(c)[ids] * (1.0 - ls) + ls / c
  return -(target * log_probs).sum(-1), log_probs


def _Params(**kwargs):
  return softmax.SimpleFullSoftmax.Params().Set(
      name='softmax', input_dim=3, num_classes=5, **kwargs)


def _Build(**kwargs):
  p = _Params(**kwargs)
  layer = p.Instantiate()
  w = test_utils.Rand([3, 5], 0) * 2.0
  b = test_utils.Rand([5], 1)
  layer.vars.w.assign(w.astype(layer.vars.w.dtype.as_numpy_dtype))
  layer.vars.b.assign(b.astype(layer.vars.b.dtype.as_numpy_dtype))
  return p, layer, w, b


_X = test_utils.Rand([2, 7, 3], 2)
_IDS = np.random.RandomState(3).randint(0, 5, [2, 7])
_WEIGHTS = np.random.RandomState(4).uniform(0, 1, [2, 7]).astype(np.float32)


class SimpleFullSoftmaxTest(tf.test.TestCase):

  def testNumpyReference(self):
    for ls in (0.0, 0.2):
      _, layer, w, b = _Build(label_smoothing=ls)
      out = layer(tf.constant(_X), tf.constant(_IDS), tf.constant(_WEIGHTS))
      xent, log_probs = _NpXent(_X, w, b, _IDS, ls)
      self.assertAllClose(out.logits, _X @ w + b, atol=1e-6)
      self.assertAllClose(out.log_probs, log_probs, atol=1e-5)
      self.assertAllClose(out.per_example_xent, xent, atol=1e-5)
      self.assertAllClose(out.per_example_weight, _WEIGHTS, atol=0)
      self.assertAllClose(out.total_xent, (xent * _WEIGHTS).sum(), atol=1e-4)
      self.assertAllClose(out.total_weight, _WEIGHTS.sum(), atol=1e-5)
      self.assertAllClose(out.avg_xent,
                          (xent * _WEIGHTS).sum() / _WEIGHTS.sum(), atol=1e-5)

  def testLabelSmoothingChangesLoss(self):
    # With smoothing the loss has a floor: even a perfect model pays the
    # entropy of the smoothed target. Check the explicit formula on one row.
    _, layer, w, b = _Build(label_smoothing=0.1)
    x = _X[0, :1]
    out = layer(tf.constant(x), tf.constant([2]))
    logits = x @ w + b
    log_probs = logits - np.log(np.exp(logits).sum())
    want = -(0.9 * log_probs[0, 2] + 0.1 / 5 * log_probs[0].sum())
    self.assertAllClose(out.per_example_xent, [want], atol=1e-5)

  def testDefaultWeightsAndZeroWeight(self):
    _, layer, _, _ = _Build()
    out = layer(tf.constant(_X), tf.constant(_IDS))
    self.assertAllEqual(out.per_example_weight, np.ones([2, 7]))
    self.assertAllClose(out.avg_xent, np.mean(out.per_example_xent),
                        atol=1e-6)
    zero = layer(tf.constant(_X), tf.constant(_IDS), tf.zeros([2, 7]))
    self.assertEqual(float(zero.avg_xent), 0.0)

  def testEagerEqualsFunction(self):
    for alloc in (0, 10):
      _, layer, _, _ = _Build(softmax_max_alloc=alloc, label_smoothing=0.1)
      args = (tf.constant(_X), tf.constant(_IDS), tf.constant(_WEIGHTS))
      eager = layer(*args)
      graph = tf.function(layer.FProp)(layer.theta, *args)
      self.assertAllClose(eager, graph, atol=1e-6)

  def _LossAndGrads(self, layer, fn=None, x=_X):
    x = tf.constant(x)

    def _Loss():
      out = (fn or layer.FProp)(layer.theta, x, tf.constant(_IDS),
                                tf.constant(_WEIGHTS))
      return out.total_xent, out

    (_, out), grads = test_utils.LossAndGrads(
        _Loss, [x, layer.vars.w, layer.vars.b])
    return out, grads

  def testChunkedEqualsUnchunked(self):
    # 14 rows * 5 classes = 70 logits. alloc 12: 2 rows per chunk, 7 chunks;
    # 15: 3 rows per chunk, the last chunk padded; 4 (< num_classes): 1 row.
    cases = [(0.3, 12, False), (0.3, 15, True), (0.0, 15, False),
             (0.0, 4, True)]
    for ls, alloc, use_function in cases:
      _, full, _, _ = _Build(label_smoothing=ls)
      want, want_g = self._LossAndGrads(full)
      _, chunked, _, _ = _Build(label_smoothing=ls, softmax_max_alloc=alloc)
      fn = tf.function(chunked.FProp) if use_function else None
      got, got_g = self._LossAndGrads(chunked, fn)
      self.assertNotIn('logits', got)
      self.assertNotIn('log_probs', got)
      self.assertEqual(got.per_example_xent.shape, [2, 7])
      self.assertAllClose(got.per_example_xent, want.per_example_xent,
                          atol=1e-5)
      self.assertAllClose(got.total_xent, want.total_xent, atol=1e-5)
      self.assertAllClose(got.avg_xent, want.avg_xent, atol=1e-6)
      for name, g, wg in zip(('x', 'w', 'b'), got_g, want_g):
        self.assertAllClose(tf.convert_to_tensor(g),
                            tf.convert_to_tensor(wg), atol=1e-5, msg=name)

  def testChunkedGraphHasNoFullLogits(self):
    # Loss and gradients in one graph (loop bodies included): with chunking
    # no logits-like tensor [..., num_classes] holds more than one chunk of
    # 2 rows; without chunking the [2, 7, 5] logits appear.
    def _LogitsSizes(layer):

      @tf.function
      def _Step(x, ids):
        with tf.GradientTape() as tape:
          loss = layer(x, ids).total_xent
        return tape.gradient(loss, [layer.vars.w, layer.vars.b])

      graph = _Step.get_concrete_function(
          tf.constant(_X), tf.constant(_IDS)).graph
      # The while-loop bodies live in the graph's function library.
      graphs = [graph] + [f.graph for f in graph._functions.values()]  # pylint: disable=protected-access
      sizes = set()
      for g in graphs:
        for op in g.get_operations():
          for t in op.outputs:
            s = t.shape
            # Skip w [3, 5] and its gradient; keep [..., 5] activations.
            if (s.rank and s.is_fully_defined() and s[-1] == 5 and
                s.as_list() != [3, 5]):
              sizes.add(s.num_elements())
      return sizes

    _, full, _, _ = _Build()
    _, chunked, _, _ = _Build(softmax_max_alloc=12)
    self.assertIn(2 * 7 * 5, _LogitsSizes(full))
    self.assertEqual(max(_LogitsSizes(chunked)), 2 * 5)

  def testChunkingOffWhenLogitsFit(self):
    _, layer, _, _ = _Build(softmax_max_alloc=70)   # exactly 14 * 5
    out = layer(tf.constant(_X), tf.constant(_IDS))
    self.assertIn('logits', out)

  def testChunkedUnknownBatch(self):
    _, full, _, _ = _Build()
    _, chunked, _, _ = _Build(softmax_max_alloc=1000)
    fn = tf.function(
        lambda x, ids: chunked.FProp(chunked.theta, x, ids).per_example_xent,
        input_signature=[tf.TensorSpec([None, 7, 3], tf.float32),
                         tf.TensorSpec([None, 7], tf.int64)])
    self.assertAllClose(fn(tf.constant(_X), tf.constant(_IDS)),
                        full(tf.constant(_X), tf.constant(_IDS)).per_example_xent,
                        atol=1e-5)

  def testGradientsFiniteForEveryVariable(self):
    _, layer, _, _ = _Build(label_smoothing=0.1)
    with tf.GradientTape() as tape:
      loss = layer(tf.constant(_X), tf.constant(_IDS)).avg_xent
    for name, g in tape.gradient(loss, layer.vars).FlattenItems():
      self.assertIsNotNone(g, msg=name)
      self.assertTrue(np.all(np.isfinite(g)), msg=name)

  def testNumericGradientChunked(self):
    _, layer, _, _ = _Build(label_smoothing=0.2, softmax_max_alloc=10,
                            dtype=tf.float64)
    x = tf.constant(test_utils.Rand([4, 3], 5, np.float64))
    ids = tf.constant([0, 4, 2, 2])

    def _Fn(w, b, inputs):
      theta = layer.theta.Transform(lambda v: v)
      theta.w, theta.b = w, b
      return layer.FProp(theta, inputs, ids).per_example_xent

    theoretical, numerical = tf.test.compute_gradient(
        _Fn, [tf.convert_to_tensor(layer.vars.w),
              tf.convert_to_tensor(layer.vars.b), x], delta=1e-5)
    for t, n in zip(theoretical, numerical):
      self.assertAllClose(t, n, atol=1e-7)

  def testBfloat16(self):
    _, ref, _, _ = _Build()
    _, bf, _, _ = _Build(fprop_dtype=tf.bfloat16)
    _, bf_chunked, _, _ = _Build(fprop_dtype=tf.bfloat16, softmax_max_alloc=10)
    want = ref(tf.constant(_X), tf.constant(_IDS)).per_example_xent
    for layer in (bf, bf_chunked):
      out = layer(tf.constant(_X), tf.constant(_IDS))
      self.assertEqual(out.per_example_xent.dtype, tf.float32)
      # Logits |l| <= 7 rounded to bfloat16 (2^-8 relative): error <~ 0.05.
      self.assertAllClose(out.per_example_xent, want, atol=6e-2)

  def testBadParams(self):
    with self.assertRaisesRegex(
        ValueError, r"SimpleFullSoftmax 'softmax': num_classes=0 must be an "
        'int >= 1'):
      _Params().Set(num_classes=0).Instantiate()
    with self.assertRaisesRegex(
        ValueError, r"SimpleFullSoftmax 'softmax': label_smoothing=1.0 must be "
        r'a number in \[0, 1\)'):
      _Params(label_smoothing=1.0).Instantiate()
    with self.assertRaisesRegex(
        ValueError, r"SimpleFullSoftmax 'softmax': softmax_max_alloc=-1 must "
        'be an int >= 0'):
      _Params(softmax_max_alloc=-1).Instantiate()
    _, layer, _, _ = _Build()
    with self.assertRaisesRegex(
        ValueError, r"SimpleFullSoftmax 'softmax': class_ids shape \(2, 6\) "
        r'must equal inputs shape \(2, 7, 3\) without its last dim'):
      layer(tf.constant(_X), tf.zeros([2, 6], tf.int32))

  def testFPropMeta(self):
    p, layer, _, _ = _Build()
    for shape in ([4, 3], [2, 7, 3]):
      meta = softmax.SimpleFullSoftmax.FPropMeta(p, shape, shape[:-1])
      x = tf.ones(shape)
      ids = tf.zeros(shape[:-1], tf.int32)
      # Every output of FProp's NestedMap, by key.
      out = layer(x, ids)
      (stated,) = meta.out_shapes
      self.assertEqual(sorted(out), sorted(stated))
      self.assertEqual(stated.logits,
                       shapes.Shape(layer.Logits(layer.theta, x).shape))
      for key in out:
        self.assertEqual(stated[key], shapes.Shape(out[key].shape), key)
    # Chunked (4 rows x 5 classes > 12), FProp gives no logits: nor does
    # FPropMeta.
    p12, chunked, _, _ = _Build(softmax_max_alloc=12)
    (stated,) = softmax.SimpleFullSoftmax.FPropMeta(p12, [4, 3]).out_shapes
    out = chunked(tf.ones([4, 3]), tf.zeros([4], tf.int32))
    self.assertNotIn('logits', stated)
    self.assertEqual({k: shapes.Shape(v.shape) for k, v in out.items()},
                     dict(stated))
    # [4, 3]: 4 rows * (2*3*5 + 5 + 6*5 + 3) = 4 * 68.
    self.assertEqual(softmax.SimpleFullSoftmax.FPropMeta(p, [4, 3]).flops,
                     4 * 68)
    meta = softmax.SimpleFullSoftmax.FPropMeta(p, [None, 7, 3])
    fn = tf.function(
        lambda x, ids: layer(x, ids).per_example_xent,
        input_signature=[tf.TensorSpec([None, 7, 3], tf.float32),
                         tf.TensorSpec([None, 7], tf.int32)])
    out = fn.get_concrete_function().structured_outputs
    self.assertEqual(meta.out_shapes[0].per_example_xent,
                     shapes.Shape(out.shape))
    self.assertEqual(meta.out_shapes[0].logits, shapes.Shape([None, 7, 5]))
    self.assertIsNone(meta.flops)


if __name__ == '__main__':
  tf.test.main()
