"""Tests for cadence.framework.train.logdir_lock."""
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import unittest

from cadence.framework.train import logdir_lock
from cadence.tests import test_utils

# Takes the lock of argv[1], says so, then waits to be killed.
_HOLD = """
import sys, time
from cadence.framework.train import logdir_lock
lock = logdir_lock.WriterLock(sys.argv[1])
print('locked', flush=True)
time.sleep(600)
"""


class WriterLockTest(unittest.TestCase):

  def setUp(self):
    super().setUp()
    self.logdir = os.path.join(tempfile.mkdtemp(), 'run')

  def testOneHolderAtATimeNamedInTheError(self):
    lock = logdir_lock.WriterLock(self.logdir)
    path = os.path.join(self.logdir, '.writer.lock')
    with open(path) as f:
      record = json.load(f)
    self.assertEqual((record['host'], record['pid']),
                     (socket.gethostname(), os.getpid()))
    self.assertEqual(record, lock.holder)
    # A second lock, even in the same process, is refused.
    with self.assertRaisesRegex(
        logdir_lock.HeldError,
        rf'^--logdir {self.logdir} is in use by another trainer \(host '
        rf'{socket.gethostname()}, pid {os.getpid()}, started '
        rf'{record["start"]}; lock file {path}\): one logdir has one writer\. '
        r'Wait for it to end \(or stop it\), or use another --logdir\.$'):
      logdir_lock.WriterLock(self.logdir)
    lock.Release()
    self.assertFalse(os.path.exists(path))   # A clean end leaves none,
    self.assertFalse(os.path.exists(self.logdir))  # nor the empty logdir.
    lock.Release()   # Idempotent.
    with logdir_lock.WriterLock(self.logdir) as again:
      self.assertTrue(again.held)
      with open(os.path.join(self.logdir, 'params.txt'), 'w') as f:
        f.write('written under the lock')
    self.assertFalse(again.held)
    self.assertEqual(os.listdir(self.logdir), ['params.txt'])

  def testAKilledHolderNeverBlocksItsRestart(self):
    proc = subprocess.Popen([sys.executable, '-c', _HOLD, self.logdir],
                            cwd=test_utils.ROOT, stdout=subprocess.PIPE,
                            text=True)
    try:
      self.assertEqual(proc.stdout.readline(), 'locked\n')
      with self.assertRaisesRegex(logdir_lock.HeldError,
                                  rf', pid {proc.pid}, started '):
        logdir_lock.WriterLock(self.logdir)
    finally:
      proc.send_signal(signal.SIGKILL)
      proc.wait()
    # The dead holder's file is still there; the kernel dropped its lock.
    path = os.path.join(self.logdir, '.writer.lock')
    with open(path) as f:
      self.assertEqual(json.load(f)['pid'], proc.pid)
    lock = logdir_lock.WriterLock(self.logdir)
    with open(path) as f:
      self.assertEqual(json.load(f)['pid'], os.getpid())
    lock.Release()

  def testAHolderThatHasNotWrittenYetIsStillNamed(self):
    os.makedirs(self.logdir)
    path = os.path.join(self.logdir, '.writer.lock')
    with open(path, 'w') as f:   # Locked, its record not written yet.
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
      with self.assertRaisesRegex(
          logdir_lock.HeldError, r'in use by another trainer \(a process '
          r'that has not said who it is; lock file '):
        logdir_lock.WriterLock(self.logdir)

  def testAnUnwritableLogdirRaisesOSError(self):
    os.makedirs(os.path.dirname(self.logdir), exist_ok=True)
    with open(self.logdir, 'w') as f:
      f.write('a file where the logdir must be')
    with self.assertRaises(OSError):
      logdir_lock.WriterLock(self.logdir)


if __name__ == '__main__':
  unittest.main()
