"""ps_programs: how steps are split into worker calls; when servers stop.

The training itself (a real cluster of trainer processes) is
tests/trainer_ps_test.py.
"""
import socket
import threading
import time
import types

import tensorflow as tf

from cadence.framework.distribute import ps_programs


class SplitStepsTest(tf.test.TestCase):

  def testExamples(self):
    self.assertEqual([10, 10], ps_programs.SplitSteps(20, 2))
    self.assertEqual([2, 2, 2, 1], ps_programs.SplitSteps(7, 2, 2))
    self.assertEqual([1], ps_programs.SplitSteps(1, 4))
    self.assertEqual([3, 2, 2], ps_programs.SplitSteps(7, 3))

  def testEveryCase(self):
    for num_steps in range(1, 30):
      for num_calls in range(1, 5):
        for per_loop in range(0, 6):
          with self.subTest(n=num_steps, calls=num_calls, per_loop=per_loop):
            split = ps_programs.SplitSteps(num_steps, num_calls, per_loop)
            self.assertEqual(num_steps, sum(split))
            self.assertGreaterEqual(len(split), min(num_steps, num_calls))
            self.assertLessEqual(max(split) - min(split), 1)
            self.assertGreaterEqual(min(split), 1)
            if per_loop:
              self.assertLessEqual(max(split), per_loop)
              self.assertEqual(len(split), max(
                  min(num_steps, num_calls), -(-num_steps // per_loop)))


class ServeTest(tf.test.TestCase):

  def _Serve(self, chief, finished, **kwargs):
    cluster = tf.train.ClusterSpec({'chief': [chief]}).as_cluster_def()
    setup = types.SimpleNamespace(
        task_type='ps', server=types.SimpleNamespace(
            server_def=types.SimpleNamespace(cluster=cluster)))
    thread = threading.Thread(target=ps_programs.Serve, daemon=True,
                              args=(setup, finished, 0.05), kwargs=kwargs)
    thread.start()
    return thread

  def _WaitForLine(self, logs, text, thread, timeout=10):
    """Waits until a warning the thread logged holds `text`."""
    deadline = time.monotonic() + timeout
    while not any(text in line for line in logs.output):
      self.assertLess(time.monotonic(), deadline, logs.output)
      self.assertTrue(thread.is_alive())
      time.sleep(0.05)

  def testAChiefThatLeavesBeforeTheEndIsSaidAtOnceAndTheTaskServesOn(self):
    chief = socket.socket()
    chief.bind(('127.0.0.1', 0))
    chief.listen()
    address = '127.0.0.1:%d' % chief.getsockname()[1]
    stop = []
    with self.assertLogs('absl', 'WARNING') as logs:
      thread = self._Serve(address, lambda: None,
                           should_stop=lambda: stop and 'SIGTERM',
                           look_secs=0.1, quiet_secs=0.5)
      time.sleep(0.5)                      # Seen: up.
      chief.close()                        # Refused, failed or stopped.
      self._WaitForLine(
          logs, f'The chief at {address} has exited before the run '
          'finished (it stopped on an error, failed or was stopped; its own '
          'log says which): this ps task keeps serving', thread)
      # Still no chief: a line every quiet_secs, the absence counted.
      self._WaitForLine(logs, f'No chief has answered at {address} for',
                        thread)
      stop.append(True)
      thread.join(10)
    self.assertFalse(thread.is_alive())

  def testServesUntilFinishedAndTheChiefHasExited(self):
    chief = socket.socket()
    chief.bind(('127.0.0.1', 0))
    chief.listen()
    address = '127.0.0.1:%d' % chief.getsockname()[1]
    done = []
    thread = self._Serve(address, lambda: 'finished' if done else None)
    thread.join(0.5)
    self.assertTrue(thread.is_alive())     # Not finished: serves.
    done.append(True)
    thread.join(0.5)
    self.assertTrue(thread.is_alive())     # Finished, the chief still up.
    chief.close()
    thread.join(10)
    self.assertFalse(thread.is_alive())    # Finished and the chief gone.

  def testAFailedChiefLeavesThemServing(self):
    port = socket.socket()
    port.bind(('127.0.0.1', 0))
    address = '127.0.0.1:%d' % port.getsockname()[1]
    port.close()                           # No chief listening...
    done = []
    thread = self._Serve(address, lambda: 'finished' if done else None)
    thread.join(0.5)
    self.assertTrue(thread.is_alive())     # ...but not finished: serves.
    done.append(True)
    thread.join(10)
    self.assertFalse(thread.is_alive())


if __name__ == '__main__':
  tf.test.main()
