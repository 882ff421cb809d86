"""The time of a training step, simulated from its schedule and its costs.

A layout (R replicas of a pipeline of S stages on D devices each, M
micro-batches, a schedule and a remat mode) trains one step as

  1. each device runs its actions of the schedule (`schedules.Schedule`, the
     lists the executor runs) in order, each as soon as its device is free
     and the actions it needs (`Schedule.Needs`) have ended and their
     results have crossed the link between the two devices
     (`hardware.Hardware.Transfer` of the stage's output bytes, forward or
     gradient);
  2. each device all-reduces its stages' weight gradients with the same
     device of the other replicas (a ring: 2 (R-1)/R of the bytes each way,
     over the link between them), then
  3. applies the optimizer update to its stages' weights.

What an action costs (`StageCost`, seconds, given per stage):

  F(s, j)  forward;
  B(s, j)  backward: input and weight gradients (`backward`), or only the
           input gradients when the schedule defers W (`W_SHARE` of
           the backward is the weights'); plus `recompute` when remat
           re-runs the forward of micro-batch j ('always'; 'except_last'
           for every micro-batch but the last; 'selective': the part it
           does not keep); plus the sum of the weight gradients into the
           step's (`accumulate`, from the second micro-batch on);
  W(s, j)  the weight gradients (`W_SHARE` of `backward`) and their sum,
           plus `defer_w`: what cutting the backward in two adds (B's
           residuals returned and W's call: measured, zero-bubble steps
           take more than the same steps with a fused backward);
and each action `overhead`: what the executor adds to the work it runs
(its call, the slice of a micro-batch, the control edges ordering it),
which measured layer costs leave out (calibration.FitOverheads fits it).
A step also pays a `fixed` cost once (the loop, the gradients' norm and
clipping, what the update costs beyond its per-device share).

The weight-gradient share: a layer's backward is dominated by its products
with a weight, each of which has an input-gradient product and a
weight-gradient product of the same size, so W_SHARE = 1/2 (an assumption;
exact for a dense layer, a little high for attention, whose score products
have input gradients only).

Devices that share compute (logical CPUs of one host: `hardware.shared`)
run at once as a processor-sharing pool: with n actions running on a
host's devices, each progresses at throughput(n) / n of its own speed
(`Hardware.Throughput`), so two concurrent actions each take longer than
alone. Devices that do not share compute run their actions at full speed;
then the simulation equals `schedules.Simulate` with the same costs.

The replicas are identical, so one is simulated: with shared compute, the
replicas on a host divide its throughput (n running actions of one replica
are n x (replicas on the host) on the host), unless `replica_concurrency`
gives the host's throughput with 1, 2, 4, ... replicas each running one
action: then each replica's n actions run at throughput(n) x that / the
replicas on the host. Replicas are independent streams of work (the
strategy runs each in its own thread), which fill a shared host's cores
better than a pipeline's dependent actions do
(calibration.FitReplicaConcurrency).

A device runs one action at a time here, as the executor chains them; a
re-run costs about one forward. On one device at a few micro-batches the
simulation predicts high: the executor's overhead per layer of an action
is fitted to one and to 8 micro-batches (calibration.FitOverheads) and is
not linear in between (figures: the README, "Measured on the development machine").

Example:
  schedule = schedules.Build('1f1b', 2, 2, 4)
  stage = StageCost(forward=1.0, backward=2.0, recompute=0.0,
                    out_bytes=1 << 20, grad_bytes=4 << 20, update=0.1,
                    accumulate=0.0)
  step = SimulateStep(schedule, [stage] * 2, hardware.Parse('h100x8'),
                      remat='never', num_replicas=2)
  step.time, step.bubble         # 13.1..., 0.2
"""
import collections

from cadence.framework.pipeline import actions
from cadence.framework.pipeline import schedules
from cadence.framework.planning import hardware as hardware_lib

W_SHARE = 0.5
_EPS = 1e-12


class StageCost(collections.namedtuple('StageCost', [
    'forward', 'backward', 'recompute', 'out_bytes', 'grad_bytes',
    'update', 'accumulate', 'overhead', 'defer_w'], defaults=[0.0, 0.0])):
  """Per stage, seconds (alone on its device) and bytes; see the module
  docstring.

  Attributes:
    forward: F of one micro-batch.
    backward: B of one micro-batch, input and weight gradients, no re-run.
    recompute: what a re-run of the forward adds to B (remat).
    out_bytes: the stage's output of one micro-batch (sent to the next
      stage; its gradient comes back the same size).
    grad_bytes: its trained weights' gradients (all-reduced).
    update: the optimizer update of its weights.
    accumulate: adding one micro-batch's weight gradients to the step's.
    overhead: what the executor adds to each action of the stage.
    defer_w: what a deferred W adds to each micro-batch's B and W of
      the stage together (charged to W).
  """
  __slots__ = ()


