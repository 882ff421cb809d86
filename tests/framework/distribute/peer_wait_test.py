"""peer_wait: a host waits, in Python, until its peers accept connections.

The loop (`WaitLoop`) runs on a fake clock: when lines are logged, what
they name, the timeout's error, a signal's stop. `Wait` runs on real
127.0.0.1 ports (bound to port 0, then freed) with short timeouts: a peer
that starts late, one that never comes, this host's port taken, SIGTERM.
The trainer's real processes are in tests/trainer_peer_wait_test.py.
"""
import os
import signal
import socket
import threading
import time
import unittest

from cadence.framework.distribute import peer_wait
from cadence.tests import test_utils

Peer = peer_wait.Peer
_A, _B = Peer('chief', 0, 'h0:1'), Peer('worker', 1, 'h2:2')


class _FakeClock:
  """A clock that moves only when the loop pauses."""

  def __init__(self):
    self.now = 100.0

  def __call__(self):
    return self.now

  def Pause(self, seconds):
    self.now += seconds


def _Loop(peers, seen_at, timeout_s, stop_at=None):
  """Runs WaitLoop on a fake clock; peer p is seen from second
  seen_at[p] of the wait (None: never), a SIGTERM arrives at `stop_at`.

  Returns:
    (result or the exception raised, its second, [(second, line)] logged).
  """
  clock = _FakeClock()
  start = clock.now
  lines = []

  def _Seen():
    return {p for p, t in seen_at.items()
            if t is not None and clock.now - start >= t}

  def _Stop():
    return ('SIGTERM' if stop_at is not None and clock.now - start >= stop_at
            else None)

  try:
    result = peer_wait.WaitLoop(
        peers, _Seen, timeout_s, clock, clock.Pause, _Stop,
        log=lambda fmt, *args: lines.append((clock.now - start,
                                              fmt % args)))
  except (peer_wait.WaitError, peer_wait.Stopped) as e:
    result = e
  return result, clock.now - start, lines


class WaitLoopTest(unittest.TestCase):

  def testLinesAtOneSecondThenEveryTenNamingTheMissingPeers(self):
    result, when, lines = _Loop([_A, _B], {_A: 25, _B: None}, 40)
    self.assertEqual([1, 11, 21, 31], [round(t) for t, _ in lines])
    for t, line in lines:
      missing = ('chief 0 at h0:1, worker 1 at h2:2' if t < 25 else
                 'worker 1 at h2:2')
      self.assertEqual(
          f'Waiting for {2 if t < 25 else 1} of 2 peer(s) to accept a '
          f'connection: {missing} ({t:.0f} s so far; giving up at '
          '--peer_timeout_s=40 s).', line)
    self.assertIsInstance(result, peer_wait.WaitError)
    self.assertEqual(
        '1 of 2 peer(s) never accepted a connection within '
        '--peer_timeout_s=40 s: worker 1 at h2:2. Check those addresses in '
        'TF_CONFIG (or --cluster_spec) and start the same command there; '
        'raise --peer_timeout_s if hosts start slowly.', str(result))
    self.assertGreaterEqual(when, 40)
    self.assertLess(when, 40.3)

  def testReturnsOnceEveryPeerIsSeen(self):
    result, when, lines = _Loop([_A, _B], {_A: 2, _B: 3.5}, 40)
    self.assertAlmostEqual(3.6, result, delta=0.11)
    self.assertAlmostEqual(result, when)
    self.assertEqual(2, len(lines))
    self.assertIn('Waiting for 2 of 2 peer(s)', lines[0][1])
    self.assertEqual("Every peer accepted a connection after 3.6 s: starting "
                     "TensorFlow's server.", lines[1][1])
    # Peers up within the first second: no line at all.
    result, _, lines = _Loop([_A, _B], {_A: 0, _B: 0.5}, 40)
    self.assertLess(result, 0.7)
    self.assertEqual([], lines)
    # No peers: nothing to wait for.
    self.assertEqual((0.0, 0.0, []), _Loop([], {}, 40))

  def testNoLimit(self):
    result, _, lines = _Loop([_B], {_B: 1000}, 0)
    self.assertAlmostEqual(1000, result, delta=0.21)
    self.assertEqual(101, len(lines))   # Seconds 1, 11, ..., 991, and done.
    self.assertTrue(lines[0][1].endswith(
        '(1 s so far; no time limit: --peer_timeout_s=0).'))

  def testASignalStopsTheWait(self):
    result, when, lines = _Loop([_A, _B], {_A: 1, _B: None}, 40, stop_at=12)
    self.assertIsInstance(result, peer_wait.Stopped)
    self.assertEqual(
        'SIGTERM received while waiting for 1 peer(s) not seen yet (worker 1 '
        'at h2:2): this host stops before building anything; nothing to '
        'save.', str(result))
    self.assertLess(when, 12.3)
    self.assertEqual(2, len(lines))

  def testPeersAndDescribe(self):
    cluster = {'chief': ['c:1'], 'worker': ['w0:1', 'w1:1'], 'ps': ['p:1']}
    self.assertEqual(
        [Peer('chief', 0, 'c:1'), Peer('worker', 1, 'w1:1')],
        peer_wait.Peers(cluster, ('chief', 'worker'), own=('worker', 0)))
    self.assertEqual([Peer('ps', 0, 'p:1'), Peer('worker', 0, 'w0:1'),
                      Peer('worker', 1, 'w1:1')],
                     peer_wait.Peers(cluster, ('ps', 'worker'),
                                     own=('chief', 0)))
    many = [Peer('worker', i, f'w{i}:1') for i in range(11)]
    self.assertEqual(', '.join(f'worker {i} at w{i}:1' for i in range(8)) +
                     ' and 3 more', peer_wait.Describe(many))
    self.assertEqual(('::1', 2222), peer_wait.SplitAddress('[::1]:2222'))
    self.assertEqual(('h0', 1), peer_wait.SplitAddress('h0:1'))


