"""Token ids of text files, cached on disk so a job does not tokenise again.

Tokenising the embedded corpus's 100,000 training sentences with
SentencePiece takes about 0.6 s of every trainer, evaler and decoder start;
loading the ids back takes milliseconds. An entry holds one text file's
sentence ids and lengths and its line counts (what `LmInput` reads from
it), and is named by a digest of

  * the file's absolute path, size and modification time (as the
    SentencePiece model cache keys its training files): an edited file gets
    a new entry;
  * the tokenizer's `cache_key` (SentencePiece: the model file's SHA-256):
    another model, another entry;
  * `_VERSION`, bumped when the stored format or the line rules change.

Entries are written whole (`atomic_file.Write`) with their digest
beside them, and read only if the digest matches; a damaged entry is
recomputed and written again. The cache only saves time: an entry that
cannot be written (a read-only home, a full disk) is skipped with a
warning, and the job goes on.

Example:
  got = token_cache.Load(cache_dir, path, tok.cache_key)   # None: a miss
  if got is None:
    got = ids, lengths, num_empty, num_bad     # tokenised here
    token_cache.Store(cache_dir, path, tok.cache_key, *got)
"""
import hashlib
import io
import json
import os

from absl import logging
import numpy as np

from cadence.framework import atomic_file
from cadence.tasks.lm import cache_files

_VERSION = 1


def DefaultDir():
  """Where tokenised files go by default: $XDG_CACHE_HOME/cadence/tokens
  (default ~/.cache/cadence/tokens; tasks/lm/cache_files.py)."""
  return cache_files.CacheDir('tokens')


def EntryPath(cache_dir, path, tokenizer_key):
  """The cache file of text file `path` tokenised by `tokenizer_key`."""
  st = os.stat(path)
  key = json.dumps({'version': _VERSION, 'file': os.path.abspath(path),
                    'size': st.st_size, 'mtime_ns': st.st_mtime_ns,
                    'tokenizer': tokenizer_key}, sort_keys=True)
  digest = hashlib.sha256(key.encode('utf-8')).hexdigest()[:24]
  return os.path.join(cache_dir, f'{os.path.basename(path)}-{digest}.npz')


def Load(cache_dir, path, tokenizer_key):
  """(ids, lengths, num_empty_lines, num_bad_utf8_lines) of `path` from the
  cache, or None when there is no intact entry.

  ids: [num_tokens] int32, the sentences' ids one after the other;
  lengths: [num_sentences] int64, the ids of each sentence.
  """
  entry = EntryPath(cache_dir, path, tokenizer_key)
  if not os.path.exists(entry):
    return None
  if not cache_files.Verified(entry):
    logging.warning('token_cache: %s does not match its recorded digest; '
                    'tokenising %s again', entry, path)
    return None
  try:
    with np.load(entry, allow_pickle=False) as data:
      ids, lengths, counts = data['ids'], data['lengths'], data['counts']
  except Exception as e:  # pylint: disable=broad-except
    # Any bytes at all can sit in a cache file (a digest that matches only
    # says nobody changed them since): a bad zip, a bad member, a bad array.
    logging.warning('token_cache: cannot read %s (%s: %s); tokenising %s '
                    'again', entry, type(e).__name__, e, path)
    return None
  if not (ids.ndim == 1 and ids.dtype == np.int32 and lengths.ndim == 1 and
          lengths.dtype == np.int64 and counts.shape == (2,) and
          int(lengths.sum()) == ids.size and (lengths >= 0).all()):
    logging.warning('token_cache: %s does not hold what an entry holds; '
                    'tokenising %s again', entry, path)
    return None
  return ids, lengths, int(counts[0]), int(counts[1])


def Store(cache_dir, path, tokenizer_key, ids, lengths, num_empty,
          num_bad):
  """Writes the entry of `path` (see `Load` for the arrays); returns whether
  it was written (False, with a warning, when the cache is not writable)."""
  buf = io.BytesIO()
  np.savez(buf, ids=np.asarray(ids, np.int32),
           lengths=np.asarray(lengths, np.int64),
           counts=np.array([num_empty, num_bad], np.int64))
  try:
    os.makedirs(cache_dir, exist_ok=True)
    entry = EntryPath(cache_dir, path, tokenizer_key)
    atomic_file.Write(entry, buf.getvalue())
    cache_files.WriteDigest(entry)
  except OSError as e:
    logging.warning('token_cache: cannot cache the tokens of %s in %s '
                    '(%s: %s); the job goes on without the cache', path,
                    cache_dir, type(e).__name__, e.strerror or e)
    return False
  return True
