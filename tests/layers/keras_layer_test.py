"""Tests for cadence.layers.keras_layer: Keras layers as Cadence layers."""
import itertools

import keras
import numpy as np
import tensorflow as tf

from cadence.framework import cluster as cluster_lib
from cadence.framework.pipeline import recurrent
from cadence.framework import shapes
from cadence.layers import gpipe
from cadence.layers import keras_layer
from cadence.tests import test_utils

KerasLayer = keras_layer.KerasLayer
Shape = shapes.Shape
NestedMap = keras_layer.NestedMap


def _Dense(name, units, input_dim, activation=None):
  return KerasLayer.Params().Set(
      name=name, layer=keras.layers.Dense, input_shape=(input_dim,),
      kwargs={'units': units, 'activation': activation})


def TwoLayerModel(hidden=6, out=3):
  """A keras.Model built by a function (its params print as function(...))."""
  x = keras.Input((4,))
  h = keras.layers.Dense(hidden, activation='tanh')(x)
  return keras.Model(x, keras.layers.Dense(out)(h))


class _CountCalls(keras.layers.Layer):
  """Identity that counts its calls in a non-trainable weight."""

  def build(self, input_shape):
    del input_shape
    self.calls = self.add_weight(shape=(), initializer='zeros',
                                 trainable=False, name='calls')

  def call(self, x):
    self.calls.assign(self.calls + 1.0)
    return x


