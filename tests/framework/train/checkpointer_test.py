"""Tests for cadence.framework.train.checkpointer."""
import gc
import glob
import os
import shutil
import tempfile

import numpy as np
import tensorflow as tf

from cadence.framework.train import checkpoint_files
from cadence.framework.train import checkpointer
from cadence.tests import test_utils


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
    reader = checkpointer.Checkpointer(directory, _State()[2], writer=False)
    self.assertIsNone(reader.Restore())
    self.assertTrue(os.path.exists(os.path.join(directory, 'ckpt-5_temp')))
    writer = checkpointer.Checkpointer(directory, _State()[2])
    # Built, it touches nothing (a refused run leaves the logdir as it
    # was); its first restore or save cleans up.
    self.assertLen(os.listdir(directory), 2)
    self.assertIsNone(writer.Restore())
    self.assertEqual(sorted(os.listdir(directory)), [])

  def testSaveFailureKeepsThePreviousCheckpointLatest(self):
    directory = self.get_temp_dir()
    w, _, objects = _State(1.0)
    ckpt = checkpointer.Checkpointer(directory, objects)
    ckpt.Save(1)
    # A file where the save's temporary folder must go: the write fails as
    # on a full disk (root ignores permissions, so no chmod here).
    with open(os.path.join(directory, 'ckpt-2_temp'), 'w') as f:
      f.write('in the way')
    w.assign(tf.fill([2, 3], 2.0))
    with self.assertRaisesRegex(
        checkpointer.SaveError,
        rf'^Could not write checkpoint {directory}/ckpt-2 \(step 2\): .+\. '
        rf'The latest checkpoint is {directory}/ckpt-1\. Free space'):
      ckpt.Save(2)
    self.assertEqual(ckpt.latest_checkpoint, os.path.join(directory,
                                                          'ckpt-1'))
    self.assertEmpty(glob.glob(os.path.join(directory, 'ckpt-2.*')))
    w2, _, objects2 = _State(-1.0)
    self.assertEqual(checkpointer.Checkpointer(directory, objects2).Restore(),
                     1)
    self.assertAllEqual(w2, np.full([2, 3], 1.0))

  def testStepOf(self):
    self.assertEqual(checkpointer.StepOf('/a/b/ckpt-120'), 120)
    with self.assertRaisesRegex(ValueError, 'does not end in -<step>'):
      checkpointer.StepOf('/a/b/ckpt')



def _Damage(directory, step, how):
  test_utils.DamageCheckpoint(os.path.join(directory, f'ckpt-{step}'), how)


_WHY = {'truncated data': r'its data is unreadable \(.*Read less bytes',
        'missing data shard': r'its data is unreadable \(',
        'deleted index': r'its index file ckpt-30.index is missing',
        'garbage index': r'its index is unreadable \(.*bad magic number'}


def _Saved(test, steps=(10, 20, 30)):
  """A new folder in `test`'s temp dir holding checkpoints of `steps`, each
  with w filled with its step."""
  directory = tempfile.mkdtemp(dir=test.get_temp_dir())
  w, _, objects = _State()
  ckpt = checkpointer.Checkpointer(directory, objects)
  for s in steps:
    w.assign(tf.fill([2, 3], float(s)))
    ckpt.Save(s)
  return directory


