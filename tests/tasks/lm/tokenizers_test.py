"""Tests of tasks/lm/tokenizers.py: byte and SentencePiece tokenizers."""
import glob
import os
import re

import numpy as np
import tensorflow as tf

from cadence.tasks.lm import synthetic_corpus
from cadence.tasks.lm import tokenizers


class ByteTokenizerTest(tf.test.TestCase):

  def testRoundTrip(self):
    tok = tokenizers.ByteTokenizer.Params().Instantiate()
    self.assertEqual(tok.vocab_size, 260)
    self.assertEqual((tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id),
                     (0, 1, 2, 3))
    for text in ('', 'the cat', 'naïve café ✓ 日本', 'tab\there'):
      ids = tok.Encode(text)
      self.assertEqual(ids, [b + 4 for b in text.encode('utf-8')])
      self.assertEqual(tok.Decode(ids), text)
      # Special ids are dropped; arrays are accepted.
      self.assertEqual(tok.Decode(np.array([1] + ids + [2, 0, 0])), text)
    self.assertEqual(tok.EncodeBatch(['a', 'bc']), [[101], [102, 103]])

  def testBadIds(self):
    tok = tokenizers.ByteTokenizer.Params().Set(name='bytes').Instantiate()
    with self.assertRaisesRegex(
        ValueError, r"ByteTokenizer 'bytes': ids \[260, -1\] are outside "
        r'\[0, 260\)'):
      tok.Decode([5, 260, -1])
    # A cut multi-byte character decodes to the replacement character.
    self.assertEqual(tok.Decode(tok.Encode('é')[:1]), '\ufffd')


class SentencePieceTokenizerTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls._dir = os.path.join(tf.compat.v1.test.get_temp_dir(), 'spm_corpus')
    cls._patterns = synthetic_corpus.WriteShards(
        cls._dir, num_train_shards=2, sentences_per_shard=1000, seed=3,
        num_heldout_sentences=50)

  def _Params(self, **kwargs):
    return tokenizers.SentencePieceTokenizer.Params().Set(
        train_file_pattern=self._patterns.train, vocab_size=300, **kwargs)

  def testTrainsOnceThenLoadsTheCache(self):
    cache = os.path.join(self.get_temp_dir(), 'cache_a')
    tok = self._Params(cache_dir=cache).Instantiate()
    path = os.path.join(cache, 'spm_bpe_300.model')
    self.assertEqual(tok.model_file, path)
    self.assertEqual(os.listdir(cache), ['spm_bpe_300.model'])  # No temps.
    stat = os.stat(path)
    again = self._Params(cache_dir=cache).Instantiate()
    self.assertEqual(again.model_file, path)
    self.assertEqual(os.stat(path).st_mtime_ns, stat.st_mtime_ns)
    self.assertEqual(os.stat(path).st_ino, stat.st_ino)
    # Loading the file by model_file gives the same tokenizer.
    given = tokenizers.SentencePieceTokenizer.Params().Set(
        model_file=path).Instantiate()
    text = 'the brave farmer sees alice near the bridge'
    self.assertEqual(given.Encode(text), tok.Encode(text))
    self.assertEqual(again.Encode(text), tok.Encode(text))

  def testDefaultCacheIsBesideTheData(self):
    tok = self._Params().Set(vocab_size=280).Instantiate()
    self.assertEqual(tok.model_file, os.path.join(self._dir,
                                                  'spm_bpe_280.model'))

  def testReservedIdsAndRoundTrip(self):
    tok = self._Params(cache_dir=self.get_temp_dir()).Instantiate()
    self.assertEqual((tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id),
                     (0, 1, 2, 3))
    self.assertBetween(tok.vocab_size, 100, 300)
    with open(self._patterns.dev, encoding='utf-8') as f:
      sentences = f.read().split('\n')[:-1]
    encoded = tok.EncodeBatch(sentences)
    for s, ids in zip(sentences, encoded):
      self.assertEqual(ids, tok.Encode(s))
      self.assertNotIn(0, ids)
      self.assertNotIn(1, ids)
      self.assertNotIn(2, ids)
      self.assertEqual(tok.Decode([1] + ids + [2, 0]), s)
    with self.assertRaisesRegex(ValueError, r'ids \[300\] are outside'):
      tok.Decode([4, 300])

  def testTinyCorpusGivesFewerPieces(self):
    path = os.path.join(self.get_temp_dir(), 'tiny.txt')
    with open(path, 'w') as f:
      f.write('ab ab ba\n\nabba\n')
    tok = tokenizers.SentencePieceTokenizer.Params().Set(
        train_file_pattern=path, vocab_size=1000).Instantiate()
    self.assertLess(tok.vocab_size, 1000)
    self.assertEqual(tok.Decode(tok.Encode('abba ab')), 'abba ab')

  def testBadParams(self):
    p = tokenizers.SentencePieceTokenizer.Params().Set(name='spm')
    with self.assertRaisesRegex(ValueError, "'spm': set model_file or "
                                'train_file_pattern'):
      p.Copy().Instantiate()
    missing = os.path.join(self.get_temp_dir(), 'nothing-*')
    with self.assertRaisesRegex(ValueError, re.escape(
        f'train_file_pattern={missing!r} matches no files')):
      p.Copy().Set(train_file_pattern=missing).Instantiate()
    with self.assertRaisesRegex(ValueError, 'model_file=.*does not exist'):
      p.Copy().Set(model_file=missing).Instantiate()
    with self.assertRaisesRegex(ValueError, 'vocab_size=4 must be > 4'):
      self._Params().Set(vocab_size=4).Instantiate()
    with self.assertRaisesRegex(ValueError, "model_type='word' must be"):
      self._Params().Set(model_type='word').Instantiate()
    empty = os.path.join(self.get_temp_dir(), 'empty.txt')
    with open(empty, 'w') as f:
      f.write('\n  \n')
    with self.assertRaisesRegex(ValueError, 'has no non-empty lines'):
      p.Copy().Set(train_file_pattern=empty).Instantiate()
    self.assertEmpty(glob.glob(os.path.join(self.get_temp_dir(), '*.tmp-*')))


if __name__ == '__main__':
  tf.test.main()
