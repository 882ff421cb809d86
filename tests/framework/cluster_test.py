"""Tests for cadence.framework.cluster."""
import tensorflow as tf

from cadence.framework import cluster as cluster_lib

Cluster = cluster_lib.Cluster


def _Cpus(n, split):
  return Cluster.Params().Set(device_type='CPU', num_devices=n,
                              worker_split_size=split).Instantiate()


class ClusterTest(tf.test.TestCase):

  def testOneTwoAndFourLogicalCpus(self):
    for n, split in ((1, 1), (2, 2), (2, 1), (4, 4), (4, 2), (4, 1)):
      with self.subTest(n=n, split=split):
        c = _Cpus(n, split)
        self.assertEqual([f'/device:CPU:{i}' for i in range(n)], c.devices)
        self.assertEqual(split, c.num_devices_per_split)
        self.assertEqual(n // split, c.num_splits)
        self.assertEqual(
            [[f'/device:CPU:{s * split + i}' for i in range(split)]
             for s in range(n // split)], c.split_devices)
        for s in range(c.num_splits):
          for i in range(split):
            device = c.WorkerDeviceInModelSplit(i, split=s)
            self.assertEqual(f'/device:CPU:{s * split + i}', device)
            with tf.device(device):     # The device exists and runs ops.
              y = tf.constant(2.0) * 3.0
            self.assertEqual(device, tf.DeviceSpec.from_string(
                y.device).replace(job=None, replica=None,
                                  task=None).to_string())

  def testDefaultNumDevicesIsEveryVisibleLogicalDevice(self):
    c = Cluster.Params().Set(worker_split_size=2).Instantiate()
    self.assertEqual(len(tf.config.list_logical_devices('CPU')),
                     len(c.devices))

  def testExplicitDevicesAreCanonicalised(self):
    c = Cluster.Params().Set(devices=['/cpu:1', '/CPU:0'],
                             worker_split_size=2).Instantiate()
    self.assertEqual(['/device:CPU:1', '/device:CPU:0'], c.devices)
    self.assertEqual('/device:CPU:0', c.WorkerDeviceInModelSplit(1))

  def testJobDevices(self):
    c = Cluster.Params().Set(job='worker', task=1, device_type='GPU',
                             num_devices=2, worker_split_size=2).Instantiate()
    self.assertEqual(['/job:worker/replica:0/task:1/device:GPU:0',
                      '/job:worker/replica:0/task:1/device:GPU:1'], c.devices)

  def testCurrentIsScoped(self):
    default = Cluster.Current()
    self.assertEqual(['/device:CPU:0'], default.devices)
    self.assertEqual(1, default.num_devices_per_split)
    outer, inner = _Cpus(4, 2), _Cpus(2, 1)
    with outer:
      self.assertIs(outer, Cluster.Current())
      with inner as entered:
        self.assertIs(inner, entered)
        self.assertIs(inner, Cluster.Current())
      self.assertIs(outer, Cluster.Current())
    self.assertEqual(['/device:CPU:0'], Cluster.Current().devices)

  def testScopeIsRestoredOnError(self):
    c = _Cpus(2, 2)
    with self.assertRaisesRegex(KeyError, 'boom'):
      with c:
        raise KeyError('boom')
    self.assertIsNot(c, Cluster.Current())

  def testBadConfigurations(self):
    with self.assertRaisesRegex(
        ValueError, r'worker_split_size=3 must be an int >= 1 that divides '
        r'the number of devices 4'):
      _Cpus(4, 3)
    with self.assertRaisesRegex(ValueError, r'num_devices=0 must be'):
      _Cpus(0, 1)
    with self.assertRaisesRegex(ValueError, r"job='worker' needs num_devices"):
      Cluster.Params().Set(job='worker').Instantiate()
    with self.assertRaisesRegex(ValueError, r'lists a device twice'):
      Cluster.Params().Set(devices=['/cpu:0', '/device:CPU:0']).Instantiate()
    c = _Cpus(4, 2)
    with self.assertRaisesRegex(
        ValueError, r'device_index=2 is out of range; a model split has '
        r'num_devices_per_split=2'):
      c.WorkerDeviceInModelSplit(2)
    with self.assertRaisesRegex(ValueError, r'split=2 is out of range; there '
                                r'are 2 model splits'):
      c.DevicesInModelSplit(2)
    with self.assertRaisesRegex(ValueError, r'replica=2 is out of range'):
      c.WithReplica(2)

  def testUnknownDeviceIsAnErrorAtConstruction(self):
    for devices in (['/cpu:0', '/cpu:9'], ['/gpu:0']):
      with self.subTest(devices=devices):
        with self.assertRaisesRegex(
            ValueError, r"Cluster: device '/device:[CG]PU:\d' does not exist "
            r"in this process; the devices are \['/device:CPU:0', "):
          Cluster.Params().Set(devices=devices).Instantiate()

  def testCurrentReplicaChoosesTheSplit(self):
    c = _Cpus(4, 2)
    self.assertEqual(0, c.replica)
    self.assertEqual(['/device:CPU:0', '/device:CPU:1'], c.ReplicaDevices())
    with c.WithReplica(1):
      current = Cluster.Current()
      self.assertEqual(1, current.replica)
      self.assertEqual(['/device:CPU:2', '/device:CPU:3'],
                       current.ReplicaDevices())
      self.assertEqual(c.devices, current.devices)
    self.assertEqual(0, c.replica)   # The view did not change the cluster.


if __name__ == '__main__':
  tf.test.main()
