"""The planner's ranked layouts next to the trainer's own steps, read as a
user reads them.

For one experiment (default: the Tiny LM with 8 layers, a model the
planner's other bench, bench/planner_bench.py, never calibrates on), in
one run and one process at a time:

  1. `trainer.py --mode=plan --plan_measure --worker_split_size=K` as a
     user runs it, its ranked layouts read from the logdir's
     plan/layouts.json (each layout's prediction and the flags that run
     it);
  2. each chosen layout run by `trainer.py` with those flags for
     `--warmup` + `--steps` steps, a progress line every 10 steps (and no
     checkpoint before the last step: the planner does not cost them); its
     step time is the wall time between the progress lines of steps
     `--warmup` and the last, over the steps between them, from the absl
     timestamps of the trainer's stderr;
  3. the first layout run again at the end: how far the machine's speed
     drifted during the run.

The machine is shared and its speed drifts (the same layout's trainer
steps took 170 ms and 200 ms twenty minutes apart, nothing else running
here): a fixed matrix product (numpy, `_Probe`) is timed before and after
the plan and each run, and the errors are given raw and with each run's
step scaled to the machine's speed during the plan (x the plan's probe /
the run's).

It prints per layout the predicted and measured step times, the error,
and the median and worst |error| and Spearman's rank correlation, next to
the targets (median <= 10%, worst <= 25%, Spearman >= 0.8).

Run on a quiet machine (nothing else running: the ratios are of times):
  .venv/bin/python bench/plan_vs_trainer.py [--model deep] [--devices 4]
      [--ranks 1,2,3,5,8,13,21] [--warmup 20] [--steps 100]
  --model is a name of MODELS or a registry key; --override adds params
  overrides ('a.b=1;c=2') to every run.
"""
import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import bench_log
import planner_bench

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TINY = 'lm.one_billion_wds.OneBWdsGPipeTransformerTiny'
# name -> (registry key, params overrides).
MODELS = {
    'tiny': (_TINY, ''),
    'deep': (_TINY, 'task.stack_tpl.num_layers=8'),
    'resnet': ('image.shapes_resnet.ShapesResNetTiny', ''),
    'mlp': ('examples.pipelined_mlp.PipelinedMlp', ''),
}
# A progress line of the train loop (train_report.ProgressLine), in absl's
# format: 'I1127 18:55:01.123456 4242 programs.py:735] step 20/120  loss'.
_PROGRESS = re.compile(r'^I(\d{4}) (\d\d:\d\d:\d\d\.\d+) +\d+ [\w.]+:\d+\] '
                       r'step (\d+)/\d+  loss')


