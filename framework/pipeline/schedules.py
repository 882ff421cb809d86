"""Pipeline schedules as data: ordered actions per device, one registry.

A pipeline cuts a model into S *stages* (stage s runs its *cell*, a group of
layers, on the micro-batches of a batch) placed on D devices, and runs M
*micro-batches* through them. A schedule says, for each device, the order
of the actions it runs; an `Action` names its kind, its stage and its
micro-batch:

  F(s, j)  forward of stage s on micro-batch j;
  B(s, j)  backward: the gradient of stage s's input on micro-batch j (what
           stage s-1 waits for) and, unless the schedule also has W(s, j),
           the gradient of its weights;
  W(s, j)  the weight gradient of stage s on micro-batch j, from what its
           B kept (a schedule with any W has one for every B).

Stage s runs on device `stage_devices[s]`, so two stages on one device
(interleaved, V-shaped schedules) are just data. A device runs its actions
one at a time, in order. An action needs (`Needs`): F(s, j) needs F(s-1, j);
B(s, j) needs F(s, j) and B(s+1, j); W(s, j) needs B(s, j). Cells that carry
state from micro-batch to micro-batch (`recurrent`, as StackedRecurrent
allows) add F(s, j-1) and B(s, j+1). When the loss runs outside the
pipeline (on the whole batch, after every forward), B(S-1, j) needs every
F(S-1, .): such a schedule puts all of a device's forwards before its
backwards; a schedule whose backwards start before the forward ends
(`loss_inside`) needs the per-micro-batch loss inside the pipeline.

The registry (`Register`, `Build`, `Names`) is the only place a schedule's
name is spelled; the executor (executor.py), the
memory estimate (memory_estimate.py), the timeline and the planner all read
the `Schedule` it builds. Adding a schedule is one function that returns
its device lists and one registry line, e.g. a toy that runs each
micro-batch's whole forward and backward before the next one (the tests
run it):

  @Register('one_at_a_time', loss_inside=True)
  def OneAtATime(stage_devices, num_devices, num_micro_batches):
    order = []
    for j in range(num_micro_batches):
      order += [Action(FORWARD, s, j) for s in range(len(stage_devices))]
      order += [Action(BACKWARD, s, j)
                for s in reversed(range(len(stage_devices)))]
    return [[a for a in order if stage_devices[a.stage] == d]
            for d in range(num_devices)]

`Simulate` runs a schedule's device lists as a discrete-event simulation
(each action as early as its device and its needs allow, at given costs);
with unit costs it gives the schedule's *ticks* (`Schedule.Ticks`), the
table the memory estimate and the ideal bubble read. `Check` validates any
schedule and names the device, tick and action of the first broken rule.

Example:
  schedule = Build('1f1b', num_stages=2, num_devices=2, num_micro_batches=4)
  schedule.actions[0]   # (F(0, 0), F(0, 1), B(0, 0), F(0, 2), B(0, 1), ...)
  schedule.Ticks()[:3]  # [[F(0, 0)], [F(0, 1), F(1, 0)], [B(1, 0)]]
"""
import collections
import re

FORWARD = 'F'
BACKWARD = 'B'
WEIGHT = 'W'
KINDS = (FORWARD, BACKWARD, WEIGHT)
# The schedule a PipeliningLayer runs unless its params say otherwise.
DEFAULT = 'gpipe'
# The name scope an executor gives the ops of an action, so that a profile
# of a step says which (kind, stage, micro-batch) each op belonged to.
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


