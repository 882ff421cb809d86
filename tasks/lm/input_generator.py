"""The LM input generator: sentences in text files -> token batches.

Data layout (one-billion-words style): text files, one sentence per line,
sharded files matched by `file_pattern` (`/data/train-*-of-00010`), a
held-out set for Dev/Test with its own pattern. Every file is read once, at
construction: lines are stripped, empty lines skipped and
counted, undecodable UTF-8 replaced (U+FFFD) and counted, and every sentence
becomes `BOS ids EOS` in one flat int32 array in memory (4 bytes a token;
the embedded corpus takes ~5 MB, the full one-billion-words corpus ~4 GB, so
point the pattern at a subset of its shards on a small machine). A file's
ids are cached on disk (`token_cache_dir`, token_cache.py) for tokenizers
with a `cache_key` (SentencePiece), so the next job reads them back instead
of tokenising again (0.6 s of the embedded corpus's 100,000 sentences).

Batches are then a pure function of the batch index: epoch `e` visits the
sentences in the permutation drawn from (random_seed, e), and batch `i`
holds rows `i*B .. i*B+B-1` of that endless stream (`B` = batch_size x
num_replicas). Resuming at the global step costs one permutation, never a
replay of the skipped batches.

Hosts share batches, not files (as every input generator does; see
framework/base_input_generator.py): with `num_input_shards` S, host h's
batch i is its share (`HostRows`) of global batch i, the rows of batch i
with S times the replicas. So S hosts x R replicas together read exactly
the rows one host with S*R replicas would, and their shares are disjoint;
every host reads every file.

Two ways to cut sequences of `max_seq_len` tokens:
  * padded (`packed=False`): one sentence per row, `ids = BOS w1 .. wn`,
    `labels = w1 .. wn EOS`, padded with pad_id (or truncated; counted in
    stats.num_truncated). Use it for Dev/Test: a row's summed log-loss is
    the sentence's log-loss, comparable with
    `synthetic_corpus.EntropyPerSentence()`.
  * packed (`packed=True`): the epoch's sentences concatenated and cut into
    windows of `max_seq_len`, labels shifted by one; no pads but at the end
    of a single pass. A label that is a BOS (the step from one sentence to
    the next) has weight 0: it is not part of either sentence.

Batches are NestedMaps:
  ids       [b, t] int32    input tokens
  labels    [b, t] int32    next tokens
  paddings  [b, t] float32  1.0 where the position is padding
  weights   [b, t] float32  label weights: 0 on pads (and on BOS labels)
  sentence_weights [b, t] float32  per-sentence averages: see below

A sentence is whole in a row when its BOS is among the row's ids and its
EOS among its labels; only whole sentences give a per-sentence log-loss.
`sentence_weights` is 0 on every label outside a whole sentence and, on the
labels of a whole sentence of n tokens (BOS and EOS not counted), the
sentence's weight: 1 in padded rows (a truncated sentence has no EOS and is
not whole); t / (t - n) in packed rows, the inverse of the chance that a
window of t ids holds the sentence whole. Longer sentences are cut more
often, so an unweighted mean over the whole ones would favour short
sentences (on the embedded corpus with t=64: 2.9 nats a sentence below the
mean over all); weighted, it estimates the mean over all sentences of
n < t tokens (longer ones are never whole). So for a per-token quantity x,
sum(x * sentence_weights) / sum(sentence_weights * (labels == EOS)) is a
per-sentence mean.
With `fixed_input_shape` every batch is [B, max_seq_len] (a last partial
batch of a single pass is filled with all-padding rows); otherwise padded
batches are as long as their longest sentence and a last batch is short.
"""
import itertools
import os
import threading

from absl import logging
import numpy as np
import tensorflow as tf

from cadence.framework import base_input_generator
from cadence.framework import hyperparams
from cadence.framework.nested_map import NestedMap
from cadence.framework import shapes
from cadence.framework import validation
from cadence.tasks.lm import token_cache
from cadence.tasks.lm import tokenizers

