"""Test-process set-up: four logical CPU devices, configured once at start;
the test command's output kept to pytest's own lines.

A process that runs tests imports TensorFlow here, with its import notices
(absl's "All log messages before absl::InitializeLog()..." and oneDNN's
"oneDNN custom operations are on...", which no log level hides) dropped
(tf_log.QuietImport): pytest captures what the set-up writes and prints it
after its summary. The xdist controller, which runs no test, does not
import it at all. A test still running after 45 s is named on the terminal
(slow_test_notice.py); passed subtests print nothing (pyproject.toml's
verbosity_subtests).
"""
import os

from cadence.framework.jobs import tf_log
from cadence.tests import slow_test_notice

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
# CPU tensors through TF's BFC allocator, which records every allocation in
# a profile (memory_profile); the default CPU allocator records only some.
os.environ.setdefault('TF_CPU_ALLOCATOR_USE_BFC', 'true')

NUM_LOGICAL_CPUS = 4


def pytest_configure(config):
  slow_test_notice.Register(config)
  if slow_test_notice.IsXdistController(config):
    return
  with tf_log.QuietImport(False):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    cpus = tf.config.list_physical_devices('CPU')
  tf.config.set_logical_device_configuration(
      cpus[0], [tf.config.LogicalDeviceConfiguration()] * NUM_LOGICAL_CPUS)


def pytest_collection_modifyitems(config, items):
  """Drops tf.test.TestCase's inherited `test_session` (not a test)."""
  del config
  items[:] = [item for item in items if item.name != 'test_session']
