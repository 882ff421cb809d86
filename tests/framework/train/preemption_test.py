"""Tests for cadence.framework.train.preemption.

The trainer's whole path (SIGTERM -> checkpoint at the step -> exit 0 ->
bit-identical resume) is tested in real subprocesses in
tests/trainer_faults_test.py; the train program's side in process in
tests/framework/train/programs_test.py.
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time
import weakref

import tensorflow as tf

from cadence.framework.train import preemption
from cadence.tests import test_utils


def _WaitFor(predicate, seconds=10.0):
  deadline = time.monotonic() + seconds
  while not predicate() and time.monotonic() < deadline:
    time.sleep(0.01)
  return predicate()


_TWO_SIGNALS = r'''
import os, signal, time
from cadence.framework.train import preemption
with preemption.Watcher() as watcher:
  os.kill(os.getpid(), signal.SIGTERM)
  time.sleep(0.1)  # The handler runs; the second signal gets the default.
  print('first handled:', watcher.requested, flush=True)
  os.kill(os.getpid(), signal.SIGINT)
  time.sleep(5)
print('survived')
'''


# One of two MultiWorkerMirroredStrategy workers on this host (argv: index,
# TF_CONFIG): a compiled loop of all-reduces that stops on the agreed flag.
_WORKER = r'''
import os, sys
os.environ['TF_CONFIG'] = sys.argv[2]
import tensorflow as tf
strategy = tf.distribute.MultiWorkerMirroredStrategy()
from cadence.framework.train import preemption
with preemption.Watcher(
    agreement=preemption.AllReduceAgreement(strategy)) as watcher:
  total = tf.Variable(0.0)

  def Body(i, unused_stop):
    ones = strategy.run(lambda: tf.ones([]))
    total.assign_add(strategy.reduce(tf.distribute.ReduceOp.SUM, ones,
                                     axis=None))
    return i + 1, watcher.StopTensor()

  loop = tf.function(lambda: tf.while_loop(
      lambda i, stop: tf.logical_and(i < 10**7, tf.logical_not(stop)), Body,
      (tf.constant(0), watcher.StopTensor())), autograph=False)
  print('ready', flush=True)
  steps, stop = watcher.Call(loop)
print(sys.argv[1], bool(stop), int(steps), int(total.numpy()),
      watcher.requested, flush=True)
'''


class WatcherTest(tf.test.TestCase):

  def testASignalSetsTheFlagAndTheHandlersAreRestored(self):
    before = {s: signal.getsignal(s) for s in preemption.DEFAULT_SIGNALS}
    with preemption.Watcher() as watcher:
      self.assertIsNone(watcher.requested)
      self.assertFalse(watcher.StopTensor().numpy())
      os.kill(os.getpid(), signal.SIGTERM)
      self.assertTrue(_WaitFor(lambda: watcher.requested))
      self.assertEqual(watcher.requested, 'SIGTERM')
      self.assertTrue(watcher.StopTensor().numpy())
      # A second signal would end the process: the default action.
      for s in preemption.DEFAULT_SIGNALS:
        self.assertEqual(signal.getsignal(s), signal.SIG_DFL)
    self.assertEqual({s: signal.getsignal(s) for s in
                      preemption.DEFAULT_SIGNALS}, before)

  def testASecondSignalEndsTheProcessAtOnce(self):
    proc = subprocess.run([sys.executable, '-c', _TWO_SIGNALS],
                          capture_output=True, text=True, timeout=120,
                          env=test_utils.QUIET_ENV, check=False)
    self.assertEqual(proc.returncode, -signal.SIGINT, proc.stderr[-2000:])
    self.assertEqual(proc.stdout, 'first handled: SIGTERM\n')
    self.assertIn('SIGTERM received: finishing the step in progress',
                  proc.stderr)

  def testCallRunsInAWorkerWhileTheMainThreadTakesSignals(self):
    with preemption.Watcher() as watcher:

      def _Loop():
        # Runs off the main thread, like the compiled loop; the signal's
        # handler must run (in the main thread) before this returns.
        os.kill(os.getpid(), signal.SIGTERM)
        seen = _WaitFor(lambda: watcher.requested)
        return threading.current_thread() is threading.main_thread(), seen

      on_main, seen = watcher.Call(_Loop)
    self.assertFalse(on_main)
    self.assertEqual(seen, 'SIGTERM')

  def testTheWorkerKeepsNothingOfACallAndIsJoined(self):
    class _Input:
      pass

    with preemption.Watcher() as watcher:
      data = _Input()
      ref = weakref.ref(data)
      self.assertEqual(3, watcher.Call(lambda x, y: y, data, 3))
      del data   # The caller's last reference: the worker holds none.
      self.assertIsNone(ref())
      self.assertIn('train_loop', [t.name for t in threading.enumerate()])
    self.assertNotIn('train_loop', [t.name for t in threading.enumerate()])

  def testCallRaisesTheWorkersError(self):
    with preemption.Watcher() as watcher:
      with self.assertRaisesRegex(ZeroDivisionError, 'division by zero'):
        watcher.Call(lambda: 1 / 0)
    # Without handlers, in this thread.
    watcher = preemption.Watcher(signals=())
    with watcher:
      self.assertTrue(watcher.Call(
          lambda: threading.current_thread() is threading.main_thread()))

  def testRequestAndAgreement(self):
    votes = []

    def _Agree(local_stop):
      votes.append(local_stop)
      return tf.logical_not(local_stop)  # A stand-in for other workers.

    watcher = preemption.Watcher(signals=(), agreement=_Agree)
    self.assertTrue(watcher.StopTensor().numpy())
    watcher.Request('a test')
    self.assertEqual(watcher.requested, 'a test')
    self.assertFalse(watcher.StopTensor().numpy())
    self.assertLen(votes, 2)

  def testWorkersAgreeOnTheStepToStopAt(self):
    # SIGTERM reaches one worker only; both stop after the same step.
    workers = [f'127.0.0.1:{p}' for p in test_utils.FreePorts(2)]
    procs = [subprocess.Popen(
        [sys.executable, '-c', _WORKER, str(i), json.dumps(dict(
            cluster=dict(worker=workers), task=dict(type='worker', index=i)))],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=test_utils.QUIET_ENV) for i in range(2)]
    for proc in procs:
      line = proc.stdout.readline()  # '' if it ended: then read why.
      self.assertEqual(line, 'ready\n', line or proc.stderr.read()[-2000:])
    time.sleep(0.3)  # Steps under way (or still compiling: then step 0).
    procs[1].send_signal(signal.SIGTERM)
    results = []
    for proc in procs:
      out, err = proc.communicate(timeout=120)
      self.assertEqual(proc.returncode, 0, err[-2000:])
      results.append(out.split())
    (i0, stop0, steps0, total0, why0), (i1, stop1, steps1, total1, why1) = (
        results)
    self.assertEqual((i0, stop0, why0, i1, stop1, why1),
                     ('0', 'True', 'None', '1', 'True', 'SIGTERM'))
    self.assertEqual(steps0, steps1)
    self.assertEqual(int(total0), 2 * int(steps0))  # Every step all-reduced.
    self.assertEqual(total0, total1)

  def testBuiltInAStrategyScopeIsAnError(self):
    with tf.distribute.OneDeviceStrategy('/cpu:0').scope():
      with self.assertRaisesRegex(ValueError, 'build it outside the '
                                  'tf.distribute strategy scope'):
        preemption.Watcher()

  def testEnteredOffTheMainThreadIsAnError(self):
    errors = []

    def _Enter():
      try:
        with preemption.Watcher():
          pass
      except ValueError as e:
        errors.append(str(e))

    thread = threading.Thread(target=_Enter)
    thread.start()
    thread.join()
    self.assertLen(errors, 1)
    self.assertIn('enter it in the main thread', errors[0])


if __name__ == '__main__':
  tf.test.main()
