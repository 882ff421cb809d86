"""`--mode=plan`: the planner's ranked layouts of a model, printed.

The planning itself is framework/planning/planner.py; this is the
trainer's side of it: the flags in, the table out, and the planner's
refusals as the trainer's one-line errors (exit 2).
"""
import sys

from cadence.framework.jobs import command_line
from cadence.framework.planning import hardware
from cadence.framework.planning import plan_model
from cadence.framework.planning import planner


def Run(options, params):
  """--mode=plan for the trainer (trainer_lib): prints the plan of
  `params` (options.model's, Train); a user error is a UserError (with
  no layout that fits, the table is printed first)."""
  try:
    text = planner.Plan(options.model, params,
                        command_line.PlanOptions.Of(options), options.logdir)
  except planner.NothingFits as e:
    sys.stdout.write(e.report)
    sys.stdout.flush()
    raise command_line.UserError(f'--mode=plan: {e}') from None
  except planner.BadRequest as e:
    raise command_line.UserError(str(e)) from None
  except (hardware.SpecError, plan_model.NotPlannable) as e:
    raise command_line.UserError(f'--mode=plan: {e}') from None
  sys.stdout.write(text)
  sys.stdout.flush()
