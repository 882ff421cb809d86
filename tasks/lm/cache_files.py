"""Where the LM's caches live, and their files checked before they are trusted.

The LM's caches (the embedded corpus, tasks/lm/synthetic_corpus.py, its
trained SentencePiece models, tasks/lm/tokenizers.py, and its tokenised
files, tasks/lm/token_cache.py) are rebuilt when missing, so they live in
the user's cache folder as the XDG Base Directory specification names it
(`CacheDir`): $XDG_CACHE_HOME/cadence when XDG_CACHE_HOME is an absolute
path (the specification ignores an empty or relative one), else
~/.cache/cadence. Every default cache path comes from `CacheDir`, which
reads the environment when it is called (a process, the one it was
started with; a test passes its own).

There a full disk, a killed copy or a stray editor can damage a file
without changing its name. So each cached file is written under a
temporary name and renamed into place, its SHA-256 digest is
recorded after it (a `<file>.sha256` beside it, or a manifest of several),
and a reader uses the file only if its digest still matches; otherwise the
cache rebuilds it.

Example:
  CacheDir('spm')                     # ~/.cache/cadence/spm
  CacheDir('spm', environ={'XDG_CACHE_HOME': '/c'})   # /c/cadence/spm
  atomic_file.Write('/c/model', data)   # framework/atomic_file.py
  WriteDigest('/c/model')             # /c/model.sha256
  Verified('/c/model')                # True until the file changes
"""
import hashlib
import os

from cadence.framework import atomic_file


def CacheDir(*parts, environ=None):
  """The path `parts` in Cadence's cache folder: $XDG_CACHE_HOME/cadence
  when XDG_CACHE_HOME is an absolute path, else ~/.cache/cadence (home:
  $HOME, else os.path.expanduser's).

  Args:
    *parts: path components below the folder, e.g. 'spm'.
    environ: the environment to read (default: os.environ).
  """
  env = os.environ if environ is None else environ
  base = env.get('XDG_CACHE_HOME', '')
  if not os.path.isabs(base):
    base = os.path.join(env.get('HOME') or os.path.expanduser('~'), '.cache')
  return os.path.join(base, 'cadence', *parts)


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
