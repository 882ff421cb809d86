"""Tests for cadence.framework.train.tf_internals: the adapter runs on this
TensorFlow, and it is the one module of the gradient sync that imports
TensorFlow's internals."""
import ast
import os

import tensorflow as tf

from cadence.framework.train import tf_internals
from cadence.tests import test_utils

# Who may import `tensorflow.python`, and why. A module of the gradient
# sync goes through the adapter; the two others use the eager context for
# what has no public API, outside the gradient sync.
_ALLOWED = {
    'framework/train/tf_internals.py': 'the adapter itself',
    'framework/pipeline/memory_profile.py':
        'run metadata of a step (the eager context)',
    'framework/distribute/coordinated_exit.py':
        "the coordination service's barrier (the eager context)",
}


def _InternalImports(path):
  """The lines of `path` that import from tensorflow.python."""
  with open(path) as f:
    tree = ast.parse(f.read(), path)
  lines = []
  for node in ast.walk(tree):
    names = ([node.module or ''] if isinstance(node, ast.ImportFrom) else
             [a.name for a in node.names] if isinstance(node, ast.Import)
             else [])
    if any(n == 'tensorflow.python' or n.startswith('tensorflow.python.')
           for n in names):
      lines.append(node.lineno)
  return lines


class TfInternalsTest(tf.test.TestCase):

  def testOnlyTheAdapterImportsTensorFlowInternals(self):
    found = {}
    for top in ('framework', 'layers', 'tasks', 'params', 'trainer.py'):
      path = os.path.join(test_utils.ROOT, top)
      files = [path] if path.endswith('.py') else [
          os.path.join(folder, n) for folder, _, names in os.walk(path)
          for n in names if n.endswith('.py')]
      for name in files:
        lines = _InternalImports(name)
        if lines:
          found[os.path.relpath(name, test_utils.ROOT)] = lines
    self.assertEqual(sorted(_ALLOWED), sorted(found),
                     'modules importing tensorflow.python: '
                     f'{found}; the gradient sync imports them through '
                     'framework/train/tf_internals.py')

  def testCollectivesOverTwoDevices(self):
    # An allocator of its own, far from any strategy's keys in this process.
    keys = tf_internals.CollectiveKeys(None, 90000)
    devices = ['/device:CPU:0', '/device:CPU:1']
    group = tf_internals.GroupKey(keys, devices)
    self.assertEqual(group, tf_internals.GroupKey(keys, list(devices)))
    self.assertNotEqual(group, tf_internals.GroupKey(
        keys, ['/device:CPU:2', '/device:CPU:3']))
    options = tf.distribute.experimental.CommunicationOptions()
    launchers = [tf_internals.Launcher(group, 2, keys, d, options)
                 for d in devices]

    @tf.function(autograph=False)
    def _Run():
      out = []
      for r, (device, launcher) in enumerate(zip(devices, launchers)):
        with tf.device(device):
          x = tf.constant([1.0, 2.0]) * (r + 1)
          out.append((launcher.AllGather(x), launcher.AllReduce(x)))
      return out

    for gathered, summed in _Run():
      self.assertAllEqual([1.0, 2.0, 2.0, 4.0], gathered)
      self.assertAllEqual([3.0, 6.0], summed)

  def testAStrategysOwnKeysWhenItHasThem(self):
    # The default strategy keeps no allocator: a new one, at the start.
    keys = tf_internals.CollectiveKeys(tf.distribute.get_strategy(), 91000)
    self.assertEqual(91000, tf_internals.GroupKey(keys, ['/device:CPU:0']))


if __name__ == '__main__':
  tf.test.main()
