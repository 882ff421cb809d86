"""Tests for cadence.framework.shapes."""
import tensorflow as tf

from cadence.framework import shapes


class ShapesTest(tf.test.TestCase):

  def testBasics(self):
    s = shapes.Shape([None, 128, 512])
    self.assertEqual(s.rank, 3)
    self.assertEqual(s[-1], 512)
    self.assertIsNone(s.num_elements())
    self.assertFalse(s.is_fully_defined)
    self.assertEqual(s[1:], shapes.Shape([128, 512]))
    self.assertIsInstance(s[1:], shapes.Shape)
    self.assertEqual(s, (None, 128, 512))
    self.assertEqual(s.WithDim(0, 4).num_elements(), 4 * 128 * 512)
    self.assertEqual(s + (3,), shapes.Shape([None, 128, 512, 3]))

  def testTensorShapeRoundTrip(self):
    for dims in ([], [3], [None, 4], [2, None, 5]):
      ts = tf.TensorShape(dims)
      s = shapes.Shape.FromTensorShape(ts)
      self.assertEqual(s.ToTensorShape().as_list(), ts.as_list())
    self.assertEqual(shapes.AsShape(tf.zeros([2, 3])), (2, 3))
    self.assertEqual(shapes.AsShape([1, 2]), (1, 2))

  def testBadDims(self):
    with self.assertRaisesRegex(ValueError, r"non-negative ints or None; got -1"):
      shapes.Shape([2, -1])
    with self.assertRaisesRegex(ValueError, r"got 1.5"):
      shapes.Shape([1.5])
    with self.assertRaisesRegex(ValueError, 'known rank'):
      shapes.Shape(tf.TensorShape(None))

  def testArithmetic(self):
    self.assertEqual(shapes.Mul(2, 3, 4), 24)
    self.assertIsNone(shapes.Mul(2, None))
    self.assertEqual(shapes.Add(1, 2), 3)
    self.assertIsNone(shapes.Add(1, None))


if __name__ == '__main__':
  tf.test.main()
