"""--job, the sync mode's flag: its forms, parsed before TensorFlow loads.

  trainer             train;
  trainer_and_evaler  train, and eval Dev after each checkpoint;
  evaler_<dataset>    eval each new checkpoint on the dataset;
  decoder_<dataset>   decode each new checkpoint on the dataset;

datasets: model_registry.DATASETS (train, dev, test; any case). Read by
sync_mode.py (its checks) and sync_run.py (its run). No TensorFlow.

Example:
  ParseJob('evaler_dev')   # ('evaler', 'Dev')
"""
import difflib

from cadence.framework import model_registry
from cadence.framework.jobs import user_error

_JOB_FORMS = ('trainer', 'trainer_and_evaler', 'evaler_<dataset>',
              'decoder_<dataset>')
TRAINS = ('trainer', 'trainer_and_evaler')   # The jobs that train.


def ParseJob(job):
  """'evaler_dev' -> ('evaler', 'Dev'); 'trainer' -> ('trainer', None).

  Raises:
    UserError: not a job form, naming the closest job.
  """
  if job in TRAINS:
    return job, None
  kind, _, dataset = str(job).partition('_')
  names = {d.lower(): d for d in model_registry.DATASETS}
  if kind in ('evaler', 'decoder') and dataset.lower() in names:
    return kind, names[dataset.lower()]
  known = list(TRAINS) + [
      f'{k}_{d.lower()}' for k in ('evaler', 'decoder') for d in names]
  close = difflib.get_close_matches(str(job), known, n=2, cutoff=0.6)
  hint = f' Did you mean {" or ".join(map(repr, close))}?' if close else ''
  raise user_error.UserError(
      f'--job={job!r} is not one of {", ".join(_JOB_FORMS)} (datasets: '
      f'{", ".join(model_registry.DATASETS)}).{hint}')
