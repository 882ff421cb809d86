"""Tests for cadence.framework.distribute.coordinated_exit.

`FinishTogether` itself needs a MultiWorkerMirroredStrategy cluster: it
runs in tests/trainer_multihost_test.py (two hosts finish; neither logs a
line that reads as a crash).
"""
import socket
import threading

import tensorflow as tf

from cadence.framework.distribute import coordinated_exit


class _Strategy:
  """What PeerAddresses reads of a MultiWorkerMirroredStrategy."""

  def __init__(self, cluster, task_type, task_id):
    self.cluster_resolver = (
        tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(cluster), task_type=task_type,
            task_id=task_id))


class CoordinatedExitTest(tf.test.TestCase):

  def testPeerAddressesAreEveryOtherTask(self):
    cluster = {'chief': ['h0:1'], 'worker': ['h1:2', 'h2:3']}
    self.assertEqual(['h1:2', 'h2:3'], coordinated_exit.PeerAddresses(
        _Strategy(cluster, 'chief', 0)))
    self.assertEqual(['h0:1', 'h2:3'], coordinated_exit.PeerAddresses(
        _Strategy(cluster, 'worker', 0)))

  def testAwaitGoneWaitsUntilNoServerListens(self):
    server = socket.socket()
    server.bind(('127.0.0.1', 0))
    server.listen()
    address = f'127.0.0.1:{server.getsockname()[1]}'
    # Still serving when the time is up: it says so.
    self.assertEqual([address],
                     coordinated_exit.AwaitGone([address], timeout_s=0.2))
    # Gone a moment later: the wait ends with nothing left.
    closer = threading.Timer(0.2, server.close)
    closer.start()
    self.assertEqual([], coordinated_exit.AwaitGone([address], timeout_s=60))
    closer.join()


if __name__ == '__main__':
  tf.test.main()
