"""Pipeline schedules: pure tables of which cell works on which step, when.

A pipeline runs K cells (stages, cell i on device i) over M steps
(micro-batches). The forward of cell i on step j, F(i, j), needs F(i-1, j)
(its input); the backward B(i, j) needs F(i, j) and B(i+1, j) (the gradient
of its output). Cells that carry state from step to step (`recurrent`, as
StackedRecurrent allows) add F(i, j) after F(i, j-1) and B(i, j) after
B(i, j+1); GPipe's cells ignore their previous state, which is what lets a
1F1B schedule start a cell's backward before its last forward.

A schedule is a list of ticks; a tick is the list of `Action`s that may run
at the same time, at most one per cell. The tables hold no tensors: the code
that runs them is `stacked_recurrent.py`, so a new schedule is a function
here plus its test against `CheckSchedule`.

  WavefrontSchedule: the forward alone as (cell, step) pairs: at tick t cell
    i works on step t - i; M + K - 1 ticks, bubble (K-1)/(M+K-1).
  GPipeSchedule: every forward in wavefront order, then every backward in
    reverse tick order (GPipe); without remat each cell holds M steps'
    activations.
  OneFOneBSchedule: one forward, one backward (PipeDream-flush, Megatron):
    cell i runs min(K-i-1, M) forwards to warm up, then alternates a
    forward and a backward, then drains its backwards; it holds at most
    min(K-i, M) steps' activations. Needs cells without state between
    steps (`recurrent=False`).
  ListSchedule: the ticks of per-cell action orders, each action as early
    as its dependencies allow (how OneFOneBSchedule gets its ticks).
  SplitPhases: a schedule whose forwards all come before its backwards, as
    the forward's and the backward's ordered action lists.
  CheckSchedule / InFlight: the rules above, and the activations a cell
    holds (steps forwarded but not yet back-propagated) at the worst tick.

Example:
  OneFOneBSchedule(2, 2)
  # [[F(0, 0)], [F(0, 1), F(1, 0)], [B(1, 0)], [B(0, 0), F(1, 1)],
  #  [B(1, 1)], [B(0, 1)]]
  GPipeSchedule(2, 2)
  # [[F(0, 0)], [F(0, 1), F(1, 0)], [F(1, 1)],
  #  [B(1, 1)], [B(0, 1), B(1, 0)], [B(0, 0)]]
"""
import collections
import re

FORWARD = 'F'
BACKWARD = 'B'
# The name scope an executor gives the ops of an action, so that a profile
# of a step says which (kind, cell, step) each op belonged to.
_SCOPE = 'pipeline_action'
_SCOPE_RE = re.compile(_SCOPE + r'_([FB])_(\d+)_(\d+)(?:_\d+)?/')


class Action(collections.namedtuple('Action', ['kind', 'cell', 'step'])):
  """One unit of pipeline work: the FORWARD or BACKWARD of (cell, step)."""
  __slots__ = ()

  def __str__(self):
    return f'{self.kind}({self.cell}, {self.step})'

  __repr__ = __str__

  @property
  def scope(self):
    """The name scope of this action's ops, e.g. 'pipeline_action_F_0_3'."""
    return f'{_SCOPE}_{self.kind}_{self.cell}_{self.step}'


def ActionOfOp(op_name):
  """The `Action` whose scope an op's name holds (the outermost), or None.

  The outermost: a backward's ops may be named after the forward ops they
  differentiate. A tape's gradient ops are named 'gradient_tape/' + the
  forward op's name whatever the scope they are built in: those of a
  forward scope belong to that (cell, step)'s backward.

  Example: ActionOfOp('model/pipeline_action_B_1_2/MatMul') == B(1, 2);
  ActionOfOp('gradient_tape/pipeline_action_F_1_2/MatMul') == B(1, 2).
  """
  found = _SCOPE_RE.search(op_name)
  if not found:
    return None
  kind, cell, step = found.groups()
  if op_name[:found.start()].endswith('gradient_tape/'):
    kind = BACKWARD
  return Action(kind, int(cell), int(step))


