"""The planner's ranked layouts as a user reads them: ranks and ties, the
table, how sure it is, the best layout's flags, and its simulated timeline.

  Rank             predictions in step-time order, those that fit first.
  Best             the layout chosen: the simplest layout within TIE of the
                   fastest (a tie goes to the smaller layout).
  Report           the table and the lines around it (plan.txt).
  Uncertainty      how far off the plan's figures may be, and from what.
  BestText         the exact flags and params overrides of the best layout;
                   a shortlist instead when the plan cannot tell its best
                   layouts apart (Uncertainty above UNSURE).
  SimulatedChart   a prediction's timeline as the timeline tool draws it.
  LayoutsJson      the table for scripts (plan/layouts.json).

Example:
  ranked, counts = planner.Search()
  print(Report(key, model, hw, costs, ranked, counts, top=10, seconds=1.0))
  print(BestText(key, model, ranked, logdir='/tmp/run'))
"""
import json
import os
import statistics

import tensorflow as tf

from cadence.framework import atomic_file
from cadence.framework.pipeline import memory_estimate
from cadence.framework.pipeline import schedules
from cadence.framework.pipeline import timeline as timeline_lib
from cadence.framework.pipeline import timeline_chart
from cadence.framework.planning import hardware as hardware_lib
from cadence.framework.planning import plan_costs

TIE = 0.02                     # Step times this close rank as equal.
# A plan whose figures may be further off than this (its fit's worst error
# on the real steps it was fitted to) names no best layout: a shortlist of
# the layouts it cannot tell apart instead. The bar for the plan's
# worst error against the trainer's steps (issue 49).
UNSURE = 0.20
# The trainer as a printed command runs it: the README's from a checkout
# (setup.py beside the package's files; a wheel leaves it out), else the
# installed command.
_CADENCE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
TRAINER_COMMAND = ('.venv/bin/python trainer.py' if os.path.isfile(
    os.path.join(_CADENCE_DIR, 'setup.py')) else 'cadence-trainer')


def _Simple(p):
  """What makes a layout simpler: fewer devices (R x K), then fewer
  micro-batches, then fewer stages."""
  lay = p.layout
  return (lay.replicas * lay.devices, lay.micro_batches, lay.stages)


def Rank(predictions):
  """`predictions` in step-time order: those that fit (or may) before
  those that do not; equal times by _Simple, then the schedules' registry
  order (the default first), then name: an order that does not depend on
  the search's."""
  names = schedules.Names()

  def _Registered(p):
    name = p.layout.schedule
    return names.index(name) if name in names else len(names)

  return sorted(predictions, key=lambda p: (
      p.fits is False, p.step.time, _Simple(p), _Registered(p),
      p.layout.Name()))


def RankOf(ranked, prediction):
  """The table's rank (1-based) of `prediction`, an item of `ranked`."""
  return next(i for i, p in enumerate(ranked) if p is prediction) + 1


def Best(ranked):
  """The layout chosen of `ranked` (Rank's order): the simplest (_Simple)
  of the layouts that fit within TIE of the fastest that fits (its step
  time is within the cost model's error of the fastest: less to go wrong,
  less memory for transfers); `ranked[0]` if none fits."""
  fits = [p for p in ranked if p.fits is not False]
  if not fits:
    return ranked[0]
  tied = [p for p in fits if p.step.time <= fits[0].step.time * (1 + TIE)]
  return min(tied, key=_Simple)


_Ms = timeline_chart.FormatMs   # The table's and the chart's ms alike.


def ConcurrencyText(concurrency):
  """The fitted {micro-batch size: concurrency} as text."""
  return ', '.join(f'{c[1]:.2f} at {b} examples a micro-batch'
                   for b, c in sorted(concurrency.items()))


def _OverheadsText(costs, o, concurrency, scales=None,
                   replica_concurrency=None):
  if not costs.steps:
    return ''
  steps = ', '.join(
      f'R={l.replicas} K={l.devices}'
      f'{f" S={l.stages}" if l.stages != l.devices else ""} '
      f'M={l.micro_batches} {l.schedule}: {_Ms(t)} ms'
      for l, t in sorted(costs.steps.items()))
  fitted = (f', and the throughput of 2 actions at once on a host '
            f'{ConcurrencyText(concurrency)} (the cluster line gives the '
            'probe\'s)') if concurrency else ''
  fitted += (f', of 2 replicas on a host {replica_concurrency[1]:.2f}'
             if replica_concurrency else '')
  fitted += (', the units\' timed seconds x ' + ', '.join(
      f'{f:.3f} at {b} examples a micro-batch'
      for b, f in sorted(scales.items()))) if scales else ''
  return (f'; fitted to real steps ({steps}): {_Ms(o.layer)} ms a unit '
          f'of an action, {_Ms(o.action)} ms an action, {_Ms(o.defer_w)} ms '
          f'a unit of a micro-batch\'s deferred W, {_Ms(o.step)} ms a '
          f'step, {_Ms(o.replica)} ms a replica beyond the first{fitted}')