def _Trainer(args, logdir, timeout):
  """Runs trainer.py with `args`; returns its stderr (raises on a
  non-zero exit, with its tail)."""
  cmd = [sys.executable, os.path.join(_ROOT, 'trainer.py'),
         f'--logdir={logdir}'] + list(args)
  proc = subprocess.run(cmd, capture_output=True, text=True, cwd=_ROOT,
                        timeout=timeout, check=False,
                        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'))
  if proc.returncode:
    raise RuntimeError(f'{" ".join(cmd)} exited {proc.returncode}:\n'
                       f'{proc.stderr[-3000:]}')
  return proc.stdout, proc.stderr


def StepSeconds(stderr, first_step):
  """Seconds a step between the progress lines of `first_step` and the
  last, from their absl timestamps (the wall time a user reads)."""
  times = {}
  for line in stderr.splitlines():
    m = _PROGRESS.match(line)
    if m:
      stamp = datetime.datetime.strptime(m.group(2), '%H:%M:%S.%f')
      times[int(m.group(3))] = stamp
  if first_step not in times or max(times) <= first_step:
    raise RuntimeError(f'no progress lines at step {first_step} and after '
                       f'it: {sorted(times)}')
  last = max(times)
  seconds = (times[last] - times[first_step]).total_seconds()
  if seconds < 0:   # Past midnight.
    seconds += 86400
  return seconds / (last - first_step)


def _Probe(size=1024, repeats=9):
  """Seconds of a fixed float32 matrix product on this host (the median of
  `repeats`): the machine's speed at this moment."""
  rng = np.random.default_rng(0)
  a = rng.standard_normal((size, size), dtype=np.float32)
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    for _ in range(8):
      a = np.tanh(a @ a * (1.0 / size))
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def _Override(*parts):
  return ';'.join(p for p in parts if p)


def _WithOverrides(flags, extra):
  """`flags` (a layout's, from layouts.json) with `extra` overrides joined
  to its --model_params_override (the trainer refuses the flag twice)."""
  out, joined = [], False
  for f in flags:
    if f.startswith('--model_params_override='):
      f = '--model_params_override=' + _Override(extra, f.split('=', 1)[1])
      joined = True
    out.append(f)
  if not joined and extra:
    out.append(f'--model_params_override={extra}')
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--model', default='deep')
  parser.add_argument('--override', default='')
  parser.add_argument('--devices', type=int, default=4,
                      help='--worker_split_size of the plan: the logical '
                      'CPUs it lays out.')
  parser.add_argument('--ranks', default='1,2,3,5,8,13,21',
                      help='Which of the ranked layouts to run.')
  parser.add_argument('--warmup', type=int, default=20)
  parser.add_argument('--steps', type=int, default=100)
  args = parser.parse_args()
  key, overrides = MODELS.get(args.model, (args.model, ''))
  overrides = _Override(overrides, args.override)
  ranks = [int(r) for r in args.ranks.split(',')]
  root = tempfile.mkdtemp(prefix='plan_vs_trainer_')
  bench_log.Say(f'{key} ({overrides or "no overrides"}): --mode=plan '
                f'--plan_measure on {args.devices} devices...')
  plan_flags = [f'--model={key}', '--mode=plan', '--plan_measure',
                f'--worker_split_size={args.devices}',
                f'--plan_top={max(ranks)}']
  if overrides:
    plan_flags.append(f'--model_params_override={overrides}')
  before = _Probe()
  out, _ = _Trainer(plan_flags, os.path.join(root, 'plan'), 3600)
  plan_speed = (before + _Probe()) / 2
  print(out, flush=True)
  with open(os.path.join(root, 'plan', 'plan', 'layouts.json')) as f:
    ranked = json.load(f)
  chosen = [r for r in ranked if r['rank'] in ranks and r['fits'] is not
            False]
  total = args.warmup + args.steps
  train = _Override(f'task.train.log_interval_steps=10;'
                    f'task.train.save_interval_steps={total}', overrides)
  rows, failed = [], []
  for i, entry in enumerate(chosen + chosen[:1]):
    again = i == len(chosen)
    bench_log.Say(f'rank {entry["rank"]} {entry["name"]}'
                  f'{" (again)" if again else ""}: {total} steps of '
                  f'trainer.py ({i + 1}/{len(chosen) + 1})...')
    before = _Probe()
    try:
      _, err = _Trainer(
          _WithOverrides(entry['flags'], train) + [f'--max_steps={total}'],
          os.path.join(root, f'run{i}'), 3600)
    except RuntimeError as e:   # A ranked layout that does not run: said.
      last = str(e).strip().splitlines()[-1]
      print(f'  rank {entry["rank"]} {entry["name"]} FAILED: {last}',
            flush=True)
      failed.append(entry)
      continue
    speed = (before + _Probe()) / 2
    rows.append((entry, StepSeconds(err, args.warmup), plan_speed / speed))
  drift = rows[-1][1] / rows[0][1] if len(rows) > 1 else float('nan')
  rows = rows[:-1]
  print(f'\n{key} ({overrides or "no overrides"}), {args.devices} devices; '
        f'measured: trainer.py steps {args.warmup}..{total} between '
        'progress lines')
  print(f'{"rank":>4}  {"layout":<44}{"predicted ms":>13}{"measured ms":>12}'
        f'{"error":>8}{"x speed":>9}{"scaled":>9}')
  pred, meas, scaled = [], [], []
  for entry, seconds, factor in rows:
    p = entry['step_seconds']
    pred.append(p)
    meas.append(seconds)
    scaled.append(seconds * factor)
    print(f'{entry["rank"]:>4}  {entry["name"]:<44}{1000 * p:13.1f}'
          f'{1000 * seconds:12.1f}{100 * (p / seconds - 1):+7.1f}%'
          f'{factor:9.3f}{100 * (p / (seconds * factor) - 1):+8.1f}%')
  for title, got in (('raw', meas), ('scaled to the plan\'s speed', scaled)):
    errs = [abs(p / m - 1) for p, m in zip(pred, got)]
    print(f'{title}: |error| median {100 * statistics.median(errs):.1f}% '
          f'(target <= 10%), worst {100 * max(errs):.1f}% (target <= 25%); '
          f'Spearman {planner_bench.Spearman(pred, got):.2f} (target >= 0.8)'
          f' over {len(rows)} layouts')
  print(f'the first layout again at the end took {drift:.2f}x its first '
        'time (the machine\'s drift)')
  if failed:
    print(f'{len(failed)} ranked layouts failed to run: ' +
          ', '.join(e['name'] for e in failed))


if __name__ == '__main__':
  sys.exit(main())