class DamagedCheckpointTest(tf.test.TestCase):

  def _Saved(self, steps=(10, 20, 30)):
    return _Saved(self, steps)

  def testWriterRestoresTheNewestReadableAndMovesTheBadAside(self):
    for how, why in _WHY.items():
      with self.subTest(how):
        directory = self._Saved()
        files = sorted(os.path.basename(f) for f in glob.glob(os.path.join(
            directory, 'ckpt-30.*')))
        _Damage(directory, 30, how)
        w, step, objects = _State(-1.0)
        ckpt = checkpointer.Checkpointer(directory, objects)
        with self.assertLogs(level='WARNING') as logs:
          self.assertEqual(ckpt.Restore(), 20)
        self.assertRegex(logs.output[0], rf'Checkpoint {directory}/ckpt-30 is '
                         f'unreadable: {why}')
        self.assertAllEqual(w, np.full([2, 3], 20.0))
        self.assertEqual(int(step.numpy()), 0)  # Not in the saved objects.
        # Kept aside, out of the state file; the next save goes on from 20.
        bad = os.path.join(directory, 'bad')
        kept = [f for f in files if os.path.exists(os.path.join(
            directory, 'bad', f))]
        self.assertEqual(sorted(os.listdir(bad)), kept)
        self.assertEqual(ckpt.latest_checkpoint,
                         os.path.join(directory, 'ckpt-20'))
        self.assertEqual([checkpointer.StepOf(p) for p in
                          checkpointer.ListCheckpoints(directory)], [10, 20])
        ckpt.Save(40)
        self.assertEqual([checkpointer.StepOf(p) for p in
                          checkpointer.ListCheckpoints(directory)],
                         [10, 20, 40])

  def testAReaderSkipsWithoutMovingAndNamesThePathAskedFor(self):
    directory = self._Saved()
    _Damage(directory, 30, 'truncated data')
    before = sorted(os.listdir(directory))
    ckpt = checkpointer.Checkpointer(directory, _State()[2], writer=False)
    self.assertEqual(ckpt.Restore(), 20)
    with self.assertRaisesRegex(
        checkpointer.UnreadableError,
        rf'^Checkpoint {directory}/ckpt-30 is unreadable: its data is '):
      ckpt.Restore(os.path.join(directory, 'ckpt-30'))
    self.assertEqual(sorted(os.listdir(directory)), before)

  def testNoneReadableRaisesAndMovesNothing(self):
    directory = self._Saved((10, 20))
    _Damage(directory, 10, 'garbage index')
    _Damage(directory, 20, 'truncated data')
    before = sorted(os.listdir(directory))
    with self.assertRaisesRegex(
        checkpointer.UnreadableError,
        rf'^No readable checkpoint in {directory}: ckpt-20: its data is '
        r'unreadable .*; ckpt-10: its index is unreadable .*\. Move them '
        r'away to train from step 0, or use a new --logdir\.$'):
      checkpointer.Checkpointer(directory, _State()[2]).Restore()
    self.assertEqual(sorted(os.listdir(directory)), before)

  def testAModelThatDoesNotFitIsNotDamage(self):
    directory = self._Saved((10,))
    other = dict(model=checkpointer.KeyedVariables(
        {'net.w': tf.Variable(tf.zeros([4]))}))
    with self.assertRaises((ValueError, tf.errors.InvalidArgumentError)):
      checkpointer.Checkpointer(directory, other).Restore()
    self.assertFalse(os.path.exists(os.path.join(directory, 'bad')))

  def testMovedTwiceKeepsBoth(self):
    directory = self._Saved()
    for _ in range(2):
      _Damage(directory, 30, 'garbage index')
      ckpt = checkpointer.Checkpointer(directory, _State()[2])
      ckpt.Restore()
      ckpt.Save(30)
    self.assertTrue(os.path.exists(os.path.join(directory, 'bad',
                                                'ckpt-30.index')))
    self.assertTrue(os.path.exists(os.path.join(directory, 'bad', '2',
                                                'ckpt-30.index')))


# An unreadable `checkpoint` state file, as a user or a cut copy leaves it.
_BAD_STATES = {
    'garbage text': (b'these are not the checkpoints\n',
                     r"is not a checkpoint state \(line 1: 'these are not"),
    'random bytes': (bytes(np.random.RandomState(0).randint(
        128, 256, 64, dtype=np.uint8)), r'is not text'),
    'empty': (b'', r'is empty'),
    'no latest': (b'all_model_checkpoint_paths: "ckpt-10"\n',
                  r'names no latest checkpoint'),
}


