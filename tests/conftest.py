"""Test-process set-up: four logical CPU devices, configured once at start."""
import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
# CPU tensors through TF's BFC allocator, which records every allocation in
# a profile (memory_profile); the default CPU allocator records only some.
os.environ.setdefault('TF_CPU_ALLOCATOR_USE_BFC', 'true')

import tensorflow as tf  # pylint: disable=g-import-not-at-top

NUM_LOGICAL_CPUS = 4

_cpus = tf.config.list_physical_devices('CPU')
tf.config.set_logical_device_configuration(
    _cpus[0], [tf.config.LogicalDeviceConfiguration()] * NUM_LOGICAL_CPUS)


def pytest_collection_modifyitems(config, items):
  """Drops tf.test.TestCase's inherited `test_session` (not a test)."""
  del config
  items[:] = [item for item in items if item.name != 'test_session']