_KEYS = ('ids', 'labels', 'paddings', 'weights', 'sentence_weights')
_DTYPES = (tf.int32, tf.int32, tf.float32, tf.float32, tf.float32)


def _ReadSentences(path):
  """(sentences, num_empty_lines, num_bad_utf8_lines) of one text file."""
  with tf.io.gfile.GFile(path, 'rb') as f:
    data = f.read()
  raw = data.split(b'\n')
  if raw and not raw[-1]:
    raw.pop()  # The newline that ends the last line.
  bad = 0
  try:
    lines = data.decode('utf-8').split('\n')[:len(raw)]
  except UnicodeDecodeError:
    lines = []
    for line in raw:
      try:
        lines.append(line.decode('utf-8'))
      except UnicodeDecodeError:
        bad += 1
        lines.append(line.decode('utf-8', errors='replace'))
  sentences = [s for s in (line.strip() for line in lines) if s]
  return sentences, len(lines) - len(sentences), bad


def _SentenceWeights(ids, labels, valid, weights, tok, window):
  """[b, t] float32 `sentence_weights` of a batch; see the module docstring.

  Args:
    ids: [b, t] int input tokens.
    labels: [b, t] int next tokens.
    valid: [b, t] bool, False on padding.
    weights: [b, t] bool label weights.
    tok: the tokenizer (its bos_id and eos_id).
    window: None for padded rows (a whole sentence weighs 1); for packed
      rows their length t (a whole sentence of n tokens weighs t / (t - n)).
  """
  ends = (labels == tok.eos_id) & weights
  # A label's sentence began in the row iff a BOS id is at or before it, and
  # ends in the row iff an EOS label is at or after it.
  own_bos = np.cumsum((ids == tok.bos_id) & valid, axis=1) > 0
  own_eos = np.cumsum(ends[:, ::-1], axis=1)[:, ::-1] > 0
  whole = weights & own_bos & own_eos
  if window is None:
    return whole.astype(np.float32)
  # Labels of each whole sentence: number them within a row by the EOS
  # labels before them, and count.
  b, t = ids.shape
  key = np.arange(b)[:, None] * (t + 1) + (np.cumsum(ends, axis=1) - ends)
  count = np.bincount(key[whole], minlength=b * (t + 1))[key]
  n = count - 1                         # tokens between BOS and EOS
  out = np.zeros([b, t], np.float32)
  np.divide(window, window - n, out=out, where=whole, casting='unsafe')
  return out


