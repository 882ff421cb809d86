"""`--mode=inspect_params`: the experiment's params as text, printed (and
written to <logdir>/params.txt with --logdir), after the checks a build
runs on them."""
import os
import sys

from cadence.framework.jobs import mode_registry


class InspectParamsMode(mode_registry.Mode):
  """Prints the params text; a mode that prints another report of the
  checked model overrides `Text`."""
  NAME = 'inspect_params'
  HELP = 'print (and write) the params text'

  def Text(self, options, params, model):
    """What the mode prints, from the checked params and symbolic model."""
    del options, model
    from cadence.framework.jobs import run_params  # pylint: disable=g-import-not-at-top
    return run_params.ParamsText(params)

  def Run(self, context):
    # TensorFlow loads with what the mode runs, after the checks.
    from cadence.framework.jobs import inspect_lib  # pylint: disable=g-import-not-at-top
    from cadence.framework.jobs import run_params  # pylint: disable=g-import-not-at-top
    options = context.options
    params = run_params.LoadParams(options, 'Train')
    model = inspect_lib.CheckModel(params)
    text = self.Text(options, params, model)
    if options.logdir:
      run_params.WriteParams(params, os.path.join(options.logdir, 'params.txt'))
    sys.stdout.write(text)
    sys.stdout.flush()
