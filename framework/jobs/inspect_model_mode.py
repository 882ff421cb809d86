"""`--mode=inspect_model`: the model's variables, devices, FLOPs and memory
per stage, printed (framework/jobs/inspect_lib.py); the params are written
to <logdir>/params.txt with --logdir, as inspect_params does."""
from cadence.framework.jobs import inspect_params_mode


class InspectModelMode(inspect_params_mode.InspectParamsMode):
  """Prints the model report."""
  NAME = 'inspect_model'
  HELP = 'print variables and FLOPs'

  def Text(self, options, params, model):
    from cadence.framework.jobs import inspect_lib  # pylint: disable=g-import-not-at-top
    return inspect_lib.ModelReport(params, options.device_memory_gib, model)