class Schedule:
  """A pipeline schedule: each device's ordered actions, stage placement.

  Attributes:
    name: the registry name it was built from (or 'table').
    num_stages: S.
    num_micro_batches: M.
    stage_devices: S ints, the device index of each stage.
    actions: D tuples of `Action`s, what device d runs, in order.
    loss_inside: whether backwards start before the whole forward ends, so
      the per-micro-batch loss must run inside the pipeline.
  """

  def __init__(self, name, num_stages, num_micro_batches, stage_devices,
               actions, loss_inside):
    self.name = name
    self.num_stages = num_stages
    self.num_micro_batches = num_micro_batches
    self.stage_devices = tuple(stage_devices)
    self.actions = tuple(tuple(Action(*a) for a in device)
                         for device in actions)
    self.loss_inside = loss_inside

  @property
  def num_devices(self):
    return len(self.actions)

  @property
  def splits_backward(self):
    """Whether B computes only input gradients and W the weights'."""
    return any(a.kind == WEIGHT for device in self.actions for a in device)

  def Stages(self, device):
    """The stages placed on device index `device`, in stage order."""
    return [s for s, d in enumerate(self.stage_devices) if d == device]

  def Needs(self, action, recurrent=False):
    """The actions `action` depends on; see the module docstring."""
    return Needs(action, self.num_stages, self.num_micro_batches,
                 recurrent=recurrent, loss_inside=self.loss_inside)

  def Ticks(self, recurrent=False):
    """The schedule run with unit-time actions: a list of ticks, each the
    actions that run in it, in device order (see `Simulate`)."""
    times = Simulate(self, recurrent=recurrent)
    ticks = [[] for _ in range(1 + max(
        (int(t) for t, _ in times.values()), default=-1))]
    for d, device in enumerate(self.actions):
      for a in device:
        ticks[int(times[a][0])].append((d, a))
    return [[a for _, a in sorted(tick, key=lambda da: da[0])]
            for tick in ticks]

  def InFlight(self):
    """Per stage, the most micro-batches forwarded and not yet
    back-propagated at once (unit-time ticks)."""
    live = [0] * self.num_stages
    peak = [0] * self.num_stages
    for tick in self.Ticks():
      for kind, s, _ in tick:
        if kind == FORWARD:
          live[s] += 1
          peak[s] = max(peak[s], live[s])
        elif kind == BACKWARD:
          live[s] -= 1
    return peak

  def Bubble(self, cost=None, latency=None):
    """Idle share of the devices' time in the step, each action taking
    cost(action) (default 1; F, B and W alike), with `latency` between
    devices (see `Simulate`)."""
    times = Simulate(self, cost=cost, latency=latency)
    span = max(e for _, e in times.values()) - min(
        s for s, _ in times.values())
    busy = sum(e - s for s, e in times.values())
    return 1.0 - busy / (self.num_devices * span) if span else 0.0

  def Text(self):
    """One line per device: its actions as 'F0:3' (kind stage:micro-batch);
    the form a 'table' schedule is written in."""
    return '\n'.join(' '.join(f'{a.kind}{a.stage}:{a.micro_batch}'
                              for a in device) for device in self.actions)

  def __str__(self):
    return (f'{self.name}: {self.num_stages} stages on {self.num_devices} '
            f'devices, {self.num_micro_batches} micro-batches\n' +
            self.Text())


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


def Simulate(schedule, cost=None, recurrent=False, latency=None):
  """Runs the device lists as a discrete-event simulation.

  Each device runs its actions in order; an action starts once its device
  is free and every action it needs has ended (plus `latency(need,
  action)` when they run on different devices, e.g. a transfer).

  Args:
    schedule: a `Schedule`.
    cost: fn(action) -> its duration (default 1 for every action).
    recurrent: whether cells carry state between micro-batches.
    latency: fn(need, action) -> the delay between a need on another
      device and the action (default 0).

  Returns:
    {action: (start, end)}.

  Raises:
    ValueError: naming each device's next action and what it waits for, if
      the lists deadlock.
  """
  cost = cost or (lambda a: 1)
  device_of = schedule.stage_devices
  pos = [0] * schedule.num_devices
  free = [0.0] * schedule.num_devices
  times = {}
  remaining = sum(len(d) for d in schedule.actions)
  while remaining:
    progressed = False
    for d, device in enumerate(schedule.actions):
      while pos[d] < len(device):
        a = device[pos[d]]
        needs = schedule.Needs(a, recurrent)
        if any(n not in times for n in needs):
          break
        start = free[d]
        for n in needs:
          ready = times[n][1]
          if latency and device_of[n.stage] != d:
            ready += latency(n, a)
          start = max(start, ready)
        times[a] = (start, start + cost(a))
        free[d] = times[a][1]
        pos[d] += 1
        remaining -= 1
        progressed = True
    if not progressed:
      stuck = []
      for d, device in enumerate(schedule.actions):
        if pos[d] < len(device):
          a = device[pos[d]]
          waits = [str(n) for n in schedule.Needs(a, recurrent)
                   if n not in times]
          stuck.append(f'device {d} at tick {pos[d]}: {a} waits for '
                       f'{", ".join(waits)}')
      raise ValueError(f'Schedule {schedule.name!r} deadlocks: ' +
                       '; '.join(stuck) + '.')
  return times