def TieLabels(ranked, top, best=None):
  """Per row of the table (the first `top` of `ranked`): the rank of the
  first row whose step time is within TIE of its own, if another row ties
  with it, else ''; `best`'s row (the layout chosen) marked '*'."""
  rows = ranked[:top]
  out = []
  for i, p in enumerate(rows):
    tied = [j for j, q in enumerate(rows) if j != i and _Ties(p, q)]
    out.append((str(min([i] + tied) + 1) if tied else '') +
               ('*' if p is best else ''))
  return out


def _Ties(a, b):
  """Whether two predictions' step times are within TIE of each other."""
  low, high = sorted((a.step.time, b.step.time))
  return high <= low * (1 + TIE)


def _Row(rank, p, tie=''):
  lay = p.layout
  fmt = memory_estimate.FormatBytes
  fits = {None: '?', True: 'yes', False: 'NO'}[p.fits]
  cut = 'even' if lay.bounds is None else '/'.join(
      str(b - a) for a, b in zip(lay.bounds, lay.bounds[1:]))
  return (f'{rank:>4} {lay.replicas:>2} {lay.devices:>2} {lay.per_device:>2}'
          f' {lay.micro_batches:>3}  {lay.schedule:<16} {lay.remat:<12}'
          f'{cut:<12}{_Ms(p.step.time):>10}{p.examples_per_sec:>11.1f}'
          f'{100 * p.mfu:>7.1f}%{p.step.bubble:>7.2f}'
          f'{fmt(max(p.memory)):>13}{"1/R" if lay.shard else "whole":>7}'
          f'{fits:>5}{tie:>5}')


_HEADER = (f'{"rank":>4} {"R":>2} {"K":>2} {"v":>2} {"M":>3}  '
           f'{"schedule":<16} {"remat":<12}{"cut":<12}{"step ms":>10}'
           f'{"examples/s":>11}{"MFU":>8}{"bubble":>7}{"memory/dev":>13}'
           f'{"slots":>7}{"fits":>5}{"tie":>5}')


def Uncertainty(calibration, hw=None):
  """(error, what it is): how far off the plan's step times may be, the
  worst |error| of the fit on the real steps it was fitted to
  (`calibration`: CalibrationErrors), else, on a cluster with the op
  model, the published check's median (hardware.PUBLISHED_CHECK); (None,
  '') where nothing was checked (FLOPs at a flat rate)."""
  if calibration:
    return (max(abs(e) for e in calibration.values()),
            f'its fit\'s worst error on the {len(calibration)} real steps it '
            'was fitted to')
  if hw is not None and hw.op_model:
    return (hardware_lib.PUBLISHED_CHECK['median'],
            'the op model\'s median error against published step times')
  return None, ''


def Candidates(ranked, error):
  """The layouts that fit within `error` of the fastest that fits (any of
  them may be the fastest in fact), in `ranked`'s order."""
  fits = [p for p in ranked if p.fits is not False]
  return [p for p in fits if p.step.time <= fits[0].step.time * (1 + error)]


def Sureness(ranked, calibration, hw=None):
  """One line: where the costs came from, how far the cost model was off
  where it could be checked (`calibration`: CalibrationErrors of the
  measured steps; else, for a cluster with the op model, the published
  check of hardware.PUBLISHED_CHECK), and how many of the layouts lie
  within that error of the best (Candidates: any of them may be the
  fastest in fact)."""
  def _Close(error):
    n = len(Candidates(ranked, error))
    if not n:
      return ''
    return (f' {n} layout{"s" if n != 1 else ""} lie within '
            f'{100 * error:.1f}% of the best: any of them may be the '
            'fastest.')

  error, _ = Uncertainty(calibration, hw)
  if calibration:
    median = statistics.median(abs(e) for e in calibration.values())
    return (f'How sure: the units\' times were measured on this host; the '
            f'overheads and the host\'s concurrency fitted to '
            f'{len(calibration)} real steps, which the model then predicts '
            f'within {100 * median:.1f}% (median) and {100 * error:.1f}% '
            f'(worst: in sample).' + _Close(error))
  if error is not None:
    check = hardware_lib.PUBLISHED_CHECK
    return (f'How sure: the costs are each op\'s FLOPs and bytes on the '
            'cluster\'s public specifications, not measured; the same op '
            f'model against {check["rows"]} published step times of '
            f'pipelined training from {check["sources"]} sources '
            f'(bench/published_check.py) is off by '
            f'{100 * check["median"]:.1f}% at the median and '
            f'{100 * check["worst"]:.0f}% at worst.' + _Close(error))
  return ('How sure: the costs are FLOPs at the cluster\'s peak x '
          'efficiency, not measured and not checked against measured step '
          'times, so read the ranking as a guide, not a measurement.')


