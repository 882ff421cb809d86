"""Checkpoint files on disk: checking them, moving bad ones aside, the end mark.

`Checkpointer` (framework/train/checkpointer.py) saves and restores through
TensorFlow; this module handles what TensorFlow leaves to its user:

  * `Problem(path)`: why a checkpoint cannot be read (its index missing or
    garbage, its data truncated or a shard missing), or None when every
    tensor in it reads back.
  * `MoveAside(directory, paths)`: moves unreadable checkpoints' files into
    `directory/bad/` (never deletes them) and rewrites the `checkpoint`
    state file without them, so the newest readable one is the latest.
  * The `checkpoint` state file is a cache, not the truth: `ReadState`
    lists the checkpoints it names, or, when it is unreadable (garbage
    text, random bytes, empty), the checkpoints found from their own files
    (`<name>-<step>.index` and its data); `RepairState` rewrites it from
    them. TensorFlow would ignore such a file (or fail on it), and a
    trainer would start from step 0 over the checkpoints beside it.
  * The *final mark* `final_checkpoint.json`: the trainer writes it
    (atomically) when its run ends for good (max_steps reached, a stop for
    non-finite steps, or max_steps lowered below the restored step), naming
    the run's final checkpoint; it removes it when it trains on. Evalers
    and decoders stop after handling that checkpoint.

Only the directory's writer (the trainer; the chief of several hosts) calls
`MoveAside`, `RepairState` and the mark's writers: a reader (evaler,
decoder) skips an unreadable checkpoint, since it may not own, or see the
end of, the files.

Example:
  Problem('/tmp/run/train/ckpt-300')  # 'its data is unreadable (Read less..)'
  ReadState('/tmp/run/train')   # (['/tmp/run/train/ckpt-100', ...], None)
  RepairState('/tmp/run/train') # None, or the one line saying what it did
  MoveAside('/tmp/run/train', ['/tmp/run/train/ckpt-300'])
  WriteFinalMark('/tmp/run/train', 200, 'max_steps 200 reached')
  ReadFinalMark('/tmp/run/train')     # {'step': 200, 'reason': ...}
"""
import glob
import json
import os
import re

import tensorflow as tf

from cadence.framework import atomic_file

BAD_DIR = 'bad'
FINAL_MARK = 'final_checkpoint.json'
STATE_FILE = 'checkpoint'

_STEP_RE = re.compile(r'-(\d+)$')
# A line of the state file as TensorFlow writes it (a text proto of four
# fields): checked before TensorFlow parses it, which on garbage logs
# "Checkpoint ignored" and carries on as if there were no checkpoint.
_STATE_LINE = re.compile(
    r'(model_checkpoint_path|all_model_checkpoint_paths|'
    r'all_model_checkpoint_timestamps|last_preserved_timestamp): '
    r'("(?:[^"\\\n]|\\.)*"|[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)')

# What reading a damaged checkpoint raises: TensorFlow's errors, and the
# IndexError of a truncated data file ('Read less bytes than requested').
READ_ERRORS = (tf.errors.OpError, IndexError)


def ErrorLine(error):
  """The first line of an error's message, without TensorFlow's op
  decorations ('{{function_node ...}} ' and ' [Op:SaveV2]')."""
  text = str(error).strip().splitlines()[0] if str(error).strip() else repr(
      error)
  if text.startswith('{{') and '}} ' in text:
    text = text.split('}} ', 1)[1]
  if text.endswith(']') and ' [Op:' in text:
    text = text[:text.rindex(' [Op:')]
  return text


def CheckpointFiles(path):
  """The files of checkpoint `path`: its index and data shards."""
  return sorted(glob.glob(glob.escape(path) + '.index') +
                glob.glob(glob.escape(path) + '.data-*'))