def Check(schedule, recurrent=False):
  """Validates a schedule; see the module docstring for the rules.

  Raises:
    ValueError: naming the device, the tick (its position in the device's
      list) and the action of the first broken rule: an unknown kind or a
      (stage, micro-batch) outside S x M, a stage on the wrong device, an
      action run twice, a micro-batch never finished (its F or B missing),
      a weight gradient never applied (a B without its W in a schedule that
      splits the backward), a forward after a backward where the loss runs
      outside, or an action without its inputs (deadlock).
  """
  name = schedule.name
  s_count, m_count = schedule.num_stages, schedule.num_micro_batches
  if s_count < 1 or m_count < 1:
    raise ValueError(f'Schedule {name!r}: num_stages={s_count} and '
                     f'num_micro_batches={m_count} must both be >= 1.')
  if len(schedule.stage_devices) != s_count or any(
      not 0 <= d < schedule.num_devices for d in schedule.stage_devices):
    raise ValueError(
        f'Schedule {name!r}: stage_devices={list(schedule.stage_devices)} '
        f'must give each of the {s_count} stages a device index < '
        f'{schedule.num_devices}.')
  where = {}
  for d, device in enumerate(schedule.actions):
    seen_backward = None
    for t, a in enumerate(device):
      at = f'Schedule {name!r}, device {d}, tick {t}: {a}'
      if (a.kind not in KINDS or not 0 <= a.stage < s_count or
          not 0 <= a.micro_batch < m_count):
        raise ValueError(f'{at} is not an action of kinds {KINDS} with '
                         f'stage < {s_count} and micro-batch < {m_count}.')
      if schedule.stage_devices[a.stage] != d:
        raise ValueError(f'{at}: stage {a.stage} runs on device '
                         f'{schedule.stage_devices[a.stage]}, not {d}.')
      if a in where:
        raise ValueError(f'{at} runs twice (first at device {where[a][0]}, '
                         f'tick {where[a][1]}).')
      where[a] = (d, t)
      if a.kind != FORWARD:
        seen_backward = seen_backward or (t, a)
      elif seen_backward and not schedule.loss_inside:
        raise ValueError(
            f'{at} comes after {seen_backward[1]} at tick '
            f'{seen_backward[0]}; with the loss outside the pipeline every '
            'forward of a device comes before its backwards (a schedule '
            'that interleaves them runs the loss inside: loss_inside).')
  split = schedule.splits_backward
  for s in range(s_count):
    for j in range(m_count):
      for kind in (FORWARD, BACKWARD) + ((WEIGHT,) if split else ()):
        a = Action(kind, s, j)
        if a in where:
          continue
        d = schedule.stage_devices[s]
        if kind == WEIGHT:
          raise ValueError(
              f'Schedule {name!r}, device {d}: the weight gradient of '
              f'{Action(BACKWARD, s, j)} (tick '
              f'{where[Action(BACKWARD, s, j)][1]}) is never applied: '
              f'{a} is missing.')
        raise ValueError(f'Schedule {name!r}, device {d}: micro-batch {j} '
                         f'never finishes stage {s}: {a} is missing.')
  Simulate(schedule, recurrent=recurrent)


# --- the registry ------------------------------------------------------------

_Entry = collections.namedtuple('_Entry', ['fn', 'loss_inside', 'placement'])
_REGISTRY = {}


def Looped(num_stages, num_devices):
  """The default placement: stage s on device s % D."""
  return [s % num_devices for s in range(num_stages)]


def Register(name, loss_inside, placement=None):
  """Registers `fn(stage_devices, num_devices, num_micro_batches) -> D
  device action lists` as schedule `name`.

  Args:
    name: the schedule's one spelling (params `schedule=name`).
    loss_inside: whether its backwards start before the forward ends (the
      per-micro-batch loss runs inside the pipeline).
    placement: fn(num_stages, num_devices) -> stage_devices, for a schedule
      whose stages must sit on given devices (a V); None: any placement
      works, `Looped` by default.
  """
  def _Decorator(fn):
    if name in _REGISTRY:
      raise ValueError(f'Schedule {name!r} is registered twice.')
    _REGISTRY[name] = _Entry(fn, loss_inside, placement)
    return fn
  return _Decorator


def Names():
  """The registered schedule names, in the order they were registered (the
  default first)."""
  return tuple(_REGISTRY)


def LossInside(name):
  """Whether schedule `name` needs the per-micro-batch loss inside the
  pipeline (KeyError for an unknown name)."""
  return _Lookup(name).loss_inside


def StageDevices(name, num_stages, num_devices):
  """The device index of each stage under schedule `name`."""
  placement = _Lookup(name).placement or Looped
  return list(placement(num_stages, num_devices))


def Unregister(name):
  """Removes schedule `name` from the registry (for tests)."""
  del _REGISTRY[name]


def _Lookup(name):
  if name not in _REGISTRY:
    raise KeyError(f'schedule={name!r}; expected one of {list(Names())}.')
  return _REGISTRY[name]


