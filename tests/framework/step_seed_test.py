"""Tests for cadence.framework.step_seed."""
import numpy as np
import tensorflow as tf

from cadence.framework import step_seed


def _Mask(seed):
  return tf.random.stateless_uniform([64], seed=seed).numpy()


class StepSeedTest(tf.test.TestCase):

  def testDeterministic(self):
    a = step_seed.LayerSeed(step_seed.MakeStepSeed(7, 1), 'x.y', 0)
    b = step_seed.LayerSeed(step_seed.MakeStepSeed(7, 1), 'x.y', 0)
    self.assertAllEqual(a, b)
    self.assertEqual(a.dtype, tf.int64)
    self.assertEqual(a.shape, [2])

  def testEveryComponentChangesTheMask(self):
    base = _Mask(step_seed.LayerSeed(step_seed.MakeStepSeed(7, 1), 'x.y', 0))
    variants = [
        step_seed.LayerSeed(step_seed.MakeStepSeed(8, 1), 'x.y', 0),
        step_seed.LayerSeed(step_seed.MakeStepSeed(7, 2), 'x.y', 0),
        step_seed.LayerSeed(step_seed.MakeStepSeed(7, 1), 'x.z', 0),
        step_seed.LayerSeed(step_seed.MakeStepSeed(7, 1), 'x.y', 1),
        step_seed.LayerSeed(
            step_seed.MicroBatchSeed(step_seed.MakeStepSeed(7, 1), 0), 'x.y'),
    ]
    masks = [_Mask(v) for v in variants]
    for m in masks:
      self.assertFalse(np.allclose(m, base))
    # Micro-batch seeds differ from one another.
    s = step_seed.MakeStepSeed(3)
    mb = [_Mask(step_seed.MicroBatchSeed(s, i)) for i in range(4)]
    for i in range(4):
      for j in range(i + 1, 4):
        self.assertFalse(np.allclose(mb[i], mb[j]))

  def testTensorStepInsideFunction(self):

    @tf.function
    def Fn(step):
      return step_seed.MicroBatchSeed(step_seed.MakeStepSeed(step), 2)

    self.assertAllEqual(
        Fn(tf.constant(5, tf.int64)),
        step_seed.MicroBatchSeed(step_seed.MakeStepSeed(5), 2))

  def testPathHashIsStable(self):
    # crc32 is fixed by definition: independent of PYTHONHASHSEED.
    self.assertEqual(step_seed.PathHash('abc'), 0x352441C2)

  def testCheckStepSeed(self):
    with self.assertRaisesRegex(ValueError, "Drop 'm.d'.*carries no step seed"):
      step_seed.CheckStepSeed(None, "Drop 'm.d'")
    with self.assertRaisesRegex(ValueError, r'shape \[2\]; got \(3,\)'):
      step_seed.CheckStepSeed(tf.constant([1, 2, 3]), 'x')


if __name__ == '__main__':
  tf.test.main()
