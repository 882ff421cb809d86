"""Tests for cadence.framework.base_input_generator."""
import os
import re

import numpy as np
import tensorflow as tf

from cadence.framework import base_input_generator as big
from cadence.framework.nested_map import NestedMap


class _TokenInput(big.BaseInputGenerator):
  """Lines of space-separated ints -> ids [len], paddings [len], index."""

  def _ProcessRecord(self, record):
    ids = tf.strings.to_number(tf.strings.split(record), tf.int32)
    return NestedMap(ids=ids, paddings=tf.zeros_like(ids, tf.float32))

  def _ExampleLength(self, example):
    return tf.shape(example.ids)[0]


class _FirstIdInput(big.BaseInputGenerator):
  """Vectorised: [n] lines -> ids [n, 1], each line's first int."""

  def _ProcessRecordBatch(self, records):
    first = tf.strings.split(records).to_tensor()[:, :1]
    return NestedMap(ids=tf.strings.to_number(first, tf.int32))


def _WriteLines(path, lines):
  with open(path, 'w') as f:
    f.write(''.join(f'{line}\n' for line in lines))
  return path


def _Ids(batches):
  """First id of every example, batch by batch."""
  return [b.ids[:, 0].numpy().tolist() for b in batches]


class BaseInputGeneratorTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = self.get_temp_dir()
    # Example i is the line 'i i ... i' of length 1 + i % 7.
    for shard in range(4):
      _WriteLines(os.path.join(self.dir, f'data-{shard:05d}-of-00004'),
                  [' '.join([str(i)] * (1 + i % 7))
                   for i in range(shard * 25, shard * 25 + 25)])
    self.pattern = os.path.join(self.dir, 'data@4')

  def _Params(self, **kw):
    return _TokenInput.Params().Set(file_pattern=self.pattern, batch_size=5,
                                    shuffle_buffer_size=50, **kw)

  def testExpandFilePattern(self):
    files, missing = big.ExpandFilePattern(
        f'{self.pattern},{self.dir}/data-00000-*,{self.dir}/nothing-*')
    self.assertLen(files, 4)  # Sorted and de-duplicated.
    self.assertEqual(files, sorted(files))
    self.assertEqual(missing, [f'{self.dir}/nothing-*'])
    _, missing = big.ExpandFilePattern(f'{self.dir}/data@5')
    self.assertEqual(missing, [f'{self.dir}/data@5 (5 of 5 shards missing)'])

  def testMissingAndEmptyFilesNameThePattern(self):
    pattern = os.path.join(self.dir, 'absent-*.txt')
    with self.assertRaisesRegex(
        big.InputError, r"_TokenInput 'input': file_pattern '.*absent-\*\."
        r"txt' matches no files for: .*absent-\*\.txt\."):
      self._Params().Set(file_pattern=pattern).Instantiate()
    _WriteLines(os.path.join(self.dir, 'empty.txt'), [])
    open(os.path.join(self.dir, 'empty.txt'), 'w').close()
    with self.assertRaisesRegex(big.InputError,
                                r"'.*empty\.txt' matches 1 file\(s\), all "
                                'empty'):
      self._Params().Set(
          file_pattern=os.path.join(self.dir, 'empty.txt')).Instantiate()
    with self.assertRaisesRegex(big.InputError, 'file_pattern=.* is empty'):
      self._Params().Set(file_pattern='').Instantiate()

  def testDirectoriesAndFilesThatAreNotText(self):
    sub = os.path.join(self.dir, 'sub')
    os.makedirs(sub)
    with self.assertRaisesRegex(big.InputError, re.escape(
        f"_TokenInput 'input': {sub!r} (of file_pattern {self.dir + '/*'!r}) "
        f"is a directory, not a file; name the files in it (e.g. "
        f"{sub + '/*'!r}).")):
      self._Params().Set(file_pattern=self.dir + '/*').Instantiate()
    cases = {  # file contents -> the rule its message states
        # Random bytes (seeded): NULs among them.
        np.random.RandomState(0).bytes(3000):
            r'is not text: it holds NUL bytes \(byte \d+\); a binary, '
            r'compressed or UTF-16 file\?',
        'ab\n'.encode('utf-16'): r'is not text: it holds NUL bytes',
        b'\xff\xfe\x80abc\n': r'is not text: 3 of its first 7 bytes are not '
                              r'UTF-8; a binary or compressed file\?'}
    for i, (data, rule) in enumerate(cases.items()):
      path = os.path.join(sub, f'bad-{i}')
      with open(path, 'wb') as f:
        f.write(data)
      self.assertRegex(big.FileProblem(path), '^' + rule)
      with self.assertRaisesRegex(big.InputError, f"_TokenInput 'input': "
                                  f"'{path}' \\(of file_pattern '{path}'\\) "
                                  + rule):
        self._Params().Set(file_pattern=path).Instantiate()
    # A few bad bytes in text (1 of 22 here) pass; tfrecords are binary.
    ok = os.path.join(sub, 'mostly-text')
    with open(ok, 'wb') as f:
      f.write(b'a line\nc\xff d\nmore text\n')
    self.assertIsNone(big.FileProblem(ok))
    self.assertIsNone(big.FileProblem(path, 'tfrecord'))

  def testBadParams(self):
    with self.assertRaisesRegex(big.InputError,
                                r"batch_size=0 must be an int >= 1"):
      self._Params().Set(batch_size=0).Instantiate()
    with self.assertRaisesRegex(big.InputError, 'strictly increasing'):
      self._Params().Set(bucket_upper_bound=[4, 2]).Instantiate()
    with self.assertRaisesRegex(big.InputError, 'one entry per bucket'):
      self._Params().Set(bucket_upper_bound=[2, 4],
                         bucket_batch_limit=[3]).Instantiate()
    with self.assertRaisesRegex(big.InputError, 'input_shard_index=2'):
      self._Params().Set(num_input_shards=2, input_shard_index=2).Instantiate()

  def testReadsEveryExampleOnceWithoutRepeat(self):
    gen = self._Params().Set(repeat=False, shuffle=False).Instantiate()
    ids = sum(_Ids(gen.Dataset()), [])
    self.assertEqual(ids, list(range(100)))
    # Padded batches: paddings are 1 past each example's length.
    batch = next(iter(gen.Dataset()))
    lengths = 1 + np.arange(5) % 7
    self.assertAllEqual(batch.paddings.numpy().sum(1),
                        batch.ids.shape[1] - lengths)

  def testDeterministicForASeed(self):
    first = _Ids(self._Params(random_seed=7).Instantiate().Dataset().take(30))
    again = _Ids(self._Params(random_seed=7).Instantiate().Dataset().take(30))
    other = _Ids(self._Params(random_seed=8).Instantiate().Dataset().take(30))
    self.assertEqual(first, again)
    self.assertNotEqual(first, other)
    # Shuffled, one epoch holds every example once, in a new order.
    once = sum(_Ids(self._Params(repeat=False).Instantiate().Dataset()), [])
    self.assertCountEqual(once, range(100))
    self.assertNotEqual(once, list(range(100)))

  def testResumeFromABatch(self):
    gen = self._Params().Instantiate()
    full = _Ids(gen.Dataset().take(40))
    resumed = _Ids(gen.Dataset(start_batch=23).take(17))
    self.assertEqual(resumed, full[23:])

  def _AssertHostsShareGlobalBatches(self, params, num_batches=3):
    """2 hosts x 2 replicas read the rows of 1 host x 4 replicas, in order
    (from a resumed position)."""
    for start in (2,):
      whole = list(params.Copy().Instantiate().Dataset(
          start_batch=start, num_replicas=4).take(num_batches))
      hosts = [list(params.Copy().Set(
          num_input_shards=2, input_shard_index=h).Instantiate().Dataset(
              start_batch=start, num_replicas=2).take(num_batches))
               for h in range(2)]
      self.assertLen(whole, num_batches)
      for batch, *shares in zip(whole, *hosts):
        for key in batch:
          self.assertAllEqual(batch[key], np.concatenate(
              [share[key] for share in shares]), msg=key)

  def testHostsShareGlobalBatches(self):
    self._AssertHostsShareGlobalBatches(self._Params())    # padded
    self._AssertHostsShareGlobalBatches(self._Params(      # bucketed
        bucket_upper_bound=[2, 4, 7], bucket_batch_limit=[3, 2, 1]))
    self._AssertHostsShareGlobalBatches(self._Params(      # static shapes
        bucket_upper_bound=[7], fixed_input_shape=True))
    self._AssertHostsShareGlobalBatches(                   # vectorised
        _FirstIdInput.Params().Set(file_pattern=self.pattern, batch_size=3))
    # A static batch dim stays static in each host's share.
    share = self._Params(bucket_upper_bound=[7], fixed_input_shape=True,
                         num_input_shards=2, input_shard_index=1)
    self.assertEqual(share.Instantiate().Dataset(
        num_replicas=2).element_spec.ids.shape.as_list(), [10, 7])

  def testHostSharesOfOnePassAreDisjointAndCover(self):
    shares = [self._Params(num_input_shards=2, input_shard_index=h,
                           repeat=False).Instantiate() for h in range(2)]
    self.assertEqual([len(s.files) for s in shares], [4, 4])  # All files.
    ids = [sum(_Ids(s.Dataset()), []) for s in shares]
    self.assertEmpty(set(ids[0]) & set(ids[1]))
    self.assertCountEqual(ids[0] + ids[1], range(100))
    # The last global batch (100 = 10 x 10) splits in equal halves; with
    # 3 hosts the shares are ceil(10 / 3) = 4, 4 and 2 rows.
    self.assertEqual([shares[0].HostRows(10), shares[1].HostRows(10)],
                     [(0, 5), (5, 10)])
    three = [self._Params(num_input_shards=3,
                          input_shard_index=h).Instantiate().HostRows(10)
             for h in range(3)]
    self.assertEqual(three, [(0, 4), (4, 8), (8, 12)])

  def testBucketingByLength(self):
    gen = self._Params(bucket_upper_bound=[2, 4, 6],
                       bucket_batch_limit=[4, 3, 2], repeat=False,
                       shuffle=False).Instantiate()
    seen = []
    for batch in gen.Dataset():
      lengths = (1 - batch.paddings.numpy()).sum(1)
      bucket = int(np.searchsorted([2, 4, 6], lengths.max()))
      self.assertTrue(all(np.searchsorted([2, 4, 6], lengths) == bucket))
      self.assertLessEqual(len(lengths), [4, 3, 2][bucket])
      seen.extend(batch.ids[:, 0].numpy().tolist())
    # Length 7 (i % 7 == 6) is above the last bound: dropped.
    self.assertCountEqual(seen, [i for i in range(100) if i % 7 != 6])

  def testFixedInputShape(self):
    gen = self._Params(bucket_upper_bound=[3, 7], bucket_batch_limit=[4, 2],
                       fixed_input_shape=True).Instantiate()
    for batch in gen.Dataset().take(10):  # Padded to the bucket bound.
      self.assertIn(tuple(batch.ids.shape), [(4, 3), (2, 7)])
    # Equal limits: a static batch dim; one bucket: a static length too.
    gen = self._Params(bucket_upper_bound=[3, 7], bucket_batch_limit=[4, 4],
                       fixed_input_shape=True).Instantiate()
    self.assertEqual(gen.Dataset().element_spec.ids.shape.as_list(),
                     [4, None])
    gen = self._Params(bucket_upper_bound=[7], fixed_input_shape=True,
                       num_input_shards=1).Instantiate()
    self.assertEqual(gen.Dataset(num_replicas=2).element_spec.ids.shape,
                     [10, 7])
    for batch in gen.Dataset(num_replicas=2).take(3):
      self.assertEqual(batch.paddings.shape, [10, 7])
    with self.assertRaisesRegex(big.InputError, 'needs bucket_upper_bound'):
      self._Params(fixed_input_shape=True).Instantiate().Dataset()

  def testRealExamplesAreTheRowsNotAllPadding(self):
    batch = NestedMap(ids=tf.zeros([4, 3], tf.int32), paddings=tf.constant(
        [[0, 0, 1], [1, 1, 1], [0, 0, 0], [1, 1, 1]], tf.float32))
    self.assertAllEqual(big.RealExamples(batch), [True, False, True, False])
    batch.sub = NestedMap(tgt_paddings=tf.constant([[0.], [0.], [1.], [1.]]))
    self.assertAllEqual(big.RealExamples(batch), [True, False, False, False])
    self.assertAllEqual(big.RealExamples(NestedMap(x=tf.zeros([3, 2]))),
                        [True] * 3)

  def testGlobalBatchAcrossReplicas(self):
    gen = self._Params().Instantiate()
    self.assertEqual(gen.GlobalBatchSize(3), 15)
    batch = next(iter(gen.Dataset(num_replicas=3)))
    self.assertEqual(batch.ids.shape[0], 15)


if __name__ == '__main__':
  tf.test.main()
