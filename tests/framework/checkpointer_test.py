"""Tests for cadence.framework.checkpointer."""
import gc
import os

import numpy as np
import tensorflow as tf

from cadence.framework import checkpointer


def _State(value=0.0):
  w = tf.Variable(tf.fill([2, 3], value), name='w')
  step = tf.Variable(tf.constant(0, tf.int64), name='step')
  return w, step, dict(model=checkpointer.KeyedVariables({'net.w': w}),
                       global_step=step)


class CheckpointerTest(tf.test.TestCase):

  def testSaveRestoreAndKeep(self):
    directory = self.get_temp_dir()
    w, step, objects = _State()
    ckpt = checkpointer.Checkpointer(directory, objects, max_to_keep=2)
    self.assertIsNone(ckpt.Restore())
    for s in (10, 20, 30):
      w.assign(tf.fill([2, 3], float(s)))
      step.assign(s)
      self.assertEqual(ckpt.Save(s), os.path.join(directory, f'ckpt-{s}'))
    self.assertEqual([checkpointer.StepOf(p) for p in
                      checkpointer.ListCheckpoints(directory)], [20, 30])
    w2, step2, objects2 = _State(-1.0)
    self.assertEqual(checkpointer.Checkpointer(directory, objects2).Restore(),
                     30)
    self.assertAllEqual(w2, np.full([2, 3], 30.0))
    self.assertEqual(int(step2.numpy()), 30)
    # An older one on request; keys are variable paths.
    checkpointer.Checkpointer(directory, objects2).Restore(
        os.path.join(directory, 'ckpt-20'))
    self.assertAllEqual(w2, np.full([2, 3], 20.0))
    values = checkpointer.ReadValues(os.path.join(directory, 'ckpt-20'))
    self.assertEqual(list(values), ['model/vars/net..w/.ATTRIBUTES/'
                                    'VARIABLE_VALUE'])

  def testRestoreLeavesNoValueUnrestored(self):
    directory = self.get_temp_dir()
    checkpointer.Checkpointer(directory, _State(1.0)[2]).Save(1)
    # TensorFlow warns when a restore status with unrestored checkpoint
    # values (e.g. the manager's save_counter) is garbage collected.
    with self.assertNoLogs('tensorflow', level='WARNING'):
      w, _, objects = _State()
      ckpt = checkpointer.Checkpointer(directory, objects)
      self.assertEqual(ckpt.Restore(), 1)
      del ckpt, objects
      gc.collect()
    self.assertAllEqual(w, np.full([2, 3], 1.0))

  def testRefusesNonFiniteWeights(self):
    directory = self.get_temp_dir()
    w, _, objects = _State(1.0)
    ckpt = checkpointer.Checkpointer(directory, objects)
    self.assertIsNotNone(ckpt.Save(1))
    w.assign(tf.constant([[1.0, np.nan, 0.0], [0.0, 0.0, np.inf]]))
    self.assertFalse(ckpt.AllFinite())
    self.assertIsNone(ckpt.Save(2))
    self.assertEqual(ckpt.latest_checkpoint, os.path.join(directory, 'ckpt-1'))

  def testRemovesTempLeftoversOnlyAsWriter(self):
    directory = self.get_temp_dir()
    os.makedirs(os.path.join(directory, 'ckpt-5_temp', 'part-0'))
    with open(os.path.join(directory, 'ckpt-6_temp.index'), 'w') as f:
      f.write('x')
    checkpointer.Checkpointer(directory, _State()[2], remove_temp=False)
    self.assertTrue(os.path.exists(os.path.join(directory, 'ckpt-5_temp')))
    checkpointer.Checkpointer(directory, _State()[2])
    self.assertEqual(sorted(os.listdir(directory)), [])

  def testStepOf(self):
    self.assertEqual(checkpointer.StepOf('/a/b/ckpt-120'), 120)
    with self.assertRaisesRegex(ValueError, 'does not end in -<step>'):
      checkpointer.StepOf('/a/b/ckpt')


if __name__ == '__main__':
  tf.test.main()
