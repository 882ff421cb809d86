"""Whether a logdir's checkpoints hold the model a command builds.

A sync job (framework/jobs/sync_run.py) and an export
(framework/jobs/export.py) both restore a logdir's checkpoint into a model
built from `--model` and its overrides. When the checkpoint holds another
model (another experiment, a changed `hidden_dim`), TensorFlow's restore
fails deep inside with "Received incompatible tensor ... name b:0". Both
ask `Mismatch` first: one phrase naming the checkpoint, the variable and
its shapes there and here, and, from the run's params.txt, the params
paths whose values differ (the key a user overrides to fit it).

Example:
  line = Mismatch(logdir, key, params, task, [path])
  if line:
    raise UserError(line)
"""
import os

from cadence.framework.jobs import params_file
from cadence.framework.train import checkpoint_files
from cadence.framework.train import checkpoint_match
from cadence.framework.train import checkpointer


def ParamsText(params):
  """`params.ToText()`, or the lenient `str(params)` when a value has no
  text form (e.g. a lambda)."""
  try:
    return params.ToText()
  except ValueError:
    return str(params)


def _OtherModel(logdir, params):
  """How the logdir's params.txt (the params its checkpoints were trained
  with) differs from `params`: the experiment, else the task's first
  differing keys; '' when it cannot say."""
  text = params_file.Read(os.path.join(logdir, 'params.txt'))
  if text is None:
    return ''
  ours = ParamsText(params)
  diffs = params_file.Differences(text, ours)
  if any(d[0] in ('name', 'task.cls') for d in diffs):
    def _Model(pairs):   # "'lm' (LanguageModel)"
      cls = pairs.get('task.cls', '').rpartition('.')[2].rstrip("')")
      return f"{pairs.get('name', '?')} ({cls or '?'})"
    return (f' Its params.txt is of the model '
            f'{_Model(params_file.Pairs(text))}, this run\'s is '
            f'{_Model(params_file.Pairs(ours))}.')
  model = [d for d in diffs if d[0].startswith('task.') and
           not d[0].startswith(('task.train.', 'task.eval.',
                                'task.is_inference'))]
  if model:
    return (" Its params.txt differs from this run's in " +
            params_file.DescribeDifferences(model) + '.')
  return ''


def Mismatch(logdir, key, params, task, paths):
  """The line saying that the newest readable of `paths` (checkpoints of
  logdir/train) does not hold the model variables of `task` (the same
  paths, shapes and dtypes), or None when it does (or none is readable: a
  damaged checkpoint is left to the restore, which says so).

  Args:
    logdir: the run's folder (its params.txt is compared with `params`).
    key: the --model registry key, for the line.
    params: the model params the command built `task` from.
    task: the built task (symbolic or real).
    paths: checkpoint paths, oldest first.
  """
  for path in reversed(paths):
    try:
      saved = checkpoint_match.SavedVariables(path)
      break
    except checkpoint_files.READ_ERRORS:
      continue
  else:
    return None
  mismatch = checkpoint_match.Mismatch(saved, checkpoint_match.ModelVariables(
      checkpointer.TaskVariables(task)))
  if not mismatch:
    return None
  return (f'--logdir {logdir} holds checkpoints of another model: {path} '
          f'does not fit --model={key}: {mismatch}.'
          f'{_OtherModel(logdir, params)}')
