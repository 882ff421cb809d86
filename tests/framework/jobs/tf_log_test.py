"""tf_log: TensorFlow's C++ log lines hidden by default, shown by --tf_log."""
import subprocess
import sys
import unittest

from cadence.framework.jobs import tf_log
from cadence.tests import test_utils

_ABSL = ('WARNING: All log messages before absl::InitializeLog() is called '
         'are written to STDERR\n')
_ONEDNN = ('I0000 00:00:1795614962.225603   12784 port.cc:153] oneDNN custom '
           'operations are on. You may see slightly different numerical '
           'results due to floating-point round-off errors from different '
           'computation orders. To turn them off, set the environment '
           'variable `TF_ENABLE_ONEDNN_OPTS=0`.\n')
_OTHER = 'E0000 00:00:1.0   1 some.cc:1] something that matters\n'

# Writes to file descriptor 2 (as C++ does) inside QuietImport(show).
_SCRIPT = """
import os, sys
from cadence.framework.jobs import tf_log
with tf_log.QuietImport(sys.argv[1] == 'show'):
  for line in sys.argv[2:]:
    os.write(2, line.encode())
  sys.stderr.write('python line\\n')
sys.stderr.write('after\\n')
"""


class TfLogTest(unittest.TestCase):

  def testDropImportNoiseKeepsEverythingElse(self):
    text = _ABSL + _ONEDNN + _OTHER + _ABSL + _ONEDNN
    self.assertEqual(_OTHER, tf_log.DropImportNoise(text))
    self.assertEqual('', tf_log.DropImportNoise(''))

  def testConfigureSetsLevelsUnlessTheEnvironmentDoes(self):
    env = {}
    tf_log.Configure(False, env)
    self.assertEqual({'TF_CPP_MIN_LOG_LEVEL': '3', 'GRPC_VERBOSITY': 'NONE'},
                     env)
    env = {'TF_CPP_MIN_LOG_LEVEL': '1'}
    tf_log.Configure(False, env)
    self.assertEqual('1', env['TF_CPP_MIN_LOG_LEVEL'])
    env = {'TF_CPP_MIN_LOG_LEVEL': '3'}
    tf_log.Configure(True, env)
    self.assertEqual({'TF_CPP_MIN_LOG_LEVEL': '0'}, env)

  def testQuietImportFiltersFileDescriptorTwo(self):
    for mode, want in (('quiet', _OTHER + 'python line\nafter\n'),
                       ('show', _ABSL + _ONEDNN + _OTHER +
                        'python line\nafter\n')):
      with self.subTest(mode=mode):
        proc = subprocess.run(
            [sys.executable, '-c', _SCRIPT, mode, _ABSL, _ONEDNN, _OTHER],
            capture_output=True, text=True, check=True, cwd=test_utils.ROOT,
            timeout=120)
        self.assertEqual(want, proc.stderr)


if __name__ == '__main__':
  unittest.main()
