"""Tests for cadence.framework.pipeline.microbatch: cutting and stitching
batches."""
import itertools

import numpy as np
import tensorflow as tf

from cadence.framework.nested_map import NestedMap
from cadence.framework.pipeline import microbatch


class CountTest(tf.test.TestCase):

  def testEveryWayOfSayingIt(self):
    # Exhaustive over small batches: exactly the (m, size) with m * size ==
    # batch are accepted, whichever knob(s) say it.
    for batch, m, size in itertools.product(range(1, 13), [None, 1, 2, 3, 4],
                                            [None, 1, 2, 3, 4]):
      want = None
      if m is None and size is None:
        want = (1, batch)
      elif size is None:
        want = (m, batch // m) if batch % m == 0 else None
      elif m is None:
        want = (batch // size, size) if batch % size == 0 else None
      elif m * size == batch:
        want = (m, size)
      with self.subTest(batch=batch, m=m, size=size):
        if want is None:
          with self.assertRaisesRegex(ValueError, rf'batch {batch} \(inputs '
                                      r'dim batch_dim=0\)'):
            microbatch.Count('pipe', batch, m, size)
        else:
          self.assertEqual(want, microbatch.Count('pipe', batch, m, size))

  def testMessagesNameTheKnob(self):
    with self.assertRaisesRegex(
        ValueError, r'^pipe: num_micro_batches=3 does not divide batch 32 '
        r'\(inputs dim batch_dim=1\)\.$'):
      microbatch.Count('pipe', 32, 3, batch_dim=1)
    with self.assertRaisesRegex(
        ValueError, r'^pipe: micro_batch_size=5 \* num_micro_batches=4 = 20 '
        r'!= batch 32'):
      microbatch.Count('pipe', 32, 4, 5)
    with self.assertRaisesRegex(ValueError, r'num_micro_batches=0 must be '
                                r'None or an int >= 1'):
      microbatch.Count('pipe', 32, 0)


class SplitConcatTest(tf.test.TestCase):

  def testRoundTripAndOrder(self):
    rng = np.random.default_rng(0)
    for batch_dim, m in itertools.product((0, 1), (1, 2, 4)):
      x = rng.normal(size=[8, 8, 3]).astype(np.float32)
      pads = rng.integers(0, 2, size=[8, 8]).astype(np.float32)
      state = NestedMap(x=tf.constant(x), nested=NestedMap(p=tf.constant(
          pads)))
      parts = microbatch.Slice(state, m, batch_dim)
      self.assertLen(parts, m)
      size = 8 // m
      for j, part in enumerate(parts):
        self.assertAllEqual(np.take(x, range(j * size, (j + 1) * size),
                                    axis=batch_dim), part.x)
        self.assertAllEqual(np.take(pads, range(j * size, (j + 1) * size),
                                    axis=batch_dim), part.nested.p)
      whole = microbatch.Concat(parts, batch_dim)
      self.assertAllEqual(x, whole.x)
      self.assertAllEqual(pads, whole.nested.p)


if __name__ == '__main__':
  tf.test.main()
