"""`--mode=inspect_params`: the experiment's params as text, printed (and
written to <logdir>/params.txt with --logdir), after the checks a build
runs on them."""
import os
import sys

from cadence.framework.jobs import mode_registry


class InspectParamsMode(mode_registry.Mode):
  """Prints the params text."""
  NAME = 'inspect_params'
  HELP = 'print (and write) the params text'

  def Run(self, context):
    # TensorFlow loads with what the mode runs, after the checks.
    from cadence.framework.jobs import inspect_lib  # pylint: disable=g-import-not-at-top
    from cadence.framework.jobs import run_params  # pylint: disable=g-import-not-at-top
    options = context.options
    params = run_params.LoadParams(options, 'Train')
    inspect_lib.CheckModel(params)
    text = run_params.ParamsText(params)
    if options.logdir:
      run_params.WriteParams(params, os.path.join(options.logdir, 'params.txt'))
    sys.stdout.write(text)
    sys.stdout.flush()
