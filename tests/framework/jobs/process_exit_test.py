"""Tests for cadence.framework.jobs.process_exit."""
import subprocess
import sys
import textwrap

import tensorflow as tf

from cadence.tests import test_utils

# A process that leaves buffered output, an atexit handler, a non-daemon
# thread still working and an object only the interpreter's teardown frees.
_SCRIPT = textwrap.dedent("""
    import atexit, sys, threading, time
    from cadence.framework.jobs import process_exit

    class Late:
      def __del__(self):
        print('teardown ran')

    LATE = Late()
    atexit.register(print, 'atexit ran')

    def _Work():
      time.sleep(0.3)
      print('thread done')

    threading.Thread(target=_Work).start()
    sys.stdout.write('buffered, ')
    process_exit.Exit(7)
    print('not reached')
""")


class ExitTest(tf.test.TestCase):

  def testWaitsRunsAtexitFlushesThenEndsWithoutTeardown(self):
    proc = subprocess.run([sys.executable, '-c', _SCRIPT], capture_output=True,
                          text=True, cwd=test_utils.ROOT,
                          env=test_utils.QUIET_ENV, timeout=60, check=False)
    self.assertEqual(7, proc.returncode, proc.stderr)
    # The thread finished, the atexit handler ran, the buffer was flushed;
    # the teardown (which would free LATE) did not run.
    self.assertEqual('buffered, thread done\natexit ran\n', proc.stdout)
    self.assertEqual('', proc.stderr)


if __name__ == '__main__':
  tf.test.main()
