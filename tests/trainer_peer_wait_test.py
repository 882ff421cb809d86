"""Peers that never come, through real `python trainer.py` processes.

Under a TF_CONFIG, a MultiWorkerMirroredStrategy host and a parameter-
server chief wait in Python for their peers before TensorFlow starts
(framework/distribute/peer_wait.py). On RegressionTiny:

  * worker 0 of two, its peer never started, --peer_timeout_s=6: a line
    naming the peer soon after its start, then exit 2 at the timeout
    with one `Error:` line naming the peer, the timeout and the flag;
  * worker 1 of two, its peer never started: SIGTERM after the waiting
    line ends it within 5 s, exit 0, with one line saying so;
  * a parameter-server chief whose ps and worker never start,
    --peer_timeout_s=6: the same line and error, naming both;
  * worker 0 of two whose peer starts only once it logged that it waits:
    both train and exit 0.

The line comes 1 s into the wait, which starts once TensorFlow is loaded:
2.6 s after the process's start on an idle machine, 8-21 s measured on the
shared 2-core machine at load 7-9 (where two imports at once took over
15 s); so each process starts once the one before logged its line (the
waits overlap the imports), and the line must come within 30 s of its own
process's start.
"""
import os
import signal
import threading
import time

import tensorflow as tf

from cadence.tests import test_utils

_KEY = 'synthetic.linear_regression.RegressionTiny'
_LINE_WITHIN_S = 30   # 2.6 s measured idle; see the module docstring.
_TIMEOUT_S = 6


def _Waiting(missing, timeout_s):
  """The regex of the waiting line naming the peers `missing`."""
  return (rf'peer_wait\.py:\d+\] Waiting for \d+ of \d+ peer\(s\) to accept '
          rf'a connection: {missing} \(\d+ s so far; giving up at '
          rf'--peer_timeout_s={timeout_s:g} s\)\.$')


def _At(cluster, job, index):
  """'worker 1 at 127\\.0\\.0\\.1:41234' of `cluster` (a regex)."""
  return f'{job} {index} at {cluster[job][index]}'.replace('.', r'\.')


def _TimeoutError(missing):
  return (rf'^Error: \d of \d peer\(s\) never accepted a connection within '
          rf'--peer_timeout_s={_TIMEOUT_S} s: {missing}\. Check those '
          r'addresses in TF_CONFIG \(or --cluster_spec\) and start the same '
          r'command there; raise --peer_timeout_s if hosts start slowly\.$')


def _ExitClock(run):
  """() -> time.monotonic() when `run` (a TrainerRun) exited, recorded by a
  thread waiting on it from now on."""
  ended = []
  thread = threading.Thread(
      target=lambda: ended.append((run.proc.wait(), time.monotonic())[1]),
      daemon=True)
  thread.start()

  def _Ended(timeout=60):
    thread.join(timeout)
    if not ended:
      raise AssertionError(f'still running after {timeout} s:\n'
                           f'{run.Stderr()[-2000:]}')
    return ended[0]
  return _Ended


class PeerWaitTest(tf.test.TestCase):

  def _Start(self, name, cluster, task, *flags):
    run = test_utils.TrainerRun(
        f'--model={_KEY}', f'--logdir={self.get_temp_dir()}/{name}',
        '--job=trainer', '--max_steps=3', *flags, script=True,
        cluster=cluster, task=task)
    run.started = time.monotonic()
    self.addCleanup(run.Kill)   # A failed assertion leaves none behind.
    return run

  def _WaitingLine(self, run, regex):
    """Asserts the line within _LINE_WITHIN_S of the start; returns when
    it was seen and a clock of the process's exit."""
    run.WaitForLog(regex, timeout=_LINE_WITHIN_S -
                   (time.monotonic() - run.started))
    return time.monotonic(), _ExitClock(run)

  def _AssertTimedOut(self, run, seen, missing):
    """Exit 2 with one line, no sooner than the timeout after the line
    (`seen`: when it was seen, and the exit clock; the line comes 1 s into
    the wait)."""
    seen, ended = seen
    ended = ended()
    code, _, err = run.Finish()
    test_utils.AssertUserErrorLine(self, code, err, _TimeoutError(missing))
    self.assertGreater(ended - seen, _TIMEOUT_S - 1.5)
    self.assertLess(ended - seen, _TIMEOUT_S + 10)

  def testPeersThatNeverComeOrComeLate(self):
    timeout = f'--peer_timeout_s={_TIMEOUT_S}'
    alone, stopped, late = (test_utils.LocalCluster(worker=2)
                            for _ in range(3))
    ps = test_utils.LocalCluster(chief=1, ps=1, worker=1)
    ps_missing = f"{_At(ps, 'ps', 0)}, {_At(ps, 'worker', 0)}"
    run_alone = self._Start('alone', alone, ('worker', 0), timeout)
    seen_alone = self._WaitingLine(
        run_alone, _Waiting(_At(alone, 'worker', 1), _TIMEOUT_S))
    run_stopped = self._Start('stopped', stopped, ('worker', 1))
    self._WaitingLine(run_stopped,
                      _Waiting(_At(stopped, 'worker', 0), 600))
    run_ps = self._Start('ps', ps, ('chief', 0), timeout)

    # SIGTERM while waiting: one line, exit 0 within 5 s, nothing written.
    run_stopped.Signal(signal.SIGTERM)
    signalled = time.monotonic()
    code, _, err = run_stopped.Finish(timeout=5)
    self.assertLess(time.monotonic() - signalled, 5)
    self.assertEqual(0, code, err[-2000:])
    self.assertNotIn('Traceback', err)
    self.assertNotIn('Error:', err)
    self.assertRegex(
        err.strip().splitlines()[-1],
        r'trainer_lib\.py:\d+\] SIGTERM received while waiting for 1 '
        rf"peer\(s\) not seen yet \({_At(stopped, 'worker', 0)}\): this host "
        r'stops before building anything; nothing to save\.$')
    self.assertFalse(os.path.exists(f'{self.get_temp_dir()}/stopped/train'))

    seen_ps = self._WaitingLine(run_ps, _Waiting(ps_missing, _TIMEOUT_S))
    run_early = self._Start('late', late, ('worker', 0))
    self._WaitingLine(run_early, _Waiting(_At(late, 'worker', 1), 600))
    # The peer of 'early' starts only now: both train.
    run_late = self._Start('late', late, ('worker', 1))
    self._AssertTimedOut(run_alone, seen_alone, _At(alone, 'worker', 1))
    self._AssertTimedOut(run_ps, seen_ps, ps_missing)
    errs = []
    for i, run in enumerate((run_early, run_late)):
      code, _, err = run.Finish()
      self.assertEqual(0, code, err[-3000:])
      self.assertIn(f'worker {i} of 2 hosts', err)
      self.assertIn('Training finished at step 3.', err)
      errs.append(err)
    self.assertRegex(errs[0], r"Every peer accepted a connection after "
                     r"[\d.]+ s: starting TensorFlow's server\.")


if __name__ == '__main__':
  tf.test.main()
