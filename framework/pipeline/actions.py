"""Pipeline actions: the units a schedule orders, their kinds, and needs.

An `Action` names its kind, its stage and its micro-batch. A kind is a
`Kind` record in a small registry (`Register`); the built-in ones are

  F(s, j)  forward of stage s on micro-batch j;
  B(s, j)  backward: the gradient of stage s's input on micro-batch j (what
           stage s-1 waits for) and, unless the schedule also has W(s, j),
           the gradient of its weights;
  W(s, j)  the weight gradient of stage s on micro-batch j, from what its
           B kept (a schedule with any W has one for every B).

These three are also the *work* every action is made of: a kind declares
the work it does, in order (`Kind.does`: F does F's work; a fused forward
and backward would do (F, B)). Everything that reads a schedule learns a
kind from that declaration, not from its letter:

  needs        the needs of its work, less the work it does itself
               (`Needs`; a schedule resolves each to the action doing it);
  the checker  every (stage, micro-batch) gets the forward and backward
               work exactly once, and the weight work when any action does
               it (schedules.Check);
  phase        a kind whose work is all forward runs in the forward phase,
               any other in the backward one (`IsForward`: a schedule with
               the loss outside puts a device's forward-phase actions first);
  memory       F's work starts keeping a micro-batch's activations, B's ends
               that (and keeps what a later W reads), W's ends that
               (memory_estimate.py);
  cost, data   the sum of its work's costs (step_model.ActionCost); what
               crosses between stages s and s+1 is stage s's output or its
               gradient, whatever the kinds (step_model.SimulateStep);
  timeline     its name and colours (timeline_chart.py).

The executor runs a kind by its handler (executor.RegisterHandler). So a
new kind is its `Kind` here, the schedule builder that uses it, and its
executor handler; tests/framework/pipeline/actions_test.py adds one.

`Needs` says what an action's work depends on: F(s, j) needs F(s-1, j);
B(s, j) needs F(s, j) and B(s+1, j); W(s, j) needs B(s, j). Cells that
carry state from micro-batch to micro-batch (`recurrent`, as
StackedRecurrent allows) add F(s, j-1) and B(s, j+1). When the loss runs
outside the pipeline (on the whole batch, after every forward), B(S-1, j)
needs every F(S-1, .).

An executor names the ops of an action by `Action.scope`, so a profile of a
step says which action each op belonged to (`ActionOfOp`).

Example:
  Action(FORWARD, 1, 3)                 # F(1, 3)
  Needs(Action(BACKWARD, 0, 3), 2, 4)   # [F(0, 3), B(1, 3)]
  Register(Kind('P', 'forward and backward', does=(FORWARD, BACKWARD),
                colours=((150, 90, 200), (190, 150, 230))))
"""
import collections
import dataclasses
import re
import typing

FORWARD = 'F'
BACKWARD = 'B'
WEIGHT = 'W'
# The built-in work (`Work`); more may be registered (`RegisterWork`).
WORK = (FORWARD, BACKWARD, WEIGHT)
# The name scope an executor gives the ops of an action.
_SCOPE = 'pipeline_action'
_SCOPE_RE = re.compile(_SCOPE + r'_([A-Z])_(\d+)_(\d+)(?:_\d+)?/')


@dataclasses.dataclass(frozen=True)
class Work:
  """A piece of work an action does: what every reader of a schedule knows
  of it. F, B and W are registered below; a work of one's own is one more
  registration (a transfer of a stage's output to the next stage's device,
  say: tests/framework/pipeline/transfer_work_test.py adds one).

  Attributes:
    letter: its one upper-case letter (a kind that does only it usually has
      the same letter).
    name: what it is, e.g. 'weight gradient'.
    needs: fn(stage, micro_batch, num_stages, num_micro_batches,
      recurrent, loss_inside) -> [Action] of the work it waits for (out of
      range ones are dropped).
    feeds: fn(stage, micro_batch, num_stages, num_micro_batches) ->
      [Action] of the work that waits for it when a schedule does it at all
      (it puts itself between two pieces of work); None: nothing more.
    applies: fn(stage, micro_batch, num_stages, num_micro_batches) ->
      whether a schedule that does this work must do it for that stage and
      micro-batch (None: for every one).
    required: whether every schedule must do it (F and B), or only one that
      does it anywhere (W: then for every B).
    seconds: fn(stage_cost) -> the seconds it takes, from a stage's costs
      (planning/step_model.StageCost), or None: F's, B's or W's own (the
      built-in work), 0 for another.
    forward: whether it belongs to the forward phase (F; a transfer of
      F's output): a schedule with the loss outside runs it before any
      backward work, in the executor's forward pass.
  """
  letter: str
  name: str
  needs: typing.Callable
  feeds: typing.Optional[typing.Callable] = None
  applies: typing.Optional[typing.Callable] = None
  required: bool = False
  seconds: typing.Optional[typing.Callable] = None
  forward: bool = False

  def __post_init__(self):
    if not re.fullmatch('[A-Z]', str(self.letter)):
      raise ValueError(f'Work(letter={self.letter!r}): the letter must be '
                       'one upper-case letter.')

  def AppliesTo(self, stage, micro_batch, num_stages, num_micro_batches):
    """Whether a schedule doing this work must do it at (stage, micro-batch)."""
    return self.applies is None or self.applies(
        stage, micro_batch, num_stages, num_micro_batches)


