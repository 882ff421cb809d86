"""The built-in pipeline schedules: pure functions that return action lists.

Each builder takes the stages' placement (`stage_devices`: the device index
of each of the S stages), the number of devices K and of micro-batches M,
and returns K lists of `actions.Action`s: what each device runs, in order.
The registry (schedules.py) names them and checks what they return.

  GPipe            every forward in wavefront order, then every backward in
                   reverse (Huang et al., 2019, arXiv:1811.06965).
  OneFOneB         1F1B (PipeDream-flush; Narayanan et al., 2021): after a
                   warm-up each stage alternates a forward and a backward,
                   so stage s holds at most min(S - s, M) micro-batches.
  Interleaved1F1B  Megatron's virtual stages (Narayanan et al., 2021,
                   arXiv:2104.04473): v = S / K stages per device, stage s on
                   device s % K; micro-batches go round the devices in
                   rounds (of K when K divides M, Megatron's groups; for any
                   M >= 1 see `InterleavedRounds`), each device alternating
                   its stages; bubble (K-1)/(vM+K-1) of a step where each
                   stage takes 1/v of the time, for M >= K (M < K: see
                   `InterleavedBubble`).
  ZeroBubbleH1     ZB-H1 (Qi et al., 2024, "Zero Bubble Pipeline
                   Parallelism", arXiv:2401.10241): the backward cut into
                   B (input gradient) and W (weight gradient); 1F1B's order
                   of F and B with stage s running its W's s micro-batches
                   late, so W fills the bubbles: (S-1)/(3M+S-1) of the step
                   when F = B = W, at 1F1B's peak memory.
  ZeroBubbleV      ZB-V: two stages per device in a V (device d holds stages
                   d and 2K-1-d), each device running by a greedy rule (a
                   ready B first, else an F within 1F1B's first stage's
                   memory, else a W), about the memory of 1F1B's first
                   stage on every device and little bubble when F, B and W
                   take the same time.
  Table            a schedule written as text, one line per device.

The zero-bubble orders are worked out for unit-time actions (the paper's
F = B = W); the executor keeps the order whatever the real times are.

Example:
  OneFOneB([0, 1], 2, 3)
  # [[F(0, 0), F(0, 1), B(0, 0), F(0, 2), B(0, 1), B(0, 2)],
  #  [F(1, 0), B(1, 0), F(1, 1), B(1, 1), F(1, 2), B(1, 2)]]
"""
import collections
import re

from cadence.framework.pipeline import actions

Action = actions.Action
F, B, W = actions.FORWARD, actions.BACKWARD, actions.WEIGHT


def Looped(num_stages, num_devices):
  """Stage s on device s % K (GPipe, 1F1B, interleaved)."""
  return [s % num_devices for s in range(num_stages)]


def VShape(num_stages, num_devices):
  """Stage s on device s for the first K stages, then back: device d holds
  stages d and 2K-1-d (ZB-V). Needs S = 2K."""
  if num_stages != 2 * num_devices:
    raise ValueError(f'a V places 2 stages per device: num_stages='
                     f'{num_stages} must be 2 x num_devices={num_devices} '
                     '(on a PipeliningLayer: stages_per_device=2).')
  return [s if s < num_devices else 2 * num_devices - 1 - s
          for s in range(num_stages)]


def WavefrontSchedule(num_stages, num_micro_batches):
  """The tick table of the forward wavefront: tick t holds (s, t - s) for
  every stage s with 0 <= t - s < M, in increasing stage order; M + S - 1
  ticks."""
  if num_stages < 1 or num_micro_batches < 1:
    raise ValueError(f'WavefrontSchedule: num_stages={num_stages} and '
                     f'num_micro_batches={num_micro_batches} must both be '
                     '>= 1.')
  return [[(s, t - s) for s in range(num_stages)
           if 0 <= t - s < num_micro_batches]
          for t in range(num_micro_batches + num_stages - 1)]


def StageTicks(orders):
  """Per-stage action orders run as early as they can, each stage on a
  device of its own, unit times: the list of ticks (stage order inside a
  tick). Raises ValueError naming the stuck actions on a deadlock."""
  num_stages = len(orders)
  m = 1 + max(a.micro_batch for order in orders for a in order)
  done, pos, ticks = set(), [0] * num_stages, []
  while any(p < len(o) for p, o in zip(pos, orders)):
    tick = [o[p] for p, o in zip(pos, orders) if p < len(o) and all(
        n in done for n in actions.Needs(o[p], num_stages, m))]
    if not tick:
      stuck = [str(o[p]) for p, o in zip(pos, orders) if p < len(o)]
      raise ValueError(f'StageTicks: deadlock after {len(ticks)} ticks; the '
                       f'next actions {stuck} all wait for each other.')
    for a in tick:
      pos[a.stage] += 1
    done.update(tick)
    ticks.append(tick)
  return ticks


