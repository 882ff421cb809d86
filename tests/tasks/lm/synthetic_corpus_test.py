"""Tests of tasks/lm/synthetic_corpus.py: sampling, exact entropy, shards."""
import glob
import hashlib
import json
import os

import numpy as np
import tensorflow as tf

from cadence.tasks.lm import synthetic_corpus


class GrammarTest(tf.test.TestCase):

  def testVocabulary(self):
    vocab = synthetic_corpus.Vocabulary()
    self.assertBetween(len(vocab), 100, 300)
    self.assertLen(set(vocab), len(vocab))
    for w in vocab:
      self.assertRegex(w, r'^[a-z]+$')

  def testDeterministicForSeed(self):
    a = synthetic_corpus.GenerateSentences(50, seed=7)
    self.assertEqual(a, synthetic_corpus.GenerateSentences(50, seed=7))
    self.assertNotEqual(a, synthetic_corpus.GenerateSentences(50, seed=8))
    self.assertEqual(synthetic_corpus.GenerateSentences(0, seed=7), [])

  def testSentencesAreInTheGrammar(self):
    vocab = set(synthetic_corpus.Vocabulary())
    for s in synthetic_corpus.GenerateSentences(200, seed=1):
      self.assertEqual(s, s.strip())
      self.assertNotIn('  ', s)
      self.assertContainsSubset(s.split(' '), vocab)
      self.assertLess(synthetic_corpus.SentenceLogProb(s), 0.0)
    # The module docstring's examples are sentences of the grammar.
    for s in ('the quiet farmer sees a cat near the bridge and alice gladly '
              'reads', 'she often finds emma'):
      self.assertTrue(np.isfinite(synthetic_corpus.SentenceLogProb(s)))

  def testSentenceLogProbRejectsNonSentences(self):
    with self.assertRaisesRegex(ValueError, "not in the grammar .*'zebra'"):
      synthetic_corpus.SentenceLogProb('the zebra sees bob')
    with self.assertRaisesRegex(ValueError, "not in the grammar .*'sees'"):
      synthetic_corpus.SentenceLogProb('sees the cat')
    with self.assertRaisesRegex(ValueError, 'cannot end'):
      synthetic_corpus.SentenceLogProb('the cat')

  def testEntropyMatchesMonteCarlo(self):
    # The mean of -log p(sentence) over samples estimates the entropy; it is
    # a mean of i.i.d. values, so it lies within 5 standard errors of the
    # exact value except with probability < 1e-6.
    n = 20000
    sentences = synthetic_corpus.GenerateSentences(n, seed=123)
    nll = -np.array([synthetic_corpus.SentenceLogProb(s) for s in sentences])
    stderr = nll.std() / np.sqrt(n)
    self.assertLess(stderr, 0.5)
    exact = synthetic_corpus.EntropyPerSentence()
    self.assertBetween(exact, 10.0, 100.0)
    self.assertAllClose(nll.mean(), exact, atol=5 * stderr, rtol=0)
    # Same for the expected number of words.
    lengths = np.array([len(s.split(' ')) for s in sentences])
    self.assertAllClose(lengths.mean(),
                        synthetic_corpus.ExpectedWordsPerSentence(),
                        atol=5 * lengths.std() / np.sqrt(n), rtol=0)
    self.assertBetween(lengths.mean(), 5.0, 20.0)

  def testShortSentenceMassMatchesSampling(self):
    # Enumerates every word sequence of 1 and 2 words: the summed
    # probability of those in the grammar is exactly P(length <= 2), which
    # the sampled frequency estimates within 5 standard errors.
    vocab = synthetic_corpus.Vocabulary()
    mass = 0.0
    for seq in [[a] for a in vocab] + [[a, b] for a in vocab for b in vocab]:
      try:
        mass += np.exp(synthetic_corpus.SentenceLogProb(' '.join(seq)))
      except ValueError:
        pass
    n = 20000
    sentences = synthetic_corpus.GenerateSentences(n, seed=5)
    freq = np.mean([len(s.split(' ')) <= 2 for s in sentences])
    self.assertBetween(mass, 0.01, 0.5)
    self.assertAllClose(freq, mass, atol=5 * np.sqrt(mass * (1 - mass) / n),
                        rtol=0)

  def testBadCount(self):
    with self.assertRaisesRegex(ValueError, 'n=-1 must be >= 0'):
      synthetic_corpus.GenerateSentences(-1, seed=0)


def _Warning(message):
  """How assertLogs shows an absl warning."""
  return f'WARNING:absl:{message}'


