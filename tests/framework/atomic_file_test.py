"""Tests of framework/atomic_file.py: whole files or none."""
import os
import re
import tempfile
import unittest
from unittest import mock

from cadence.framework import atomic_file


class WriteTest(unittest.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = tempfile.mkdtemp()
    self.path = os.path.join(self.dir, 'state')

  def testWritesTextAndBytesAndReplaces(self):
    atomic_file.Write(self.path, 'first\n')
    with open(self.path, 'rb') as f:
      self.assertEqual(b'first\n', f.read())
    atomic_file.Write(self.path, b'\x00\xffsecond')
    with open(self.path, 'rb') as f:
      self.assertEqual(b'\x00\xffsecond', f.read())
    self.assertEqual(['state'], os.listdir(self.dir))

  def testAFailedWriteLeavesTheOldFileAndNoTemporary(self):
    atomic_file.Write(self.path, 'old')
    with mock.patch.object(os, 'replace', side_effect=OSError('disk full')):
      with self.assertRaisesRegex(OSError, 'disk full'):
        atomic_file.Write(self.path, 'new')
    with open(self.path, encoding='utf-8') as f:
      self.assertEqual('old', f.read())
    self.assertEqual(['state'], os.listdir(self.dir))

  def testTemporaryNamesAreUniqueBesideThePath(self):
    names = {atomic_file.TempPath(self.path) for _ in range(100)}
    self.assertEqual(100, len(names))
    for name in names:
      self.assertRegex(name, '^' + re.escape(self.path) + r'\.tmp-[0-9a-f]{12}$')


if __name__ == '__main__':
  unittest.main()
