"""Tokenizers for language modelling: SentencePiece and raw UTF-8 bytes.

Both reserve the same special ids, so models and input generators never
special-case a tokenizer:

  pad = 0, bos = 1, eos = 2, unk = 3

`Encode(text)` returns the ids of the text alone (no BOS/EOS; the input
generator adds them) and `Decode(ids)` drops the special ids.
`WordStartMask()` says which ids begin a new word (SentencePiece: pieces
that start with '\u2581'; bytes: the space), so a decoder can cut a prompt on
a word boundary. Both are
deterministic, and `Decode(Encode(s)) == s` for text without control
characters, runs of spaces or leading/trailing spaces (SentencePiece
collapses those), which is what makes a per-sentence log-loss comparable
across tokenizers.

Example:
  tok = ByteTokenizer.Params().Instantiate()
  tok.Encode('hi')              # [108, 109]
  tok.Decode([1, 108, 109, 2])  # 'hi'
  spm = SentencePieceTokenizer.Params().Set(
      train_file_pattern='/tmp/lm_data/train-*', vocab_size=256).Instantiate()
  spm.vocab_size                # pieces of the model (<= 256 on tiny data)
"""
import hashlib
import io
import json
import os
import re

from absl import logging
import numpy as np
import sentencepiece as spm

from cadence.framework import atomic_file
from cadence.framework import base_input_generator
from cadence.framework import hyperparams
from cadence.framework import validation
from cadence.tasks.lm import cache_files

PAD_ID = 0
BOS_ID = 1
EOS_ID = 2
UNK_ID = 3
NUM_RESERVED_IDS = 4
# SentencePieceTokenizer's `model_type` choices.
MODEL_TYPES = ('bpe', 'unigram')


class BaseTokenizer:
  """Text <-> ids. Subclasses implement `Encode`, `Decode`, `vocab_size`."""

  @classmethod
  def Params(cls):
    p = hyperparams.InstantiableParams(cls)
    p.Define('name', 'tokenizer', 'Name used in messages and logs.')
    return p

  @classmethod
  def CheckParams(cls, p, owner):
    """Raises ValueError for a bad value of params `p`, from params alone
    (no file is read); `owner` names the params (validation.Owner). The
    input that holds the tokenizer's params calls it in its own check."""
    del p, owner

  def __init__(self, params):
    type(self).CheckParams(params, validation.Owner(params))
    self._params = params.Copy().Freeze()

  @property
  def params(self):
    return self._params

  @property
  def pad_id(self):
    return PAD_ID

  @property
  def bos_id(self):
    return BOS_ID

  @property
  def eos_id(self):
    return EOS_ID

  @property
  def unk_id(self):
    return UNK_ID

  @property
  def vocab_size(self):
    """Number of ids; every id is in [0, vocab_size)."""
    raise NotImplementedError

  def Encode(self, text):
    """str -> list of int ids, without BOS/EOS."""
    raise NotImplementedError

  def EncodeBatch(self, texts):
    """list of str -> list of lists of ids (subclasses may batch faster)."""
    return [self.Encode(t) for t in texts]

  @property
  def cache_key(self):
    """A str naming what `Encode` computes, for caching its ids on disk
    (token_cache.py); None (the default): not worth caching, or not known
    to be the same function from one process to the next."""
    return None

  def Decode(self, ids):
    """ids (ints or a 1-D array) -> str; pad/bos/eos ids are dropped."""
    raise NotImplementedError

  def WordStartMask(self):
    """[vocab_size] bool: True for the ids that begin a word after a space.

    A sentence's words are its space-separated parts; the first word of a
    text needs no marker (SentencePiece marks it anyway).
    """
    raise NotImplementedError


class ByteTokenizer(BaseTokenizer):
  """The UTF-8 bytes of the text, shifted past the reserved ids.

  Byte b has id b + 4, so the vocabulary has 260 ids. Meant for tests and
  for text whose alphabet is unknown; sequences are 3-4x longer than with
  SentencePiece.

  Example:
    tok = ByteTokenizer.Params().Instantiate()
    tok.Encode('é')          # [199, 173]  (0xc3 + 4, 0xa9 + 4)
    tok.Decode([199, 173])   # 'é'
  """

  @property
  def vocab_size(self):
    return 256 + NUM_RESERVED_IDS

  def Encode(self, text):
    data = np.frombuffer(text.encode('utf-8'), np.uint8)
    return (data.astype(np.int64) + NUM_RESERVED_IDS).tolist()

  def Decode(self, ids):
    ids = np.asarray(ids, np.int64).reshape([-1])
    bad = ids[(ids < 0) | (ids >= self.vocab_size)]
    if bad.size:
      raise ValueError(f'ByteTokenizer {self._params.name!r}: ids '
                       f'{bad[:5].tolist()} are outside [0, {self.vocab_size})')
    data = ids[ids >= NUM_RESERVED_IDS] - NUM_RESERVED_IDS
    return data.astype(np.uint8).tobytes().decode('utf-8', errors='replace')

  def WordStartMask(self):
    mask = np.zeros([self.vocab_size], bool)
    mask[ord(' ') + NUM_RESERVED_IDS] = True
    return mask