Step = collections.namedtuple('Step', [
    'time', 'pipeline', 'spans', 'bubble', 'allreduce', 'update', 'fixed'],
                              defaults=[0.0])
Step.__doc__ = """A simulated step (seconds).

Attributes:
  time: the step: pipeline, then all-reduce and update, and `fixed`.
  pipeline: from the first action's start to the last one's end.
  spans: {Action: (start, end)} of replica 0's pipeline actions.
  bubble: the idle share of the devices' time in `pipeline`.
  allreduce: the longest device's gradient all-reduce.
  update: the longest device's optimizer update.
  fixed: the step's fixed cost.
"""


def Run(lists, cost, needs, group=None, throughput=None):
  """A discrete-event simulation of devices running ordered work.

  Each device runs its list in order, one item at a time; an item starts
  once its device is free and every item it needs has ended, plus that
  need's delay. Items of devices in one group share its compute: with n of
  them running, each progresses at throughput(n) / n (of its cost, its
  seconds alone).

  Args:
    lists: {device: [item, ...]} in run order; items are hashable.
    cost: {item: seconds alone}.
    needs: {item: [(needed item, delay seconds)]}; an item's needs may be
      on any device.
    group: {device: group key}; None: every device its own.
    throughput: fn(n) -> the group's work per second with n items running
      (1 for n = 1); None: n (no sharing).

  Returns:
    {item: (start, end)}.

  Raises:
    ValueError: naming each device's next item and what it waits for, if
      the lists deadlock.
  """
  group = group or {d: d for d in lists}
  throughput = throughput or float
  pos = {d: 0 for d in lists}
  busy = {}            # device -> the item it runs
  left = {}            # item -> work left (seconds alone)
  times, start = {}, {}
  now = 0.0
  remaining = sum(len(v) for v in lists.values())
  while remaining:
    # Start every head item whose needs are met; note the next ready time.
    next_ready = None
    started = True
    while started:
      started = False
      for d, items in lists.items():
        if d in busy or pos[d] >= len(items):
          continue
        item = items[pos[d]]
        ready = now
        for need, delay in needs.get(item, ()):
          if need not in times:
            ready = None
            break
          ready = max(ready, times[need][1] + delay)
        if ready is None:
          continue
        if ready > now + _EPS:
          next_ready = ready if next_ready is None else min(next_ready,
                                                            ready)
          continue
        start[item] = now
        if cost[item] <= 0:
          times[item] = (now, now)
          pos[d] += 1
          remaining -= 1
        else:
          busy[d] = item
          left[item] = cost[item]
        started = True
    if not busy:
      if next_ready is None:
        if not remaining:
          break
        raise ValueError('step_model.Run: the lists deadlock: ' + '; '.join(
            f'device {d} at item {pos[d]}: {items[pos[d]]} waits for '
            + ', '.join(str(n) for n, _ in needs.get(items[pos[d]], ())
                        if n not in times)
            for d, items in lists.items() if pos[d] < len(items)) + '.')
      now = next_ready
      continue
    running = collections.Counter(group[d] for d in busy)
    rate = {g: throughput(n) / n for g, n in running.items()}
    finish = min(left[i] / rate[group[d]] for d, i in busy.items())
    step = finish if next_ready is None else min(finish, next_ready - now)
    now += step
    for d, item in list(busy.items()):
      left[item] -= step * rate[group[d]]
      if left[item] <= _EPS * max(1.0, cost[item]):
        times[item] = (start[item], now)
        del busy[d], left[item]
        pos[d] += 1
        remaining -= 1
  return times


def ReRuns(remat, micro_batch, num_micro_batches):
  """Whether the backward of `micro_batch` re-runs its forward (or, with
  'selective', the part it does not keep)."""
  if remat in ('always', 'selective'):
    return True
  if remat == 'except_last':
    return micro_batch != num_micro_batches - 1
  return False


def ActionCost(action, stage, defers_w, remat, num_micro_batches):
  """Seconds `action` takes alone, from its stage's `StageCost`: the
  action's overhead once, plus the cost of each piece of work its kind does
  (actions.Kind.does; a work of one's own: its Work.seconds, or 0)."""
  j = action.micro_batch
  accumulate = stage.accumulate if j else 0.0
  cost = 0.0
  for work in actions.Does(action):
    if work == schedules.FORWARD:
      cost += stage.forward
    elif work == schedules.WEIGHT:
      cost += W_SHARE * stage.backward + accumulate + stage.defer_w
    elif work != schedules.BACKWARD:
      seconds = actions.WorkOf(work).seconds
      cost += seconds(stage) if seconds else 0.0
    else:
      cost += stage.backward * ((1 - W_SHARE) if defers_w else 1.0)
      if ReRuns(remat, j, num_micro_batches):
        cost += stage.recompute
      cost += 0.0 if defers_w else accumulate
  return cost + stage.overhead


