"""Pipeline schedules as data: ordered actions per device, one registry.

A pipeline cuts a model into S *stages* (stage s runs its *cell*, a group of
layers, on the micro-batches of a batch) placed on D devices, and runs M
*micro-batches* through them. A schedule says, for each device, the order
of the actions it runs (actions.py: F, B and W of (stage, micro-batch), or
a kind of one's own, and what each needs). Stage s runs on device
`stage_devices[s]`, so two stages on one device (interleaved, V-shaped
schedules) are just data. A device runs its actions one at a time, in
order. A schedule whose backwards start
before the forward ends (`loss_inside`) needs the per-micro-batch loss
inside the pipeline; the others put all of a device's forwards before its
backwards, and the loss may run after the pipeline on the whole batch.

The registry (`Register`, `Build`, `Names`) is the only place a schedule's
name is spelled; the executor (executor.py), the memory estimate
(memory_estimate.py), the timeline and the planner all read the `Schedule`
it builds. Adding a schedule is one function that returns its device lists
(schedule_builders.py has the built-in ones) and one registry line, e.g. a
toy that runs each micro-batch's whole forward and backward before the next
one (the tests run it):

  def OneAtATime(stage_devices, num_devices, num_micro_batches):
    order = []
    for j in range(num_micro_batches):
      order += [Action(FORWARD, s, j) for s in range(len(stage_devices))]
      order += [Action(BACKWARD, s, j)
                for s in reversed(range(len(stage_devices)))]
    return [[a for a in order if stage_devices[a.stage] == d]
            for d in range(num_devices)]

  Register('one_at_a_time', loss_inside=True)(OneAtATime)

A schedule may also be written as text (`TABLE`, schedule_builders.
ParseTable): one line per device, e.g. 'F0:0 F0:1 B0:0 W0:0 ...'. It is an
ordinary registered schedule whose builder takes the text (`Register`'s
`devices`; `Build(..., table=text)`).

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

from cadence.framework.pipeline import actions
from cadence.framework.pipeline import schedule_builders

# The units, re-exported: a schedule's reader needs them with it.
Action = actions.Action
ActionOfOp = actions.ActionOfOp
IsForward = actions.IsForward
FORWARD, BACKWARD, WEIGHT = actions.FORWARD, actions.BACKWARD, actions.WEIGHT
KINDS = actions.KINDS
Looped = schedule_builders.Looped
WavefrontSchedule = schedule_builders.WavefrontSchedule
OneFOneBOrder = schedule_builders.OneFOneBOrder
ParseTable = schedule_builders.ParseTable

# The schedule a PipeliningLayer runs unless its params say otherwise.
DEFAULT = 'gpipe'
# The schedule written as text (its action lists are a param).
TABLE = 'table'

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
    self._doers = None
    self._needs = {}   # (action, recurrent) -> Needs.

  @property
  def num_devices(self):
    return len(self.actions)

  @property
  def defers_w(self):
    """Whether B computes only input gradients and W the weights'."""
    return any(WEIGHT in actions.Does(a) for device in self.actions
               for a in device)

  @property
  def works(self):
    """The work letters this schedule does, in registration order."""
    done = {w.kind for w in self.doers}
    return tuple(w for w in actions.Works() if w in done)

  @property
  def doers(self):
    """{work: the action of this schedule that does it}, e.g. {F(1, 3):
    F(1, 3)}, or {F(1, 3): P(1, 3), B(1, 3): P(1, 3)} for a kind that does
    both (actions.Kind.does)."""
    if self._doers is None:
      self._doers = {w: a for device in self.actions for a in device
                     for w in a.Work()}
    return self._doers

  def Stages(self, device):
    """The stages placed on device index `device`, in stage order."""
    return [s for s, d in enumerate(self.stage_devices) if d == device]

  def Needs(self, action, recurrent=False):
    """The actions `action` depends on: those of this schedule that do
    the work it needs (actions.Needs; work no action does stays as it is)."""
    key = (action, recurrent)
    if key not in self._needs:   # Simulations ask for them again and again.
      doers = self.doers
      needs = (doers.get(n, n) for n in actions.Needs(
          action, self.num_stages, self.num_micro_batches,
          recurrent=recurrent, loss_inside=self.loss_inside,
          present=self.works))
      self._needs[key] = [n for n in dict.fromkeys(needs) if n != action]
    return list(self._needs[key])

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
      for a in tick:
        for kind in actions.Does(a):
          if kind == FORWARD:
            live[a.stage] += 1
            peak[a.stage] = max(peak[a.stage], live[a.stage])
          elif kind == BACKWARD:
            live[a.stage] -= 1
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
      action run twice (or two actions doing the same work: actions.Kind),
      a micro-batch never finished (its F or B missing), a weight gradient
      never applied (a B without its W in a schedule that splits the
      backward), a forward after a backward where the loss runs outside,
      or an action without its inputs (deadlock).
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
  where = {}   # Work -> (device, tick) of the action doing it.
  for d, device in enumerate(schedule.actions):
    seen_backward = None
    for t, a in enumerate(device):
      at = f'Schedule {name!r}, device {d}, tick {t}: {a}'
      kinds = actions.Letters()
      if (a.kind not in kinds or not 0 <= a.stage < s_count or
          not 0 <= a.micro_batch < m_count):
        raise ValueError(f'{at} is not an action of kinds {kinds} with '
                         f'stage < {s_count} and micro-batch < {m_count}.')
      if schedule.stage_devices[a.stage] != d:
        raise ValueError(f'{at}: stage {a.stage} runs on device '
                         f'{schedule.stage_devices[a.stage]}, not {d}.')
      for w in a.Work():
        if w in where:
          (d0, t0), first = where[w], schedule.actions[where[w][0]][where[w][1]]
          if first == a:
            raise ValueError(f'{at} runs twice (first at device {d0}, tick '
                             f'{t0}).')
          raise ValueError(f'{at} does the work of {w}, which {first} at '
                           f'device {d0}, tick {t0} does already.')
        where[w] = (d, t)
      if not actions.IsForward(a):
        seen_backward = seen_backward or (t, a)
      elif seen_backward and not schedule.loss_inside:
        raise ValueError(
            f'{at} comes after {seen_backward[1]} at tick '
            f'{seen_backward[0]}; with the loss outside the pipeline every '
            'forward of a device comes before its backwards (a schedule '
            'that interleaves them runs the loss inside: loss_inside).')
  present = schedule.works
  owed = [w for w in actions.Works()
          if actions.WorkOf(w).required or w in present]
  for s in range(s_count):
    for j in range(m_count):
      for kind in owed:
        a = Action(kind, s, j)
        if a in where or not actions.WorkOf(kind).AppliesTo(
            s, j, s_count, m_count):
          continue
        d = schedule.stage_devices[s]
        if kind not in (FORWARD, BACKWARD, WEIGHT):
          raise ValueError(
              f'Schedule {name!r}, device {d}: {a} is missing: the schedule '
              f'does {actions.WorkOf(kind).name} ({kind}) elsewhere, so it '
              f'owes it for stage {s} and micro-batch {j} too.')
        if kind == WEIGHT:
          raise ValueError(
              f'Schedule {name!r}, device {d}: the weight gradient of '
              f'{schedule.doers[Action(BACKWARD, s, j)]} (tick '
              f'{where[Action(BACKWARD, s, j)][1]}) is never applied: '
              f'{a} is missing.')
        raise ValueError(f'Schedule {name!r}, device {d}: micro-batch {j} '
                         f'never finishes stage {s}: {a} is missing.')
  Simulate(schedule, recurrent=recurrent)


