"""Tests of tasks/lm/token_cache.py and LmInput's use of it."""
import io
import os
import stat
import tempfile

import numpy as np
import tensorflow as tf

from cadence.framework import atomic_file
from cadence.tasks.lm import cache_files
from cadence.tasks.lm import input_generator
from cadence.tasks.lm import synthetic_corpus
from cadence.tasks.lm import token_cache
from cadence.tasks.lm import tokenizers


class _CountingTokenizer(tokenizers.ByteTokenizer):
  """A ByteTokenizer that caches (its `key` param) and counts the
  sentences it encodes in `ENCODED`."""
  ENCODED = []

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('key', 'bytes-test', 'Its cache_key.')
    return p

  @property
  def cache_key(self):
    return self._params.key

  def EncodeBatch(self, texts):
    _CountingTokenizer.ENCODED.extend(texts)
    return super().EncodeBatch(texts)


def _AsLists(batch):
  return {k: np.asarray(v).tolist() for k, v in batch.items()}


class TokenCacheTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    self._dir = tempfile.mkdtemp(dir=self.get_temp_dir())
    self._cache = os.path.join(self._dir, 'cache')
    self._sentences = synthetic_corpus.GenerateSentences(30, [7])
    self._files = []
    for i in range(2):
      path = os.path.join(self._dir, f'train-{i}')
      with open(path, 'w', encoding='utf-8') as f:
        f.write('\n'.join(self._sentences[i * 15:(i + 1) * 15]) + '\n\n')
      self._files.append(path)
    _CountingTokenizer.ENCODED.clear()

  def _Gen(self, key='bytes-test', cache=None):
    return input_generator.LmInput.Params().Set(
        file_pattern=os.path.join(self._dir, 'train-*'),
        tokenizer=_CountingTokenizer.Params().Set(key=key),
        token_cache_dir=self._cache if cache is None else cache,
        batch_size=4, max_seq_len=32, packed=True).Instantiate()

  def _Batches(self, gen):
    return [_AsLists(gen.InputBatchAt(i)) for i in range(4)]

  def testSecondInputReadsTheCacheAndGivesTheSameBatches(self):
    first = self._Gen()
    self.assertLen(_CountingTokenizer.ENCODED, 30)
    self.assertLen(os.listdir(self._cache), 4)   # 2 entries + 2 digests.
    second = self._Gen()
    self.assertLen(_CountingTokenizer.ENCODED, 30)   # Nothing encoded.
    self.assertEqual(self._Batches(second), self._Batches(first))
    self.assertEqual(second.stats, first.stats)
    self.assertEqual(second.stats.num_empty_lines, 2)
    # The reference: the same input without any cache.
    self.assertEqual(self._Batches(self._Gen(cache='')),
                     self._Batches(first))

  def testStoredArraysAreTheEncodedSentences(self):
    tok = tokenizers.ByteTokenizer.Params().Instantiate()
    self._Gen()
    ids, lengths, empty, bad = token_cache.Load(self._cache, self._files[1],
                                                'bytes-test')
    want = [tok.Encode(s) for s in self._sentences[15:]]
    self.assertEqual(lengths.tolist(), [len(w) for w in want])
    self.assertEqual(ids.tolist(), sum(want, []))
    self.assertEqual((ids.dtype, lengths.dtype), (np.int32, np.int64))
    self.assertEqual((empty, bad), (1, 0))

  def testEditedFileOrOtherTokenizerIsTokenisedAgain(self):
    self._Gen()
    with open(self._files[0], 'a', encoding='utf-8') as f:
      f.write('the new sentence\n')
    gen = self._Gen()
    self.assertEqual(_CountingTokenizer.ENCODED[30:],
                     self._sentences[:15] + ['the new sentence'])
    self.assertEqual(gen.stats.num_sentences, 31)
    self._Gen(key='another model')
    self.assertLen(_CountingTokenizer.ENCODED, 30 + 16 + 31)

  def testDamagedEntryIsRecomputedAndRewritten(self):
    want = self._Batches(self._Gen())
    entry = token_cache.EntryPath(self._cache, self._files[0], 'bytes-test')
    with open(entry, 'r+b') as f:
      f.seek(100)
      f.write(b'\x00\xff' * 8)
    self.assertFalse(cache_files.Verified(entry))
    with self.assertLogs(level='WARNING') as logs:
      gen = self._Gen()
    self.assertIn('does not match its recorded digest', logs.output[0])
    self.assertEqual(_CountingTokenizer.ENCODED[30:], self._sentences[:15])
    self.assertEqual(self._Batches(gen), want)
    self.assertTrue(cache_files.Verified(entry))

  def testAnyBytesWithAMatchingDigestAreTokenisedAgain(self):
    # A digest only says nobody changed the bytes since it was written: an
    # entry written damaged (a zip header and noise, a zip of other arrays,
    # arrays that do not agree) is treated as missing and rewritten.
    want = self._Batches(self._Gen())
    entry = token_cache.EntryPath(self._cache, self._files[0], 'bytes-test')
    other = io.BytesIO()
    np.savez(other, ids=np.zeros([3], np.int32))
    mismatched = io.BytesIO()
    np.savez(mismatched, ids=np.zeros([3], np.int32),
             lengths=np.array([5], np.int64), counts=np.zeros([2], np.int64))
    noise = b'PK' + np.random.RandomState(0).bytes(500)
    for name, data in (('noise', noise), ('other arrays', other.getvalue()),
                       ('lengths that do not sum', mismatched.getvalue()),
                       ('empty', b'')):
      with self.subTest(name):
        atomic_file.Write(entry, data)
        cache_files.WriteDigest(entry)
        _CountingTokenizer.ENCODED.clear()
        with self.assertLogs(level='WARNING') as logs:
          gen = self._Gen()
        self.assertRegex(logs.output[0], 'cannot read|does not hold')
        self.assertEqual(_CountingTokenizer.ENCODED, self._sentences[:15])
        self.assertEqual(self._Batches(gen), want)
        got = token_cache.Load(self._cache, self._files[0], 'bytes-test')
        self.assertEqual(int(got[1].sum()), got[0].size)

  def testUnwritableCacheWarnsAndTheInputWorks(self):
    os.makedirs(self._cache)
    os.chmod(self._cache, stat.S_IRUSR | stat.S_IXUSR)
    self.addCleanup(os.chmod, self._cache, stat.S_IRWXU)
    if os.access(self._cache, os.W_OK):   # root ignores the mode bits.
      blocker = os.path.join(self._dir, 'not_a_dir')
      open(blocker, 'w').close()
      cache = os.path.join(blocker, 'cache')
    else:
      cache = self._cache
    with self.assertLogs(level='WARNING') as logs:
      gen = self._Gen(cache=cache)
    self.assertIn('the job goes on without the cache', logs.output[0])
    self.assertEqual(self._Batches(gen), self._Batches(self._Gen(cache='')))

  def testAnInputThatFailsWritesNothing(self):
    blank = os.path.join(self._dir, 'blank-0')
    with open(blank, 'w', encoding='utf-8') as f:
      f.write('\n \n')
    with self.assertRaisesRegex(ValueError, 'has no sentences'):
      input_generator.LmInput.Params().Set(
          file_pattern=blank, tokenizer=_CountingTokenizer.Params(),
          token_cache_dir=self._cache).Instantiate()
    self.assertFalse(os.path.exists(self._cache))

  def testTokenizersWithoutAKeyAreNotCached(self):
    input_generator.LmInput.Params().Set(
        file_pattern=os.path.join(self._dir, 'train-*'),
        token_cache_dir=self._cache).Instantiate()   # ByteTokenizer.
    self.assertFalse(os.path.exists(self._cache))

  def testSentencePieceKeyIsItsModelDigest(self):
    tok = tokenizers.SentencePieceTokenizer.Params().Set(
        train_file_pattern=os.path.join(self._dir, 'train-*'),
        vocab_size=40, cache_dir=os.path.join(self._dir, 'spm')).Instantiate()
    self.assertEqual(tok.cache_key,
                     'spm-' + cache_files.Sha256(tok.model_file))

  def testBadCacheDirParam(self):
    with self.assertRaisesRegex(
        ValueError, r"LmInput 'lm_input': token_cache_dir=3 must be None"):
      input_generator.LmInput.Params().Set(
          file_pattern=self._files[0], token_cache_dir=3).Instantiate()


if __name__ == '__main__':
  tf.test.main()
