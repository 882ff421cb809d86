"""`--mode=plan`: the planner's ranked layouts of a model, printed.

The planning is framework/planning/planner.py; this is the trainer's side
of it: its --plan_* flags and their checks, the table out, and the
planner's refusals as the trainer's one-line errors (exit 2).
"""
import dataclasses
import os
import sys

from cadence.framework.jobs import mode_registry
from cadence.framework.jobs import user_error
from cadence.framework.planning import hardware

Flag = mode_registry.Flag


@dataclasses.dataclass
class PlanFlags:
  """The --plan_* flags of --mode=plan."""
  cluster: str = Flag('cpu', 'the cluster, a preset (cpu: this host\'s '
                      'logical CPUs, measured; h100x8; tpu_v4_8) and/or '
                      'key=value items, e.g. \'h100x8,hosts=2\' '
                      '(framework/planning/hardware.py).')
  measure: bool = Flag(False, 'time each layer on this host\'s CPU instead '
                       'of costing it by its FLOPs.')
  top: int = Flag(10, 'layouts in the table.')
  apply: str = Flag('', 'write the best layout\'s overrides to this Params '
                    'file (for --model_params_file_override).')
  explain: int = Flag(0, 'with --logdir: draw the simulated timeline of the '
                      'layout of this rank (0: the layout chosen).')


class PlanMode(mode_registry.Mode):
  """Prints the planner's ranked layouts."""
  NAME = 'plan'
  HELP = ('predict and rank every layout on --plan_cluster '
          '(framework/planning/planner.py)')
  FLAGS = PlanFlags
  PREFIX = 'plan_'

  def Check(self, options, flags):
    del options
    try:
      hardware.Parse(flags.cluster)
    except hardware.SpecError as e:
      raise user_error.UserError(str(e)) from None
    for name, low in (('top', 1), ('explain', 0)):
      value = getattr(flags, name)
      if not (user_error.IsInt(value) and value >= low):
        raise user_error.UserError(
            f'--plan_{name}={value!r} must be an int >= {low}.')
    if not isinstance(flags.measure, bool):
      raise user_error.UserError(f'--plan_measure={flags.measure!r} must be '
                                 'True or False.')
    if flags.apply and user_error.IsLocal(flags.apply):
      folder = os.path.dirname(os.path.abspath(flags.apply))
      if os.path.isdir(flags.apply) or not os.path.isdir(folder):
        raise user_error.UserError(
            f'--plan_apply={flags.apply!r} must be a file path in an '
            'existing folder (the best layout\'s overrides are written there '
            'as Params text).')

  def Environment(self, flags):
    # Timed on TF's BFC allocator, so timings do not depend on what the
    # process built before them (framework/planning/plan_measure.py).
    return {'TF_CPU_ALLOCATOR_USE_BFC': 'true'} if flags.measure else {}

  def Run(self, context):
    """Prints the plan of the experiment's Train params; with no layout
    that fits, the table is printed first, then the error."""
    # TensorFlow loads with what the mode runs, after the checks.
    from cadence.framework.jobs import inspect_lib  # pylint: disable=g-import-not-at-top
    from cadence.framework.jobs import run_params  # pylint: disable=g-import-not-at-top
    from cadence.framework.planning import plan_model  # pylint: disable=g-import-not-at-top
    from cadence.framework.planning import planner  # pylint: disable=g-import-not-at-top
    options = context.options
    params = run_params.LoadParams(options, 'Train')
    inspect_lib.CheckParamsAlone(params)   # Laid out on devices of its own.
    try:
      text = planner.Plan(options.model, params, context.flags,
                          options.logdir)
    except planner.NothingFits as e:
      sys.stdout.write(e.report)
      sys.stdout.flush()
      raise user_error.UserError(f'--mode=plan: {e}') from None
    except planner.BadRequest as e:
      raise user_error.UserError(str(e)) from None
    except (hardware.SpecError, plan_model.NotPlannable) as e:
      raise user_error.UserError(f'--mode=plan: {e}') from None
    sys.stdout.write(text)
    sys.stdout.flush()