class StateFileTest(tf.test.TestCase):
  """The `checkpoint` state file is a cache of the checkpoints' own files."""

  def _Saved(self):
    return _Saved(self)

  def _Steps(self, directory, **kw):
    return [checkpointer.StepOf(p) for p in
            checkpointer.ListCheckpoints(directory, **kw)]

  def testUnreadableStateFindsTheCheckpointsFromTheirFiles(self):
    for name, (content, why) in _BAD_STATES.items():
      with self.subTest(name):
        directory = self._Saved()
        state = os.path.join(directory, 'checkpoint')
        with open(state, 'wb') as f:
          f.write(content)
        # TensorFlow alone would see no checkpoint, or fail.
        paths, problem = checkpoint_files.ReadState(directory)
        self.assertRegex(problem, why)
        self.assertEqual(self._Steps(directory), [10, 20, 30])
        # A reader restores the newest and leaves the file as it is.
        w, _, objects = _State(-1.0)
        reader = checkpointer.Checkpointer(directory, objects, writer=False)
        self.assertEqual(reader.Restore(), 30)
        self.assertEqual(reader.latest_checkpoint, paths[-1])
        self.assertAllEqual(w, np.full([2, 3], 30.0))
        with open(state, 'rb') as f:
          self.assertEqual(f.read(), content)
        # The writer rewrites it at its first use, saying so in one line.
        w, _, objects = _State(-1.0)
        writer = checkpointer.Checkpointer(directory, objects, max_to_keep=3)
        with self.assertLogs(level='WARNING') as logs:
          self.assertEqual(writer.latest_checkpoint, paths[-1])
        self.assertLen(logs.output, 1)
        self.assertRegex(
            logs.output[0], rf'The checkpoint state file {state} {why}.*: '
            r'rewrote it from the checkpoint files beside it \(ckpt-10, '
            r'ckpt-20, ckpt-30\)\.$')
        self.assertEqual(checkpoint_files.ReadState(directory),
                         ([os.path.join(directory, f'ckpt-{s}')
                           for s in (10, 20, 30)], None))
        self.assertEqual(writer.Restore(), 30)
        self.assertAllEqual(w, np.full([2, 3], 30.0))
        # The manager manages them again: max_to_keep drops the oldest.
        writer.Save(40)
        self.assertEqual(self._Steps(directory), [20, 30, 40])
        self.assertEqual(
            [n for n in os.listdir(directory) if '.tmp' in n], [])

  def testAMissingStateFileIsFoundByTheWriterOnly(self):
    directory = self._Saved()
    os.remove(os.path.join(directory, 'checkpoint'))
    # A reader polling a live directory waits for the state file.
    self.assertEqual(self._Steps(directory), [])
    self.assertEqual(self._Steps(directory, when_missing=True), [10, 20, 30])
    with self.assertLogs(level='WARNING') as logs:
      self.assertEqual(checkpointer.Checkpointer(
          directory, _State()[2]).Restore(), 30)
    self.assertRegex(logs.output[0], r'checkpoint is missing: rewrote it')
    self.assertEqual(self._Steps(directory), [10, 20, 30])

  def testAnUnreadableStateWithoutCheckpointsGoesAside(self):
    directory = self.get_temp_dir()
    with open(os.path.join(directory, 'checkpoint'), 'wb') as f:
      f.write(b'\xff\xfe')
    ckpt = checkpointer.Checkpointer(directory, _State()[2])
    with self.assertLogs(level='WARNING') as logs:
      self.assertIsNone(ckpt.Restore())
    self.assertRegex(logs.output[0], rf'is not text; no checkpoint files '
                     rf'beside it: moved it into {directory}/bad\.$')
    self.assertEqual(sorted(os.listdir(directory)), ['bad'])
    with open(os.path.join(directory, 'bad', 'checkpoint'), 'rb') as f:
      self.assertEqual(f.read(), b'\xff\xfe')

  def testAReadableStateIsTrusted(self):
    directory = self._Saved()
    # A checkpoint the state file does not name (a save cut before its
    # state was written) is not listed: as TensorFlow does.
    for suffix in ('.index', '.data-00000-of-00001'):
      shutil.copy(os.path.join(directory, 'ckpt-30' + suffix),
                  os.path.join(directory, 'ckpt-35' + suffix))
    self.assertEqual(checkpoint_files.ReadState(directory)[1], None)
    self.assertEqual(self._Steps(directory), [10, 20, 30])
    self.assertEqual([checkpointer.StepOf(p) for p in
                      checkpoint_files.FoundCheckpoints(directory)],
                     [10, 20, 30, 35])


class FinalMarkTest(tf.test.TestCase):

  def testWriteReadRemove(self):
    directory = self.get_temp_dir()
    self.assertIsNone(checkpoint_files.ReadFinalMark(directory))
    checkpoint_files.WriteFinalMark(directory, 120, 'max_steps 120 reached')
    self.assertEqual(checkpoint_files.ReadFinalMark(directory),
                     dict(step=120, reason='max_steps 120 reached'))
    checkpoint_files.RemoveFinalMark(directory)
    self.assertIsNone(checkpoint_files.ReadFinalMark(directory))

  def testAnyOtherBytesAreNoMark(self):
    directory = self.get_temp_dir()
    path = os.path.join(directory, checkpoint_files.FINAL_MARK)
    for data in (b'\xff\xfe\x00', b'[1, 2]', b'{"step": "7", "reason": "x"}',
                 b'{"step": true, "reason": "x"}', b'{"step": 7}', b''):
      with self.subTest(data=data):
        with open(path, 'wb') as f:
          f.write(data)
        self.assertIsNone(checkpoint_files.ReadFinalMark(directory))

  def testOnlyTheWriterMarks(self):
    directory = self.get_temp_dir()
    w, _, objects = _State()
    del w
    checkpointer.Checkpointer(directory, objects, writer=False).MarkFinal('x')
    self.assertIsNone(checkpoint_files.ReadFinalMark(directory))
    writer = checkpointer.Checkpointer(directory, objects)
    writer.MarkFinal('no checkpoint yet')
    self.assertEqual(checkpoint_files.ReadFinalMark(directory),
                     dict(step=None, reason='no checkpoint yet'))
    writer.Save(5)
    writer.MarkFinal('max_steps 5 reached')
    self.assertEqual(checkpoint_files.ReadFinalMark(directory)['step'], 5)
    writer.ClearFinal()
    self.assertIsNone(checkpoint_files.ReadFinalMark(directory))


if __name__ == '__main__':
  tf.test.main()
