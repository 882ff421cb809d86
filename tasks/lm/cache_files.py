"""Files in a cache that are checked before they are trusted.

The LM's caches (the embedded corpus, tasks/lm/synthetic_corpus.py, and the
trained SentencePiece models, tasks/lm/tokenizers.py) live in
~/.cache/cadence, where a full disk, a killed copy or a stray editor can
damage a file without changing its name. So each cached file is written
under a temporary name and renamed into place, its SHA-256 digest is
recorded after it (a `<file>.sha256` beside it, or a manifest of several),
and a reader uses the file only if its digest still matches; otherwise the
cache rebuilds it.

Example:
  atomic_file.Write('/c/model', data)   # framework/atomic_file.py
  WriteDigest('/c/model')             # /c/model.sha256
  Verified('/c/model')                # True until the file changes
"""
import hashlib
import os

from cadence.framework import atomic_file


def Sha256(path):
  """Hex SHA-256 of the file's bytes."""
  digest = hashlib.sha256()
  with open(path, 'rb') as f:
    for block in iter(lambda: f.read(1 << 20), b''):
      digest.update(block)
  return digest.hexdigest()


def DigestPath(path):
  """Where `WriteDigest` records the digest of `path`."""
  return path + '.sha256'


def WriteDigest(path):
  """Records the digest of `path` beside it (after `path` is complete)."""
  atomic_file.Write(DigestPath(path), Sha256(path) + '\n')


def Verified(path):
  """Whether `path` exists with the digest recorded for it.

  False for a missing file, a missing or unreadable record, or a file
  whose bytes changed since `WriteDigest`.
  """
  try:
    with open(DigestPath(path), encoding='utf-8') as f:
      want = f.read().strip()
    return Sha256(path) == want
  except (OSError, UnicodeDecodeError):
    return False
