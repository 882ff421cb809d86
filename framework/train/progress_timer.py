"""When the train loop logs a progress line by time, not only by steps.

The train loop (programs.TrainProgram.Run) runs compiled chunks of steps
from boundary to boundary: a summary, a progress line or a checkpoint every
so many steps. Slow steps put those boundaries far apart in time (50 steps
at 0.6 steps/s: 83 s without a line). `ProgressTimer` also ends a chunk in
time for a line every `interval` seconds: from the seconds a step took in
the last chunk it cuts the next chunk so that it ends by the deadline, and
it says when a line is due.

The deadline is `AIM` x interval after the last line, which leaves a step
25% slower than the last chunk's steps room to end within the interval.
Fast steps are untouched: when the steps to the next boundary end before
the deadline, the chunk is not cut (no extra call of the compiled loop, no
extra wait for its results).

Example:
  timer = ProgressTimer(30.0)
  timer.Logged(now)                  # a line: the first step's, or another
  timer.Ran(1, first_step_seconds)
  n = timer.Steps(now, limit=49)     # the next chunk: 1 <= n <= 49 steps
  # ... run n steps in `seconds` ...
  timer.Ran(n, seconds)
  if timer.Due(now):                 # another step could end past the
    ...log a line...                 # deadline
    timer.Logged(now)
"""
import math

# The share of the interval that chunks aim to end within.
AIM = 0.8


class ProgressTimer:
  """Cuts the train loop's chunks so that a line comes every `interval` s.

  Args:
    interval: seconds between progress lines at most (as far as one step's
      time allows: a line can only come between steps); 0 disables it.

  Example:
    timer = ProgressTimer(30.0)
    timer.Logged(0.0)
    timer.Ran(1, 10.0)       # 10 s a step
    timer.Steps(10.0, 50)    # 1: two steps would end after 24 s
    timer.Due(20.0)          # True: a step more would end after 24 s
  """

  def __init__(self, interval):
    if interval < 0:
      raise ValueError(f'ProgressTimer: interval={interval} must be >= 0 '
                       'seconds (0: no line by time).')
    self._interval = interval
    self._last = None          # When the last line was logged.
    self._step_secs = None     # Seconds a step of the last chunk took.

  def Logged(self, now):
    """A line was logged at `now`: the next deadline counts from it."""
    self._last = now

  def Ran(self, steps, seconds):
    """A chunk ran `steps` steps in `seconds`: its rate plans the next."""
    if steps > 0:
      self._step_secs = seconds / steps

  def _Deadline(self):
    if not self._interval or self._last is None or self._step_secs is None:
      return None
    return self._last + AIM * self._interval

  def Steps(self, now, limit):
    """The next chunk's steps: `limit` (the steps to the next boundary),
    or fewer to end by the deadline at the last chunk's rate (at least
    one)."""
    deadline = self._Deadline()
    if deadline is None or self._step_secs <= 0:
      return limit
    fit = math.floor((deadline - now) / self._step_secs)
    return max(1, min(limit, fit))

  def Due(self, now):
    """Whether a line is due at `now`: one more step, at the last chunk's
    rate, would end past the deadline."""
    deadline = self._Deadline()
    return deadline is not None and now + self._step_secs > deadline