def Problem(path):
  """Why checkpoint `path` cannot be read, or None if every tensor reads.

  Reads the whole checkpoint (each tensor once): for diagnosing a failed
  restore, not for every restore.
  """
  if not tf.io.gfile.exists(path + '.index'):
    return f'its index file {os.path.basename(path)}.index is missing'
  try:
    reader = tf.train.load_checkpoint(path)
  except READ_ERRORS as e:
    return f'its index is unreadable ({ErrorLine(e)})'
  for key in sorted(reader.get_variable_to_shape_map()):
    try:
      reader.get_tensor(key)
    except READ_ERRORS as e:
      return f'its data is unreadable ({key}: {ErrorLine(e)})'
  return None


def _FreeName(folder, names):
  """`folder`, or `folder/2`, `folder/3`, ...: the first holding none of
  `names` (a checkpoint moved aside twice keeps both copies)."""
  candidate, n = folder, 1
  while any(tf.io.gfile.exists(os.path.join(candidate, name))
            for name in names):
    n += 1
    candidate = os.path.join(folder, str(n))
  return candidate


def MoveAside(directory, paths):
  """Moves the files of checkpoints `paths` into `directory/bad/`.

  Then rewrites the `checkpoint` state file without them: its latest
  becomes the newest checkpoint left. Only the directory's writer may call
  this.

  Returns:
    The folder the files went to.
  """
  files = [f for path in paths for f in CheckpointFiles(path)]
  target = _FreeName(os.path.join(directory, BAD_DIR),
                     [os.path.basename(f) for f in files])
  tf.io.gfile.makedirs(target)
  for f in files:
    tf.io.gfile.rename(f, os.path.join(target, os.path.basename(f)))
  _DropFromState(directory, {os.path.basename(p) for p in paths})
  return target


def _DropFromState(directory, names):
  """Rewrites the `checkpoint` state file without the checkpoints `names`."""
  state = tf.train.get_checkpoint_state(directory)
  if state is None:
    return
  paths = list(state.all_model_checkpoint_paths)
  stamps = list(state.all_model_checkpoint_timestamps)
  keep = [i for i, p in enumerate(paths) if os.path.basename(p) not in names]
  if not keep:
    tf.io.gfile.remove(os.path.join(directory, STATE_FILE))
    return
  # Relative names, as CheckpointManager writes them (the proto read back
  # holds absolute paths).
  del state.all_model_checkpoint_paths[:]
  state.all_model_checkpoint_paths.extend(
      os.path.basename(paths[i]) for i in keep)
  if stamps:
    del state.all_model_checkpoint_timestamps[:]
    state.all_model_checkpoint_timestamps.extend(stamps[i] for i in keep)
  state.model_checkpoint_path = os.path.basename(paths[keep[-1]])
  atomic_file.Write(os.path.join(directory, STATE_FILE), str(state))


# --- the state file -----------------------------------------------------------


def FoundCheckpoints(directory):
  """The checkpoints of `directory` found from their files, oldest first:
  each `<name>-<step>.index` (its data is checked when it is restored)."""
  paths = [f[:-len('.index')] for f in
           glob.glob(os.path.join(glob.escape(directory), '*.index'))]
  return sorted((p for p in paths if _STEP_RE.search(p)),
                key=lambda p: int(_STEP_RE.search(p).group(1)))


def _StateProblem(path):
  """Why the state file `path` cannot be read, or None."""
  with tf.io.gfile.GFile(path, 'rb') as f:
    data = f.read()
  if not data.strip():
    return 'is empty'
  try:
    text = data.decode('utf-8')
  except UnicodeDecodeError:
    return 'is not text'
  for n, line in enumerate(text.splitlines(), 1):
    if line.strip() and not _STATE_LINE.fullmatch(line.strip()):
      return f'is not a checkpoint state (line {n}: {line.strip()[:40]!r})'
  if not any(line.startswith('model_checkpoint_path:')
             for line in text.splitlines()):
    return 'names no latest checkpoint'
  return None


