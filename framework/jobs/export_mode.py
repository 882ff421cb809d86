"""`--mode=export`: a checkpoint of --logdir as a SavedModel for serving
(framework/jobs/export.py), written whole or not at all."""
import dataclasses
import sys

from cadence.framework.jobs import mode_registry
from cadence.framework.jobs import user_error

Flag = mode_registry.Flag


@dataclasses.dataclass
class ExportFlags:
  """The flags of --mode=export."""
  export_dir: str = Flag('', 'the SavedModel\'s folder (default: '
                         '<logdir>/export/<step>); written whole or not at '
                         'all.')
  checkpoint: str = Flag('', 'the checkpoint to export, a path '
                         '(<logdir>/train/ckpt-300) or a step (default: '
                         'the latest).')
  export_batch_size: int = Flag(None, 'a static batch size (TPU/XLA '
                                'servers); default: dynamic.', 'integer')
  export_max_len: int = Flag(None, 'a static sequence length for sequence '
                             'models (TPU/XLA servers); default: the '
                             'task\'s (see its Inference).', 'integer')


class ExportMode(mode_registry.Mode):
  """Exports a checkpoint as a SavedModel."""
  NAME = 'export'
  HELP = ('a checkpoint as a SavedModel for serving '
          '(framework/jobs/export.py)')
  FLAGS = ExportFlags

  def Check(self, options, flags):
    if not options.logdir:
      raise user_error.UserError('--logdir is required for --mode=export: '
                                 'the run whose checkpoint is exported.')
    user_error.CheckInt('export_batch_size', flags.export_batch_size, 1,
                        True, '--mode=export: a static batch size')
    user_error.CheckInt('export_max_len', flags.export_max_len, 2, True,
                        '--mode=export: a static sequence length')

  def Run(self, context):
    """Reads the params of Dev (the decoder's data) if the experiment has
    it."""
    # TensorFlow loads with what the mode runs, after the checks.
    from cadence.framework.jobs import export  # pylint: disable=g-import-not-at-top
    from cadence.framework.jobs import inspect_lib  # pylint: disable=g-import-not-at-top
    from cadence.framework.jobs import run_params  # pylint: disable=g-import-not-at-top
    options, flags = context.options, context.flags
    params = run_params.LoadParams(options, 'Train')
    inspect_lib.CheckModel(params)
    if run_params.HasDataset(options, 'Dev'):
      params = run_params.LoadParams(options, 'Dev')
    try:
      path, step = export.Export(
          params, options.logdir, flags.export_dir, flags.checkpoint,
          flags.export_batch_size, flags.export_max_len, options.model)
    except export.ExportError as e:
      raise user_error.UserError(str(e)) from None
    except export.Interrupted as e:
      raise mode_registry.Stopped(
          f'--mode=export stopped by {e}: the partial export was removed '
          'and nothing was written; rerun the command to export.') from None
    sys.stdout.write(f'Exported step {step} to {path}\n')