class WaitTest(unittest.TestCase):
  """Real sockets on 127.0.0.1."""

  def _ListenLater(self, port, after_s):
    """A peer whose server listens on `port` from `after_s` seconds on;
    closed at the test's end."""
    def _Start():
      time.sleep(after_s)
      server = socket.create_server(('127.0.0.1', port))
      self.addCleanup(server.close)
    thread = threading.Thread(target=_Start)
    thread.start()
    self.addCleanup(thread.join)

  def testWaitsForALatePeerWhileAcceptingItsProbes(self):
    own, late = test_utils.FreePorts(2)
    self._ListenLater(late, 0.7)
    probed = []

    def _ProbeUs():   # The late peer's own wait, probing this host.
      time.sleep(0.3)
      probed.append(peer_wait.Accepts(f'127.0.0.1:{own}'))
    prober = threading.Thread(target=_ProbeUs)
    prober.start()
    start = time.monotonic()
    waited = peer_wait.Wait([Peer('worker', 1, f'127.0.0.1:{late}')],
                            timeout_s=10, listen_port=own,
                            own=f'worker 0 at 127.0.0.1:{own}')
    prober.join()
    self.assertEqual([True], probed)
    self.assertGreaterEqual(waited, 0.6)
    self.assertLess(time.monotonic() - start, 4)
    # The port is free again for TensorFlow's server.
    self.assertFalse(peer_wait.Accepts(f'127.0.0.1:{own}'))
    socket.create_server(('', own)).close()

  def testAPeerThatNeverComesTimesOut(self):
    own, gone = test_utils.FreePorts(2)
    start = time.monotonic()
    with self.assertRaisesRegex(
        peer_wait.WaitError,
        rf'^1 of 1 peer\(s\) never accepted a connection within '
        rf'--peer_timeout_s=0\.6 s: worker 1 at 127\.0\.0\.1:{gone}\. '):
      peer_wait.Wait([Peer('worker', 1, f'127.0.0.1:{gone}')],
                     timeout_s=0.6, listen_port=own)
    self.assertLess(time.monotonic() - start, 2)
    socket.create_server(('', own)).close()   # Closed on the error too.

  def testTakenPortIsAnError(self):
    own, peer = test_utils.FreePorts(2)
    holder = socket.create_server(('127.0.0.1', own))
    self.addCleanup(holder.close)
    with self.assertRaisesRegex(
        peer_wait.WaitError,
        rf'^This task \(worker 0 at 127\.0\.0\.1:{own}\) cannot listen on '
        rf'its port {own}: Address already in use; another process holds '
        r'it \(each task needs a free port of its own\)\.$'):
      peer_wait.Wait([Peer('worker', 1, f'127.0.0.1:{peer}')],
                     listen_port=own, own=f'worker 0 at 127.0.0.1:{own}')

  def testSigtermStopsTheWaitAndRestoresTheHandler(self):
    self.assertIs(threading.current_thread(), threading.main_thread())
    before = signal.getsignal(signal.SIGTERM)
    (gone,) = test_utils.FreePorts(1)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    start = time.monotonic()
    with self.assertRaisesRegex(peer_wait.Stopped,
                                rf'^SIGTERM received while waiting for 1 '
                                rf'peer\(s\) not seen yet \(worker 1 at '
                                rf'127\.0\.0\.1:{gone}\)'):
      peer_wait.Wait([Peer('worker', 1, f'127.0.0.1:{gone}')], timeout_s=30)
    timer.join()
    self.assertLess(time.monotonic() - start, 1.5)
    self.assertEqual(before, signal.getsignal(signal.SIGTERM))

  def testWaitForTasksSkipsItselfAndOtherJobs(self):
    chief, worker, ps = test_utils.FreePorts(3)
    self._ListenLater(worker, 0)
    config = {'cluster': {'chief': [f'127.0.0.1:{chief}'],
                          'worker': [f'127.0.0.1:{worker}'],
                          'ps': [f'127.0.0.1:{ps}']},   # Nobody listens.
              'task': {'type': 'chief', 'index': 0}}
    waited = peer_wait.WaitForTasks(config, ('chief', 'worker'),
                                    timeout_s=5, listen=True)
    self.assertLess(waited, 3)


if __name__ == '__main__':
  unittest.main()
