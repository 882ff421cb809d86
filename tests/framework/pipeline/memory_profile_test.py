"""Tests for memory_profile: per-device peaks from allocator events."""
import tensorflow as tf

from cadence.framework.pipeline import memory_profile

_MIB = 2**20
_CPU0, _CPU1 = '/device:CPU:0', '/device:CPU:1'


class PeaksTest(tf.test.TestCase):

  def testPeaksPerDevice(self):
    placement = {'a': 'd0', 'b': 'd1', 'c': 'd0'}
    events = [(1, 100, 1, 'a'), (2, 50, 2, 'b'), (3, 30, 3, 'c'),
              (4, -100, 1, ''), (5, 70, 4, 'a'), (6, -30, 3, ''),
              (7, -40, 9, ''),       # Allocated before the profile: ignored.
              (8, 5, 5, 'unknown_op')]
    # d0: 100, 130, 30, 100, 70 -> 130; d1: 50.
    with tf.device(_CPU1):
      v = tf.Variable(tf.zeros([10], tf.float32))
    self.assertEqual({'CPU:0': 7, 'CPU:1': 40 + 9, memory_profile.UNATTRIBUTED:
                      5}, memory_profile.DeviceTotals(
                          {'/device:CPU:0': 7, '/device:CPU:1': 9,
                           memory_profile.UNATTRIBUTED: 5}, [v]))
    self.assertEqual({'d0': 130, 'd1': 50, memory_profile.UNATTRIBUTED: 5},
                     memory_profile.Peaks(events, placement))
    # The batch the step is called with, made before it: on its device.
    with tf.device(_CPU0):
      batch = dict(x=tf.zeros([4, 3], tf.float32), y=tf.zeros([4], tf.int64))
    self.assertEqual({'CPU:0': 7 + 4 * 3 * 4 + 4 * 8, 'CPU:1': 40 + 9},
                     memory_profile.DeviceTotals(
                         {'/device:CPU:0': 7, '/device:CPU:1': 9}, [v],
                         batch))

  def testRealStep(self):
    # Known buffers on two logical CPUs: on CPU:1, x and y (1 MiB each) are
    # alive together (one op reads both); on CPU:0 a (256 KiB).
    @tf.function
    def Step(seed):
      with tf.device(_CPU1):
        x = tf.random.stateless_uniform([1024, 256], seed)
        y = x * 2.0
        s1 = tf.reduce_sum(y * x)   # One op reads both: alive together.
      with tf.device(_CPU0):
        a = tf.random.stateless_uniform([256, 256], seed)
        s0 = tf.reduce_sum(a * 3.0) + tf.reduce_sum(a)
      return s0 + s1

    seed = tf.constant([1, 2])
    placement = memory_profile.Placement(lambda: Step(seed).numpy())
    peaks = memory_profile.DevicePeaks(lambda: Step(seed).numpy(), placement)
    # No variable: the totals are the peaks, by short device name.
    by_device = memory_profile.DeviceTotals(peaks, [])
    self.assertBetween(by_device['CPU:1'], 2 * _MIB, 3 * _MIB)
    self.assertBetween(by_device['CPU:0'], _MIB // 4, _MIB)
    self.assertLess(peaks.get(memory_profile.UNATTRIBUTED, 0), _MIB // 16)
    with self.assertRaisesRegex(ValueError, 'instantiated no graph'):
      memory_profile.Placement(lambda: Step(seed).numpy())   # Traced before.

  def testNoEvents(self):
    with self.assertRaisesRegex(ValueError, 'no allocator event'):
      memory_profile.DevicePeaks(lambda: None, {})


if __name__ == '__main__':
  tf.test.main()
