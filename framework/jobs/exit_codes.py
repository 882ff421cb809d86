"""The trainer's exit codes, and the one `Error: ...` line of a failure.

  0  EXIT_OK                done (trainer_lib's docstring says what counts);
  2  EXIT_USER_ERROR        a user's mistake (user_error.py);
  3  EXIT_TRAINING_STOPPED  too many skipped steps or non-finite weights;
  4  EXIT_SAVE_FAILED, EXIT_PEER_FAILED, EXIT_STOPPED: the run cannot go
     on and nothing is lost (a checkpoint not written, a peer host that
     failed, a mode stopped by a signal before it wrote anything): rerun.

trainer_lib.Main and the modes that answer for their own run (sync_run.py)
return them; `Fail` prints the one line.
"""
import sys

from cadence.framework import base_input_generator
from cadence.framework.distribute import distribution
from cadence.framework.jobs import user_error

EXIT_OK = 0
EXIT_USER_ERROR = user_error.EXIT_USER_ERROR
EXIT_TRAINING_STOPPED = 3
EXIT_SAVE_FAILED = 4
EXIT_PEER_FAILED = 4
EXIT_STOPPED = 4   # A mode other than sync stopped by a signal, nothing written.


def Fail(code, message):
  """Writes `Error: message` to stderr; returns `code`."""
  sys.stderr.write(f'Error: {message}\n')
  sys.stderr.flush()
  return code


def SetupFailure(e):
  """EXIT_USER_ERROR for an error while setting up (a UserError, a
  distribution.SetupError, or params validation and input files:
  ValueError, InputError), its line printed."""
  if isinstance(e, (user_error.UserError, distribution.SetupError)):
    return Fail(EXIT_USER_ERROR, str(e))
  kind = ('Input' if isinstance(e, base_input_generator.InputError) else
          'Bad params')
  return Fail(EXIT_USER_ERROR, f'{kind}: {e}')