class KerasLayerTest(tf.test.TestCase):

  def testDenseRunsWithThetasValues(self):
    layer = _Dense('ffn', 5, 4, 'relu').Instantiate()
    self.assertEqual({'kernel': [4, 5], 'bias': [5]},
                     {k: v.shape.as_list() for k, v in
                      layer.vars.FlattenItems()})
    self.assertIs(layer.vars.kernel, layer.keras_object.kernel.value)
    # Theta's values, not the variables, are what FProp uses.
    w, b = test_utils.Rand([4, 5], 1), test_utils.Rand([5], 2)
    x = test_utils.Rand([3, 4], 3)
    theta = layer.theta.Transform(lambda v: v)
    theta.kernel, theta.bias = tf.constant(w), tf.constant(b)
    want = np.maximum(x @ w + b, 0)
    self.assertAllClose(want, layer.FProp(theta, x), atol=1e-6)
    self.assertAllClose(want, tf.function(layer.FProp)(theta, x), atol=1e-6)
    meta = KerasLayer.FPropMeta(layer.params, Shape([3, 4]))
    self.assertEqual((Shape([3, 5]),), meta.out_shapes)

  def testGradientsReachTheta(self):
    # Cadence's gradients by theta equal Keras's own by its variables.
    layer = KerasLayer.Params().Set(
        name='att', layer=keras.layers.MultiHeadAttention,
        kwargs={'num_heads': 2, 'key_dim': 3},
        input_shape=[(5, 6), (5, 6)]).Instantiate()
    x = tf.constant(test_utils.Rand([2, 5, 6], 4))
    _, got = test_utils.LossAndGrads(
        lambda: tf.reduce_sum(layer.FProp(layer.theta, x, x) ** 2),
        layer.vars.Flatten())
    keras_vars = [w.value for w in layer.keras_object.weights]
    _, want = test_utils.LossAndGrads(
        lambda: tf.reduce_sum(layer.keras_object(x, x) ** 2), keras_vars)
    by_var = dict(zip([id(v) for v in keras_vars], want))
    for var, g in zip(layer.vars.Flatten(), got):
      self.assertAllClose(by_var[id(var)], g, atol=1e-6)
    self.assertLen(layer.vars.Flatten(), 8)   # w0_kernel ... w7_bias.
    # 4 projections [2*5, 6] x [6, 2*3] and scores/context [2, 2, 5, 5, 3].
    meta = KerasLayer.FPropMeta(layer.params, Shape([2, 5, 6]),
                                Shape([2, 5, 6]))
    self.assertEqual(4 * 2 * 10 * 6 * 6 + 2 * 2 * 2 * 2 * 5 * 5 * 3,
                     meta.flops)
    self.assertEqual((Shape([2, 5, 6]),), meta.out_shapes)

  def testWeightsAreSeededByPath(self):
    a, b = [_Dense('ffn', 5, 4).Instantiate() for _ in range(2)]
    c = _Dense('other', 5, 4).Instantiate()
    self.assertAllEqual(a.vars.kernel, b.vars.kernel)
    self.assertNotAllClose(a.vars.kernel, c.vars.kernel)
    self.assertAllEqual(np.zeros([5]), a.vars.bias)   # Keras's 'zeros'.

  def testFlopsAreTheProductsOfTheCall(self):
    b, t, i, o = 3, 5, 4, 7
    meta = KerasLayer.FPropMeta(_Dense('d', o, i), Shape([b, t, i]))
    self.assertEqual(2 * b * t * i * o, meta.flops)   # Bias not counted.
    conv = KerasLayer.Params().Set(
        name='conv', layer=keras.layers.Conv2D, input_shape=(9, 9, 2),
        kwargs={'filters': 4, 'kernel_size': 3})
    meta = KerasLayer.FPropMeta(conv, Shape([b, 9, 9, 2]))
    self.assertEqual((Shape([b, 7, 7, 4]),), meta.out_shapes)
    self.assertEqual(2 * b * 7 * 7 * 4 * (3 * 3 * 2), meta.flops)
    emb = KerasLayer.Params().Set(
        name='emb', layer=keras.layers.Embedding, input_shape=(t,),
        kwargs={'input_dim': 10, 'output_dim': 4})
    meta = KerasLayer.FPropMeta(emb, Shape([b, t]))
    self.assertEqual(((Shape([b, t, 4]),), 0), (meta.out_shapes, meta.flops))
    layer = emb.Instantiate()
    ids = tf.constant([[1, 9], [0, 1]])
    self.assertAllEqual(tf.gather(layer.vars.embeddings, ids),
                        layer.FProp(layer.theta, ids))
    # Unknown batch: unknown FLOPs, shapes still known.
    meta = KerasLayer.FPropMeta(_Dense('d', o, i), Shape([None, i]))
    self.assertEqual((None, Shape([None, o])),
                     (meta.flops, meta.out_shapes[0]))

  def testModelFromAFunctionAndParamsText(self):
    p = KerasLayer.Params().Set(name='net', layer=TwoLayerModel,
                                kwargs={'hidden': 6})
    text = p.ToText()
    self.assertIn(f"layer : function('{__name__}.TwoLayerModel')", text)
    q = KerasLayer.Params().FromText(text)
    self.assertIs(TwoLayerModel, q.layer)
    net = q.Instantiate()
    self.assertEqual(['w0_kernel', 'w1_bias', 'w2_kernel', 'w3_bias'],
                     list(net.vars))
    self.assertEqual([4, 6], net.vars.w0_kernel.shape.as_list())
    x = test_utils.Rand([2, 4], 5)
    self.assertAllClose(net.keras_object(x), net.FProp(net.theta, x),
                        atol=1e-6)
    meta = KerasLayer.FPropMeta(q, Shape([2, 4]))
    self.assertEqual((2 * 2 * (4 * 6 + 6 * 3), (Shape([2, 3]),)),
                     (meta.flops, meta.out_shapes))
    dense = _Dense('d', 5, 4).ToText()
    self.assertIn("layer : type('keras.layers.Dense')", dense)
    self.assertEqual(_Dense('d', 5, 4),
                     KerasLayer.Params().FromText(dense))

  def testInsideRecurrent(self):
    # A Keras Dense as a Recurrent cell: state = tanh(dense([state, x])).
    layer = _Dense('cell', 3, 5, 'tanh').Instantiate()

    def _Cell(theta, state, inputs):
      return NestedMap(h=layer.FProp(
          theta, tf.concat([state.h, inputs.x], -1)))

    xs = tf.constant(test_utils.Rand([4, 2, 2], 6))   # [time, batch, 2]
    h0 = NestedMap(h=tf.zeros([2, 3]))

    def _Unrolled():
      h = h0.h
      for t in range(4):
        h = _Cell(layer.theta, NestedMap(h=h),
                  NestedMap(x=xs[t])).h
      return tf.reduce_sum(h ** 2)

    def _Recurrent():
      _, final = recurrent.Recurrent(layer.theta, h0,
                                     NestedMap(x=xs), _Cell)
      return tf.reduce_sum(final.h ** 2)

    want, want_g = test_utils.LossAndGrads(_Unrolled, layer.vars.Flatten())
    got, got_g = test_utils.LossAndGrads(_Recurrent, layer.vars.Flatten())
    self.assertAllClose(want, got, atol=1e-6)
    for w, g in zip(want_g, got_g):
      self.assertAllClose(w, g, atol=1e-6)

  def testUpdatedWeightsAreAssignedOrRejected(self):
    layer = KerasLayer.Params().Set(name='count', layer=_CountCalls,
                                    input_shape=(2,)).Instantiate()
    layer.FProp(layer.theta, tf.ones([1, 2]))
    layer.FProp(layer.theta, tf.ones([1, 2]))
    self.assertEqual(2.0, float(layer.vars.calls.numpy()))
    theta = layer.theta.Transform(tf.convert_to_tensor)
    with self.assertRaisesRegex(
        ValueError, r"KerasLayer 'count': _CountCalls updated its weight "
        r"'calls' .* but theta holds a tensor there"):
      layer.FProp(theta, tf.ones([1, 2]))

  def testBadParamsNameThePath(self):
    p = KerasLayer.Params().Set(name='ffn', layer=keras.layers.Dense,
                                kwargs={'units': 4})
    with self.assertRaisesRegex(
        ValueError, r"KerasLayer 'ffn'.*input_shape=None is needed to build "
        r'Dense \(it has no keras.Input\)'):
      p.Instantiate()
    with self.assertRaisesRegex(ValueError, r"KerasLayer 'ffn'.*input_shape="
                                r"'4' must give the shape of one example"):
      p.Copy().Set(input_shape='4').Instantiate()
    with self.assertRaisesRegex(ValueError, r"kwargs=\{'unit': 4\} do not fit"
                                r' Dense: .*unit'):
      p.Copy().Set(kwargs={'unit': 4}, input_shape=(3,)).Instantiate()
    with self.assertRaisesRegex(ValueError, r'layer=None must be a '
                                r'keras.layers.Layer class'):
      p.Copy().Set(layer=None).Instantiate()


