"""The README's test command keeps its output readable.

One pytest run in a subprocess, as the README runs the suite (`-q`, xdist's
workers, `--dist loadfile`, this checkout's pyproject.toml and
tests/conftest.py), on a file of cases written here: a test of 30 passed
subtests and one that sleeps past the slow-test notice
($CADENCE_TEST_NOTICE_S=1). Its output must have one progress letter per
test (no `u` per passed subtest), name the sleeping test while it runs
(tests/slow_test_notice.py), and end with pytest's summary: no
TensorFlow import notice (absl's, oneDNN's) anywhere, which today's
conftest made pytest print after it.
"""
import os
import re
import subprocess
import sys
from unittest import mock

import tensorflow as tf

from cadence.tests import slow_test_notice
from cadence.tests import test_utils

_CASES = '''
import time
import unittest


class Cases(unittest.TestCase):

  def testSubtests(self):
    for i in range(30):
      with self.subTest(i=i):
        self.assertEqual(i, i)

  def testSlow(self):
    time.sleep(3.5)
'''


class SuiteOutputTest(tf.test.TestCase):

  def testTheTestCommandsOutputIsPytestsOwn(self):
    tmp = self.get_temp_dir()
    with open(os.path.join(tmp, 'cases_test.py'), 'w') as f:
      f.write(_CASES)
    env = {k: v for k, v in test_utils.QUIET_ENV.items()
           if not k.startswith('PYTEST_')}   # Not this worker's.
    env[slow_test_notice.ENV] = '1'
    proc = subprocess.run(
        [sys.executable, '-m', 'pytest', '-q', '-n', '1', '--dist',
         'loadfile', '-c', os.path.join(test_utils.ROOT, 'pyproject.toml'),
         f'--rootdir={tmp}', '-p', 'cadence.tests.conftest',
         os.path.join(tmp, 'cases_test.py')],
        cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, timeout=300)
    out = proc.stdout
    self.assertEqual(0, proc.returncode, out)
    lines = [line for line in out.splitlines() if line.strip()]
    self.assertRegex(lines[-1], r'^2 passed in [\d.]+s$', out)
    # Progress letters: one a test, whatever its subtests.
    letters = ''.join(re.findall(r'^([.a-zA-Z]+)(?: +\[ *\d+%\])?$',
                                 out, re.M))
    self.assertEqual('..', letters, out)
    self.assertRegex(out, r'(?m)^\[still running after [1-4] s: '
                     r'cases_test\.py::Cases::testSlow\]$')
    self.assertNotRegex(out, r'oneDNN|InitializeLog|tensorflow')


class SlowTestNoticeTest(tf.test.TestCase):

  def testATestIsDueEveryPeriodItRuns(self):
    notice = slow_test_notice.SlowTestNotice(every_s=45)
    with mock.patch('time.monotonic', return_value=100.0):
      notice.pytest_runtest_logstart('a_test.py::T::testA', None)
      notice.pytest_runtest_logstart('b_test.py::T::testB', None)
    self.assertEqual([], notice.Due(144.0))
    self.assertEqual([('a_test.py::T::testA', 45.0),
                      ('b_test.py::T::testB', 45.0)], notice.Due(145.0))
    self.assertEqual([], notice.Due(189.0))
    notice.pytest_runtest_logfinish('b_test.py::T::testB', None)
    self.assertEqual([('a_test.py::T::testA', 90.5)], notice.Due(190.5))


if __name__ == '__main__':
  tf.test.main()