# --- the registry ----------------------------------------------------------

_Entry = collections.namedtuple('_Entry', ['fn', 'loss_inside', 'placement',
                                           'bubble', 'devices'])
_REGISTRY = {}


def Register(name, loss_inside, placement=None, bubble=None, devices=None):
  """Registers `fn(stage_devices, num_devices, num_micro_batches) -> D
  device action lists` as schedule `name`.

  A schedule written as text (TABLE) is one like the others whose
  functions take the text as their last argument: its builder, and its
  `loss_inside`, `placement` and `devices` (`devices` says it: a
  schedule with it takes the text).

  Args:
    name: the schedule's one spelling (params `schedule=name`).
    loss_inside: whether its backwards start before the forward ends (the
      per-micro-batch loss runs inside the pipeline); fn(text) for a text.
    placement: fn(num_stages, num_devices[, text]) -> stage_devices, for a
      schedule whose stages must sit on given devices (a V, a table); None:
      any placement works, `Looped` by default.
    bubble: fn(num_stages, num_devices, num_micro_batches) -> the bubble
      its paper gives when every stage's F, B and W take the same time
      (`FormulaBubble`), or None.
    devices: fn(text) -> the devices the text runs on (a table's lines),
      for a schedule written as text; None for the others.
  """
  def _Decorator(fn):
    if name in _REGISTRY:
      raise ValueError(f'Schedule {name!r} is registered twice.')
    _REGISTRY[name] = _Entry(fn, loss_inside, placement, bubble, devices)
    return fn
  return _Decorator


def Unregister(name):
  """Removes schedule `name` from the registry (for tests)."""
  del _REGISTRY[name]


def Names():
  """The registered schedule names, in the order they were registered (the
  default first)."""
  return tuple(_REGISTRY)


def _Lookup(name):
  if name not in _REGISTRY:
    raise KeyError(f'schedule={name!r}; expected one of {list(Names())}.')
  return _REGISTRY[name]


def TakesText(name):
  """Whether schedule `name` is written as text (its params' schedule_table
  holds it)."""
  return _Lookup(name).devices is not None


