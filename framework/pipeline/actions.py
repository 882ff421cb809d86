"""Pipeline actions: the units a schedule orders, and what each needs.

An `Action` names its kind, its stage and its micro-batch:

  F(s, j)  forward of stage s on micro-batch j;
  B(s, j)  backward: the gradient of stage s's input on micro-batch j (what
           stage s-1 waits for) and, unless the schedule also has W(s, j),
           the gradient of its weights;
  W(s, j)  the weight gradient of stage s on micro-batch j, from what its
           B kept (a schedule with any W has one for every B).

`Needs` says what an action depends on: F(s, j) needs F(s-1, j); B(s, j)
needs F(s, j) and B(s+1, j); W(s, j) needs B(s, j). Cells that carry state
from micro-batch to micro-batch (`recurrent`, as StackedRecurrent allows)
add F(s, j-1) and B(s, j+1). When the loss runs outside the pipeline (on
the whole batch, after every forward), B(S-1, j) needs every F(S-1, .).

An executor names the ops of an action by `Action.scope`, so a profile of a
step says which action each op belonged to (`ActionOfOp`).

Example:
  Action(FORWARD, 1, 3)                 # F(1, 3)
  Needs(Action(BACKWARD, 0, 3), 2, 4)   # [F(0, 3), B(1, 3)]
"""
import collections
import re

FORWARD = 'F'
BACKWARD = 'B'
WEIGHT = 'W'
KINDS = (FORWARD, BACKWARD, WEIGHT)
# The name scope an executor gives the ops of an action.
_SCOPE = 'pipeline_action'
_SCOPE_RE = re.compile(_SCOPE + r'_([FBW])_(\d+)_(\d+)(?:_\d+)?/')


class Action(collections.namedtuple('Action',
                                    ['kind', 'stage', 'micro_batch'])):
  """One unit of pipeline work: F, B or W of (stage, micro-batch)."""
  __slots__ = ()

  def __str__(self):
    return f'{self.kind}({self.stage}, {self.micro_batch})'

  __repr__ = __str__

  @property
  def scope(self):
    """The name scope of this action's ops, e.g. 'pipeline_action_F_0_3'."""
    return f'{_SCOPE}_{self.kind}_{self.stage}_{self.micro_batch}'


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
          loss_inside=True):
  """The actions `action` depends on (inside the S x M grid)."""
  kind, s, j = action
  last = num_stages - 1
  if kind == FORWARD:
    needs = [Action(FORWARD, s - 1, j)]
    if recurrent:
      needs.append(Action(FORWARD, s, j - 1))
  elif kind == BACKWARD:
    needs = [Action(FORWARD, s, j), Action(BACKWARD, s + 1, j)]
    if recurrent:
      needs.append(Action(BACKWARD, s, j + 1))
    if s == last and not loss_inside:
      needs += [Action(FORWARD, s, i) for i in range(num_micro_batches)]
  else:
    needs = [Action(BACKWARD, s, j)]
  return [a for a in dict.fromkeys(needs)
          if 0 <= a.stage < num_stages and 0 <= a.micro_batch <
          num_micro_batches]
