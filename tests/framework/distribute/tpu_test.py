"""Tests for cadence.framework.distribute.tpu: replicas of logical cores,
off a TPU.

A TPU cannot be reached here; what is tested is what does not need one:
the cut of a TPU mesh into replicas (on a `Topology` built from a v3-8's
mesh), the logical-core devices of the cluster, and that a TPU that cannot
be resolved or reached fails at once (the trainer's exit 2 is in
tests/trainer_bad_inputs_test.py).
"""
import itertools
import json
import os
import unittest
from unittest import mock

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
    where = (r"^--tpu='nonexistent' --tpu_zone='us-central2-b' "
             r"--tpu_project='my-project': ")
    if tpu.HasTpuApiClient():   # Tried: this machine has no credentials.
      regex = where + r'cannot resolve the TPU \(DefaultCredentialsError: '
    else:   # Said before trying: the lookup needs the API's client.
      regex = where + (
          r'a TPU name is looked up with the Cloud TPU API, whose client is '
          r'not installed: pip install -e "\.\[tpu\]" \(in one command with '
          r'your TensorFlow extra, e\.g\. "\.\[cpu,tpu\]"\); or give '
          r"--tpu=local on a TPU VM, or a TPU Node's grpc://host:8470 "
          r'address\.$')
    # No credentials, and no probe of the GCE metadata server for them.
    no_credentials = {'NO_GCE_CHECK': 'True', 'GOOGLE_APPLICATION_CREDENTIALS':
                      '', 'CLOUDSDK_CONFIG': self.get_temp_dir()}
    with mock.patch.dict(os.environ, no_credentials):
      with self.assertRaisesRegex(tpu.TpuError, regex):
        tpu.Connect('nonexistent', zone='us-central2-b', project='my-project')

  @unittest.skipUnless(tpu.HasTpuApiClient(), "needs setup.py's tpu extra")
  def testNameResolvesThroughTheApiObjectWithoutOauth2client(self):
    # What Connect hands TensorFlow's resolver for a name (_TpuApi), here
    # answering the Cloud TPU API's nodes.get from memory.
    from googleapiclient import discovery  # pylint: disable=g-import-not-at-top
    from googleapiclient import http  # pylint: disable=g-import-not-at-top
    from google.auth import credentials  # pylint: disable=g-import-not-at-top
    node = {'state': 'READY', 'networkEndpoints': [
        {'ipAddress': '10.0.0.2', 'port': 8470},
        {'ipAddress': '10.0.0.3', 'port': 8470}]}
    service = discovery.build(
        'tpu', 'v1', credentials=credentials.AnonymousCredentials(),
        cache_discovery=False, requestBuilder=http.RequestMockBuilder(
            {'tpu.projects.locations.nodes.get': (None, json.dumps(node))},
            check_unexpected=True))
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
        tpu='my-tpu', zone='us-central2-b', project='my-project',
        service=service)
    self.assertEqual(resolver.master(), 'grpc://10.0.0.2:8470')
    self.assertEqual(resolver.cluster_spec().as_dict(),
                     {'worker': ['10.0.0.2:8470', '10.0.0.3:8470']})

  def testNamesAndAddresses(self):
    self.assertTrue(tpu.IsName('my-tpu'))
    self.assertFalse(tpu.IsName('grpc://10.0.0.2:8470'))
    self.assertFalse(tpu.IsName('local'))


if __name__ == '__main__':
  tf.test.main()