class WriteShardsTest(tf.test.TestCase):

  def _Lines(self, path):
    with open(path, encoding='utf-8') as f:
      return f.read().split('\n')[:-1]

  def testLayoutAndIdempotence(self):
    data_dir = os.path.join(self.get_temp_dir(), 'corpus')
    patterns = synthetic_corpus.WriteShards(
        data_dir, num_train_shards=3, sentences_per_shard=20, seed=4,
        num_heldout_sentences=7)
    train = sorted(glob.glob(patterns.train))
    self.assertEqual([os.path.basename(f) for f in train],
                     [f'train-0000{i}-of-00003' for i in range(3)])
    for f in train:
      self.assertLen(self._Lines(f), 20)
    self.assertLen(self._Lines(patterns.dev), 7)
    self.assertLen(self._Lines(patterns.test), 7)
    self.assertEqual(self._Lines(train[1]),
                     synthetic_corpus.GenerateSentences(20, [4, 0, 1]))
    self.assertNotEqual(self._Lines(patterns.dev),
                        self._Lines(patterns.test))

    mtimes = {f: os.stat(f).st_mtime_ns for f in glob.glob(data_dir + '/*')}
    again = synthetic_corpus.WriteShards(
        data_dir, num_train_shards=3, sentences_per_shard=20, seed=4,
        num_heldout_sentences=7)
    self.assertEqual(again, patterns)
    self.assertEqual(
        {f: os.stat(f).st_mtime_ns for f in glob.glob(data_dir + '/*')},
        mtimes)

  def testNewConfigReplacesOldFilesAndModels(self):
    data_dir = os.path.join(self.get_temp_dir(), 'corpus2')
    synthetic_corpus.WriteShards(data_dir, 3, 5, seed=0)
    stale_model = os.path.join(data_dir, 'spm_bpe_64.model')
    with open(stale_model, 'w') as f:
      f.write('trained on the old text')
    patterns = synthetic_corpus.WriteShards(data_dir, 2, 5, seed=0)
    self.assertFalse(os.path.exists(stale_model))
    self.assertEqual(sorted(os.listdir(data_dir)), [
        'dev-00000-of-00001', 'synthetic_corpus.json',
        'synthetic_corpus.sha256.json', 'test-00000-of-00001',
        'train-00000-of-00002', 'train-00001-of-00002'])
    self.assertLen(glob.glob(patterns.train), 2)

  def testDamagedFilesAreRewrittenFromTheirDigests(self):
    data_dir = os.path.join(self.get_temp_dir(), 'corpus3')
    args = dict(num_train_shards=3, sentences_per_shard=20, seed=4,
                num_heldout_sentences=7)
    patterns = synthetic_corpus.WriteShards(data_dir, **args)
    files = sorted(glob.glob(data_dir + '/*-of-*'))
    written = {}
    for f in files:
      with open(f, 'rb') as fh:
        written[f] = fh.read()
    record = os.path.join(data_dir, 'synthetic_corpus.sha256.json')
    with open(record) as fh:
      self.assertEqual(json.load(fh), {
          os.path.basename(f): hashlib.sha256(data).hexdigest()
          for f, data in written.items()})

    def _Damage():
      damaged, deleted = files[1], files[3]
      with open(damaged, 'wb') as fh:   # Same size, random bytes.
        fh.write(np.random.RandomState(0).bytes(len(written[damaged])))
      os.remove(deleted)
      return (f'synthetic_corpus: {data_dir}: {os.path.basename(damaged)}, '
              f'{os.path.basename(deleted)} missing or not as written; '
              'rewriting it')

    def _AssertAsWritten(untouched_since=None):
      for f in files:
        with open(f, 'rb') as fh:
          self.assertEqual(fh.read(), written[f], f)
        if untouched_since and f in untouched_since:
          self.assertEqual(os.stat(f).st_mtime_ns, untouched_since[f])

    warning = _Damage()
    intact = {f: os.stat(f).st_mtime_ns for f in (files[0], files[2])}
    with self.assertLogs(level='WARNING') as logs:
      self.assertEqual(synthetic_corpus.WriteShards(data_dir, **args),
                       patterns)
    self.assertEqual(logs.output, [_Warning(warning)])
    _AssertAsWritten(untouched_since=intact)
    # A corpus written without the digest record (by an older version) or
    # with an unreadable one is compared with the samples once.
    for how in ('missing', 'garbage'):
      if how == 'missing':
        os.remove(record)
      else:
        with open(record, 'wb') as fh:
          fh.write(b'\x00garbage')
      warning = _Damage()
      with self.assertLogs(level='WARNING') as logs:
        synthetic_corpus.WriteShards(data_dir, **args)
      self.assertEqual(logs.output[-1], _Warning(warning))
      _AssertAsWritten()
      self.assertTrue(os.path.exists(record))

  def testBadShardCount(self):
    with self.assertRaisesRegex(ValueError, 'num_train_shards=0 must be'):
      synthetic_corpus.WriteShards(self.get_temp_dir(), 0, 5)


if __name__ == '__main__':
  tf.test.main()