def _UnitNames(model):
  """'layer0..layer3' (the plan's unit names, first and last)."""
  names = model.unit_names
  return names[0] if len(names) == 1 else f'{names[0]}..{names[-1]}'


def Report(key, model, hw, costs, predictions, counts, top, seconds,
           overheads=None, concurrency=None, scales=None, calibration=None,
           replica_concurrency=None):
  """The ranked table and how sure it is (Sureness; `calibration`: the
  CalibrationErrors of the planner), as text."""
  fits = [p for p in predictions if p.fits is not False]
  lines = [
      f'Layout plan of {key}: global batch {model.batch_size} '
      f'(input.batch_size; R replicas take batch_size / R each), '
      f'{model.num_units} units ({_UnitNames(model)}), '
      f'{model.flops * 3 / 1e9:.4g} GFLOP a '
      'training step.',
      f'Cluster {hw.Describe()}.',
      f'Costs: {costs.source}' + (f' ({costs.seconds:.0f} s of timing)' if
                                   costs.seconds else '') +
      _OverheadsText(costs, overheads or plan_costs.Overheads(),
                     concurrency or {}, scales, replica_concurrency) +
      f'; {len(predictions)} layouts simulated, {seconds:.1f} s in all '
      f'({counts["dominated"]} dominated by a cheaper remat that fits, '
      f'{counts["refused"]} sizes refused by their schedule, '
      f'{counts.get("same", 0)} the same action lists as another '
      'schedule\'s); '
      f'{len(predictions) - len(fits)} do not fit.',
      'R replicas x K devices x v stages per device (S = K v stages), M '
      'micro-batches; cut: units per stage; memory/dev: the largest '
      'device\'s peak' + (' (the host\'s devices share its memory: fits '
                          'counts them all)' if hw.shared else '') + '.',
      _HEADER]
  ties = TieLabels(predictions, top, Best(predictions) if fits else None)
  lines += [_Row(i + 1, p, tie)
            for i, (p, tie) in enumerate(zip(predictions[:top], ties))]
  if any(ties):
    lines.append(
        f'Rows in step-time order. tie: the first rank within {100 * TIE:g}% '
        'of the row\'s step time; *: the layout chosen, the simplest within '
        f'{100 * TIE:g}% of the fastest (fewer devices, R x K, then fewer '
        'micro-batches, then fewer stages).')
  if not fits:
    lines.append('No layout fits the cluster\'s memory.')
  lines.append(Sureness(predictions, calibration, hw))
  return '\n'.join(lines) + '\n'


def Shortlist(candidates):
  """Of `candidates` (Rank's order), the fastest on each number of devices
  (R x K), fewest devices first: the choices that differ in what they
  take."""
  out = {}
  for p in candidates:
    out.setdefault(p.layout.replicas * p.layout.devices, p)
  return [out[n] for n in sorted(out)]


def BestText(key, model, ranked, params_file=None, logdir='',
             calibration=None, hw=None):
  """The command that runs the layout chosen (Best of `ranked`;
  TRAINER_COMMAND: as pasted in the repository, or the installed command)
  in `logdir` (the plan's --logdir; else a fresh one of its own). When
  the plan's figures may be off by more than UNSURE (Uncertainty) and
  more than one layout lies within that of the fastest, it names no best
  plan: it says the plan cannot tell them apart, lists the Shortlist,
  and gives the chosen layout's command as a place to start."""
  best = Best(ranked)
  rank = RankOf(ranked, best)
  logdir = logdir or f'/tmp/cadence_plan_{key.rsplit(".", 1)[-1]}'
  figures = (f'{best.layout.Name()}: {_Ms(best.step.time)} ms a step, '
             f'{best.examples_per_sec:.1f} examples/s, MFU '
             f'{100 * best.mfu:.1f}%, bubble {best.step.bubble:.2f}')
  command = (f'  {TRAINER_COMMAND} '
             f'{model.Flags(best.layout, key, params_file)} '
             f'--logdir={logdir}\n')
  chosen = (f'rank {rank}, the simplest within {100 * TIE:g}% of the '
            'fastest' if rank > 1 else 'rank 1')
  error, what = Uncertainty(calibration, hw)
  candidates = Candidates(ranked, error) if error is not None else []
  if error is None or error <= UNSURE or len(candidates) < 2:
    return f'Best layout ({chosen}): {figures}.\n' + command
  shown = Shortlist(candidates)
  return (
      f'No best layout: the plan\'s step times may be off by '
      f'{100 * error:.1f}% ({what}; above {100 * UNSURE:g}%), and '
      f'{len(candidates)} layouts lie within that of the fastest: the plan '
      'cannot tell them apart. The shortlist, the fastest of them on each '
      'number of devices (layouts.json gives each layout\'s flags; time '
      'them with trainer.py before choosing):\n' +
      ''.join(f'  rank {RankOf(ranked, p)}: {p.layout.Name()}: '
              f'{_Ms(p.step.time)} ms a step, on '
              f'{p.layout.replicas * p.layout.devices} device(s)\n'
              for p in shown) +
      f'A layout to start from, not a confident best ({chosen}): '
      f'{figures}.\n' + command)