def _Call(name, fn, *args, text=None):
  """fn(*args), and the text last for a schedule written as text (which
  must have one); its ValueError names the schedule."""
  if not TakesText(name):
    return fn(*args)
  if text is None or not str(text).strip():
    raise ValueError(f'Schedule {name!r} needs its action lists as text '
                     "(schedule_table): one line per device, e.g. 'F0:0 "
                     "F0:1 B0:0 B0:1'.")
  try:
    return fn(*args, text)
  except ValueError as e:
    raise ValueError(f'Schedule {name!r}: {e}') from None


def LossInside(name, table=None):
  """Whether schedule `name` needs the per-micro-batch loss inside the
  pipeline (a table: whether a device runs a forward after a backward).

  Raises:
    KeyError: for an unknown name.
  """
  inside = _Lookup(name).loss_inside
  return _Call(name, inside, text=table) if TakesText(name) else inside


def NumDevices(name, num_stages, stages_per_device=1, table=None):
  """The devices a pipeline of `num_stages` runs on under schedule `name`:
  its text's (a table's lines), else num_stages / stages_per_device."""
  if TakesText(name):
    return _Call(name, _Lookup(name).devices, text=table)
  return max(1, num_stages // stages_per_device)


def FormulaBubble(name, num_stages, num_devices, num_micro_batches):
  """The bubble (idle share of the devices' time in a step) the paper of
  schedule `name` gives for S stages on D devices and M micro-batches when
  F, B and W take the same time, or None (no closed form, or the sizes are
  outside it). Compare with `Schedule.Bubble()`: the same schedule's
  action lists simulated at unit times."""
  fn = _Lookup(name).bubble
  return None if fn is None else fn(num_stages, num_devices,
                                     num_micro_batches)


def _OnePerDevice(formula):
  """A formula that holds with one stage per device."""
  return lambda s, d, m: formula(d, m) if s == d else None


def StageDevices(name, num_stages, num_devices, table=None):
  """The device index of each stage under schedule `name`.

  Raises:
    ValueError: for a schedule whose placement does not fit the sizes.
  """
  placement = _Lookup(name).placement or Looped
  try:
    return list(_Call(name, placement, num_stages, num_devices, text=table))
  except ValueError as e:
    if str(e).startswith(f'Schedule {name!r}'):
      raise
    raise ValueError(f'Schedule {name!r}: {e}') from None


def Build(name, num_stages, num_devices, num_micro_batches,
          stage_devices=None, recurrent=False, table=None):
  """The checked `Schedule` of registered `name` for S stages on D devices
  and M micro-batches.

  Args:
    name: a registered name (`Names()`).
    num_stages, num_devices, num_micro_batches: S, D and M, ints >= 1.
    stage_devices: S device indices; default `StageDevices(name, S, D)`. A
      schedule with its own placement accepts only that one.
    recurrent: whether cells carry state between micro-batches (adds the
      dependencies of actions.Needs to the check).
    table: for a schedule written as text (TABLE), its text: the action
      lists (schedule_builders.ParseTable), D lines of S stages and M
      micro-batches.

  Raises:
    KeyError: for an unknown name.
    ValueError: for sizes the schedule does not allow, or a broken rule
      (naming the device, tick and action).
  """
  entry = _Lookup(name)
  for what, n in (('num_stages', num_stages), ('num_devices', num_devices),
                  ('num_micro_batches', num_micro_batches)):
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
      raise ValueError(f'Schedule {name!r}: {what}={n!r} must be an int '
                       '>= 1.')
  own = StageDevices(name, num_stages, num_devices, table)
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
  try:
    lists = _Call(name, entry.fn, stage_devices, num_devices,
                  num_micro_batches, text=table)
  except ValueError as e:
    if str(e).startswith(f'Schedule {name!r}'):
      raise
    raise ValueError(f'Schedule {name!r}: {e}') from None
  schedule = Schedule(name, num_stages, num_micro_batches, stage_devices,
                      lists, LossInside(name, table))
  Check(schedule, recurrent=recurrent)
  return schedule


# One line per schedule: its name, whether its loss runs inside the
# pipeline, its placement when it has its own, its paper's bubble (F = B =
# W), and its builder.
Register(DEFAULT, loss_inside=False,
         bubble=_OnePerDevice(lambda d, m: (d - 1) / (m + d - 1)))(
             schedule_builders.GPipe)
Register('1f1b', loss_inside=True,
         bubble=_OnePerDevice(lambda d, m: (d - 1) / (m + d - 1)))(
             schedule_builders.OneFOneB)
Register('interleaved_1f1b', loss_inside=True,
         bubble=schedule_builders.InterleavedBubble)(
             schedule_builders.Interleaved1F1B)
Register('zb_h1', loss_inside=True,
         bubble=_OnePerDevice(lambda d, m: (d - 1) / (3 * m + d - 1)))(
             schedule_builders.ZeroBubbleH1)
Register('zb_v', loss_inside=True, placement=schedule_builders.VShape,
         bubble=lambda s, d, m: 0.0)(schedule_builders.ZeroBubbleV)
Register(TABLE, loss_inside=schedule_builders.TableLossInside,
         placement=schedule_builders.TablePlacement,
         devices=schedule_builders.TableDevices)(schedule_builders.FromTable)
