"""`--mode=inspect_pipeline`: one training step profiled; its pipeline
timeline and each device's measured memory printed (and, with --logdir,
the chart and summary written, else a last line saying how to get them):
framework/jobs/inspect_pipeline.py."""
import os
import sys

from cadence.framework.jobs import mode_registry
from cadence.framework.jobs import user_error

# What a run without --logdir prints last: it wrote nothing, and how to.
NO_LOGDIR_LINE = ('No chart written: add --logdir=DIR to write the chart '
                  '(SVG), every action\'s times and a TensorBoard image to '
                  'DIR/inspect_pipeline.')


class InspectPipelineMode(mode_registry.Mode):
  """Profiles one training step and prints its timeline."""
  NAME = 'inspect_pipeline'
  HELP = ('profile one training step and print (and write to --logdir) its '
          'pipeline timeline')

  def Environment(self, flags):
    # TF's BFC allocator on CPU, read when TF makes its first device: its
    # allocations are what the measured memory reads (memory_profile).
    del flags
    return {'TF_CPU_ALLOCATOR_USE_BFC': 'true'}

  def Run(self, context):
    # TensorFlow loads with what the mode runs, after the checks.
    from cadence.framework.jobs import inspect_lib  # pylint: disable=g-import-not-at-top
    from cadence.framework.jobs import inspect_pipeline  # pylint: disable=g-import-not-at-top
    from cadence.framework.jobs import run_params  # pylint: disable=g-import-not-at-top
    options = context.options
    params = run_params.LoadParams(options, 'Train')
    inspect_lib.CheckModel(params)
    try:
      timeline, memory = inspect_pipeline.InspectPipeline(
          params, options.logdir or None)
    except inspect_pipeline.NoPipelineError as e:
      raise user_error.UserError(f'--mode=inspect_pipeline: {e}') from None
    sys.stdout.write(timeline.Report() + memory)
    if options.logdir:
      sys.stdout.write(f'Chart and summary: '
                       f'{os.path.join(options.logdir, "inspect_pipeline")}\n')
    else:
      sys.stdout.write(NO_LOGDIR_LINE + '\n')
    sys.stdout.flush()