def _Cluster(k):
  return cluster_lib.Cluster.Params().Set(
      num_devices=k, worker_split_size=k).Instantiate()


class KerasPipelineTest(tf.test.TestCase):

  def testPipelineOfKerasCellsEqualsTheKerasLayersInSequence(self):
    layers = [
        _Dense('fc0', 8, 4, 'relu'),
        KerasLayer.Params().Set(name='norm', input_shape=(8,),
                                layer=keras.layers.LayerNormalization),
        _Dense('fc1', 8, 8, 'tanh'),
        _Dense('fc2', 3, 8),
    ]
    x = tf.constant(test_utils.Rand([4, 4], 7))
    for k, m in itertools.product((1, 2), (1, 2)):
      with self.subTest(k=k, m=m):
        cells = gpipe.PartitionSequentialLayers(layers, k, Shape([4, 4]))
        with _Cluster(k):
          pipe = gpipe.PipeliningLayer.Params().Set(
              name='pipe', cell_tpl=cells,
              num_micro_batches=m).Instantiate()
        kept = [child.keras_object for cell in pipe.children.cells
                for child in cell.children.values()]
        self.assertLen(kept, 4)
        for i, cell in enumerate(pipe.children.cells):   # Cell i on device i.
          for var in cell.vars.Flatten():
            self.assertEqual(f'CPU:{i}', var.device.split('device:')[-1])

        def _Keras(xs=x, objects=kept):   # Plain Keras, its own variables.
          for obj in objects:
            xs = obj(xs)
          return tf.reduce_mean(xs * tf.range(3.0))

        def _Pipelined(p=pipe):
          return tf.reduce_mean(p.FProp(p.theta, x) * tf.range(3.0))

        want, want_g = test_utils.LossAndGrads(_Keras, pipe.vars.Flatten())
        got, got_g = test_utils.LossAndGrads(_Pipelined, pipe.vars.Flatten())
        self.assertAllClose(want, got, atol=1e-5)
        self.assertLen(got_g, 8)
        for w, g in zip(want_g, got_g):
          self.assertAllClose(w, g, atol=1e-5)


if __name__ == '__main__':
  tf.test.main()