def Build(name, num_stages, num_devices, num_micro_batches,
          stage_devices=None, recurrent=False):
  """The checked `Schedule` of registered `name` for S stages on D devices
  and M micro-batches.

  Args:
    name: a registered name (`Names()`).
    num_stages, num_devices, num_micro_batches: S, D and M, ints >= 1.
    stage_devices: S device indices; default `StageDevices(name, S, D)`. A
      schedule with its own placement accepts only that one.
    recurrent: whether cells carry state between micro-batches (adds the
      dependencies of the module docstring to the check).

  Raises:
    KeyError: for an unknown name.
    ValueError: for sizes the schedule does not allow, or a broken rule.
  """
  entry = _Lookup(name)
  for what, n in (('num_stages', num_stages), ('num_devices', num_devices),
                  ('num_micro_batches', num_micro_batches)):
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
      raise ValueError(f'Schedule {name!r}: {what}={n!r} must be an int '
                       '>= 1.')
  own = StageDevices(name, num_stages, num_devices)
  if stage_devices is None:
    stage_devices = own
  elif entry.placement and list(stage_devices) != own:
    raise ValueError(f'Schedule {name!r} places stages on devices {own}; '
                     f'got stage_devices={list(stage_devices)}.')
  stage_devices = list(stage_devices)
  idle = sorted(set(range(num_devices)) - set(stage_devices))
  if idle:
    raise ValueError(f'Schedule {name!r}: {num_stages} stage(s) on '
                     f'{num_devices} devices leave device(s) {idle} idle.')
  actions = entry.fn(stage_devices, num_devices, num_micro_batches)
  schedule = Schedule(name, num_stages, num_micro_batches, stage_devices,
                      actions, entry.loss_inside)
  Check(schedule, recurrent=recurrent)
  return schedule


def FromStageOrders(stage_devices, orders, num_devices):
  """Device lists of per-stage orders: each device's actions merged in the
  order of the ticks of the stage-level table (every stage on a device of
  its own, each action as early as it can run), so a stage-level schedule
  runs with several stages per device."""
  m = 1 + max(a.micro_batch for order in orders for a in order)
  one_each = Schedule('stages', len(orders), m, range(len(orders)), orders,
                      loss_inside=True)
  lists = [[] for _ in range(num_devices)]
  for tick in one_each.Ticks():
    for a in sorted(tick, key=lambda a: a.stage):
      lists[stage_devices[a.stage]].append(a)
  return lists


@Register('gpipe', loss_inside=False)
def GPipe(stage_devices, num_devices, num_micro_batches):
  """GPipe: every forward in wavefront order, then every backward in
  reverse (Huang et al., 2019); without remat a stage holds all M
  micro-batches' activations. The loss may run outside the pipeline."""
  wave = WavefrontSchedule(len(stage_devices), num_micro_batches)
  forward = [Action(FORWARD, s, j) for tick in wave for s, j in tick]
  backward = [Action(BACKWARD, s, j) for tick in reversed(wave)
              for s, j in tick]
  return [[a for a in forward + backward if stage_devices[a.stage] == d]
          for d in range(num_devices)]


def OneFOneBOrder(stage, num_stages, num_micro_batches):
  """Stage `stage`'s actions under 1F1B: warm-up forwards, then F and B in
  turn, then the remaining backwards."""
  warm = min(num_stages - stage - 1, num_micro_batches)
  order = [Action(FORWARD, stage, j) for j in range(warm)]
  for j in range(num_micro_batches - warm):
    order += [Action(FORWARD, stage, warm + j), Action(BACKWARD, stage, j)]
  order += [Action(BACKWARD, stage, j)
            for j in range(num_micro_batches - warm, num_micro_batches)]
  return order


@Register('1f1b', loss_inside=True)
def OneFOneB(stage_devices, num_devices, num_micro_batches):
  """1F1B (PipeDream-flush, Megatron): after a warm-up each stage
  alternates a forward and a backward, so stage s holds at most
  min(S - s, M) micro-batches' activations. Needs the loss inside."""
  num_stages = len(stage_devices)
  orders = [OneFOneBOrder(s, num_stages, num_micro_batches)
            for s in range(num_stages)]
  return FromStageOrders(stage_devices, orders, num_devices)


# --- stage-level tables (one stage per device) -------------------------------


def WavefrontSchedule(num_cells, num_steps):
  """The tick table of the forward wavefront: tick t holds (s, t - s) for
  every stage s with 0 <= t - s < M, in increasing stage order; M + S - 1
  ticks."""
  if num_cells < 1 or num_steps < 1:
    raise ValueError(f'WavefrontSchedule: num_stages={num_cells} and '
                     f'num_micro_batches={num_steps} must both be >= 1.')
  return [[(i, t - i) for i in range(num_cells) if 0 <= t - i < num_steps]
          for t in range(num_steps + num_cells - 1)]