_CACHE_VERSION = 1  # Bump when the training options below change.


def DefaultCacheDir():
  """Where trained SentencePiece models go by default:
  $XDG_CACHE_HOME/cadence/spm (default ~/.cache/cadence/spm;
  tasks/lm/cache_files.py)."""
  return cache_files.CacheDir('spm')


def _DataDigest(files, params):
  """Hex digest of the training files (paths, sizes, mtimes) and params."""
  stats = [os.stat(f) for f in files]
  key = {'version': _CACHE_VERSION,
         'files': [[os.path.abspath(f), st.st_size, st.st_mtime_ns]
                   for f, st in zip(files, stats)],
         'params': {k: params.Get(k) for k in (
             'vocab_size', 'model_type', 'max_train_sentences',
             'character_coverage', 'byte_fallback', 'hard_vocab_limit')}}
  text = json.dumps(key, sort_keys=True)
  return hashlib.sha256(text.encode('utf-8')).hexdigest()[:16]


def _TrainingSentences(files, limit):
  """(non-empty stripped lines of `files` in order, at most `limit`;
  number of lines read)."""
  sentences, lines = [], 0
  for path in files:
    with open(path, 'rb') as f:
      for line in f:
        lines += 1
        text = line.decode('utf-8', errors='replace').strip()
        if text:
          sentences.append(text)
          if len(sentences) >= limit:
            return sentences, lines
  return sentences, lines


def _Loads(path):
  """Whether SentencePiece loads the model file `path` (any bytes can sit
  in a cache file; its digest only says nobody changed them since)."""
  try:
    spm.SentencePieceProcessor(model_file=path)
    return True
  except Exception:  # pylint: disable=broad-except
    return False


def _TrainingError(owner, error, params):
  """The ValueError of a SentencePiece training failure (a RuntimeError
  whose message is SentencePiece's C++ check), in the house's words."""
  text = str(error)
  chars = re.search(r'required_chars\. (\d+) vs (\d+)', text)
  if chars:
    return ValueError(
        f'{owner}: vocab_size={params.vocab_size} is too small for the '
        f'{int(chars.group(2)) - NUM_RESERVED_IDS} distinct characters that '
        f'character_coverage={params.character_coverage} keeps in the text '
        f'of train_file_pattern {params.train_file_pattern!r} (SentencePiece '
        f'needs a piece for each); raise vocab_size (to at least '
        f'{chars.group(2)}) or lower character_coverage (e.g. 0.9995).')
  last = [l for l in text.splitlines() if l.strip()][-1:] or [repr(error)]
  return ValueError(f'{owner}: SentencePiece training on train_file_pattern '
                    f'{params.train_file_pattern!r} failed: {last[0]}')


