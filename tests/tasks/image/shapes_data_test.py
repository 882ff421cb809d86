"""Tests for tasks/image/shapes_data.py and tasks/image/input_generator.py."""
import numpy as np
import tensorflow as tf

from cadence.tasks.image import input_generator
from cadence.tasks.image import shapes_data


class ShapesDataTest(tf.test.TestCase):

  def testExampleDependsOnlyOnSeedAndIndex(self):
    images, labels = shapes_data.DrawShapes(6, [16, 12], seed=3)
    later, later_labels = shapes_data.DrawShapes(2, [16, 12], seed=3,
                                                 first_example=4)
    self.assertAllEqual(images[4:], later)
    self.assertAllEqual(labels[4:], later_labels)
    self.assertEqual((6, 16, 12, 3), images.shape)
    self.assertEqual(np.uint8, images.dtype)
    other, _ = shapes_data.DrawShapes(6, [16, 12], seed=4)
    self.assertFalse(np.array_equal(images, other))

  def testEveryClassIsDrawnAndCoversPixels(self):
    _, labels = shapes_data.DrawShapes(400, [8, 8], seed=1)
    counts = np.bincount(labels, minlength=len(shapes_data.CLASSES))
    self.assertLen(counts, 10)
    self.assertGreater(counts.min(), 20)          # ~40 each
    ys, xs = np.mgrid[-1:1:41j, -1:1:41j]
    areas = {k: shapes_data._Mask(k, xs, ys).mean()
             for k in shapes_data.CLASSES}
    for kind, area in areas.items():
      self.assertBetween(area, 0.1, 0.9, kind)
    # A ring is a circle with a hole; a frame a square with one.
    self.assertLess(areas['ring'], areas['circle'])
    self.assertLess(areas['frame'], areas['square'])


class ShapesInputTest(tf.test.TestCase):

  def testBatches(self):
    p = input_generator.ShapesInput.Params().Set(
        image_size=[8, 8], num_examples=10, batch_size=4,
        fixed_input_shape=True, repeat=False, shuffle=False, data_seed=5)
    batches = list(p.Instantiate().Dataset())
    self.assertLen(batches, 2)                    # 10 // 4, remainder dropped
    images, labels = shapes_data.DrawShapes(4, [8, 8], seed=5)
    self.assertAllClose(images / 127.5 - 1.0, batches[0].image, atol=1e-6)
    self.assertAllEqual(labels, batches[0].label)
    shapes = input_generator.ShapesInput.BatchShapes(p)
    self.assertEqual([4, 8, 8, 3], list(shapes.image))
    with self.assertRaisesRegex(ValueError, r"ShapesInput 'input': "
                                r'image_size=\[8\] must be a list of 2'):
      p.Copy().Set(image_size=[8]).Instantiate()


if __name__ == '__main__':
  tf.test.main()