def _CheckSizes(owner, num_cells, num_steps):
  if num_cells < 1 or num_steps < 1:
    raise ValueError(f'{owner}: num_cells={num_cells} and '
                     f'num_steps={num_steps} must both be >= 1.')


def WavefrontSchedule(num_cells, num_steps):
  """The tick table of the forward wavefront.

  Args:
    num_cells: K >= 1.
    num_steps: M >= 1.

  Returns:
    A list of M + K - 1 ticks; tick t is the list of (cell, step) pairs that
    run at t, i.e. (i, t - i) for every cell i with 0 <= t - i < M, in
    increasing cell order.
  """
  _CheckSizes('WavefrontSchedule', num_cells, num_steps)
  return [[(i, t - i) for i in range(num_cells) if 0 <= t - i < num_steps]
          for t in range(num_steps + num_cells - 1)]


def GPipeSchedule(num_cells, num_steps):
  """GPipe: the forward wavefront, then its ticks in reverse as backwards.

  Args:
    num_cells: K >= 1.
    num_steps: M >= 1.

  Returns:
    A list of 2 (M + K - 1) ticks of `Action`s: ticks 0 .. M+K-2 are the
    wavefront's F(i, t - i); tick M+K-1+t holds B(i, j) for the pairs of
    wavefront tick M+K-2-t, in increasing cell order.
  """
  _CheckSizes('GPipeSchedule', num_cells, num_steps)
  wave = WavefrontSchedule(num_cells, num_steps)
  return ([[Action(FORWARD, i, j) for i, j in tick] for tick in wave] +
          [[Action(BACKWARD, i, j) for i, j in tick]
           for tick in reversed(wave)])


def ListSchedule(orders, num_steps, recurrent=False):
  """Ticks of per-cell action orders, each action as early as it can run.

  At each tick every cell runs the next action of its order if everything
  it needs (see the module docstring) ran at an earlier tick.

  Args:
    orders: K lists of `Action`s: what cell i runs, in order.
    num_steps: M.
    recurrent: whether cells carry state from step to step.

  Returns:
    The list of ticks.

  Raises:
    ValueError: if the orders deadlock (no cell can run its next action).
  """
  num_cells = len(orders)
  done = set()
  pos = [0] * num_cells
  ticks = []
  while any(p < len(o) for p, o in zip(pos, orders)):
    tick = [o[p] for p, o in zip(pos, orders) if p < len(o) and all(
        need in done for need in _Needs(o[p], num_cells, num_steps,
                                        recurrent))]
    if not tick:
      stuck = [str(o[p]) for p, o in zip(pos, orders) if p < len(o)]
      raise ValueError(f'ListSchedule: deadlock after {len(ticks)} ticks; '
                       f'the next actions {stuck} all wait for each other.')
    for action in tick:
      pos[action.cell] += 1
    done.update(tick)
    ticks.append(tick)
  return ticks


def OneFOneBOrder(cell, num_cells, num_steps):
  """Cell `cell`'s actions under 1F1B: warm-up forwards, then F and B in
  turn, then the remaining backwards."""
  warm = min(num_cells - cell - 1, num_steps)
  order = [Action(FORWARD, cell, j) for j in range(warm)]
  for j in range(num_steps - warm):
    order += [Action(FORWARD, cell, warm + j), Action(BACKWARD, cell, j)]
  order += [Action(BACKWARD, cell, j)
            for j in range(num_steps - warm, num_steps)]
  return order


def OneFOneBSchedule(num_cells, num_steps):
  """1F1B: after a warm-up each cell alternates a forward and a backward.

  Args:
    num_cells: K >= 1.
    num_steps: M >= 1.

  Returns:
    The ticks of `ListSchedule` over the cells' `OneFOneBOrder`s; valid
    for cells without state between steps (`CheckSchedule(...,
    recurrent=False)`); cell i holds at most min(K - i, M) steps in flight
    (`InFlight`).
  """
  _CheckSizes('OneFOneBSchedule', num_cells, num_steps)
  return ListSchedule([OneFOneBOrder(i, num_cells, num_steps)
                       for i in range(num_cells)], num_steps)


