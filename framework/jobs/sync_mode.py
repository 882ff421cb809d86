"""`--mode=sync` (the default): run `--job`: train, evaluate or decode.

Its checks are here; its run is the trainer's own path
(trainer_lib.Main: the logdir's lock, signals, peer hosts, exit codes 3
and 4), which no other mode shares.
"""
import difflib

from cadence.framework import model_registry
from cadence.framework.jobs import mode_registry
from cadence.framework.jobs import user_error

_JOB_FORMS = ('trainer', 'trainer_and_evaler', 'evaler_<dataset>',
              'decoder_<dataset>')


class SyncMode(mode_registry.Mode):
  """Runs --job (trainer_lib.Main's own path)."""
  NAME = 'sync'
  HELP = 'run --job'

  def Check(self, options, flags):
    del flags
    ParseJob(options.job)
    if not options.logdir:
      raise user_error.UserError('--logdir is required for --mode=sync.')


def ParseJob(job):
  """'evaler_dev' -> ('evaler', 'Dev'); 'trainer' -> ('trainer', None).

  Raises:
    UserError: not a job form, naming the closest job.
  """
  if job in ('trainer', 'trainer_and_evaler'):
    return job, None
  kind, _, dataset = str(job).partition('_')
  names = {d.lower(): d for d in model_registry.DATASETS}
  if kind in ('evaler', 'decoder') and dataset.lower() in names:
    return kind, names[dataset.lower()]
  known = ['trainer', 'trainer_and_evaler'] + [
      f'{k}_{d.lower()}' for k in ('evaler', 'decoder') for d in names]
  close = difflib.get_close_matches(str(job), known, n=2, cutoff=0.6)
  hint = f' Did you mean {" or ".join(map(repr, close))}?' if close else ''
  raise user_error.UserError(
      f'--job={job!r} is not one of {", ".join(_JOB_FORMS)} (datasets: '
      f'{", ".join(model_registry.DATASETS)}).{hint}')
