"""Checkpoints of the training state, crash-safe and never non-finite.

A checkpoint holds the model variables (keyed by variable path, e.g.
`model/vars/regression.net.fc[0].w`), the optimizer state, the global step,
the input position and, when enabled, the EMA variables. Writing goes
through `tf.train.CheckpointManager`, which is atomic against SIGKILL: the
previous checkpoint stays loadable, at worst a `ckpt-N_temp` folder is left
behind, which `Checkpointer` removes when it starts.

A checkpoint is never written while any saved floating variable holds a NaN
or Inf: `Save` checks first and refuses (returns None), so the latest
checkpoint is always a good one to resume from. A save that fails (disk
full, quota, permission) raises `SaveError` naming the path and the OS
error; the previous checkpoint stays the latest and the failed save's own
partial files are removed.

`Restore()` survives damaged files: when the latest checkpoint cannot be
read (a missing or garbage index, truncated data, a missing shard) it logs
which and why and restores the newest readable one; the directory's writer
(the trainer) also moves the damaged files into `bad/`
(framework/train/checkpoint_files.py). No readable checkpoint at all raises
`UnreadableError`. A readable checkpoint that does not fit the model is not
damage: its error is raised as TensorFlow gives it. The `checkpoint` state
file is a cache: when it is unreadable (or missing beside checkpoint
files) the checkpoints are found from their own files, and the writer
rewrites it (one warning line; checkpoint_files.RepairState).

Example:
  ckpt = Checkpointer('/tmp/run/train', dict(
      model=KeyedVariables(TaskVariables(task)), global_step=step_var),
      max_to_keep=3)
  ckpt.Restore()            # None on a fresh run, else the restored step.
  ckpt.Save(step=100)       # '/tmp/run/train/ckpt-100'
"""
import glob
import os
import re
import shutil

from absl import logging
import tensorflow as tf

from cadence.framework.train import checkpoint_files

_CKPT_NAME = 'ckpt'
_STEP_RE = re.compile(r'-(\d+)$')


def TaskVariables(task, var_map=None):
  """{'<task path>.<key>': variable}: the full variable paths of a task.

  Args:
    task: a BaseTask (or any BaseLayer).
    var_map: a NestedMap of variables keyed like `task.vars`, or a dict
      {key: variable} (e.g. the EMA copies); default: `task.vars`.

  Example:
    TaskVariables(task)   # {'regression.net.fc[0].w': <tf.Variable>, ...}
  """
  var_map = task.vars if var_map is None else var_map
  items = (var_map.FlattenItems() if hasattr(var_map, 'FlattenItems') else
           var_map.items())
  return {f'{task.path}.{k}': v for k, v in items}


class SaveError(Exception):
  """A checkpoint could not be written (disk full, quota, permission)."""


class UnreadableError(Exception):
  """No checkpoint of a directory (or not the one asked for) can be read."""


class KeyedVariables(tf.Module):
  """A trackable dict of variables whose checkpoint keys are its keys.

  Example:
    KeyedVariables({'reg.w': w_var, 'reg.b': b_var})
    # keys model/vars/reg..w/... in tf.train.Checkpoint(model=...)
  """

  def __init__(self, variables, name=None):
    super().__init__(name=name)
    self.vars = dict(variables)


def StepOf(checkpoint_path):
  """The step number in a checkpoint path ('.../ckpt-120' -> 120)."""
  m = _STEP_RE.search(checkpoint_path)
  if not m:
    raise ValueError(f'Checkpoint path {checkpoint_path!r} does not end in '
                     '-<step>.')
  return int(m.group(1))


def RemoveTempFiles(directory):
  """Deletes leftovers of interrupted saves (`*_temp*`); returns them."""
  removed = sorted(glob.glob(os.path.join(directory, '*_temp*')))
  for path in removed:
    if os.path.isdir(path):
      shutil.rmtree(path, ignore_errors=True)
    else:
      try:
        os.remove(path)
      except FileNotFoundError:
        pass
  return removed


