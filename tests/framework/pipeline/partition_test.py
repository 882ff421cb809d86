"""Tests for cadence.framework.pipeline.partition: the optimal contiguous
cut, against brute force."""
import itertools

import numpy as np
import tensorflow as tf

from cadence.framework.pipeline import partition


class BalancedPartitionTest(tf.test.TestCase):

  def _BruteForce(self, costs, k):
    n = len(costs)
    best = None
    for cuts in itertools.combinations(range(1, n), k - 1):
      bounds = [0, *cuts, n]
      worst = max(sum(costs[a:b]) for a, b in zip(bounds, bounds[1:]))
      best = worst if best is None else min(best, worst)
    return best

  def testOptimalAgainstBruteForce(self):
    cases = [list(c) for n in range(1, 5)
             for c in itertools.product((0, 1, 3), repeat=n)]
    rng = np.random.RandomState(0)
    cases += [list(rng.randint(0, 20, size=rng.randint(5, 9)))
              for _ in range(60)]
    for costs in cases:
      for k in range(1, len(costs) + 1):
        bounds = partition.BalancedPartition(costs, k)
        self.assertLen(bounds, k + 1)
        self.assertEqual(0, bounds[0])
        self.assertEqual(len(costs), bounds[-1])
        self.assertTrue(all(a < b for a, b in zip(bounds, bounds[1:])))
        worst = max(sum(costs[a:b]) for a, b in zip(bounds, bounds[1:]))
        self.assertEqual(self._BruteForce(costs, k), worst, (costs, k))

  def testTooManyParts(self):
    with self.assertRaisesRegex(ValueError, r'num_parts=4 must be in \[1, 3\]'):
      partition.BalancedPartition([1, 2, 3], 4)