def CellOrders(ticks, num_cells):
  """Per cell, its actions in the order the ticks run them."""
  orders = [[] for _ in range(num_cells)]
  for tick in ticks:
    for action in tick:
      orders[action.cell].append(Action(*action))
  return orders


def SplitPhases(ticks):
  """(forward actions, backward actions), each in schedule order.

  For executors that run the whole forward before the backward starts (a
  tf.custom_gradient computes its gradients only after its forward).

  Raises:
    ValueError: if a forward comes after a backward (e.g. 1F1B), naming both.
  """
  forward, backward = [], []
  first_backward = None
  for t, tick in enumerate(ticks):
    for action in tick:
      if action.kind == BACKWARD:
        backward.append(action)
        first_backward = first_backward or (t, action)
      elif first_backward is not None:
        raise ValueError(
            f'SplitPhases: {action} at tick {t} comes after '
            f'{first_backward[1]} at tick {first_backward[0]}; a schedule '
            'that interleaves forwards and backwards needs an executor that '
            'runs both in one pass.')
      else:
        forward.append(action)
  return forward, backward


def _Needs(action, num_cells, num_steps, recurrent):
  """The actions `action` depends on (inside the K x M grid)."""
  kind, i, j = action
  if kind == FORWARD:
    needs = [Action(FORWARD, i - 1, j)]
    if recurrent:
      needs.append(Action(FORWARD, i, j - 1))
  else:
    needs = [Action(FORWARD, i, j), Action(BACKWARD, i + 1, j)]
    if recurrent:
      needs.append(Action(BACKWARD, i, j + 1))
  return [a for a in needs
          if 0 <= a.cell < num_cells and 0 <= a.step < num_steps]


def CheckSchedule(ticks, num_cells, num_steps, backward=True,
                  recurrent=True):
  """Checks a schedule's table against the rules of the module docstring.

  Args:
    ticks: a list of ticks, each a list of `Action`s.
    num_cells: K.
    num_steps: M.
    backward: whether the table must hold the backwards too (False: a
      forward-only table).
    recurrent: whether cells carry state from step to step (adds the
      dependencies on the previous step's forward and the next step's
      backward).

  Raises:
    ValueError: naming the tick and action of the first broken rule: an
      unknown kind or a (cell, step) outside K x M, two actions of one cell
      in a tick, an action missing or run twice, or an action that runs
      no later than one it needs.
  """
  kinds = (FORWARD, BACKWARD) if backward else (FORWARD,)
  when = {}
  for t, tick in enumerate(ticks):
    cells = set()
    for action in tick:
      action = Action(*action)
      if (action.kind not in kinds or not 0 <= action.cell < num_cells or
          not 0 <= action.step < num_steps):
        raise ValueError(
            f'CheckSchedule: tick {t} has {action}; expected kinds {kinds} '
            f'with cell < {num_cells} and step < {num_steps}.')
      if action.cell in cells:
        raise ValueError(f'CheckSchedule: tick {t} has two actions of cell '
                         f'{action.cell}: {tick}.')
      if action in when:
        raise ValueError(f'CheckSchedule: {action} runs twice, at ticks '
                         f'{when[action]} and {t}.')
      cells.add(action.cell)
      when[action] = t
  for kind in kinds:
    for i in range(num_cells):
      for j in range(num_steps):
        if Action(kind, i, j) not in when:
          raise ValueError(f'CheckSchedule: {Action(kind, i, j)} never '
                           'runs.')
  for action, t in when.items():
    for need in _Needs(action, num_cells, num_steps, recurrent):
      if when[need] >= t:
        raise ValueError(
            f'CheckSchedule: {action} at tick {t} needs {need}, which runs '
            f'at tick {when[need]}.')


def InFlight(ticks, num_cells):
  """Per cell, the most steps forwarded and not yet back-propagated.

  Without rematerialisation a cell holds this many steps' activations at its
  worst tick (GPipe: M for every cell; 1F1B would hold at most K - i).
  """
  live = [0] * num_cells
  peak = [0] * num_cells
  for tick in ticks:
    for kind, i, _ in tick:
      live[i] += 1 if kind == FORWARD else -1
      peak[i] = max(peak[i], live[i])
  return peak