def ListCheckpoints(directory, when_missing=False):
  """Paths of the checkpoints in `directory`, oldest first: those its state
  file names, or those found from their files when it is unreadable (or
  missing, with `when_missing`: checkpoint_files.ReadState)."""
  paths, _ = checkpoint_files.ReadState(directory, when_missing)
  return sorted((p for p in paths if tf.io.gfile.exists(p + '.index')),
                key=StepOf)


def ReadValues(checkpoint_path, prefix='model/'):
  """{checkpoint key: numpy value} of the keys starting with `prefix`."""
  reader = tf.train.load_checkpoint(checkpoint_path)
  return {name: reader.get_tensor(name)
          for name, _ in tf.train.list_variables(checkpoint_path)
          if name.startswith(prefix)}


class Checkpointer:
  """Saves and restores a set of trackables in `directory`.

  Args:
    directory: the folder of the checkpoints (created, if missing, at the
      first restore or save: constructing touches nothing).
    objects: dict name -> trackable (tf.Module, tf.Variable, ...).
    max_to_keep: checkpoints kept; older ones are deleted.
    writer: this process writes the directory (the trainer; the chief of
      several hosts). Only the writer deletes `*_temp*` leftovers and
      rewrites an unreadable state file (both at the first restore or
      save), and moves unreadable
      checkpoints aside: for a reader (an evaler) a leftover can be a save
      in progress. A reader saves nothing.
  """

  def __init__(self, directory, objects, max_to_keep=5, writer=True):
    self._directory = directory
    self._writer = writer
    self._max_to_keep = max_to_keep
    self._checkpoint = tf.train.Checkpoint(**objects)
    # The writer's manager saves; a reader lists the directory afresh. Made
    # (with the folder and its repairs) at the first use, not here: a run
    # refused after its programs are built leaves the logdir as it was.
    self._manager = None
    self._ready = False
    self._float_vars = [
        v for v in self._checkpoint_variables(objects)
        if v.dtype.is_floating]

  def _Ready(self):
    """Creates the folder and, for the writer, cleans what an interrupted
    save left (`*_temp*`, an unreadable state file) and makes its manager;
    once, before the first restore or save."""
    if self._ready:
      return
    tf.io.gfile.makedirs(self._directory)
    if self._writer:
      for path in RemoveTempFiles(self._directory):
        logging.warning('Removed %s, left by an interrupted checkpoint '
                        'save.', path)
      repaired = checkpoint_files.RepairState(self._directory)
      if repaired:
        logging.warning('%s', repaired)
      self._manager = self._NewManager()
    self._ready = True

  def _NewManager(self):
    """A CheckpointManager reading the state file as it is on disk now."""
    return tf.train.CheckpointManager(
        self._checkpoint, self._directory, max_to_keep=self._max_to_keep,
        checkpoint_name=_CKPT_NAME)

  @staticmethod
  def _checkpoint_variables(objects):
    seen, out = set(), []
    for obj in objects.values():
      variables = [obj] if isinstance(obj, tf.Variable) else list(
          getattr(obj, 'variables', ()))
      for v in variables:
        if v.ref() not in seen:
          seen.add(v.ref())
          out.append(v)
    return out

  @property
  def directory(self):
    return self._directory

  @property
  def latest_checkpoint(self):
    self._Ready()
    if self._manager is not None:
      return self._manager.latest_checkpoint
    paths = ListCheckpoints(self._directory, when_missing=True)
    return paths[-1] if paths else None

  def Restore(self, checkpoint_path=None, expect_partial=False):
    """Restores `checkpoint_path`, or else the newest readable checkpoint.

    Args:
      checkpoint_path: a path from `ListCheckpoints`, or None for the latest
        readable one (unreadable newer ones are logged, and moved aside by
        the writer).
      expect_partial: allow the checkpoint to hold more than `objects` (an
        evaler restores the model but not the optimizer).

    Returns:
      The restored checkpoint's step, or None when there is none.

    Raises:
      UnreadableError: `checkpoint_path` cannot be read, or none of the
        directory's checkpoints can.
    """
    self._Ready()
    if checkpoint_path:
      problem = self._TryRestore(checkpoint_path, expect_partial)
      if problem:
        raise UnreadableError(f'Checkpoint {checkpoint_path} is unreadable: '
                              f'{problem}.')
      return StepOf(checkpoint_path)
    candidates = checkpoint_files.ReadState(self._directory,
                                            when_missing=True)[0][::-1]
    bad = []
    for path in candidates:
      problem = self._TryRestore(path, expect_partial)
      if problem is None:
        break
      logging.warning('Checkpoint %s is unreadable: %s.', path, problem)
      bad.append((path, problem))
    else:
      if not bad:
        return None
      raise UnreadableError(
          f'No readable checkpoint in {self._directory}: ' + '; '.join(
              f'{os.path.basename(p)}: {why}' for p, why in bad) +
          '. Move them away to train from step 0, or use a new --logdir.')
    if bad and self._writer:
      folder = checkpoint_files.MoveAside(self._directory,
                                          [p for p, _ in bad])
      self._manager = self._NewManager()
      logging.warning('Moved %s into %s; restored %s instead.', ', '.join(
          os.path.basename(p) for p, _ in bad), folder, path)
    return StepOf(path)

  def _TryRestore(self, path, expect_partial):
    """Restores `path`; returns None, or why its files cannot be read."""
    try:
      # `restore`, not `read`: the manager's saves hold the checkpoint's
      # `save_counter`, which `read` leaves unrestored (TensorFlow then
      # warns "deleted with unrestored values" when the status goes away).
      status = self._checkpoint.restore(path)
      if expect_partial:
        status.expect_partial()
      else:
        status.assert_existing_objects_matched()
      return None
    except checkpoint_files.READ_ERRORS + (ValueError, AssertionError):
      problem = checkpoint_files.Problem(path)
      if problem is None:  # The files are fine: they do not fit the model.
        raise
      return problem

  def MarkFinal(self, reason):
    """Marks the run ended for good (the writer only): its final checkpoint
    is the latest one. `reason`: one phrase, e.g. 'max_steps 200 reached'."""
    if self._writer:
      self._Ready()
      latest = self._manager.latest_checkpoint
      checkpoint_files.WriteFinalMark(
          self._directory, StepOf(latest) if latest else None, reason)

  def ClearFinal(self):
    """Removes the final mark (the writer only): the run trains on."""
    if self._writer:
      checkpoint_files.RemoveFinalMark(self._directory)

  def AllFinite(self):
    """True if every saved floating variable is finite."""
    # Eager: a few small ops per variable, and no tracing on the first save.
    flags = [tf.reduce_all(tf.math.is_finite(v)) for v in self._float_vars]
    return bool(tf.reduce_all(tf.stack(flags))) if flags else True

  def Save(self, step):
    """Writes checkpoint `ckpt-<step>` unless a variable is non-finite.

    Returns:
      The checkpoint path, or None when the save was refused.

    Raises:
      SaveError: the files could not be written; the previous checkpoint
        stays the latest (the state file on disk is the judge).
    """
    self._Ready()
    if not self.AllFinite():
      logging.error('Not saving a checkpoint at step %d: some variables are '
                    'NaN or Inf. The latest good checkpoint stays %s.', step,
                    self._manager.latest_checkpoint)
      return None
    try:
      return self._manager.save(checkpoint_number=int(step))
    except (tf.errors.OpError, OSError) as e:
      raise self._SaveFailed(step, e) from None

  def _SaveFailed(self, step, error):
    """Cleans up after a failed save of `step`; returns its SaveError."""
    prefix = os.path.join(self._directory, f'{_CKPT_NAME}-{int(step)}')
    self._manager = self._NewManager()  # What the state file on disk says.
    latest = self._manager.latest_checkpoint
    if latest != prefix:  # The save never landed: its files are partial.
      for path in checkpoint_files.CheckpointFiles(prefix):
        tf.io.gfile.remove(path)
      shutil.rmtree(prefix + '_temp', ignore_errors=True)
    return SaveError(
        f'Could not write checkpoint {prefix} (step {step}): '
        f'{checkpoint_files.ErrorLine(error)}. The latest checkpoint is '
        f'{latest or "none"}. Free space or fix the folder, then rerun the '
        'same command to resume from it.')
