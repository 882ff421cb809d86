"""`--mode=inspect_model`: the model's variables, devices, FLOPs and memory
per stage, printed (framework/jobs/inspect_lib.py); the params are written
to <logdir>/params.txt with --logdir."""
import os
import sys

from cadence.framework.jobs import mode_registry


class InspectModelMode(mode_registry.Mode):
  """Prints the model report."""
  NAME = 'inspect_model'
  HELP = 'print variables and FLOPs'

  def Run(self, context):
    # TensorFlow loads with what the mode runs, after the checks.
    from cadence.framework.jobs import inspect_lib  # pylint: disable=g-import-not-at-top
    from cadence.framework.jobs import run_params  # pylint: disable=g-import-not-at-top
    options = context.options
    params = run_params.LoadParams(options, 'Train')
    model = inspect_lib.CheckModel(params)
    text = inspect_lib.ModelReport(params, options.device_memory_gib, model)
    if options.logdir:
      run_params.WriteParams(params, os.path.join(options.logdir, 'params.txt'))
    sys.stdout.write(text)
    sys.stdout.flush()
