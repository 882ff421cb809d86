"""`params.txt` in a logdir: written by each run, a user's edits kept.

Every job writes its params as text (`key : value` lines, hyperparams'
ToText) to `params.txt` in its folder. When the file already there differs
from what this run writes (a user edited it by hand, or the run before had
other params, e.g. another --max_steps), it is not lost: `Write` renames it
to `params.txt.<UTC time>` first and returns one line saying which keys
differ. The same comparison (`Differences`) says how the model of a
logdir's checkpoints differs from this run's, when they do not fit
(sync_run.py).

Example:
  Write('/tmp/run/params.txt', params.ToText())
  # None, or "/tmp/run/params.txt differs from this run's params in
  # task.hidden_dims ([32] there, [16] here): kept it as
  # /tmp/run/params.txt.20250102T030405Z."
"""
import datetime

import tensorflow as tf


def Pairs(text):
  """{key: value text} of the `key : value` lines of a params text."""
  pairs = {}
  for line in text.splitlines():
    key, sep, value = line.partition(' : ')
    if sep and not line.startswith('#'):
      pairs[key.strip()] = value.strip()
  return pairs


def Differences(old_text, new_text):
  """[(key, old value or None, new value or None)] of the keys whose values
  differ between two params texts, sorted by key; lines that are not
  `key : value` are ignored."""
  old, new = Pairs(old_text), Pairs(new_text)
  return [(k, old.get(k), new.get(k)) for k in sorted(set(old) | set(new))
          if old.get(k) != new.get(k)]


def DescribeDifferences(diffs, first=3, there='there', here='here'):
  """'a.b (1 there, 2 here), c (missing there, 3 here) and 4 more'."""
  items = [f"{k} ({'missing' if a is None else a} {there}, "
           f"{'missing' if b is None else b} {here})"
           for k, a, b in diffs[:first]]
  more = len(diffs) - first
  text = ', '.join(items)
  return f'{text} and {more} more' if more > 0 else text


def Read(path):
  """The text of the params file `path`, or None if it is missing or is
  not text."""
  try:
    with tf.io.gfile.GFile(path, 'rb') as f:
      return f.read().decode('utf-8')
  except (tf.errors.OpError, UnicodeDecodeError):   # Missing, a folder, ...
    return None


def _KeptName(path, now):
  """`path.<UTC time>`, with `.2`, `.3`, ... if that name is taken."""
  base = f"{path}.{now.strftime('%Y%m%dT%H%M%SZ')}"
  name, n = base, 1
  while tf.io.gfile.exists(name):
    n += 1
    name = f'{base}.{n}'
  return name


def Write(path, text, now=None):
  """Writes the params `text` to `path`, keeping a different file there.

  Args:
    path: the params file, e.g. '/tmp/run/params.txt' (its folder exists).
    text: the params text this run writes.
    now: the UTC time for the kept file's name (default: now).

  Returns:
    None, or one line saying that the file there differed (the first keys
    that differ) and where it was kept.
  """
  old = None
  if tf.io.gfile.exists(path):
    with tf.io.gfile.GFile(path, 'rb') as f:
      old = f.read()
  message = None
  if old is not None and old != text.encode('utf-8'):
    now = now or datetime.datetime.now(datetime.timezone.utc)
    kept = _KeptName(path, now)
    tf.io.gfile.rename(path, kept)
    try:
      diffs = Differences(old.decode('utf-8'), text)
      what = (f'in {DescribeDifferences(diffs)}' if diffs else
              'in its comments or layout')
    except UnicodeDecodeError:
      what = '(it is not text)'
    message = (f"{path} differs from this run's params {what}: kept it as "
               f'{kept}.')
  with tf.io.gfile.GFile(path, 'w') as f:
    f.write(text)
  return message