class _Letters:
  """Records by their letter, in registration order: the registry of work
  (`Work`) and the one of action kinds (`Kind`)."""

  def __init__(self, what):
    self._what = what   # What a record is, in errors: 'action kind'.
    self._items = {}

  def Add(self, item):
    if item.letter in self._items:
      raise ValueError(f'{self._what.capitalize()} {item.letter!r} is '
                       'registered twice.')
    self._items[item.letter] = item
    return item

  def Remove(self, letter):
    del self._items[letter]

  def Get(self, letter):
    if letter not in self._items:
      raise KeyError(f'{self._what} {letter!r}; expected one of '
                     f'{list(self._items)}.')
    return self._items[letter]

  def Letters(self):
    return tuple(self._items)


_WORKS = _Letters('work')


def RegisterWork(work):
  """Adds `work` (a `Work`) to the registry; returns it."""
  return _WORKS.Add(work)


def UnregisterWork(letter):
  """Removes work `letter` (for tests)."""
  _WORKS.Remove(letter)


def WorkOf(letter):
  """The registered `Work` of `letter`.

  Raises:
    KeyError: for an unregistered letter.
  """
  return _WORKS.Get(letter)


def Works():
  """The registered works' letters, F, B and W first."""
  return _WORKS.Letters()


@dataclasses.dataclass(frozen=True)
class Kind:
  """An action kind.

  Attributes:
    letter: its one upper-case letter: `F(1, 3)`, 'F1:3' in a table.
    name: what a legend calls it, e.g. 'weight gradient'.
    does: the work it does, in order: a non-empty tuple of distinct
      registered work letters (`Works`).
    colours: two RGB triples, for even and odd micro-batches in a chart.
  """
  letter: str
  name: str
  does: tuple
  colours: tuple

  def __post_init__(self):
    if not re.fullmatch('[A-Z]', str(self.letter)):
      raise ValueError(f'Kind(letter={self.letter!r}): the letter must be '
                       'one upper-case letter.')
    does = tuple(self.does)
    if (not does or len(set(does)) != len(does) or
        any(w not in Works() for w in does)):
      raise ValueError(f'Kind {self.letter!r}: does={self.does!r} must be '
                       f'distinct work of {Works()}, at least one.')
    object.__setattr__(self, 'does', does)


_KINDS = _Letters('action kind')


def Register(kind):
  """Adds `kind` (a `Kind`) to the registry; returns it."""
  return _KINDS.Add(kind)


def Unregister(letter):
  """Removes kind `letter` (for tests)."""
  _KINDS.Remove(letter)


def Letters():
  """The registered kinds' letters, in registration order ('F', 'B', 'W'
  first)."""
  return _KINDS.Letters()


def KindOf(letter):
  """The registered `Kind` of `letter`.

  Raises:
    KeyError: for an unregistered letter.
  """
  return _KINDS.Get(letter)


def Does(action):
  """The work `action` does: its kind's `does`."""
  return KindOf(action.kind).does


def IsForward(action):
  """Whether `action` belongs to the forward phase: all its work does
  (Work.forward: F, a transfer of F's output)."""
  return all(WorkOf(w).forward for w in Does(action))


def _ForwardNeeds(s, j, num_stages, num_micro_batches, recurrent,
                  loss_inside):
  del num_stages, num_micro_batches, loss_inside   # Unused.
  needs = [Action(FORWARD, s - 1, j)]
  if recurrent:
    needs.append(Action(FORWARD, s, j - 1))
  return needs


