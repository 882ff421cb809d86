"""Tests for cadence.framework.base_layer: the BaseLayer contract."""
import numpy as np
import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import cost
from cadence.framework import shapes
from cadence.framework import step_seed


class ScaleLayer(base_layer.BaseLayer):
  """y = x * w + b, with an optional stateless noise term."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('dim', 0, 'Depth of the input.')
    p.Define('noise', 0.0, 'Stddev of stateless noise added in training.')
    return p

  def __init__(self, params):
    super().__init__(params)
    if self.params.dim <= 0:
      raise ValueError(f"ScaleLayer '{self.path}': dim={self.params.dim} must be > 0")
    self.CreateVariable('w', base_layer.WeightParams([self.params.dim]))
    self.CreateVariable(
        'b', base_layer.WeightParams([self.params.dim],
                                     base_layer.WeightInit.Constant(0.5)))

  def FProp(self, theta, inputs):
    out = inputs * theta.w + theta.b
    if self.params.noise and not self.params.is_inference:
      out += self.params.noise * tf.random.stateless_normal(
          tf.shape(out), seed=self.OpSeed(theta))
    return out

  @classmethod
  def FPropMeta(cls, p, inputs):
    shape = shapes.AsShape(inputs)
    return cost.Cost(flops=shapes.Mul(2, shape.num_elements()),
                     out_shapes=(shape,))


class TwoScales(base_layer.BaseLayer):
  """Parent of a named child and a list of children."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('dim', 2, 'Depth.')
    p.Define('first_tpl', ScaleLayer.Params(), 'First child template.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.first = self.CreateChild('first', p.first_tpl.Copy().Set(dim=p.dim))
    self.rest = self.CreateChildren(
        'rest', [ScaleLayer.Params().Set(dim=p.dim)] * 2)
    with tf.device('/cpu:1'):
      self.CreateVariable('v', base_layer.WeightParams([p.dim, p.dim]))

  def FProp(self, theta, inputs):
    x = self.first.FProp(theta.first, inputs)
    for layer, th in zip(self.rest, theta.rest):
      x = layer.FProp(th, x)
    return tf.matmul(x, theta.v)


class NoMeta(base_layer.BaseLayer):
  pass


class LateChild(ScaleLayer):

  def AddLater(self):
    return self.CreateChild('late', ScaleLayer.Params().Set(dim=1))


class Lingvoish(base_layer.BaseLayer):
  """Children built without assigning them; FProp reaches them as
  attributes, as Lingvo layers do (`self.fc.FProp(theta.fc, x)`)."""

  def __init__(self, params):
    super().__init__(params)
    self.CreateChild('fc', ScaleLayer.Params().Set(dim=2), device='/cpu:1')
    self.CreateChildren('more', [ScaleLayer.Params().Set(dim=2)] * 2,
                        devices=['/cpu:2', None])

  def FProp(self, theta, inputs):
    x = self.fc.FProp(theta.fc, inputs)
    return self.more[1].FProp(theta.more[1], x)


def _Build(**kw):
  return TwoScales.Params().Set(name='top', **kw).Instantiate()


class BaseLayerTest(tf.test.TestCase):

  def testParamsAreFrozenCopies(self):
    p = TwoScales.Params().Set(name='top', dim=3)
    layer = p.Instantiate()
    p.dim = 5
    self.assertEqual(layer.params.dim, 3)
    with self.assertRaisesRegex(TypeError, 'frozen'):
      layer.params.dim = 4

  def testPathsChildrenAndStructures(self):
    layer = _Build()
    self.assertEqual(layer.path, 'top')
    self.assertEqual(layer.first.path, 'top.first')
    self.assertEqual(layer.children.rest[1].path, 'top.rest[1]')
    self.assertEqual(sorted(layer.children.keys()), ['first', 'rest'])
    keys = [k for k, _ in layer.vars.FlattenItems()]
    self.assertEqual(keys, ['first.b', 'first.w', 'rest[0].b', 'rest[0].w',
                            'rest[1].b', 'rest[1].w', 'v'])
    self.assertTrue(layer.vars.IsCompatible(layer.theta))
    self.assertLen(layer.trainable_variables, 7)

  def testChildrenInheritDefaultsOnly(self):
    init = base_layer.WeightInit.Gaussian(0.1)
    layer = _Build(random_seed=9, params_init=init, is_inference=True,
                   first_tpl=ScaleLayer.Params().Set(random_seed=3))
    self.assertEqual(layer.first.params.random_seed, 3)  # set: kept.
    self.assertEqual(layer.rest[0].params.random_seed, 9)  # default: inherited.
    self.assertEqual(layer.rest[0].params.params_init, init)
    self.assertTrue(layer.rest[1].params.is_inference)

  def testChildrenAreAttributesAndPlacedOnTheirDevice(self):
    layer = Lingvoish.Params().Set(name='l').Instantiate()
    self.assertIs(layer.fc, layer.children.fc)
    self.assertIs(layer.more[1], layer.children.more[1])
    x = tf.constant([1.0, 2.0])
    want = layer.more[1](layer.fc(x))
    self.assertAllClose(want, layer(x))
    self.assertIn('CPU:1', layer.vars.fc.w.device)
    self.assertIn('CPU:2', layer.vars.more[0].w.device)
    self.assertIn('CPU:0', layer.vars.more[1].w.device)
    with self.assertRaisesRegex(AttributeError, "has no attribute 'fcc'"):
      _ = layer.fcc

  def testCreateChildrenNeedsOneDevicePerChild(self):

    class Bad(base_layer.BaseLayer):

      def __init__(self, params):
        super().__init__(params)
        self.CreateChildren('x', [ScaleLayer.Params().Set(dim=1)] * 2,
                            devices=['/cpu:0'])

    with self.assertRaisesRegex(ValueError, r"Bad 'b': CreateChildren\('x'\) "
                                'got 1 devices for 2 children'):
      Bad.Params().Set(name='b').Instantiate()

  def testVariablePlacementFollowsScope(self):
    layer = _Build()
    self.assertIn('CPU:1', layer.vars.v.device)
    self.assertIn('CPU:0', layer.vars.first.w.device)

  def testInitIsDeterministicPerPathAndSeed(self):
    a, b = _Build(random_seed=1), _Build(random_seed=1)
    self.assertAllEqual(a.vars.rest[0].w, b.vars.rest[0].w)
    # Siblings of identical shape get different draws (path is in the seed).
    self.assertNotAllClose(a.vars.rest[0].w, a.vars.rest[1].w)
    c = _Build(random_seed=2)
    self.assertNotAllClose(a.vars.v, c.vars.v)
    self.assertAllEqual(a.vars.first.b, [0.5, 0.5])

  def testFPropMatchesNumpyAndDefaultTheta(self):
    layer = _Build(dim=2)
    x = np.array([[1.0, -2.0], [0.5, 3.0]], np.float32)
    expected = x
    for name in ('first', 'rest[0]', 'rest[1]'):
      v = dict(layer.vars.FlattenItems())
      expected = expected * v[f'{name}.w'].numpy() + v[f'{name}.b'].numpy()
    expected = expected @ layer.vars.v.numpy()
    self.assertAllClose(layer(x), expected, atol=1e-6)
    self.assertAllClose(layer.FPropDefaultTheta(x), expected, atol=1e-6)
    # FProp is a pure function of theta: substitute tensors for variables.
    theta = layer.theta.Transform(tf.zeros_like)
    self.assertAllClose(layer.FProp(theta, x), np.zeros_like(x), atol=0)

  def testEagerEqualsFunctionAndGradients(self):
    layer = _Build()
    x = tf.constant([[1.0, 2.0]])
    fn = tf.function(layer.FProp)
    self.assertAllClose(layer.FProp(layer.theta, x), fn(layer.theta, x),
                        atol=1e-6)
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(layer(x) ** 2)
    grads = tape.gradient(loss, layer.vars)
    for key, g in grads.FlattenItems():
      self.assertIsNotNone(g, key)
      self.assertTrue(np.all(np.isfinite(g.numpy())), key)

  def testCreateAfterConstructionFails(self):
    layer = LateChild.Params().Set(name='s', dim=1).Instantiate()
    with self.assertRaisesRegex(
        RuntimeError, r"LateChild 's': CreateChild\('late'\) is only allowed "
        'inside __init__'):
      layer.AddLater()

  def testBadParams(self):
    with self.assertRaisesRegex(ValueError, "ScaleLayer 'top.first': dim=0"):
      _Build(dim=0)
    with self.assertRaisesRegex(ValueError, "params.name='a b' must be a Python"):
      ScaleLayer.Params().Set(name='a b', dim=1).Instantiate()
    with self.assertRaisesRegex(AttributeError, "did you mean 'dim'"):
      ScaleLayer.Params().Set(dimm=1)

  def testParamsEveryLayerHasAreChecked(self):
    xavier = ("must be one of 'constant', 'gaussian', 'uniform', "
              "'truncated_gaussian', 'xavier', 'gaussian_sqrt_dim', "
              "'uniform_sqrt_dim', 'gaussian_sqrt_fanout'.")
    for field, value, rule in (
        ('is_inference', 'yes', 'must be True or False.'),
        ('random_seed', '7', 'must be None or an int >= 0.'),
        ('random_seed', -1, 'must be None or an int >= 0.'),
        ('params_init.method', 'Xavier', f"{xavier} Did you mean 'xavier'?"),
        ('params_init.method', 'he', xavier)):
      with self.subTest(field=field, value=value):
        want = f"TwoScales 'top': {field}={value!r} {rule}"
        with self.assertRaisesWithLiteralMatch(ValueError, want):
          _Build(**{field: value})
        # Also from params alone (FPropMeta calls CheckParams first).
        p = TwoScales.Params().Set(name='top', **{field: value})
        with self.assertRaisesWithLiteralMatch(ValueError, want):
          TwoScales.CheckParams(p, "TwoScales 'top'")

  def testFPropMeta(self):
    meta = ScaleLayer.FPropMeta(ScaleLayer.Params(), shapes.Shape([4, 3]))
    self.assertEqual(meta.flops, 24)
    self.assertEqual(meta.out_shapes, (shapes.Shape([4, 3]),))
    meta = ScaleLayer.FPropMeta(ScaleLayer.Params(), [None, 3])
    self.assertIsNone(meta.flops)
    with self.assertRaisesRegex(NotImplementedError, 'NoMeta does not implement FPropMeta'):
      NoMeta.FPropMeta(NoMeta.Params(), [1])

  def testFPropCost(self):
    # FPropMeta completed by cost.Complete, bytes in the activation dtype:
    # input and output [4, 3], 12 elements each.
    for fprop_dtype, size in ((None, 4), (tf.bfloat16, 2)):
      p = ScaleLayer.Params().Set(fprop_dtype=fprop_dtype)
      c = base_layer.FPropCost(p, shapes.Shape([4, 3]))
      self.assertIsInstance(c, cost.Cost)
      self.assertEqual((c.flops, c.bwd_flops), (24, 48))
      self.assertEqual((c.act, c.act_weights, c.residuals, c.transient),
                       (24 * size, 24 * size, 24 * size, 12 * size))
      self.assertEqual(c.defaulted, ('bwd_flops', 'act', 'act_weights',
                                     'residuals', 'transient', 'act_outputs',
                                     'act_inputs', 'ops'))
    self.assertIsNone(base_layer.FPropCost(p, [None, 3]).act)

  def testStepSeedReplaysNoise(self):
    layer = ScaleLayer.Params().Set(name='n', dim=4, noise=1.0).Instantiate()
    x = tf.ones([3, 4])
    with self.assertRaisesRegex(ValueError, "ScaleLayer 'n'.*no step seed"):
      layer(x)
    s5 = step_seed.MakeStepSeed(5)
    theta5 = base_layer.WithStepSeed(layer.theta, s5)
    self.assertAllEqual(layer.FProp(theta5, x), layer.FProp(theta5, x))
    theta6 = base_layer.WithStepSeed(layer.theta, step_seed.MakeStepSeed(6))
    self.assertNotAllClose(layer.FProp(theta5, x), layer.FProp(theta6, x))
    theta_mb = base_layer.WithStepSeed(layer.theta,
                                       step_seed.MicroBatchSeed(s5, 1))
    self.assertNotAllClose(layer.FProp(theta5, x), layer.FProp(theta_mb, x))
    # Inference: no randomness, no seed needed.
    inf = ScaleLayer.Params().Set(name='n', dim=4, noise=1.0,
                                  is_inference=True).Instantiate()
    self.assertAllClose(inf(x), x * inf.vars.w + 0.5, atol=1e-6)

  def testWithStepSeedReachesEveryLevel(self):
    layer = _Build()
    seed = step_seed.MakeStepSeed(1)
    theta = base_layer.WithStepSeed(layer.theta, seed)
    self.assertIs(theta.step_seed, seed)
    self.assertIs(theta.first.step_seed, seed)
    self.assertIs(theta.rest[1].step_seed, seed)
    self.assertIs(theta.v, layer.vars.v)
    self.assertNotIn('step_seed', layer.theta)

  def testCheckpointRoundTrip(self):
    layer = _Build(random_seed=1)
    ckpt = tf.train.Checkpoint(model=layer)
    path = ckpt.write(self.get_temp_dir() + '/ckpt')
    other = _Build(random_seed=2)
    tf.train.Checkpoint(model=other).read(path).assert_consumed()
    for (k, a), (_, b) in zip(layer.vars.FlattenItems(),
                              other.vars.FlattenItems()):
      self.assertAllEqual(a, b, msg=k)

  def testBfloat16Fprop(self):
    layer = ScaleLayer.Params().Set(name='s', dim=2,
                                    fprop_dtype=tf.bfloat16).Instantiate()
    self.assertEqual(layer.vars.w.dtype, tf.float32)
    self.assertEqual(layer.fprop_dtype, tf.bfloat16)
    self.assertEqual(layer.CastToFPropDtype(tf.ones([2])).dtype, tf.bfloat16)
    self.assertEqual(layer.CastToFPropDtype(tf.ones([2], tf.int32)).dtype,
                     tf.int32)

  def testFPropAndAccumulationDtypes(self):
    p = ScaleLayer.Params()
    self.assertEqual(base_layer.FPropDtype(p), tf.float32)
    self.assertEqual(base_layer.FPropDtype(p.Set(fprop_dtype=tf.bfloat16)),
                     tf.bfloat16)
    self.assertEqual(base_layer.FPropDtype(p.Set(fprop_dtype=None,
                                                 dtype=tf.float64)),
                     tf.float64)
    for dtype, want in ((tf.bfloat16, tf.float32), (tf.float16, tf.float32),
                        (tf.float32, tf.float32), (tf.float64, tf.float64)):
      self.assertEqual(base_layer.AccumulationDtype(dtype), want)
    # One knob at the top: the children inherit it, variables stay float32.
    layer = _Build(fprop_dtype=tf.bfloat16)
    for child in [layer.first] + layer.rest:
      self.assertEqual(child.fprop_dtype, tf.bfloat16)
    self.assertEqual({v.dtype for v in layer.vars.Flatten()}, {tf.float32})

  def testBadDtypesNameTheFieldTheValueAndTheChoices(self):
    choices = (r'must be one of None, tf\.float32, tf\.bfloat16 \(tf\.float16 '
               r'is not supported: .*loss scaling; use tf\.bfloat16\)\.')
    owner = r"^TwoScales 'top': "
    for value, want in (
        ('bfloat16', rf"fprop_dtype='bfloat16' {choices} Did you mean "
         r'tf\.bfloat16 \(a dtype, not a string\)\?$'),
        ('tf.bfloat17', rf"fprop_dtype='tf\.bfloat17' {choices} Did you mean "
         r'tf\.bfloat16\?$'),
        (tf.int32, rf'fprop_dtype=tf\.int32 {choices}$'),
        (tf.float16, rf'fprop_dtype=tf\.float16 {choices}$'),
        (3, rf'fprop_dtype=3 {choices}$')):
      with self.subTest(value=value):
        with self.assertRaisesRegex(ValueError, owner + want):
          _Build(fprop_dtype=value)
    with self.assertRaisesRegex(ValueError, owner + r'dtype=tf\.int32 must be '
                                r'one of tf\.float32, tf\.float64\.$'):
      _Build(dtype=tf.int32)
    # What is allowed builds, children included.
    for fprop in base_layer.FPROP_DTYPES:
      self.assertEqual(_Build(fprop_dtype=fprop).first.fprop_dtype,
                       fprop or tf.float32)


if __name__ == '__main__':
  tf.test.main()
