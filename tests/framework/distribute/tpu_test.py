"""Tests for cadence.framework.distribute.tpu: replicas of logical cores,
off a TPU.

A TPU cannot be reached here; what is tested is what does not need one:
the cut of a TPU mesh into replicas (on a `Topology` built from a v3-8's
mesh), the logical-core devices of the cluster, and that a TPU that cannot
be resolved or reached fails at once (the trainer's exit 2 is in
tests/trainer_tpu_test.py).
"""
import itertools

import numpy as np
import tensorflow as tf

from cadence.framework import cluster as cluster_lib
from cadence.framework.distribute import tpu

_V3_8_MESH = [2, 2, 1, 2]   # x, y, z, cores per chip: 8 cores on 4 chips.


def _Topology(mesh):
  """A Topology of one host holding every core of `mesh`."""
  coords = np.array([c for c in itertools.product(*map(range, mesh))],
                    np.int32)
  return tf.tpu.experimental.Topology(mesh_shape=mesh,
                                      device_coordinates=coords[None])


class ComputationShapeTest(tf.test.TestCase):

  def testCoresOfAChipFirstThenChips(self):
    for cores, want in ((1, [1, 1, 1, 1]), (2, [1, 1, 1, 2]),
                        (4, [2, 1, 1, 2]), (8, [2, 2, 1, 2])):
      self.assertEqual(tpu.ComputationShape(_V3_8_MESH, cores), want)
    self.assertEqual(tpu.ComputationShape([2, 2, 2, 1], 4), [2, 2, 1, 1])

  def testCoresThatDoNotCutTheMeshAreAnError(self):
    for cores in (3, 16):
      with self.assertRaisesRegex(
          tpu.TpuError, rf'--worker_split_size={cores}: cannot cut this TPU '
          r'\(mesh shape \[2, 2, 1, 2\], 8 cores\) into replicas'):
        tpu.ComputationShape(_V3_8_MESH, cores)


class DeviceAssignmentTest(tf.test.TestCase):

  def testTwoCoresPerReplicaAreTheTwoCoresOfAChip(self):
    topology = _Topology(_V3_8_MESH)
    assignment = tpu.BuildDeviceAssignment(topology, 2)
    self.assertEqual(assignment.num_replicas, 4)
    self.assertEqual(assignment.num_cores_per_replica, 2)
    chips, ordinals = set(), set()
    for r in range(4):
      coords = assignment.core_assignment[r]   # [logical core, 4]
      self.assertAllEqual(coords[0][:3], coords[1][:3])   # One chip.
      self.assertEqual(sorted(coords[:, 3]), [0, 1])      # Both its cores.
      chips.add(tuple(coords[0][:3]))
      ordinals.update(assignment.tpu_ordinal(replica=r, logical_core=s)
                      for s in range(2))
    self.assertLen(chips, 4)
    self.assertEqual(ordinals, set(range(8)))   # Every core used once.

  def testOneCorePerReplica(self):
    assignment = tpu.BuildDeviceAssignment(_Topology(_V3_8_MESH), 1)
    self.assertEqual((assignment.num_replicas,
                      assignment.num_cores_per_replica), (8, 1))


class LogicalCoreTest(tf.test.TestCase):

  def testDeviceStringsRoundTrip(self):
    self.assertEqual(tpu.LogicalCore(1), '/device:TPU_REPLICATED_CORE:1')
    self.assertEqual(tpu.LogicalCoreIndex(tpu.LogicalCore(3)), 3)
    self.assertIsNone(tpu.LogicalCoreIndex('/device:CPU:1'))

  def testClusterOfLogicalCoresIsOneSplitOfStages(self):
    cluster = cluster_lib.Cluster.Params().Set(
        devices=[tpu.LogicalCore(s) for s in range(2)], device_type='TPU',
        worker_split_size=2).Instantiate()
    self.assertEqual(cluster.num_splits, 1)
    self.assertEqual(cluster.WorkerDeviceInModelSplit(1),
                     '/device:TPU_REPLICATED_CORE:1')
    # Off a TPU (no TPUStrategy) a logical core places nothing.
    with cluster_lib.DeviceScope(cluster.WorkerDeviceInModelSplit(1)):
      v = tf.Variable(1.0)
    self.assertIn('CPU:0', v.device)


class ConnectTest(tf.test.TestCase):

  def testUnknownNameFailsWithOneLine(self):
    if tpu.HasCloudTpuClient():
      regex = r"^--tpu='nonexistent': cannot resolve the TPU \("
    else:   # Said before trying: the lookup needs the Google API client.
      regex = (r"^--tpu='nonexistent' --tpu_zone='us-central2-b': a TPU name "
               r'is looked up with the Cloud TPU API, which needs the Google '
               r'API client: pip install -e "\.\[tpu\]" \(cloud-tpu-client\); '
               r"or give the TPU's grpc://host:8470 address\.$")
    with self.assertRaisesRegex(tpu.TpuError, regex):
      tpu.Connect('nonexistent', zone='us-central2-b')

  def testNamesAndAddresses(self):
    self.assertTrue(tpu.IsName('my-tpu'))
    self.assertFalse(tpu.IsName('grpc://10.0.0.2:8470'))
    self.assertFalse(tpu.IsName('local'))


if __name__ == '__main__':
  tf.test.main()
