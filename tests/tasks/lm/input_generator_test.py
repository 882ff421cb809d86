"""Tests of tasks/lm/input_generator.py: LmInput batches, order, resume."""
import os
import re

import numpy as np
import tensorflow as tf

from cadence.framework import base_input_generator
from cadence.framework import hyperparams
from cadence.tasks.lm import input_generator
from cadence.tasks.lm import synthetic_corpus
from cadence.tasks.lm import tokenizers

# ByteTokenizer ids: byte + 4; pad 0, bos 1, eos 2.
A, B, C, D, E, F = (ord(ch) + 4 for ch in 'abcdef')


def _Write(path, data):
  with open(path, 'wb') as f:
    f.write(data)
  return path


def _AsLists(batch):
  return {k: np.asarray(v).tolist() for k, v in batch.items()}


def _Split(batches):
  """(batches as lists without sentence_weights, [sentence_weights])."""
  lists = [_AsLists(b) for b in batches]
  return lists, [b.pop('sentence_weights') for b in lists]


class LmInputTest(tf.test.TestCase):

  def _Dir(self, name):
    path = os.path.join(self.get_temp_dir(), name)
    os.makedirs(path, exist_ok=True)
    return path

  def _Params(self, pattern, **kwargs):
    return input_generator.LmInput.Params().Set(file_pattern=pattern,
                                                **kwargs)

  def _Corpus(self, name, num_files=4, per_file=9):
    """num_files files of distinct synthetic sentences; returns the glob."""
    data_dir = self._Dir(name)
    sentences = list(dict.fromkeys(
        synthetic_corpus.GenerateSentences(4 * num_files * per_file, 0)))
    for i in range(num_files):
      chunk = sentences[i * per_file:(i + 1) * per_file]
      _Write(os.path.join(data_dir, f'train-{i:05d}-of-{num_files:05d}'),
             ('\n'.join(chunk) + '\n').encode())
    return os.path.join(data_dir, 'train-*'), sentences[:num_files * per_file]

  # --- hand-made examples ------------------------------------------------

  def testPackedHandMade(self):
    path = _Write(os.path.join(self._Dir('packed'), 'x.txt'), b'ab\nc\nde\n')
    gen = self._Params(path, batch_size=2, max_seq_len=4, packed=True,
                       shuffle=False, repeat=False,
                       fixed_input_shape=True).Instantiate()
    # Stream: 1 a b 2 | 1 c 2 | 1 d e 2; windows of 4 inputs + 1 label.
    self.assertEqual(gen.NumBatchesPerEpoch(), 2)
    batches, sentence_weights = _Split(gen.Dataset())
    self.assertEqual(batches, [
        dict(ids=[[1, A, B, 2], [1, C, 2, 1]],
             labels=[[A, B, 2, 1], [C, 2, 1, D]],
             paddings=[[0, 0, 0, 0], [0, 0, 0, 0]],
             weights=[[1, 1, 1, 0], [1, 1, 0, 1]]),   # BOS labels: 0.
        dict(ids=[[D, E, 0, 0], [0, 0, 0, 0]],
             labels=[[E, 2, 0, 0], [0, 0, 0, 0]],
             paddings=[[0, 0, 1, 1], [1, 1, 1, 1]],
             weights=[[1, 1, 0, 0], [0, 0, 0, 0]])])
    # Whole in their row: 'ab' (n=2 of t=4: weight 4/2) and 'c' (4/3); 'de'
    # lost its BOS to the row before.
    self.assertAllClose(sentence_weights, [
        [[2, 2, 2, 0], [4 / 3, 4 / 3, 0, 0]],
        [[0, 0, 0, 0], [0, 0, 0, 0]]], atol=1e-6)
    # Without fixed_input_shape the all-padding row of the last batch goes.
    gen = self._Params(path, batch_size=2, max_seq_len=4, packed=True,
                       shuffle=False, repeat=False).Instantiate()
    self.assertEqual(_AsLists(gen.InputBatchAt(1))['ids'], [[D, E, 0, 0]])

  def testPaddedHandMade(self):
    path = _Write(os.path.join(self._Dir('padded'), 'x.txt'),
                  b'ab\nc\nabcdef\n')
    p = self._Params(path, batch_size=2, max_seq_len=4, packed=False,
                     shuffle=False, repeat=False, fixed_input_shape=True)
    gen = p.Instantiate()
    self.assertEqual(gen.stats.num_truncated, 1)
    batches, sentence_weights = _Split(gen.Dataset())
    self.assertEqual(batches, [
        dict(ids=[[1, A, B, 0], [1, C, 0, 0]],
             labels=[[A, B, 2, 0], [C, 2, 0, 0]],
             paddings=[[0, 0, 0, 1], [0, 0, 1, 1]],
             weights=[[1, 1, 1, 0], [1, 1, 0, 0]]),
        dict(ids=[[1, A, B, C], [0, 0, 0, 0]],        # truncated, no EOS
             labels=[[A, B, C, D], [0, 0, 0, 0]],
             paddings=[[0, 0, 0, 0], [1, 1, 1, 1]],
             weights=[[1, 1, 1, 1], [0, 0, 0, 0]])])
    # One sentence a row weighs 1, but the truncated one is not whole.
    self.assertEqual(sentence_weights, [
        [[1, 1, 1, 0], [1, 1, 0, 0]], [[0, 0, 0, 0], [0, 0, 0, 0]]])
    # Unfixed: padded to the longest row of the batch, short last batch.
    gen = p.Copy().Set(fixed_input_shape=False).Instantiate()
    batches, sentence_weights = _Split(gen.Dataset())
    self.assertEqual(sentence_weights, [[[1, 1, 1], [1, 1, 0]],
                                        [[0, 0, 0, 0]]])
    self.assertEqual(batches, [
        dict(ids=[[1, A, B], [1, C, 0]], labels=[[A, B, 2], [C, 2, 0]],
             paddings=[[0, 0, 0], [0, 0, 1]], weights=[[1, 1, 1], [1, 1, 0]]),
        dict(ids=[[1, A, B, C]], labels=[[A, B, C, D]],
             paddings=[[0, 0, 0, 0]], weights=[[1, 1, 1, 1]])])

  def testStaticShapes(self):
    pattern, _ = self._Corpus('shapes')
    p = self._Params(pattern, batch_size=3, max_seq_len=16)
    for packed in (True, False):
      gen = p.Copy().Set(packed=packed, fixed_input_shape=True).Instantiate()
      ds = gen.Dataset(num_replicas=2)
      for spec in ds.element_spec.values():
        self.assertEqual(spec.shape.as_list(), [6, 16])
      batch = next(iter(ds))
      self.assertIsInstance(batch, input_generator.NestedMap)
      self.assertEqual(batch.ids.dtype, tf.int32)
      self.assertEqual(batch.labels.dtype, tf.int32)
      self.assertEqual(batch.paddings.dtype, tf.float32)
      self.assertEqual(batch.weights.dtype, tf.float32)
      self.assertEqual(batch.sentence_weights.dtype, tf.float32)
      gen = p.Copy().Set(packed=packed).Instantiate()
      for spec in gen.Dataset().element_spec.values():
        self.assertEqual(spec.shape.as_list(), [None, None])

  def testSentenceWeightsEstimateTheMeanOverAllSentences(self):
    # Bytes of grammar sentences (about 48 a sentence) in windows of 96:
    # long sentences are cut more often. The weighted mean over the whole
    # ones estimates the mean over all sentences that fit in a window; the
    # unweighted mean is biased short.
    data_dir = self._Dir('weights')
    sentences = synthetic_corpus.GenerateSentences(400, 7)
    path = _Write(os.path.join(data_dir, 'x.txt'),
                  ('\n'.join(sentences) + '\n').encode())
    t = 96
    gen = self._Params(path, batch_size=16, max_seq_len=t,
                       fixed_input_shape=True).Instantiate()
    n = np.array([len(s.encode()) for s in sentences])
    want = (n[n < t] + 1).mean()               # labels a sentence, EOS too
    weighted = unweighted = eos = whole = 0.0
    for i in range(400):                       # about 20 epochs
      batch = gen.InputBatchAt(i)
      sw = batch.sentence_weights
      is_eos = batch.labels == tokenizers.EOS_ID
      weighted += sw.sum()
      eos += (sw * is_eos).sum()
      unweighted += (sw > 0).sum()
      whole += ((sw > 0) & is_eos).sum()
    self.assertAllClose(weighted / eos, want, rtol=0.02)   # 0.8% here
    self.assertLess(unweighted / whole, 0.9 * want)       # 0.85 here

  # --- order, epochs, resume, shards -------------------------------------

  def testOnePassVisitsEverySentenceOnce(self):
    pattern, sentences = self._Corpus('one_pass')
    p = self._Params(pattern, batch_size=4, max_seq_len=8, repeat=False,
                     random_seed=3)
    # Padded with a long max_seq_len: every row is one whole sentence.
    gen = p.Copy().Set(packed=False, max_seq_len=400).Instantiate()
    tok = gen.tokenizer
    rows = [tok.Decode(r) for b in gen.Dataset() for r in b.ids.numpy()]
    rows = [r for r in rows if r]
    self.assertCountEqual(rows, sentences)
    self.assertNotEqual(rows, sentences)  # Shuffled.
    # Packed: the stream of real inputs, plus the last label, is the
    # epoch's sentences concatenated.
    gen = p.Copy().Set(packed=True).Instantiate()
    stream = []
    for b in gen.Dataset():
      valid = b.paddings.numpy() == 0
      stream += b.ids.numpy()[valid].tolist()
      last = b.labels.numpy()[valid]
    stream.append(int(last[-1]))
    decoded, current = [], []
    for t in stream:
      if t == tok.eos_id:
        decoded.append(tok.Decode(current))  # Drops the BOS.
        current = []
      else:
        current.append(t)
    self.assertEqual(current, [])
    self.assertCountEqual(decoded, sentences)
    self.assertEqual(gen.stats.num_sentences, len(sentences))

  def testDeterministicForSeed(self):
    pattern, _ = self._Corpus('seed')
    for packed in (True, False):
      p = self._Params(pattern, batch_size=4, max_seq_len=8, packed=packed,
                       fixed_input_shape=True, random_seed=5)
      a = [_AsLists(b) for b in p.Instantiate().Dataset().take(12)]
      b = [_AsLists(b) for b in p.Instantiate().Dataset().take(12)]
      self.assertEqual(a, b)
      c = [_AsLists(b) for b in
           p.Copy().Set(random_seed=6).Instantiate().Dataset().take(12)]
      self.assertNotEqual(a, c)

  def testResumeEqualsUninterruptedStream(self):
    # 36 sentences, 4 rows a batch: batches 0..19 span two epochs and more.
    pattern, _ = self._Corpus('resume')
    for packed in (True, False):
      p = self._Params(pattern, batch_size=4, max_seq_len=8, packed=packed,
                       fixed_input_shape=True)
      whole = [_AsLists(b) for b in p.Instantiate().Dataset().take(20)]
      restarted = p.Instantiate()   # A fresh process would build anew.
      tail = [_AsLists(b) for b in restarted.Dataset(start_batch=13).take(7)]
      self.assertEqual(tail, whole[13:])
      self.assertEqual(_AsLists(restarted.InputBatchAt(17)), whole[17])
      far = restarted.InputBatchAt(10**9)
      self.assertEqual(far.ids.shape, (4, 8))

  def testEpochsArePermutations(self):
    pattern, sentences = self._Corpus('epochs', num_files=2, per_file=5)
    gen = self._Params(pattern, batch_size=5, max_seq_len=400, packed=False,
                       fixed_input_shape=True).Instantiate()
    tok = gen.tokenizer
    epochs = []
    for i in range(0, 6, 2):  # 10 sentences = 2 batches an epoch.
      rows = np.concatenate([gen.InputBatchAt(i).ids,
                             gen.InputBatchAt(i + 1).ids])
      epochs.append([tok.Decode(r) for r in rows])
      self.assertCountEqual(epochs[-1], sentences)
    self.assertNotEqual(epochs[0], epochs[1])  # Reshuffled each epoch.

  def testShardsSplitBatchesOfOneStream(self):
    # Shard h of S reads batches h, h+S, ... of the stream every shard
    # count sees, so S shards of B rows x R replicas read exactly what one
    # reader of S*R*B rows reads: disjoint, covering, resumable.
    pattern, sentences = self._Corpus('shards', num_files=4, per_file=6)
    one = self._Params(pattern, batch_size=3, max_seq_len=400).Instantiate()
    shards = [self._Params(pattern, batch_size=3, max_seq_len=400,
                           num_input_shards=2, input_shard_index=h
                           ).Instantiate() for h in range(2)]
    for shard in shards:
      self.assertLen(shard.files, 4)   # Every shard reads every file.
    for step in (0, 1, 7, 123):
      whole = one.InputBatchAt(step, num_replicas=4).ids
      parts = [shard.InputBatchAt(step, num_replicas=2).ids
               for shard in shards]
      self.assertAllEqual(whole, np.concatenate(parts))
      resumed = [next(iter(shard.Dataset(start_batch=step, num_replicas=2)))
                 for shard in shards]
      self.assertAllEqual(whole, np.concatenate([r.ids for r in resumed]))
    # A single pass: the shards' batches are disjoint and cover the data.
    rows = []
    for h in range(2):
      gen = self._Params(pattern, batch_size=5, max_seq_len=400,
                         packed=False, repeat=False, num_input_shards=2,
                         input_shard_index=h).Instantiate()
      rows.append([gen.tokenizer.Decode(r) for b in gen.Dataset()
                   for r, w in zip(b.ids.numpy(), b.weights.numpy())
                   if w.any()])
    self.assertEmpty(set(rows[0]) & set(rows[1]))
    self.assertCountEqual(rows[0] + rows[1], sentences)

  # --- bad data ----------------------------------------------------------

  def testBadUtf8AndEmptyLinesAreCounted(self):
    data_dir = self._Dir('dirty')
    _Write(os.path.join(data_dir, 'f-0'), b'ab\n\n  \nc\xff d\n\xc3\n')
    _Write(os.path.join(data_dir, 'f-1'), b'')            # Empty file.
    _Write(os.path.join(data_dir, 'f-2'), b'\r\nef\r\n\n')  # CRLF, no text.
    gen = self._Params(os.path.join(data_dir, 'f-*'), batch_size=1,
                       max_seq_len=8, packed=False, shuffle=False,
                       repeat=False).Instantiate()
    self.assertEqual(gen.stats, dict(
        # 'c\ufffd d' is 6 bytes: U+FFFD is 3.
        num_files=3, num_sentences=4, num_tokens=2 + 6 + 3 + 2,
        num_empty_lines=4, num_bad_utf8_lines=2, num_truncated=0))
    rows = [gen.tokenizer.Decode(b.ids.numpy()[0]) for b in gen.Dataset()]
    self.assertEqual(rows, ['ab', 'c\ufffd d', '\ufffd', 'ef'])

  def testEmptyDataSetNamesThePattern(self):
    data_dir = self._Dir('empty')
    blank = os.path.join(data_dir, 'blank-*')
    _Write(os.path.join(data_dir, 'blank-0'), b'\n \n\n')
    with self.assertRaisesRegex(base_input_generator.InputError, re.escape(
        f"LmInput 'lm_input': file_pattern='{blank}' has no sentences: its 1 "
        'file(s) hold 3 lines, all blank; point it at text with one sentence '
        'a line.')):
      self._Params(blank).Instantiate()
    zero = os.path.join(data_dir, 'zero-*')
    _Write(os.path.join(data_dir, 'zero-0'), b'')
    with self.assertRaisesRegex(ValueError,
                                re.escape(f"'{zero}' matches 1 file")):
      self._Params(zero).Instantiate()
    none = os.path.join(data_dir, 'none-*')
    with self.assertRaisesRegex(ValueError,
                                re.escape(f"'{none}' matches no files")):
      self._Params(none).Instantiate()
    self.assertTrue(issubclass(base_input_generator.InputError, ValueError))

  def testBadParams(self):
    pattern, _ = self._Corpus('bad')
    with self.assertRaisesRegex(ValueError, "LmInput 'lm_input': "
                                'max_seq_len=0 must be an int >= 1'):
      self._Params(pattern, max_seq_len=0).Instantiate()
    with self.assertRaisesRegex(ValueError, "file_type='tfrecord' must be "
                                "'text'"):
      self._Params(pattern, file_type='tfrecord').Instantiate()
    with self.assertRaisesRegex(ValueError, r'bucket_upper_bound=\[8\] must '
                                'be empty'):
      self._Params(pattern, bucket_upper_bound=[8]).Instantiate()
    with self.assertRaisesRegex(ValueError, 'random_seed=-1 must be an int '
                                '>= 0'):
      self._Params(pattern, random_seed=-1).Instantiate()

  def testTokenizerCheckedWithTheInputsParams(self):
    # From params alone (no file read, the tokenizer not built), named by
    # the key a user overrides: as the trainer's experiment tree has it.
    root = hyperparams.Params()
    root.Define('input', self._Params('/no/such/train-*'), 'The input.')
    root.input.tokenizer = tokenizers.SentencePieceTokenizer.Params()
    root.input.tokenizer.model_type = 'bpee'
    with self.assertRaisesWithLiteralMatch(
        base_input_generator.InputError, "SentencePieceTokenizer 'tokenizer' "
        "(params 'input.tokenizer'): model_type='bpee' must be one of 'bpe', "
        "'unigram'. Did you mean 'bpe'?"):
      input_generator.LmInput.CheckParams(root.input)
    root.input.tokenizer = None
    with self.assertRaisesWithLiteralMatch(
        base_input_generator.InputError, "LmInput 'lm_input' (params "
        "'input'): tokenizer=None must be a tokenizers.BaseTokenizer: "
        'SentencePieceTokenizer or ByteTokenizer.'):
      input_generator.LmInput.CheckParams(root.input)
    root.input.tokenizer = tokenizers.ByteTokenizer.Params().Set(
        cls=input_generator.LmInput)
    with self.assertRaisesWithLiteralMatch(
        base_input_generator.InputError, "LmInput 'lm_input' (params "
        "'input'): tokenizer.cls=<class 'cadence.tasks.lm.input_generator."
        "LmInput'> must be a tokenizers.BaseTokenizer: "
        'SentencePieceTokenizer or ByteTokenizer.'):
      input_generator.LmInput.CheckParams(root.input)

  # --- with SentencePiece ------------------------------------------------

  def testSentencePieceRowsDecodeToTheSentences(self):
    data_dir = self._Dir('spm')
    patterns = synthetic_corpus.WriteShards(data_dir, 2, 300, seed=1,
                                            num_heldout_sentences=20)
    cache = self._Dir('spm_cache')
    tok_p = tokenizers.SentencePieceTokenizer.Params().Set(
        train_file_pattern=patterns.train, vocab_size=300, cache_dir=cache)
    gen = self._Params(patterns.dev, tokenizer=tok_p, batch_size=8,
                       max_seq_len=64, packed=False, shuffle=False,
                       repeat=False).Instantiate()
    self.assertEqual(os.path.dirname(gen.tokenizer.model_file), cache)
    with open(patterns.dev, encoding='utf-8') as f:
      want = f.read().split('\n')[:-1]
    got = []
    for b in gen.Dataset():
      for ids, labels, w in zip(b.ids.numpy(), b.labels.numpy(),
                                b.weights.numpy()):
        if w.sum():
          self.assertEqual(ids[0], 1)
          self.assertEqual(labels[int(w.sum()) - 1], 2)   # EOS label.
          got.append(gen.tokenizer.Decode(ids))
    self.assertEqual(got, want)
    self.assertEqual(gen.stats.num_sentences, len(want))
    self.assertEqual(gen.stats.num_tokens,
                     sum(len(gen.tokenizer.Encode(s)) for s in want))


if __name__ == '__main__':
  tf.test.main()