def FromStageOrders(stage_devices, orders, num_devices):
  """Device lists of per-stage orders: each device's actions merged in the
  order of their `StageTicks`, so a stage-level schedule runs with several
  stages per device."""
  lists = [[] for _ in range(num_devices)]
  for tick in StageTicks(orders):
    for a in tick:
      lists[stage_devices[a.stage]].append(a)
  return lists


def _ByDevice(order, stage_devices, num_devices):
  return [[a for a in order if stage_devices[a.stage] == d]
          for d in range(num_devices)]


def GPipe(stage_devices, num_devices, num_micro_batches):
  """GPipe's device lists; see the module docstring."""
  wave = WavefrontSchedule(len(stage_devices), num_micro_batches)
  forward = [Action(F, s, j) for tick in wave for s, j in tick]
  backward = [Action(B, s, j) for tick in reversed(wave) for s, j in tick]
  return _ByDevice(forward + backward, stage_devices, num_devices)


def OneFOneBOrder(stage, num_stages, num_micro_batches):
  """Stage `stage`'s actions under 1F1B: warm-up forwards, then F and B in
  turn, then the remaining backwards."""
  warm = min(num_stages - stage - 1, num_micro_batches)
  order = [Action(F, stage, j) for j in range(warm)]
  for j in range(num_micro_batches - warm):
    order += [Action(F, stage, warm + j), Action(B, stage, j)]
  order += [Action(B, stage, j)
            for j in range(num_micro_batches - warm, num_micro_batches)]
  return order


def _EachStage(stage_order, stage_devices, num_devices, num_micro_batches):
  """The device lists of a schedule whose stage s runs
  `stage_order(s, num_stages, num_micro_batches)`, in that order."""
  num_stages = len(stage_devices)
  return FromStageOrders(
      stage_devices, [stage_order(s, num_stages, num_micro_batches)
                      for s in range(num_stages)], num_devices)


def OneFOneB(stage_devices, num_devices, num_micro_batches):
  """1F1B's device lists; see the module docstring."""
  return _EachStage(OneFOneBOrder, stage_devices, num_devices,
                    num_micro_batches)