class SentencePieceTokenizer(BaseTokenizer):
  """A SentencePiece model, given or trained on the training text.

  With `model_file` set the model is loaded from it. Otherwise the model is
  trained at first use on the first `max_train_sentences` non-empty lines of
  the files of `train_file_pattern` (sorted) and cached as
  `<cache_dir>/spm_<model_type>_<vocab_size>-<digest>.model`, `cache_dir`
  defaulting to `$XDG_CACHE_HOME/cadence/spm` (default
  `~/.cache/cadence/spm`: `DefaultCacheDir`); later instances with the same
  data and params load the cached file. The digest covers the training files'
  paths, sizes and modification times and the training params, so changed
  text trains a new model, and nothing is written beside the data (data
  directories are often read-only or shared). Training writes to a unique
  temporary name and renames it into place, so concurrent trainers (a
  trainer and an evaler) never see a partial file, then records the
  model's SHA-256 beside it (`<model>.sha256`, tasks/lm/cache_files.py); a
  cached model whose bytes no longer match is trained again, with one
  warning line. A `cache_dir` that cannot be written, and training files
  that are missing, directories, not text or only blank lines, are an
  `InputError` (the trainer's exit 2) naming them; a vocab_size too small
  for the text's characters is a ValueError naming vocab_size and
  character_coverage.

  Trained models reserve pad=0, bos=1, eos=2, unk=3 and use the identity
  normalisation (no NFKC), so decoding returns the text as written. With
  `hard_vocab_limit=False` a tiny corpus yields fewer pieces than asked;
  `vocab_size` is the model's actual size (size the softmax with the asked
  size, which bounds it).

  Example:
    p = SentencePieceTokenizer.Params().Set(
        train_file_pattern='/tmp/lm_data/train-*-of-00010', vocab_size=512)
    tok = p.Instantiate()       # trains once, then loads the cached model
    tok.Decode(tok.Encode('the cat sees alice'))  # 'the cat sees alice'
    tok.model_file  # '~/.cache/cadence/spm/spm_bpe_512-<digest>.model'
                    # (without $XDG_CACHE_HOME)
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('model_file', None, 'Path of a trained SentencePiece model; None '
             'trains one (see train_file_pattern).')
    p.Define('train_file_pattern', None, 'Glob of the training text (one '
             'sentence per line), used when model_file is None.')
    p.Define('cache_dir', None, 'Directory of trained models (each named by '
             'a digest of its training data and params); None: '
             '$XDG_CACHE_HOME/cadence/spm (default ~/.cache/cadence/spm).')
    p.Define('vocab_size', 512, 'Number of pieces to train, an int > 4 '
             '(special ids included).')
    p.Define('model_type', 'bpe', "'bpe' (fast to train) or 'unigram'.")
    p.Define('max_train_sentences', 1000000, 'Train on at most this many '
             'sentences (the first ones of the sorted files).')
    p.Define('character_coverage', 1.0, 'Fraction of characters covered by '
             'pieces; the rest map to unk (or bytes with byte_fallback).')
    p.Define('byte_fallback', False, 'Encode unknown characters as UTF-8 '
             'byte pieces instead of unk (needs vocab_size > 260).')
    p.Define('hard_vocab_limit', False, 'If False, vocab_size is an upper '
             'bound (tiny corpora have fewer pieces).')
    return p

  @classmethod
  def CheckParams(cls, p, owner):
    super().CheckParams(p, owner)
    validation.CheckOneOf(owner, 'model_type', p.model_type, MODEL_TYPES)
    for field in ('byte_fallback', 'hard_vocab_limit'):
      validation.CheckBool(owner, field, p.Get(field))

  def __init__(self, params):
    super().__init__(params)
    p = self._params
    if p.model_file is None:
      self._model_file = self._TrainedModelFile()
    elif not os.path.isfile(p.model_file):
      raise validation.Error(validation.Owner(p), 'model_file', p.model_file,
                             'does not exist or is not a file (a trained '
                             'SentencePiece model).',
                             base_input_generator.InputError)
    else:
      self._model_file = p.model_file
    try:
      self._sp = spm.SentencePieceProcessor(model_file=self._model_file)
    except RuntimeError as e:   # SentencePiece's C++ check, e.g. not a model.
      raise validation.Error(validation.Owner(p), 'model_file',
                             self._model_file, f'is not a SentencePiece '
                             f'model: {str(e).splitlines()[0]}',
                             base_input_generator.InputError) from None
    self._cache_key = None
    special = {'bos_id': self._sp.bos_id(), 'eos_id': self._sp.eos_id()}
    missing = [k for k, v in special.items() if v < 0]
    if missing:
      raise ValueError(f'SentencePieceTokenizer {p.name!r}: model '
                       f'{self._model_file!r} has no {missing}; train it with '
                       'pad_id=0, bos_id=1, eos_id=2, unk_id=3')
    # A model without a pad piece pads with eos; paddings mask it anyway.
    self._pad_id = self._sp.pad_id() if self._sp.pad_id() >= 0 else (
        self._sp.eos_id())
    self._special = np.array(
        sorted({self._pad_id, self._sp.bos_id(), self._sp.eos_id()}))
    logging.info('SentencePieceTokenizer %r: %s has %d pieces', p.name,
                 self._model_file, self.vocab_size)

  def _TrainedModelFile(self):
    p = self._params
    owner = validation.Owner(p)
    if p.vocab_size <= NUM_RESERVED_IDS:
      raise ValueError(f'SentencePieceTokenizer {p.name!r}: vocab_size='
                       f'{p.vocab_size} must be > {NUM_RESERVED_IDS}')
    if not p.train_file_pattern:
      raise ValueError(f'{owner}: set model_file or train_file_pattern (the '
                       'text to train it on, e.g. the training files); both '
                       'are None. With corpus=\'\' the input names no '
                       'training text of its own.')
    files = base_input_generator.CheckedFiles(
        p.train_file_pattern, owner, field='train_file_pattern')
    cache_dir = os.path.abspath(os.path.expanduser(
        p.cache_dir or DefaultCacheDir()))
    path = os.path.join(cache_dir, f'spm_{p.model_type}_{p.vocab_size}-'
                        f'{_DataDigest(files, p)}.model')
    if cache_files.Verified(path):
      if _Loads(path):
        return path
      logging.warning('SentencePieceTokenizer %r: the cached %s matches its '
                      'recorded digest but is not a SentencePiece model; '
                      'training it again', p.name, path)
    elif os.path.exists(path):
      logging.warning('SentencePieceTokenizer %r: the cached %s does not '
                      'match its recorded digest (damaged, or cached before '
                      'digests); training it again', p.name, path)
    sentences, lines = _TrainingSentences(files, p.max_train_sentences)
    if not sentences:
      raise validation.Error(
          owner, 'train_file_pattern', p.train_file_pattern,
          f'has no sentences to train on: its {len(files)} file(s) hold '
          f'{lines} lines, all blank; point it at text with one sentence a '
          'line.', base_input_generator.InputError)
    model = io.BytesIO()
    try:
      spm.SentencePieceTrainer.train(
          sentence_iterator=iter(sentences), model_writer=model,
          vocab_size=p.vocab_size, model_type=p.model_type,
          character_coverage=p.character_coverage,
          byte_fallback=p.byte_fallback,
          hard_vocab_limit=p.hard_vocab_limit,
          normalization_rule_name='identity',
          pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID, unk_id=UNK_ID,
          input_sentence_size=0, num_threads=1,
          minloglevel=2)
    except RuntimeError as e:
      raise _TrainingError(owner, e, p) from None
    try:
      os.makedirs(cache_dir, exist_ok=True)
      atomic_file.Write(path, model.getvalue())
      cache_files.WriteDigest(path)
    except OSError as e:
      raise base_input_generator.InputError(
          f'SentencePieceTokenizer {p.name!r}: cannot write the trained model '
          f'to cache_dir={cache_dir!r} ({type(e).__name__}: '
          f'{e.strerror or e}); set tokenizer.cache_dir to a writable '
          'directory (input.tokenizer.cache_dir).') from None
    logging.info('SentencePieceTokenizer %r: trained %s on %d sentences of %s',
                 p.name, path, len(sentences), p.train_file_pattern)
    return path

  @property
  def model_file(self):
    """Path of the model in use (given, cached or freshly trained)."""
    return self._model_file

  @property
  def cache_key(self):
    """'spm-<SHA-256 of the model file>': the same model encodes the same."""
    if self._cache_key is None:
      self._cache_key = 'spm-' + cache_files.Sha256(self._model_file)
    return self._cache_key

  @property
  def pad_id(self):
    return self._pad_id

  @property
  def bos_id(self):
    return self._sp.bos_id()

  @property
  def eos_id(self):
    return self._sp.eos_id()

  @property
  def unk_id(self):
    return self._sp.unk_id()

  @property
  def vocab_size(self):
    return self._sp.get_piece_size()

  def Encode(self, text):
    return self._sp.encode(text, out_type=int)

  def EncodeBatch(self, texts):
    return self._sp.encode(list(texts), out_type=int)

  def Decode(self, ids):
    ids = np.asarray(ids, np.int64).reshape([-1])
    bad = ids[(ids < 0) | (ids >= self.vocab_size)]
    if bad.size:
      raise ValueError(f'SentencePieceTokenizer {self._params.name!r}: ids '
                       f'{bad[:5].tolist()} are outside [0, {self.vocab_size})')
    ids = ids[~np.isin(ids, self._special)]
    return self._sp.decode(ids.tolist())

  def WordStartMask(self):
    sp = self._sp
    return np.array([
        sp.id_to_piece(i).startswith('\u2581') and not (
            sp.is_control(i) or sp.is_unknown(i) or sp.is_byte(i))
        for i in range(self.vocab_size)], bool)
