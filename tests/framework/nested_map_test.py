"""Tests for cadence.framework.nested_map."""
import tensorflow as tf

from cadence.framework.nested_map import NestedMap
from cadence.framework import shapes


def _Sample():
  return NestedMap(
      b=tf.constant([1.0, 2.0]),
      a=NestedMap(y=3, x=[4, NestedMap(z=5)]),
      c=(6, 7))


class NestedMapTest(tf.test.TestCase):

  def testAttributeAccessAndErrors(self):
    m = NestedMap(alpha=1)
    m.beta = 2
    self.assertEqual(m['beta'], 2)
    self.assertEqual(m.alpha, 1)
    with self.assertRaisesRegex(AttributeError, r"no key 'alpah'.*Did you mean 'alpha'"):
      _ = m.alpah
    with self.assertRaisesRegex(ValueError, "not a valid identifier"):
      m['1x'] = 3
    with self.assertRaisesRegex(ValueError, "shadows a dict attribute"):
      NestedMap(keys=1)
    del m.alpha
    self.assertNotIn('alpha', m)

  def testFlattenItemsOrderAndPack(self):
    m = _Sample()
    keys = [k for k, _ in m.FlattenItems()]
    self.assertEqual(keys, ['a.x[0]', 'a.x[1].z', 'a.y', 'b', 'c[0]', 'c[1]'])
    leaves = m.Flatten()
    self.assertEqual(leaves[0], 4)
    packed = m.Pack(list(range(len(leaves))))
    self.assertEqual(packed.a.x[1].z, 1)
    self.assertIsInstance(packed.c, tuple)
    self.assertIsInstance(packed.a, NestedMap)
    with self.assertRaisesRegex(ValueError, 'structure has 6 leaves, got 2'):
      m.Pack([1, 2])

  def testTransformAndFilter(self):
    m = NestedMap(a=1, b=NestedMap(c=2, d=3), e=[4, 5])
    doubled = m.Transform(lambda v: v * 2)
    self.assertEqual(doubled.b.d, 6)
    self.assertEqual(doubled.e, [8, 10])
    odd = m.Filter(lambda v: v % 2 == 1)
    self.assertEqual(odd, NestedMap(a=1, b=NestedMap(d=3), e=[5]))
    self.assertEqual(m.Filter(lambda v: False), NestedMap())

  def testShapesAreLeaves(self):
    m = NestedMap(x=shapes.Shape([2, 3]), y=NestedMap(z=shapes.Shape([4])))
    self.assertEqual([shapes.Shape([2, 3]), shapes.Shape([4])], m.Flatten())
    doubled = m.Transform(lambda s: s.WithDim(0, 2 * s[0]))
    self.assertEqual(shapes.Shape([4, 3]), doubled.x)
    self.assertEqual(shapes.Shape([8]), doubled.y.z)
    # Plain tuples are still containers.
    self.assertEqual([1, 2], NestedMap(t=(1, 2)).Flatten())

  def testIsCompatible(self):
    m = NestedMap(a=1, b=NestedMap(c=2))
    self.assertTrue(m.IsCompatible(NestedMap(a='x', b=NestedMap(c='y'))))
    self.assertFalse(m.IsCompatible(NestedMap(a=1, b=NestedMap(d=2))))
    self.assertFalse(m.IsCompatible(NestedMap(a=1)))
    self.assertFalse(m.IsCompatible({'a': 1, 'b': {'c': 2}}))

  def testTfNestRoundTrip(self):
    m = _Sample()
    out = tf.nest.map_structure(lambda v: v, m)
    self.assertIsInstance(out, NestedMap)
    self.assertIsInstance(out.a, NestedMap)
    self.assertLen(tf.nest.flatten(m), len(m.Flatten()))

  def testInsideTfFunction(self):

    @tf.function
    def Fn(m):
      return NestedMap(s=m.x + m.sub.y, d=m.x * 2.0)

    out = Fn(NestedMap(x=tf.constant(2.0), sub=NestedMap(y=tf.constant(3.0))))
    self.assertIsInstance(out, NestedMap)
    self.assertAllClose(out.s, 5.0, atol=0)
    self.assertAllClose(out.d, 4.0, atol=0)

  def testWhileLoopState(self):
    state = NestedMap(i=tf.constant(0), acc=NestedMap(v=tf.constant(0.0)))
    final = tf.while_loop(
        lambda s: s.i < 3,
        lambda s: [NestedMap(i=s.i + 1, acc=NestedMap(v=s.acc.v + 1.5))],
        [state])[0]
    self.assertIsInstance(final, NestedMap)
    self.assertAllClose(final.acc.v, 4.5, atol=0)

  def testDebugStringAndDeepCopy(self):
    m = NestedMap(w=tf.zeros([2, 3]), n=NestedMap(k=7))
    text = m.DebugString()
    self.assertRegex(text, r'n\.k\s+7')
    self.assertRegex(text, r'w\s+float32\[2, 3\]')
    c = m.DeepCopy()
    c.n.k = 8
    self.assertEqual(m.n.k, 7)
    self.assertIsInstance(m.copy(), NestedMap)


if __name__ == '__main__':
  tf.test.main()