def InterleavedRounds(num_devices, num_micro_batches):
  """The sizes of the rounds in which interleaved 1F1B sends consecutive
  micro-batches round the K devices: R = max(1, M // K) rounds, their sizes
  differing by at most one, the larger first.

  So K each when K divides M (Megatron's groups), one round of M when
  M < 2K, else sizes between K and 2K - 1; PyTorch's
  `ScheduleInterleaved1F1B` has the same R rounds of M / R
  (`microbatches_per_round`) and refuses an M that R does not divide. A
  round of at least K keeps device 0 busy until the round's first
  micro-batch comes back for its next stage, K stage-times later (M < K:
  one round of M, device 0 waits K - M of them between stages). The larger
  first: the last device warms up until the first round reaches its last
  stage, so a later, larger round would need a backward before its
  forward.

  Example: InterleavedRounds(2, 7) == [3, 2, 2]; InterleavedRounds(4, 2)
  == [2].
  """
  rounds = max(1, num_micro_batches // num_devices)
  size, extra = divmod(num_micro_batches, rounds)
  return [size + (r < extra) for r in range(rounds)]


def InterleavedWarmUp(device, num_devices, stages_per_device,
                      num_micro_batches):
  """The forwards device `device` runs before its first backward under
  interleaved 1F1B: (v - 1) P + 2 (K - d - 1), P the first round's size
  (`InterleavedRounds`), at most v M. It holds at most one more
  stage-micro-batch (the forward before each backward)."""
  first = InterleavedRounds(num_devices, num_micro_batches)[0]
  return min((stages_per_device - 1) * first +
             2 * (num_devices - device - 1),
             stages_per_device * num_micro_batches)


def InterleavedBubble(num_stages, num_devices, num_micro_batches):
  """The bubble (idle share of the devices' time) of interleaved 1F1B when
  each stage's F and B take 1/v of a step's: 1 - vM / (v max(M, K) +
  min(M, K) - 1), i.e. Megatron's (K-1)/(vM+K-1) for M >= K; for M < K,
  (v(K-M)+M-1)/(vK+M-1): each device waits K - M stage-times between its
  stages for the micro-batches to come round."""
  v, d, m = num_stages // num_devices, num_devices, num_micro_batches
  return 1.0 - v * m / (v * max(m, d) + min(m, d) - 1)


def Interleaved1F1B(stage_devices, num_devices, num_micro_batches):
  """Megatron's interleaved 1F1B for any M; see the module docstring.

  The micro-batches go in rounds (`InterleavedRounds`): device d's forwards
  run a round on its chunk 0 (stage d), the same round on chunk 1 (stage
  K + d), ..., chunk v - 1, then the next round; its backwards the same
  rounds, chunks in reverse. It runs `InterleavedWarmUp` forwards, then
  alternates a forward and a backward. With rounds of K (K divides M) these
  are Megatron's lists.

  Example (K=2, v=2, M=3: one round of 3):
    device 0: F0:0 F0:1 F0:2 F2:0 F2:1 F2:2 B2:0 B2:1 B2:2 B0:0 B0:1 B0:2
    device 1: F1:0 F1:1 F1:2 F3:0 B3:0 F3:1 B3:1 F3:2 B3:2 B1:0 ...
  """
  num_stages, d_count, m = len(stage_devices), num_devices, num_micro_batches
  if num_stages % d_count or list(stage_devices) != Looped(num_stages,
                                                           d_count):
    raise ValueError(f'interleaved stages: stage s on device s % K, '
                     f'num_stages={num_stages} a multiple of num_devices='
                     f'{d_count} (stages_per_device = num_stages / '
                     'num_devices on each device).')
  v = num_stages // d_count
  if v == 1:
    return OneFOneB(stage_devices, num_devices, num_micro_batches)
  # Every device's k-th forward: (chunk, micro-batch); its k-th backward is
  # of the same micro-batch, the chunks of its round in reverse.
  slots, start = [], 0
  for size in InterleavedRounds(d_count, m):
    slots += [(chunk, start + j) for chunk in range(v) for j in range(size)]
    start += size

  def _Order(kind, d, k):
    chunk, micro_batch = slots[k]
    if kind == B:
      chunk = v - 1 - chunk
    return Action(kind, chunk * d_count + d, micro_batch)

  lists = []
  total = m * v
  for d in range(d_count):
    warm = InterleavedWarmUp(d, d_count, v, m)
    order = [_Order(F, d, k) for k in range(warm)]
    for k in range(total - warm):
      order += [_Order(F, d, warm + k), _Order(B, d, k)]
    order += [_Order(B, d, k) for k in range(total - warm, total)]
    lists.append(order)
  return lists


def _Greedy(stage_devices, num_devices, num_micro_batches, caps, defer):
  """Zero-bubble lists by a greedy rule on unit-time actions.

  At each tick every device runs one ready action of its stages, the first
  of: a B (the oldest micro-batch; the later stage first); a W when more
  than defer[d] of its B's wait for their W; an F while fewer than caps[d]
  of its stage-micro-batches wait for their B (1F1B's activations); a W.
  So the W's it defers (at most defer[d] + 1) fill the ticks where the
  device would wait.
  """
  num_stages, m = len(stage_devices), num_micro_batches
  todo = [[Action(kind, s, j) for s in range(num_stages)
           if stage_devices[s] == d for j in range(m) for kind in (F, B, W)]
          for d in range(num_devices)]
  done = set()
  lists = [[] for _ in range(num_devices)]
  live = [0] * num_devices      # F run, B not yet.
  waiting = [0] * num_devices   # B run, W not yet.

  def _Key(a):
    return (a.micro_batch, -a.stage)

  while any(todo):
    ran = []
    for d in range(num_devices):
      ready = [a for a in todo[d] if all(
          n in done for n in actions.Needs(a, num_stages, m))]
      rules = [B, W if waiting[d] > defer[d] else None,
               F if live[d] < caps[d] else None, W]
      pick = next((min(mine, key=_Key) for kind in rules if kind for mine in
                   [[a for a in ready if a.kind == kind]] if mine), None)
      if pick is None:
        continue
      todo[d].remove(pick)
      lists[d].append(pick)
      live[d] += {F: 1, B: -1, W: 0}[pick.kind]
      waiting[d] += {F: 0, B: 1, W: -1}[pick.kind]
      ran.append(pick)
    if not ran:
      raise ValueError('zero-bubble rule: no device can run an action; '
                       f'caps {caps} are too small.')
    done.update(ran)
  return lists


def ZeroBubbleH1Order(stage, num_stages, num_micro_batches):
  """Stage `stage`'s actions under ZB-H1.

  S - s forwards, then per micro-batch j its B, the W of micro-batch j - s
  and the next forward; the W's left run at the end. A stage s runs its
  W's s micro-batches late, so the last backwards travel back to stage 0
  without waiting behind W's, and the W's fill the ticks where the stage
  would wait for them (with F, B and W of one time, it never waits after
  its first B). Stage s holds at most S micro-batches from F to W (S - s
  from F to B, as 1F1B).
  """
  m = num_micro_batches
  warm = min(num_stages - stage, m)
  order = [Action(F, stage, j) for j in range(warm)]
  for j in range(m):
    order.append(Action(B, stage, j))
    if j >= stage:
      order.append(Action(W, stage, j - stage))
    if j + warm < m:
      order.append(Action(F, stage, j + warm))
  order += [Action(W, stage, j) for j in range(max(m - stage, 0), m)]
  return order


def ZeroBubbleH1(stage_devices, num_devices, num_micro_batches):
  """ZB-H1's device lists; see the module docstring."""
  return _EachStage(ZeroBubbleH1Order, stage_devices, num_devices,
                    num_micro_batches)


def ZeroBubbleV(stage_devices, num_devices, num_micro_batches):
  """ZB-V's device lists (stages in a V: `VShape`); see the module
  docstring. Every device holds the activations of at most 2K
  stage-micro-batches from F to B (1F1B's first stage: K micro-batches of a
  stage twice as large) and defers at most one W beyond them.

  Measured on unit-time actions (F = B = W of a stage, each stage half of
  a 1F1B stage), bubble of the step: 0.077 at K=4, M=8 and 0.030 at M=16
  (1F1B 0.273 and 0.158, ZB-H1 0.111 and 0.059); deferring more W's buys
  little (0.059 at M=8 with 2) for a stage-micro-batch more each.
  """
  if list(stage_devices) != VShape(len(stage_devices), num_devices):
    raise ValueError('ZB-V places stages in a V: device d holds stages d and '
                     f'2K-1-d; got stage_devices={list(stage_devices)}.')
  caps = [2 * min(num_devices, num_micro_batches)] * num_devices
  return _Greedy(stage_devices, num_devices, num_micro_batches, caps,
                 [1] * num_devices)


# --- schedules written as text -----------------------------------------------

_TOKEN = re.compile(r'^([A-Za-z])(\d+):(\d+)$')


def ParseTable(text):
  """K device lists of a schedule written as text.

  One line per device (in device order), its actions in order, separated by
  spaces: kind (a registered letter, actions.Letters), stage, ':',
  micro-batch, e.g. `F0:0 F0:1 B0:0 W0:0`; '|' also ends a device's line
  (one line of text on a command line: `F0:0 B0:0 | F1:0 B1:0`). Blank
  lines and text after '#' are ignored.

  Raises:
    ValueError: naming the device, the column and the token that is not an
      action.
  """
  lists = []
  for line in str(text).replace('|', '\n').splitlines():
    line = line.split('#', 1)[0].strip()
    if not line:
      continue
    device = []
    for column, token in enumerate(line.split(), 1):
      found = _TOKEN.match(token)
      if not found or found.group(1).upper() not in actions.Letters():
        raise ValueError(f'device {len(lists)}, action {column}: {token!r} '
                         'is not an action written kind stage:micro_batch '
                         "(e.g. 'F0:3', 'B1:0', 'W1:0').")
      kind, stage, micro_batch = found.groups()
      device.append(Action(kind.upper(), int(stage), int(micro_batch)))
    lists.append(device)
  if not lists:
    raise ValueError('the table holds no action: write one line per device, '
                     "e.g. 'F0:0 F0:1 B0:0 B0:1'.")
  return lists


def _TableDevice(lists, stage):
  """The device a table places `stage` on: the line holding most of its
  actions (schedules.Check names any action of it on another line)."""
  count = collections.Counter(d for d, device in enumerate(lists)
                              for a in device if a.stage == stage)
  return max(range(len(lists)), key=lambda d: (count[d], -d))


def TableDevices(text):
  """The devices (lines) of a table."""
  return len(ParseTable(text))


def TablePlacement(num_stages, num_devices, text):
  """Each stage's device in a table of `num_devices` lines."""
  lists = ParseTable(text)
  if len(lists) != num_devices:
    raise ValueError(f'the table has {len(lists)} line(s); the pipeline has '
                     f'{num_devices} devices (one line per device).')
  return [_TableDevice(lists, s) for s in range(num_stages)]


def TableLossInside(text):
  """Whether a table runs the loss inside the pipeline: a device does
  forward work after other work (a kind that does F and B, twice,
  interleaves)."""
  for device in ParseTable(text):
    seen_backward = False
    for work in (w for a in device for w in a.Work()):
      if work.kind != actions.FORWARD:
        seen_backward = True
      elif seen_backward:
        return True
  return False


def FromTable(stage_devices, num_devices, num_micro_batches, text):
  """The device lists written in `text` (ParseTable), as they are: the
  schedule's check (schedules.Check) holds them to its sizes and rules."""
  del stage_devices, num_devices, num_micro_batches   # The text says them.
  return ParseTable(text)

