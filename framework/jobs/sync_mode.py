"""`--mode=sync` (the default): run `--job`: train, evaluate or decode.

A mode like the others (mode_registry.py): its checks are here, before
TensorFlow loads (--job, --logdir, and a trainer job's logdir not held by
another live trainer); its checks before the devices and its run are
sync_run.py (the job built, the logdir's lock, signals, peer hosts, exit
codes 3 and 4), what each job runs sync_jobs.py.
"""
from cadence.framework.distribute import tf_config
from cadence.framework.jobs import job_flag
from cadence.framework.jobs import mode_registry
from cadence.framework.jobs import user_error
from cadence.framework.train import logdir_lock


class SyncMode(mode_registry.Mode):
  """Runs --job (sync_run.py)."""
  NAME = 'sync'
  HELP = 'run --job'
  REPORTS_ITS_RUN = True

  def Check(self, options, flags):
    del flags
    kind, _ = job_flag.ParseJob(options.job)
    if not options.logdir:
      raise user_error.UserError('--logdir is required for --mode=sync.')
    if kind in job_flag.TRAINS:
      _CheckLogdirFree(options)

  def CheckBeforeDevices(self, options, flags, setup_cls):
    # TensorFlow loads with what the mode runs, after the checks.
    from cadence.framework.jobs import sync_run  # pylint: disable=g-import-not-at-top
    return sync_run.CheckBeforeDevices(options, setup_cls)

  def Run(self, context):
    from cadence.framework.jobs import sync_run  # pylint: disable=g-import-not-at-top
    return sync_run.Run(context)


def _CheckLogdirFree(options):
  """A trainer job's logdir held by another live trainer (its writer lock,
  framework/train/logdir_lock.py), answered before TensorFlow loads, on
  the host that writes it (tf_config.IsChief); the lock itself is taken
  later, before the first write."""
  if not user_error.IsLocal(options.logdir):
    return
  try:
    config = tf_config.Read(options.cluster_spec, options.task_type,
                            options.task_index)
  except tf_config.ConfigError as e:
    raise user_error.UserError(str(e)) from None
  if not tf_config.IsChief(config):
    return
  try:
    logdir_lock.CheckFree(options.logdir)
  except logdir_lock.HeldError as e:
    raise user_error.UserError(str(e)) from None