def SimulatedTimeline(prediction, device_names=None):
  """A timeline.Timeline of a prediction's simulated actions (replica 0):
  the timeline tool's object, built from one op event per action named in
  its scope, so it draws the same chart."""
  lay = prediction.layout
  devices = device_names or [f'/device:SIM:{d}' for d in range(lay.devices)]
  events = [timeline_lib.OpEvent(f'{a.scope}/simulated', s, e)
            for a, (s, e) in prediction.step.spans.items()]
  return timeline_lib.Timeline(events, devices, schedule=lay.schedule)


def _After(step):
  """The chart's bands for what a simulated step pays after its last
  action, as the plan's table counts it: [(name, seconds, what)]."""
  rest = max(0.0, step.time - step.fixed - step.pipeline)
  parts = [(n, what, t) for n, what, t in (
      ('all-reduce', 'gradient all-reduce', step.allreduce),
      ('update', 'optimizer update', step.update)) if t > 0]
  out = []
  if parts and rest > 0:
    out.append((' and '.join(n for n, _, _ in parts), rest,
                'from the last action\'s end to the end of the last '
                'device\'s ' + ' and '.join(
                    f'{what} (up to {_Ms(t)} ms a device)'
                    for _, what, t in parts) +
                '; each device\'s starts after its own last action'))
  if step.fixed > 0:
    out.append(('fixed', step.fixed, 'what a step pays once beyond its '
                'actions, all-reduce and update (the loop, the gradients\' '
                'norm and clipping, each replica beyond the first), fitted '
                'to the real steps --plan_measure timed'))
  return out


def SimulatedChart(prediction):
  """The chart of a prediction's simulated step (SVG text): its pipeline's
  actions, then bands for what the step pays after them, so that the time
  axis ends, and the title adds up, at the step time of the plan's
  table."""
  step, lay = prediction.step, prediction.layout
  timeline = SimulatedTimeline(prediction)
  after = _After(step)
  title = (f'Simulated step of {lay.Name()} (planner): {_Ms(step.time)} '
           'ms (the step time of the plan\'s table) = '
           f'{_Ms(step.pipeline)} ms of pipeline actions ({lay.stages} '
           f'stages x {lay.micro_batches} micro-batches; bubble '
           f'{step.bubble:.2f}, ideal {timeline.ideal_bubble:.2f})' +
           ''.join(f' + {_Ms(seconds)} ms {name}'
                   for name, seconds, _ in after))
  return timeline_chart.Svg(
      timeline, title=title, after=after,
      idle='the device waits for an action it needs (and its transfer '
      'from another device)')


def WriteTimeline(prediction, folder):
  """Writes plan_timeline.svg (SimulatedChart) and plan_timeline.txt (its
  actions' times, Timeline.SpanTable) to `folder`; returns the chart's
  path."""
  path = os.path.join(folder, 'plan_timeline.svg')
  WriteText(path, SimulatedChart(prediction))
  WriteText(os.path.join(folder, 'plan_timeline.txt'),
             SimulatedTimeline(prediction).SpanTable())
  return path


def WriteText(path, text):
  """Writes `text` to `path` whole or not at all (a temporary file, then a
  rename)."""
  tf.io.gfile.makedirs(os.path.dirname(path) or '.')
  atomic_file.Write(path, text)


def LayoutsJson(key, model, predictions, best=None):
  """The ranked table for scripts (plan/layouts.json): per layout its
  name, predicted step seconds, largest device's bytes, whether it fits
  (null: unknown), whether it is `best` (the layout chosen) and the trainer
  flags that run it."""
  return json.dumps([
      dict(rank=i + 1, name=p.layout.Name(), step_seconds=p.step.time,
           memory_bytes=max(p.memory), fits=p.fits, chosen=p is best,
           flags=model.FlagList(p.layout, key))
      for i, p in enumerate(predictions)], indent=1) + '\n'