def ReadState(directory, when_missing=False):
  """The checkpoints of `directory`, oldest first, and why its state file
  cannot be trusted.

  Args:
    directory: the train folder.
    when_missing: also find the checkpoints from their files when there
      is no state file (the writer, and hosts restoring at start). Without
      it a missing state file means no checkpoint, as for TensorFlow: a
      reader polling a live directory waits for the state file, which the
      writer writes once a save is complete.

  Returns:
    (paths, problem): the paths the state file names (absolute, whether
    their files exist or not) and None; or, when the state file is
    unreadable (or missing, with `when_missing`), the checkpoints found
    from their files (`FoundCheckpoints`) and what is wrong with it, e.g.
    'is not text'.
  """
  path = os.path.join(directory, STATE_FILE)
  if not tf.io.gfile.exists(path):
    found = FoundCheckpoints(directory) if when_missing else []
    return found, 'is missing' if found else None
  problem = _StateProblem(path)
  if problem is None:
    try:
      state = tf.train.get_checkpoint_state(directory)
    except (ValueError, UnicodeDecodeError) as e:
      state, problem = None, f'is unreadable ({ErrorLine(e)})'
    if state is None and problem is None:
      problem = 'is unreadable'
  if problem:
    return FoundCheckpoints(directory), problem
  return [p if os.path.isabs(p) else os.path.join(directory, p)
          for p in state.all_model_checkpoint_paths], None


def _WriteState(directory, paths):
  """Writes the state file naming `paths` (oldest first), atomically; each
  stamped with its index's time, so CheckpointManager keeps managing them
  (max_to_keep deletes the oldest beyond it)."""
  stamps = [os.path.getmtime(p + '.index') for p in paths]
  state = tf.compat.v1.train.generate_checkpoint_state_proto(
      directory, os.path.basename(paths[-1]),
      [os.path.basename(p) for p in paths],
      all_model_checkpoint_timestamps=stamps,
      last_preserved_timestamp=min(stamps) - 1)
  atomic_file.Write(os.path.join(directory, STATE_FILE), str(state))


def RepairState(directory):
  """Rewrites an unreadable or missing state file from the checkpoints'
  files (the writer only); an unreadable one without any checkpoint
  beside it goes into `bad/` (never deleted).

  Returns:
    None when the state file was fine (or there is none and no
    checkpoint), else one line saying what was wrong and what was done.
  """
  paths, problem = ReadState(directory, when_missing=True)
  if problem is None:
    return None
  path = os.path.join(directory, STATE_FILE)
  if not paths:
    target = _FreeName(os.path.join(directory, BAD_DIR), [STATE_FILE])
    tf.io.gfile.makedirs(target)
    tf.io.gfile.rename(path, os.path.join(target, STATE_FILE))
    return (f'The checkpoint state file {path} {problem}; no checkpoint '
            f'files beside it: moved it into {target}.')
  _WriteState(directory, paths)
  names = ', '.join(os.path.basename(p) for p in paths)
  return (f'The checkpoint state file {path} {problem}: rewrote it from the '
          f'checkpoint files beside it ({names}).')


# --- the final mark -----------------------------------------------------------


def WriteFinalMark(directory, step, reason):
  """Marks the run in `directory` as ended, its final checkpoint at `step`.

  Args:
    directory: the train folder.
    step: the step of the run's final checkpoint (None: it wrote none).
    reason: one phrase, e.g. 'max_steps 200 reached'.
  """
  atomic_file.Write(os.path.join(directory, FINAL_MARK),
                   json.dumps(dict(step=step, reason=reason)) + '\n')


def ReadFinalMark(directory):
  """{'step': int or None, 'reason': str} if the run ended, else None (also
  for a file that holds anything else: any bytes can be there)."""
  path = os.path.join(directory, FINAL_MARK)
  try:
    with tf.io.gfile.GFile(path, 'rb') as f:
      mark = json.loads(f.read().decode('utf-8'))
  except (tf.errors.OpError, ValueError):  # None, or not JSON text.
    return None
  if not (isinstance(mark, dict) and isinstance(mark.get('reason'), str) and
          (mark.get('step') is None or (isinstance(mark['step'], int) and
                                        not isinstance(mark['step'], bool)))):
    return None
  return mark


def RemoveFinalMark(directory):
  """Removes the mark (the trainer trains on); no-op if there is none."""
  path = os.path.join(directory, FINAL_MARK)
  if tf.io.gfile.exists(path):
    tf.io.gfile.remove(path)