class LmInput(base_input_generator.BaseInputGenerator):
  """Batches of token sequences from one-sentence-per-line text files.

  See the module docstring for the layout and the two sequence modes. Of
  the base Params, `file_type` must be 'text' and bucketing is not used
  (sequences are already of one length); `shuffle_buffer_size` is not used:
  whole epochs are shuffled in memory.

  Example:
    p = LmInput.Params().Set(file_pattern='/tmp/lm_data/train-*-of-00010',
                             batch_size=16, max_seq_len=64)
    p.tokenizer = tokenizers.SentencePieceTokenizer.Params().Set(
        train_file_pattern=p.file_pattern, vocab_size=512)
    gen = p.Instantiate()
    batch = next(iter(gen.Dataset(start_batch=global_step)))
    batch.ids.shape   # [16, 64]
    gen.stats         # NestedMap(num_sentences=..., num_empty_lines=...)

  Dev/Test generators take the same tokenizer params (train_file_pattern
  naming the training files), so they load the model Train cached.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.name = 'lm_input'
    p.Define('tokenizer', tokenizers.ByteTokenizer.Params(), 'Params of the '
             'tokenizer (tokenizers.SentencePieceTokenizer or ByteTokenizer).')
    p.Define('max_seq_len', 64, 'Tokens per row, an int > 0 (t of [b, t]).')
    p.Define('packed', True, 'True: concatenate sentences and cut windows of '
             'max_seq_len; False: one sentence per row, padded.')
    p.Define('token_cache_dir', None, 'Where the ids of tokenised files are '
             'cached (token_cache.py; tokenizers with a cache_key only, e.g. '
             'SentencePiece); None: $XDG_CACHE_HOME/cadence/tokens (default '
             '~/.cache/cadence/tokens); \'\': no cache.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self._params
    self._tokenizer = p.tokenizer.Instantiate()
    self._cache = {}
    self._cache_lock = threading.Lock()
    self._Load()

  @classmethod
  def _CheckParams(cls, p, owner):
    super()._CheckParams(p, owner)
    if p.file_type != 'text':
      raise validation.Error(owner, 'file_type', p.file_type, "must be 'text' "
                             '(one sentence per line).')
    if p.bucket_upper_bound:
      raise validation.Error(owner, 'bucket_upper_bound',
                             p.bucket_upper_bound, 'must be empty: LmInput '
                             'rows have max_seq_len tokens.')
    validation.CheckInt(owner, 'max_seq_len', p.max_seq_len)
    validation.CheckBool(owner, 'packed', p.packed)
    tok = p.tokenizer
    if not (isinstance(tok, hyperparams.InstantiableParams) and
            isinstance(tok.cls, type) and
            issubclass(tok.cls, tokenizers.BaseTokenizer)):
      is_params = isinstance(tok, hyperparams.InstantiableParams)
      raise validation.Error(owner, 'tokenizer.cls' if is_params else
                             'tokenizer', tok.cls if is_params else tok,
                             'must be a tokenizers.BaseTokenizer: '
                             'SentencePieceTokenizer or ByteTokenizer.')
    tok.cls.CheckParams(tok, validation.Owner(tok))
    if p.token_cache_dir is not None and not isinstance(p.token_cache_dir,
                                                        str):
      raise validation.Error(owner, 'token_cache_dir', p.token_cache_dir,
                             "must be None (the default cache), '' (no "
                             'cache) or a directory path (a str).')

  def _Load(self):
    """Reads and tokenises this shard's files into one flat array."""
    p = self._params
    tok = self._tokenizer
    key = tok.cache_key
    cache_dir = None if key is None or p.token_cache_dir == '' else (
        os.path.abspath(os.path.expanduser(
            p.token_cache_dir or token_cache.DefaultDir())))
    id_arrays, len_arrays, to_cache = [], [], []
    empty = bad = 0
    for path in self._files:
      cached = cache_dir and token_cache.Load(cache_dir, path, key)
      tokens = cached or self._TokeniseFile(path)
      if cache_dir and not cached:
        to_cache.append((path, tokens))
      ids, lens, file_empty, file_bad = tokens
      empty += file_empty
      bad += file_bad
      id_arrays.append(ids)
      len_arrays.append(lens)
    lengths = np.concatenate(len_arrays)
    if not lengths.size:
      raise self._Error(
          'file_pattern', p.file_pattern,
          f'has no sentences: its {len(self._files)} file(s) hold {empty} '
          'lines, all blank; point it at text with one sentence a line.')
    # Only an input that loads writes its files' tokens to the cache.
    for path, tokens in to_cache:
      token_cache.Store(cache_dir, path, key, *tokens)
    # Each sentence becomes BOS ids EOS in one flat array.
    self._lengths = lengths + 2
    self._starts = np.concatenate([[0], np.cumsum(self._lengths)[:-1]])
    self._flat = np.empty([int(self._lengths.sum())], np.int32)
    is_text = np.ones([self._flat.size], bool)
    is_text[self._starts] = is_text[self._starts + self._lengths - 1] = False
    self._flat[self._starts] = tok.bos_id
    self._flat[self._starts + self._lengths - 1] = tok.eos_id
    self._flat[is_text] = np.concatenate(id_arrays)
    num_tokens = int(lengths.sum())
    self._stats = NestedMap(
        num_files=len(self._files), num_sentences=lengths.size,
        num_tokens=num_tokens, num_empty_lines=empty, num_bad_utf8_lines=bad,
        num_truncated=0 if p.packed else int(
            (self._lengths - 1 > p.max_seq_len).sum()))
    logging.info(
        '%s %r: %d files of %r: %d sentences, %d tokens (%.1f a sentence, '
        'vocab %d), %d empty lines skipped, %d lines with bad UTF-8 '
        'replaced, %d sentences truncated to max_seq_len=%d',
        type(self).__name__, p.name, len(self._files), p.file_pattern,
        lengths.size, num_tokens, num_tokens / lengths.size, tok.vocab_size,
        empty, bad, self._stats.num_truncated, p.max_seq_len)

  def _TokeniseFile(self, path):
    """(ids [n] int32, lengths [sentences] int64, empty lines, bad UTF-8
    lines) of one file, tokenised here."""
    sentences, empty, bad = _ReadSentences(path)
    encoded = self._tokenizer.EncodeBatch(sentences)
    lens = np.fromiter(map(len, encoded), np.int64, count=len(encoded))
    ids = np.fromiter(itertools.chain.from_iterable(encoded), np.int32,
                      count=int(lens.sum()))
    return ids, lens, empty, bad

  # --- properties --------------------------------------------------------

  @property
  def tokenizer(self):
    return self._tokenizer

  @property
  def stats(self):
    """NestedMap of ints: num_files, num_sentences, num_tokens (without
    BOS/EOS), num_empty_lines, num_bad_utf8_lines, num_truncated."""
    return NestedMap(self._stats)

  def _NumRows(self):
    """Rows in one epoch: sentences (padded) or windows (packed)."""
    if self._params.packed:
      return -(-(self._flat.size - 1) // self._params.max_seq_len)
    return self._lengths.size

  def NumBatchesPerEpoch(self, num_replicas=1):
    """Batches of a single pass (`repeat=False`), the last one partial; the
    same on every host (a host's share of the last may be padding only)."""
    rows = self.GlobalBatchSize(num_replicas) * self._params.num_input_shards
    return -(-self._NumRows() // rows)

  # --- batches as numpy --------------------------------------------------

  def _Epoch(self, epoch):
    """(order of sentences, exclusive cumsum of their lengths) of an epoch."""
    with self._cache_lock:
      if epoch in self._cache:
        return self._cache[epoch]
    p = self._params
    n = self._lengths.size
    if p.shuffle:
      rng = np.random.default_rng([p.random_seed, epoch])
      order = rng.permutation(n)
    else:
      order = np.arange(n)
    cum = np.concatenate([[0], np.cumsum(self._lengths[order])[:-1]])
    with self._cache_lock:
      while len(self._cache) >= 4:
        self._cache.pop(min(self._cache))
      self._cache[epoch] = (order, cum)
    return order, cum

  def _ForEachEpoch(self, epochs, fn, out):
    """out[mask] = fn(order, cum, mask) for each epoch in `epochs`."""
    for e in np.unique(epochs):
      mask = epochs == e
      order, cum = self._Epoch(int(e))
      out[mask] = fn(order, cum, mask)
    return out

  def _PaddedRows(self, rows):
    """[b, t+1] tokens and [b, t+1] in-sentence mask of sentence rows."""
    n, t = self._lengths.size, self._params.max_seq_len
    exists = np.ones(rows.shape, bool) if self._params.repeat else rows < n
    rows = np.where(exists, rows, 0)
    sent = self._ForEachEpoch(rows // n,
                              lambda order, cum, m: order[rows[m] % n],
                              np.zeros(rows.shape, np.int64))
    pos = np.arange(t + 1)[None, :]
    inside = (pos < self._lengths[sent][:, None]) & exists[:, None]
    index = np.minimum(self._starts[sent][:, None] + pos, self._flat.size - 1)
    return self._flat[index], inside

  def _PackedRows(self, rows):
    """[b, t+1] tokens and [b, t+1] in-stream mask of window rows."""
    size, t = self._flat.size, self._params.max_seq_len
    q = rows[:, None] * t + np.arange(t + 1)[None, :]   # stream positions
    inside = np.ones(q.shape, bool) if self._params.repeat else q < size
    q = np.where(inside, q, 0)
    r = q % size

    def _Lookup(order, cum, m):
      slot = np.searchsorted(cum, r[m], side='right') - 1
      return self._flat[self._starts[order[slot]] + r[m] - cum[slot]]

    return self._ForEachEpoch(q // size, _Lookup,
                              np.zeros(q.shape, np.int32)), inside

  @classmethod
  def BatchShapes(cls, params):
    """[batch_size, max_seq_len] for each field with fixed_input_shape;
    otherwise the batch and length dims are None (a last batch may be short,
    padded rows as long as their longest sentence)."""
    fixed = bool(params.fixed_input_shape)
    shape = shapes.Shape([params.batch_size if fixed else None,
                          params.max_seq_len if fixed else None])
    return NestedMap({k: shape for k in _KEYS})

  def InputBatchAt(self, batch_index, num_replicas=1):
    """Batch `batch_index` of the stream as a NestedMap of numpy arrays.

    The pure function behind `Dataset`: same params and index, same batch.

    Args:
      batch_index: int >= 0, the input position (the global step).
      num_replicas: this host's replicas: the batch holds `num_replicas *
        batch_size` rows, this host's share (`HostRows`) of global batch
        `batch_index` (num_input_shards times as many rows).

    Returns:
      NestedMap(ids, labels, paddings, weights, sentence_weights), each
      [b, t] (see the module docstring).
    """
    p = self._params
    n = self.GlobalBatchSize(num_replicas) * p.num_input_shards
    begin, end = self.HostRows(n)
    rows = np.arange(begin, end, dtype=np.int64) + int(batch_index) * n
    tokens, inside = (self._PackedRows if p.packed else self._PaddedRows)(rows)
    # Position j is real iff its label (token j + 1) is.
    valid = inside[:, 1:]
    pad = self._tokenizer.pad_id
    ids = np.where(valid, tokens[:, :-1], pad).astype(np.int32)
    labels = np.where(valid, tokens[:, 1:], pad).astype(np.int32)
    weights = valid & (labels != self._tokenizer.bos_id)
    sentence_weights = _SentenceWeights(
        ids, labels, valid, weights, self._tokenizer,
        p.max_seq_len if p.packed else None)
    if not p.fixed_input_shape:
      keep = valid.any(axis=1) | (rows == rows[0])  # Never an empty batch.
      length = max(int(valid.sum(axis=1).max()), 1) if not p.packed else (
          p.max_seq_len)
      ids, labels, valid, weights, sentence_weights = (
          x[keep, :length]
          for x in (ids, labels, valid, weights, sentence_weights))
    return NestedMap(ids=ids, labels=labels,
                     paddings=(~valid).astype(np.float32),
                     weights=weights.astype(np.float32),
                     sentence_weights=sentence_weights)

  # --- tf.data -----------------------------------------------------------

  def Dataset(self, start_batch=0, num_replicas=1):
    """tf.data.Dataset of batches from batch `start_batch` on.

    Endless with `repeat`, else up to `NumBatchesPerEpoch`. Batch i equals
    `InputBatchAt(i, num_replicas)` whatever `start_batch` was.

    Args:
      start_batch: the input position to resume from (the global step).
      num_replicas: replicas the batches are split among.

    Returns:
      A tf.data.Dataset of NestedMap(ids, labels, paddings, weights,
      sentence_weights).
    """
    p = self._params
    end = np.iinfo(np.int64).max if p.repeat else self.NumBatchesPerEpoch(
        num_replicas)
    b = self.GlobalBatchSize(num_replicas)
    shape = [b, p.max_seq_len] if p.fixed_input_shape else [None, None]

    def _Batch(index):
      batch = self.InputBatchAt(int(index), num_replicas)
      return [batch[k] for k in _KEYS]

    def _Map(index):
      outs = tf.numpy_function(_Batch, [index], list(_DTYPES), stateful=False)
      for x in outs:
        x.set_shape(shape)
      return NestedMap(zip(_KEYS, outs))

    batches = tf.data.Dataset.range(int(start_batch), end).map(
        _Map, num_parallel_calls=p.num_parallel_calls, deterministic=True)
    return batches.prefetch(tf.data.AUTOTUNE)
