"""Tests of tasks/lm/tokenizers.py: byte and SentencePiece tokenizers."""
import glob
import os
import re
import shutil

import numpy as np
import tensorflow as tf

from cadence.framework import atomic_file
from cadence.framework import base_input_generator
from cadence.tasks.lm import cache_files
from cadence.tasks.lm import synthetic_corpus
from cadence.tasks.lm import tokenizers


def _Snapshot(directory):
  """{name: (size, mtime_ns)} of the files in `directory`."""
  return {name: (os.stat(os.path.join(directory, name)).st_size,
                 os.stat(os.path.join(directory, name)).st_mtime_ns)
          for name in os.listdir(directory)}


def _Words(tok, ids):
  """Decoded text of the ids cut before each word-start id."""
  mask = tok.WordStartMask()
  cuts = [i for i, x in enumerate(ids) if i and mask[x]]
  return [tok.Decode(ids[a:b]) for a, b in zip([0] + cuts, cuts + [None])]


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

  def testWordStartsAreTheSpaces(self):
    tok = tokenizers.ByteTokenizer.Params().Instantiate()
    mask = tok.WordStartMask()
    self.assertEqual(mask.shape, (260,))
    self.assertEqual(np.flatnonzero(mask).tolist(), [ord(' ') + 4])
    self.assertEqual(_Words(tok, tok.Encode('the cat sees')),
                     ['the', ' cat', ' sees'])

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
    path = tok.model_file
    self.assertRegex(path, '^' + re.escape(cache) +
                     r'/spm_bpe_300-[0-9a-f]{16}\.model$')
    self.assertCountEqual(os.listdir(cache), [   # No temporary files.
        os.path.basename(path), os.path.basename(path) + '.sha256'])
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

  def testDamagedCachedModelIsTrainedAgain(self):
    cache = os.path.join(self.get_temp_dir(), 'cache_damaged')
    tok = self._Params(cache_dir=cache).Instantiate()
    with open(tok.model_file, 'rb') as f:
      good = f.read()
    text = 'the brave farmer sees alice near the bridge'
    for damage in (np.random.RandomState(0).bytes(len(good)),  # garbage
                   good[:-1] + bytes([good[-1] ^ 1])):         # one bit
      with open(tok.model_file, 'wb') as f:
        f.write(damage)
      with self.assertLogs(level='WARNING') as logs:
        again = self._Params(cache_dir=cache).Instantiate()
      self.assertLen(logs.output, 1)
      self.assertRegex(logs.output[0], re.escape(
          f'the cached {tok.model_file} does not match its recorded digest'))
      self.assertEqual(again.model_file, tok.model_file)
      self.assertEqual(again.Encode(text), tok.Encode(text))
      with open(tok.model_file, 'rb') as f:
        self.assertEqual(f.read(), good)   # Training is deterministic.
    # A model cached without a digest (by an older version) is retrained.
    os.remove(tok.model_file + '.sha256')
    with self.assertLogs(level='WARNING'):
      self._Params(cache_dir=cache).Instantiate()
    self.assertTrue(os.path.exists(tok.model_file + '.sha256'))
    # Bytes that are no model, with a digest that matches them.
    atomic_file.Write(tok.model_file, b'PK' + good[:100])
    cache_files.WriteDigest(tok.model_file)
    with self.assertLogs(level='WARNING') as logs:
      again = self._Params(cache_dir=cache).Instantiate()
    self.assertRegex(logs.output[0], 'matches its recorded digest but is not '
                     'a SentencePiece model')
    self.assertEqual(again.Encode(text), tok.Encode(text))
    with open(tok.model_file, 'rb') as f:
      self.assertEqual(f.read(), good)

  def testDefaultCacheIsUnderTheUsersCache(self):
    # $XDG_CACHE_HOME/cadence/spm, default ~/.cache/cadence/spm
    # (tests/tasks/lm/cache_files_test.py).
    self.assertEqual(tokenizers.DefaultCacheDir(), cache_files.CacheDir('spm'))

  def testReadOnlyDataDirTrainsElsewhereAndReuses(self):
    data = os.path.join(self.get_temp_dir(), 'read_only_data')
    os.makedirs(data)
    for path in glob.glob(self._patterns.train):
      shutil.copy(path, data)
    os.chmod(data, 0o555)     # (root writes anyway: the snapshot checks.)
    self.addCleanup(os.chmod, data, 0o755)
    before = _Snapshot(data)
    cache = os.path.join(self.get_temp_dir(), 'cache_ro')
    p = self._Params(cache_dir=cache).Set(train_file_pattern=data + '/train-*')
    first = p.Instantiate()
    self.assertEqual(_Snapshot(data), before)   # Nothing written there.
    self.assertEqual(os.path.dirname(first.model_file), cache)
    mtime = os.stat(first.model_file).st_mtime_ns
    second = p.Instantiate()
    self.assertEqual(second.model_file, first.model_file)
    self.assertEqual(os.stat(first.model_file).st_mtime_ns, mtime)
    # Other params or changed text: another model beside it.
    other = p.Copy().Set(vocab_size=280).Instantiate()
    self.assertNotEqual(other.model_file, first.model_file)
    os.chmod(data, 0o755)
    with open(sorted(glob.glob(data + '/train-*'))[0], 'a') as f:
      f.write('the cat sees alice\n')
    changed = p.Instantiate()
    self.assertNotEqual(changed.model_file, first.model_file)
    self.assertLen(glob.glob(os.path.join(cache, '*.model')), 3)

  def testUnwritableCacheFailsWithOneLine(self):
    blocker = os.path.join(self.get_temp_dir(), 'a_file')
    with open(blocker, 'w') as f:
      f.write('not a directory')
    cache = os.path.join(blocker, 'spm')
    with self.assertRaises(base_input_generator.InputError) as ctx:
      self._Params(cache_dir=cache, name='spm').Instantiate()
    message = str(ctx.exception)
    self.assertNotIn('\n', message)
    self.assertRegex(message, re.escape(
        f"SentencePieceTokenizer 'spm': cannot write the trained model to "
        f"cache_dir={cache!r} (") + r'\w+Error: .*\); set '
                     r'tokenizer.cache_dir to a writable directory')
    self.assertIsInstance(ctx.exception, ValueError)   # exit 2 in trainer

  def testWordStartsArePiecesAfterASpace(self):
    tok = self._Params(cache_dir=self.get_temp_dir()).Instantiate()
    mask = tok.WordStartMask()
    self.assertEqual(mask.shape, (tok.vocab_size,))
    self.assertFalse(mask[:4].any())    # pad, bos, eos, unk
    with open(self._patterns.dev, encoding='utf-8') as f:
      sentences = f.read().split('\n')[:20]
    for s in sentences:
      words = _Words(tok, tok.Encode(s))
      self.assertEqual(words, s.split(' '))

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
        train_file_pattern=path, vocab_size=1000,
        cache_dir=self.get_temp_dir()).Instantiate()
    self.assertLess(tok.vocab_size, 1000)
    self.assertEqual(tok.Decode(tok.Encode('abba ab')), 'abba ab')

  def testBadParams(self):
    p = tokenizers.SentencePieceTokenizer.Params().Set(name='spm')
    with self.assertRaisesRegex(ValueError, "'spm': set model_file or "
                                'train_file_pattern'):
      p.Copy().Instantiate()
    missing = os.path.join(self.get_temp_dir(), 'nothing-*')
    with self.assertRaisesRegex(base_input_generator.InputError, re.escape(
        f"SentencePieceTokenizer 'spm': train_file_pattern {missing!r} "
        f'matches no files for: {missing}.')):
      p.Copy().Set(train_file_pattern=missing).Instantiate()
    with self.assertRaisesRegex(ValueError, 'model_file=.*does not exist'):
      p.Copy().Set(model_file=missing).Instantiate()
    with self.assertRaisesRegex(ValueError, 'vocab_size=4 must be > 4'):
      self._Params().Set(vocab_size=4).Instantiate()
    with self.assertRaisesRegex(ValueError, "model_type='word' must be"):
      self._Params().Set(model_type='word').Instantiate()
    self.assertEmpty(glob.glob(os.path.join(self.get_temp_dir(), '*.tmp-*')))

  def testSettingsCheckedBeforeAnyFileIsRead(self):
    # The training text does not exist: each error comes before it is read.
    p = tokenizers.SentencePieceTokenizer.Params().Set(
        name='spm', train_file_pattern='/no/such/text-*')
    for field, value, rule in (
        ('model_type', 'BPE', "must be one of 'bpe', 'unigram'. Did you mean "
         "'bpe'?"),
        ('model_type', 'word', "must be one of 'bpe', 'unigram'."),
        ('byte_fallback', 'yes', 'must be True or False.'),
        ('hard_vocab_limit', 1, 'must be True or False.')):
      with self.subTest(field=field, value=value):
        want = f"SentencePieceTokenizer 'spm': {field}={value!r} {rule}"
        with self.assertRaisesWithLiteralMatch(ValueError, want):
          p.Copy().Set(**{field: value}).Instantiate()
        with self.assertRaisesWithLiteralMatch(ValueError, want):
          tokenizers.SentencePieceTokenizer.CheckParams(
              p.Copy().Set(**{field: value}), "SentencePieceTokenizer 'spm'")
    # A model_file that is a folder, or not a model: one line, no traceback
    # of SentencePiece's.
    folder = self.get_temp_dir()
    with self.assertRaisesWithLiteralMatch(
        base_input_generator.InputError,
        f"SentencePieceTokenizer 'spm': model_file={folder!r} "
        'does not exist or is not a file (a trained SentencePiece model).'):
      p.Copy().Set(model_file=folder).Instantiate()
    text = os.path.join(folder, 'not_a_model.txt')
    with open(text, 'w') as f:
      f.write('hello\n')
    with self.assertRaisesRegex(
        base_input_generator.InputError,
        rf"^SentencePieceTokenizer 'spm': model_file="
        rf"{re.escape(repr(text))} is not a SentencePiece model: .+"):
      p.Copy().Set(model_file=text).Instantiate()

  def testTrainingFilesThatCannotTrainAModel(self):
    d = self.get_temp_dir()
    p = tokenizers.SentencePieceTokenizer.Params().Set(
        name='spm', vocab_size=64, cache_dir=os.path.join(d, 'cache'))
    owner = "SentencePieceTokenizer 'spm'"
    blank = os.path.join(d, 'blank.txt')
    with open(blank, 'w') as f:
      f.write('\n  \n\t\n')
    with self.assertRaisesRegex(base_input_generator.InputError, re.escape(
        f'{owner}: train_file_pattern={blank!r} has no sentences to train '
        'on: its 1 file(s) hold 3 lines, all blank; point it at text with '
        'one sentence a line.')):
      p.Copy().Set(train_file_pattern=blank).Instantiate()
    noise = os.path.join(d, 'noise.bin')
    with open(noise, 'wb') as f:
      f.write(np.random.RandomState(0).bytes(20000))
    with self.assertRaisesRegex(base_input_generator.InputError, re.escape(
        f'{owner}: {noise!r} (of train_file_pattern {noise!r}) is not text: '
        'it holds NUL bytes')):
      p.Copy().Set(train_file_pattern=noise).Instantiate()
    with self.assertRaisesRegex(base_input_generator.InputError, re.escape(
        f'{owner}: {d!r} (of train_file_pattern {d!r}) is a directory, not '
        'a file')):
      p.Copy().Set(train_file_pattern=d).Instantiate()
    # Text with more distinct characters than pieces: the settings' fault.
    many = os.path.join(d, 'many_chars.txt')
    with open(many, 'w', encoding='utf-8') as f:
      f.write(' '.join(chr(0x4e00 + i) for i in range(200)) + '\n')
    with self.assertRaisesRegex(ValueError, re.escape(
        f'{owner}: vocab_size=64 is too small for the 201 distinct '
        'characters that character_coverage=1.0 keeps in the text of '
        f'train_file_pattern {many!r} (SentencePiece needs a piece for '
        'each); raise vocab_size (to at least 205) or lower '
        'character_coverage')):
      p.Copy().Set(train_file_pattern=many).Instantiate()
    self.assertFalse(os.path.exists(os.path.join(d, 'cache')))  # Nothing.


if __name__ == '__main__':
  tf.test.main()