def _BackwardNeeds(s, j, num_stages, num_micro_batches, recurrent,
                   loss_inside):
  needs = [Action(FORWARD, s, j), Action(BACKWARD, s + 1, j)]
  if recurrent:
    needs.append(Action(BACKWARD, s, j + 1))
  if s == num_stages - 1 and not loss_inside:
    needs += [Action(FORWARD, s, i) for i in range(num_micro_batches)]
  return needs


def _WeightNeeds(s, j, num_stages, num_micro_batches, recurrent,
                 loss_inside):
  del num_stages, num_micro_batches, recurrent, loss_inside   # Unused.
  return [Action(BACKWARD, s, j)]


RegisterWork(Work(FORWARD, 'forward', _ForwardNeeds, required=True,
                  forward=True))
RegisterWork(Work(BACKWARD, 'backward', _BackwardNeeds, required=True))
RegisterWork(Work(WEIGHT, 'weight gradient', _WeightNeeds))

Register(Kind(FORWARD, 'forward', (FORWARD,),
              ((66, 133, 244), (120, 170, 250))))
Register(Kind(BACKWARD, 'backward', (BACKWARD,),
              ((234, 134, 0), (246, 178, 90))))
Register(Kind(WEIGHT, 'weight gradient', (WEIGHT,),
              ((52, 168, 83), (129, 201, 149))))
# The built-in kinds, as the schedules and their tests name them.
KINDS = Letters()


class Action(collections.namedtuple('Action',
                                    ['kind', 'stage', 'micro_batch'])):
  """One unit of pipeline work: a kind (F, B, W, ...) of (stage,
  micro-batch)."""
  __slots__ = ()

  def __str__(self):
    return f'{self.kind}({self.stage}, {self.micro_batch})'

  __repr__ = __str__

  @property
  def scope(self):
    """The name scope of this action's ops, e.g. 'pipeline_action_F_0_3'."""
    return f'{_SCOPE}_{self.kind}_{self.stage}_{self.micro_batch}'

  def Work(self):
    """The work this action does, as actions of work letters: e.g. [F(1,
    3), B(1, 3)] for a kind that does (F, B)."""
    return [Action(w, self.stage, self.micro_batch) for w in Does(self)]


def ActionOfOp(op_name):
  """The `Action` whose scope an op's name holds (the outermost), or None.

  The outermost: a backward's ops may be named after the forward ops they
  differentiate. A tape's gradient ops are named 'gradient_tape/' + the
  forward op's name whatever the scope they are built in: those of a
  forward scope belong to that (stage, micro-batch)'s backward.

  Example: ActionOfOp('model/pipeline_action_B_1_2/MatMul') == B(1, 2);
  ActionOfOp('gradient_tape/pipeline_action_F_1_2/MatMul') == B(1, 2).
  """
  found = _SCOPE_RE.search(op_name)
  if not found:
    return None
  kind, stage, micro_batch = found.groups()
  if op_name[:found.start()].endswith('gradient_tape/'):
    kind = BACKWARD
  return Action(kind, int(stage), int(micro_batch))


def Needs(action, num_stages, num_micro_batches, recurrent=False,
          loss_inside=True, present=()):
  """The work `action` depends on (inside the S x M grid), as actions of
  work letters: the needs of each piece of its work (`Work.needs`), and the
  work of `present` (the work letters a schedule does) that feeds it
  (`Work.feeds`), less the work it does itself. A schedule resolves them
  to the actions doing that work (schedules.Schedule.Needs)."""
  own = action.Work()
  needs = [n for w in own for n in WorkOf(w.kind).needs(
      w.stage, w.micro_batch, num_stages, num_micro_batches, recurrent,
      loss_inside)]
  for letter in present:
    work = WorkOf(letter)
    if work.feeds is None:
      continue
    for s in range(num_stages):
      for j in range(num_micro_batches):
        if (work.AppliesTo(s, j, num_stages, num_micro_batches) and
            any(w in own for w in work.feeds(s, j, num_stages,
                                             num_micro_batches))):
          needs.append(Action(letter, s, j))
  return [a for a in dict.fromkeys(needs)
          if a not in own and 0 <= a.stage < num_stages and
          0 <= a.micro_batch < num_micro_batches]