def _TransferBytes(need, action, stages):
  """Bytes `action` receives from `need` on another stage: what crosses
  between stages s and s+1 is stage s's output (forward) or its gradient
  (backward), the same size, whatever kinds the two actions are; nothing
  crosses within a stage."""
  if need.stage == action.stage:
    return 0
  return stages[min(need.stage, action.stage)].out_bytes


def AllReduceTime(num_bytes, num_replicas, bandwidth, latency):
  """Seconds of a ring all-reduce of `num_bytes` over R devices."""
  if num_replicas <= 1 or not num_bytes:
    return 0.0
  r = num_replicas
  return 2 * (r - 1) * (num_bytes / r / bandwidth + latency)


def SimulateStep(schedule, stages, hardware, remat, num_replicas=1,
                 first_device=0, fixed=0.0, replica_concurrency=None):
  """Simulates one training step of a layout; see the module docstring.

  Args:
    schedule: the replica's `schedules.Schedule` (D devices, S stages).
    stages: S `StageCost`s.
    hardware: a calibrated `hardware.Hardware`.
    remat: the pipeline's remat mode (executor.REMAT_MODES).
    num_replicas: R; replica r uses global devices first_device + r * D ..
      + D - 1.
    first_device: the global index of replica 0's first device.
    fixed: seconds the step pays once, after the update.
    replica_concurrency: (1.0, throughput with 2 replicas on a host, 4,
      ...) each running one action, relative to one; None: the host's
      concurrency at (running actions x replicas on the host).

  Returns:
    A `Step`.
  """
  d_count, m = schedule.num_devices, schedule.num_micro_batches
  defer_w = schedule.defers_w
  glob = lambda d: first_device + d  # pylint: disable=unnecessary-lambda-assignment
  lists, cost, needs = {}, {}, {}
  for d, device in enumerate(schedule.actions):
    lists[d] = list(device)
    for a in device:
      cost[a] = ActionCost(a, stages[a.stage], defer_w, remat, m)
      needs[a] = [
          (n, hardware.Transfer(_TransferBytes(n, a, stages),
                                glob(schedule.stage_devices[n.stage]),
                                glob(d)))
          for n in schedule.Needs(a)]
  # All-reduce, then update, of each device's stages, after its actions.
  span_hosts = (num_replicas * d_count > hardware.devices_per_host)
  bandwidth = (hardware.network_bandwidth if span_hosts and
               hardware.num_hosts > 1 else
               hardware.link_bandwidth or hardware.memory_bandwidth)
  reduce_time, update_time = {}, {}
  for d in range(d_count):
    mine = [stages[s] for s in schedule.Stages(d)]
    reduce_time[d] = AllReduceTime(sum(s.grad_bytes for s in mine),
                                   num_replicas, bandwidth, hardware.latency)
    update_time[d] = sum(s.update for s in mine)
    last = lists[d][-1] if lists[d] else None
    ar, up = ('allreduce', d), ('update', d)
    lists[d] += [ar, up]
    cost[ar], cost[up] = reduce_time[d], update_time[d]
    # A ring needs every device of the ring; by symmetry, the other
    # replicas' device d ends its backward when this one does.
    needs[ar] = [(last, 0.0)] if last is not None else []
    needs[up] = [(ar, 0.0)]
  group, throughput = None, None
  if hardware.shared:
    per_host = max(1, min(num_replicas,
                          hardware.devices_per_host // max(d_count, 1)))
    group = {d: hardware.Host(glob(d)) for d in range(d_count)}
    if replica_concurrency and per_host > 1:
      gain = hardware_lib.Interpolate(
          [(2 ** i, c) for i, c in enumerate(replica_concurrency)], per_host)
      throughput = lambda n: hardware.Throughput(n) * gain / per_host  # pylint: disable=unnecessary-lambda-assignment
    else:
      throughput = lambda n: hardware.Throughput(n * per_host) / per_host  # pylint: disable=unnecessary-lambda-assignment
  times = Run(lists, cost, needs, group, throughput)
  spans = {a: t for a, t in times.items()
           if isinstance(a, schedules.Action)}
  first = min(s for s, _ in spans.values())
  last = max(e for _, e in spans.values())
  busy = sum(e - s for s, e in spans.values())
  pipeline = last - first
  bubble = 1.0 - busy / (d_count * pipeline) if pipeline else 0.0
  return Step(time=max(e for _, e in times.values()) - first + fixed,
              pipeline=pipeline,
              spans={a: (s - first, e - first) for a, (s, e) in spans.items()},
              bubble=bubble, allreduce=max(reduce_time.values()),
              update=max(update_time.values()), fixed=fixed)
