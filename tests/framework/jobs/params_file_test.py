"""Tests for cadence.framework.jobs.params_file."""
import datetime
import os

import tensorflow as tf

from cadence.framework.jobs import params_file

_NOW = datetime.datetime(2025, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)
_TEXT = ("name : 'regression'\ntask.hidden_dims : [16]\n"
         'task.train.max_steps : 500\ninput.batch_size : 32\n')


class ParamsFileTest(tf.test.TestCase):

  def testDifferences(self):
    edited = ("# my notes\nname : 'regression'\ntask.hidden_dims : [32]\n"
              'task.train.max_steps : 500\ntask.extra : 1\n')
    diffs = params_file.Differences(_TEXT, edited)
    self.assertEqual(diffs, [('input.batch_size', '32', None),
                             ('task.extra', None, '1'),
                             ('task.hidden_dims', '[16]', '[32]')])
    self.assertEqual(params_file.DescribeDifferences(diffs, first=2),
                     'input.batch_size (32 there, missing here), task.extra '
                     '(missing there, 1 here) and 1 more')
    self.assertEqual(params_file.Differences(_TEXT, _TEXT), [])

  def testWriteKeepsAFileThatDiffers(self):
    path = os.path.join(self.get_temp_dir(), 'params.txt')
    self.assertIsNone(params_file.Write(path, _TEXT, now=_NOW))   # New.
    self.assertIsNone(params_file.Write(path, _TEXT, now=_NOW))   # Same.
    self.assertEqual(os.listdir(self.get_temp_dir()), ['params.txt'])
    edited = _TEXT.replace('[16]', '[64]').replace('32\n', '8\n')
    with open(path, 'w') as f:   # A user's edit by hand.
      f.write(edited)
    kept = path + '.20250102T030405Z'
    self.assertEqual(
        params_file.Write(path, _TEXT, now=_NOW),
        f"{path} differs from this run's params in input.batch_size (8 "
        f'there, 32 here), task.hidden_dims ([64] there, [16] here): kept '
        f'it as {kept}.')
    with open(kept) as f:
      self.assertEqual(f.read(), edited)
    with open(path) as f:
      self.assertEqual(f.read(), _TEXT)
    # The same second again: a second name; a file that is not text.
    with open(path, 'wb') as f:
      f.write(b'\xff\xfe')
    self.assertEqual(params_file.Write(path, _TEXT, now=_NOW),
                     f"{path} differs from this run's params (it is not "
                     f'text): kept it as {kept}.2.')
    with open(kept + '.2', 'rb') as f:
      self.assertEqual(f.read(), b'\xff\xfe')
    self.assertEqual(params_file.Read(path), _TEXT)
    self.assertIsNone(params_file.Read(kept + '.2'))
    self.assertIsNone(params_file.Read(path + '.missing'))


if __name__ == '__main__':
  tf.test.main()
