"""The trainer's loop against a hand-written tf.function loop, and start-up.

1. Steps/sec, in one process, of
   * `programs.TrainProgram.Run` (what `trainer.py --job=trainer` runs:
     multi-step tf.function loops, step seeds, skip checks, summaries every
     20 steps, a progress line every 100, checkpoints), timed between its
     checkpoint at max_steps/2 and the one at max_steps (so tracing is
     excluded and exactly one checkpoint save is included);
   * a hand-written loop: `for batch in dataset: train_step(batch)` with a
     `tf.function` train step (forward, tape, learner.Apply) over the same
     task params, learner and input generator, warmed up, then timed;
   for the tiny regression experiment (8 -> 16 -> 1, batch 32) and a wider
   one (256 -> 512 -> 512 -> 1, batch 256). Interleaved repeats; medians.
   Both loops run the same updates on the same batches from the same
   initial weights, so the table also gives the largest difference of
   their final weights (a check that the comparison is like for like).
2. Time from command start to the first train step: `python -m
   cadence.trainer --job=trainer --max_steps=1`, wall time from Popen to
   the "First step done" log line, beside `python -c "import tensorflow"`.
3. (`--lm`) The same for the README's main job, `trainer.py
   --model=lm.one_billion_wds.OneBWdsGPipeTransformerTiny
   --worker_split_size=2` (trainer_and_evaler, a fresh logdir, stopped at
   the "First step done" line), in interleaved repeats, with the CPU seconds
   the process used; with `--baseline_root DIR` (a checkout of another
   revision, e.g. `git archive main | tar -x -C /tmp/base/cadence`) the same
   command of that checkout too, and the ratio of the medians.
4. (`--grappler`) The same main job with `--graph_optimizer` true and
   false, interleaved, run to its second progress line (step 100): start to
   the first step (wall, the process's CPU seconds from /proc, and the
   first step's own time as the trainer logs it), start to step 50 (the
   multi-step loop compiled too; wall and CPU), and the steady step time
   between the progress lines of steps 50 and 100 (wall and CPU), with the
   ratios off / on of the medians.
5. (`--watcher`) `TrainProgram.Run`'s steps/s (as in 1., tiny model) with
   the preemption watcher's signal handlers installed, so that its loop
   runs in the watcher's worker thread, against without; interleaved.
6. (`--lm_steps`) The Tiny LM's train step as the trainer runs it (its
   compiled loop on its own input: `TrainProgram.StepRunner`) in four
   layouts (K devices, M micro-batches, schedule, remat), each checkout in
   a process of its own with 4 logical CPUs, `--repeats` processes per
   checkout, alternating; with `--baseline_root` the same for that
   checkout and the ratios of the medians. (A baseline before
   TrainProgram.StepRunner existed is timed through the loop's private
   methods, which StepRunner wraps.)

Run:
  .venv/bin/python bench/trainer_bench.py [--repeats 3]
  .venv/bin/python bench/trainer_bench.py --lm --repeats 5 \
      --baseline_root /tmp/base/cadence
  .venv/bin/python bench/trainer_bench.py --grappler --repeats 3
  .venv/bin/python bench/trainer_bench.py --watcher --repeats 5
  .venv/bin/python bench/trainer_bench.py --lm_steps --repeats 3 \
      --baseline_root /tmp/base/cadence
"""
import argparse
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import bench_log
import numpy as np
import tensorflow as tf

from cadence.framework import model_registry
from cadence.framework.train import preemption
from cadence.framework.train import programs

_LM_KEY = 'lm.one_billion_wds.OneBWdsGPipeTransformerTiny'
_KEY = 'synthetic.linear_regression.RegressionTiny'
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_CONFIGS = {
    'tiny (8-16-1, b32)': dict(input_dim=8, hidden=[16], batch=32),
    'wide (256-512-512-1, b256)': dict(input_dim=256, hidden=[512, 512],
                                       batch=256),
}


def _Params(cfg, steps):
  p = model_registry.GetParams(_KEY, 'Train')
  p.input.Set(input_dim=cfg['input_dim'], batch_size=cfg['batch'])
  p.task.Set(input_dim=cfg['input_dim'], hidden_dims=cfg['hidden'])
  p.task.train.Set(max_steps=steps, save_interval_steps=steps // 2,
                   summary_interval_steps=20, log_interval_steps=100)
  return p


def _Weights(task):
  return {k: v.numpy() for k, v in task.vars.FlattenItems()}


def TrainerLoop(cfg, steps, signals=()):
  """(steps/sec between TrainProgram.Run's two checkpoints, final weights).

  With `signals`, a preemption watcher handles them during the run (the
  compiled loop then runs in its worker thread).
  """
  times = {}
  with tempfile.TemporaryDirectory() as logdir, preemption.Watcher(
      signals) as watcher:
    task = _Params(cfg, steps).Instantiate().task
    stamp = lambda step: times.setdefault(step, time.perf_counter())
    program = programs.TrainProgram(task, logdir, peak_flops=1e12,
                                    on_checkpoint=[stamp], watcher=watcher)
    program.Run()
  return (steps // 2) / (times[steps] - times[steps // 2]), _Weights(task)


def HandWrittenLoop(cfg, steps):
  """(steps/sec of a plain per-step tf.function loop over the same model,
  learner and data, timed over the second half; final weights)."""
  params = _Params(cfg, steps)
  task = params.Instantiate().task
  learner = task.InstantiateLearner()
  learner.Build()
  dataset = params.input.Instantiate().Dataset()

  @tf.function
  def TrainStep(batch, step):
    with tf.GradientTape() as tape:
      metrics, _ = task.FPropTower(task.theta, batch)
    learner.Apply(step, tape, metrics.loss[0])
    return metrics.loss[0]

  warmup = steps // 2
  start = loss = None
  for i, batch in enumerate(dataset.take(steps)):
    if i == warmup:
      if loss is not None:   # The warm-up steps have finished.
        loss.numpy()
      start = time.perf_counter()
    loss = TrainStep(batch, tf.constant(i, tf.int64))
  loss.numpy()
  return (steps - warmup) / (time.perf_counter() - start), _Weights(task)


def StartupSeconds():
  """(seconds to 'First step done', total seconds) of a 1-step trainer run."""
  with tempfile.TemporaryDirectory() as logdir:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, '-m', 'cadence.trainer', f'--model={_KEY}',
         f'--logdir={logdir}', '--max_steps=1', '--job=trainer'],
        cwd=_ROOT, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
        text=True)
    first = None
    for line in proc.stderr:
      if first is None and 'First step done' in line:
        first = time.perf_counter() - start
    proc.wait()
    return first, time.perf_counter() - start


def LmStartupSeconds(root, baseline=False):
  """(wall, CPU) seconds from Popen to the Tiny LM's 'First step done'.

  Runs the README's main job of the checkout `root` in a fresh logdir and
  kills it after the first step. A `baseline` checkout must be a folder
  named `cadence`: its parent goes first on PYTHONPATH, so the package is
  imported from there and not from the installed one.
  """
  logdir = tempfile.mkdtemp(prefix='trainer_bench_lm_')
  env = _Env(root if baseline else None)
  before = resource.getrusage(resource.RUSAGE_CHILDREN)
  start = time.perf_counter()
  proc = subprocess.Popen(
      [sys.executable, 'trainer.py',
       f'--model={_LM_KEY}', f'--logdir={logdir}', '--worker_split_size=2'],
      cwd=root, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
      text=True)
  first, tail = None, []
  for line in proc.stderr:
    tail = (tail + [line])[-20:]
    if 'First step done' in line:
      first = time.perf_counter() - start
      proc.send_signal(signal.SIGKILL)
      break
  proc.wait()
  after = resource.getrusage(resource.RUSAGE_CHILDREN)
  shutil.rmtree(logdir, ignore_errors=True)
  if first is None:
    raise RuntimeError(f'{root}: no "First step done" line:\n' +
                       ''.join(tail))
  return first, (after.ru_utime + after.ru_stime - before.ru_utime -
                 before.ru_stime)


def LmStartup(repeats, baseline_root=None):
  """Prints the Tiny LM start-up table (see the module docstring, 3.)."""
  roots = {'this checkout': _ROOT}
  if baseline_root:
    _CheckoutParent(baseline_root)
    roots = {'baseline': os.path.abspath(baseline_root), **roots}
  runs = {name: [] for name in roots}
  for r in range(repeats):   # Interleaved, alternating the order.
    for name in (list(roots) if r % 2 == 0 else list(roots)[::-1]):
      bench_log.Say(f'repeat {r + 1} of {repeats}: the Tiny LM main job to '
                    f'its first step ({name})...')
      runs[name].append(LmStartupSeconds(roots[name], name == 'baseline'))
  print('\n| Tiny LM main job | start -> first step done (s, median) | CPU s '
        '(median) | runs (s) |')
  print('| --- | --- | --- | --- |')
  medians = {}
  for name, results in runs.items():
    medians[name] = statistics.median(w for w, _ in results)
    print(f'| {name} ({roots[name]}) | {medians[name]:.2f} | '
          f'{statistics.median(c for _, c in results):.2f} | '
          f'{", ".join(f"{w:.1f}" for w, _ in results)} |')
  if baseline_root:
    print(f'\nthis checkout / baseline: '
          f'{medians["this checkout"] / medians["baseline"]:.2f}')


def _CpuSeconds(pid):
  """User + system CPU seconds the live process `pid` has used so far."""
  with open(f'/proc/{pid}/stat') as f:
    fields = f.read().rsplit(')', 1)[1].split()
  return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')


def LmGrapplerRun(enabled):
  """One run of the Tiny LM main job with --graph_optimizer=`enabled`.

  Returns:
    {'first' / 'first_cpu': wall / CPU s to 'First step done', 'logged':
    the first step's own time in that line, 'step50' / 'step50_cpu': wall
    / CPU s to the step 50 progress line, 'step_ms' / 'step_cpu_ms': wall
    / CPU ms per step between the step 50 and step 100 progress lines}.
  """
  logdir = tempfile.mkdtemp(prefix='trainer_bench_grappler_')
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')
  start = time.perf_counter()
  proc = subprocess.Popen(
      [sys.executable, 'trainer.py', f'--model={_LM_KEY}',
       f'--logdir={logdir}', '--worker_split_size=2',
       f'--graph_optimizer={str(enabled).lower()}'],
      cwd=_ROOT, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
      text=True)
  marks, tail, logged = {}, [], None
  for line in proc.stderr:
    tail = (tail + [line])[-20:]
    found = re.search(r'First step done .* in ([\d.]+) s', line)
    if found:
      logged = float(found.group(1))
    for key, text in (('first', 'First step done'),
                      (50, 'step 50/'), (100, 'step 100/')):
      if text in line and key not in marks:
        marks[key] = (time.perf_counter() - start, _CpuSeconds(proc.pid))
    if 100 in marks:
      proc.send_signal(signal.SIGKILL)
      break
  proc.wait()
  shutil.rmtree(logdir, ignore_errors=True)
  if len(marks) < 3:
    raise RuntimeError('no "First step done", "step 50/" and "step 100/" '
                       'lines:\n' + ''.join(tail))
  return dict(first=marks['first'][0], first_cpu=marks['first'][1],
              logged=logged, step50=marks[50][0],
              step50_cpu=marks[50][1],
              step_ms=(marks[100][0] - marks[50][0]) * 1000 / 50,
              step_cpu_ms=(marks[100][1] - marks[50][1]) * 1000 / 50)


def LmGrappler(repeats):
  """Prints the grappler on/off table (see the module docstring, 4.)."""
  runs = {True: [], False: []}
  for r in range(repeats):   # Interleaved, alternating the order.
    for enabled in ([True, False] if r % 2 == 0 else [False, True]):
      bench_log.Say(f'repeat {r + 1} of {repeats}: the Tiny LM main job, '
                    f'--graph_optimizer={str(enabled).lower()}...')
      runs[enabled].append(LmGrapplerRun(enabled))
  keys = ('first', 'first_cpu', 'logged', 'step50', 'step50_cpu',
          'step_ms', 'step_cpu_ms')
  med = {e: {k: statistics.median(run[k] for run in runs[e]) for k in keys}
         for e in runs}
  print(f'\nTiny LM main job ({_LM_KEY}, --worker_split_size=2), '
        f'median of {repeats} interleaved runs')
  print('| --graph_optimizer | start -> first step (s) | its CPU (s) | '
        'first step as logged (s) | start -> step 50 (s) | its CPU (s) | '
        'step, wall (ms) | step, CPU (ms) | runs: first step (s) / step '
        '(ms) |')
  print('| --- ' * 9 + '|')
  for enabled in runs:
    m = med[enabled]
    each = ', '.join(f'{run["first"]:.1f}/{run["step_ms"]:.0f}'
                     for run in runs[enabled])
    print(f'| {str(enabled).lower()} | {m["first"]:.2f} | '
          f'{m["first_cpu"]:.2f} | {m["logged"]:.2f} | {m["step50"]:.2f} | '
          f'{m["step50_cpu"]:.2f} | {m["step_ms"]:.1f} | '
          f'{m["step_cpu_ms"]:.1f} | {each} |')
  print('| off / on | ' + ' | '.join(
      f'{med[False][k] / med[True][k]:.3f}' for k in keys) + ' | |')


def ImportSeconds():
  start = time.perf_counter()
  subprocess.run([sys.executable, '-c', 'import tensorflow'], check=True,
                 env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'),
                 capture_output=True)
  return time.perf_counter() - start


def Watcher(repeats, steps):
  """Prints the preemption watcher table (see the module docstring, 5.)."""
  cfg = _CONFIGS['tiny (8-16-1, b32)']
  runs = {(): [], preemption.DEFAULT_SIGNALS: []}
  for r in range(repeats):   # Interleaved, alternating the order.
    for signals in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
      bench_log.Say(f'repeat {r + 1} of {repeats}: {steps} steps, '
                    f'{"signals handled" if signals else "no handlers"}...')
      runs[signals].append(TrainerLoop(cfg, steps, signals)[0])
  plain, watched = (statistics.median(runs[k]) for k in runs)
  print('| tiny (8-16-1, b32), trainer loop | steps/s (median) |')
  print('| --- | --- |')
  print(f'| no signal handlers (loop in the main thread) | {plain:.0f} |')
  print(f'| SIGTERM/SIGINT handled (loop in the watcher\'s thread) | '
        f'{watched:.0f} |')
  print(f'\nwatched / plain: {watched / plain:.3f} ({repeats} repeats, '
        f'{steps} steps)')


# (K devices, M micro-batches, schedule, remat) of --lm_steps.
_LM_LAYOUTS = [(1, 8, 'gpipe', 'never'), (2, 4, 'gpipe', 'never'),
               (2, 4, 'gpipe', 'except_last'), (2, 8, '1f1b', 'never')]


def _LayoutName(layout):
  return 'K={} M={} {} {}'.format(*layout)


def LmStepsChild(steps, rounds):
  """Prints {layout: median seconds a step} (JSON) of the Tiny LM's
  trainer step in each of _LM_LAYOUTS, built in this process (whichever
  cadence it imports), timed in `rounds` interleaved rounds."""
  from cadence.framework import cluster as cluster_lib  # pylint: disable=g-import-not-at-top
  tf.config.set_logical_device_configuration(
      tf.config.list_physical_devices('CPU')[0],
      [tf.config.LogicalDeviceConfiguration()] * 4)
  runs = {}
  for layout in _LM_LAYOUTS:
    k, m, schedule, remat = layout
    params = model_registry.GetParams(_LM_KEY, 'Train')
    params.task.stack_tpl.splits = k
    params.task.stack_tpl.pipeline_tpl.Set(num_micro_batches=m,
                                           schedule=schedule, remat=remat)
    cluster = cluster_lib.Cluster.Params().Set(
        num_devices=k, worker_split_size=k).Instantiate()
    with cluster:
      program = programs.TrainProgram(params.Instantiate().task,
                                      tempfile.mkdtemp(), cluster=cluster,
                                      peak_flops=1e12)
    if hasattr(program, 'StepRunner'):
      run = program.StepRunner()
    else:   # A checkout before StepRunner: what it wraps.
      iterator = program._Iterator(program._ReplicaBatches(0), 0)  # pylint: disable=protected-access

      def run(n, iterator=iterator, program=program):
        start = time.perf_counter()
        program._RunLoop(iterator, n)  # pylint: disable=protected-access
        return (time.perf_counter() - start) / n
    run(2)
    runs[_LayoutName(layout)] = (run, [])
  for _ in range(rounds):
    for run, times in runs.values():
      times.append(run(steps))
  print(json.dumps({name: statistics.median(times)
                    for name, (_, times) in runs.items()}))


def LmSteps(repeats, steps, baseline_root=None):
  """Prints the Tiny LM step table (see the module docstring, 6.)."""
  roots = {'this checkout': None}
  if baseline_root:
    _CheckoutParent(baseline_root)
    roots = {'baseline': os.path.abspath(baseline_root), **roots}
  found = {name: [] for name in roots}
  for r in range(repeats):   # Alternating the order.
    for name in (list(roots) if r % 2 == 0 else list(roots)[::-1]):
      bench_log.Say(f'repeat {r + 1} of {repeats}: a fresh process times '
                    f'the Tiny LM layouts\' steps ({name})...')
      out = subprocess.run(
          [sys.executable, os.path.abspath(__file__), '--lm_steps_child',
           f'--steps={steps}'], env=_Env(roots[name]), capture_output=True,
          text=True, check=False)
      if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
      found[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
  names = [_LayoutName(l) for l in _LM_LAYOUTS]
  med = {n: {l: statistics.median(run[l] for run in found[n]) for l in names}
         for n in roots}
  print(f'\n| Tiny LM, trainer step (ms, median of {repeats} processes) | ' +
        ' | '.join(roots) + (' | this / baseline |' if baseline_root else
                             ' |'))
  print('| --- ' * (len(roots) + 1 + bool(baseline_root)) + '|')
  for l in names:
    cells = [f'{1000 * med[n][l]:.1f}' for n in roots]
    if baseline_root:
      cells.append(f'{med["this checkout"][l] / med["baseline"][l]:.2f}')
    print(f'| {l} | ' + ' | '.join(cells) + ' |')


def _Env(baseline_root=None):
  """The environment of a child process; with `baseline_root` (a checkout
  named cadence) its parent goes first on PYTHONPATH, so the package is
  imported from there and not from the installed one."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')
  if baseline_root:
    env['PYTHONPATH'] = os.pathsep.join(
        [_CheckoutParent(baseline_root)] +
        [p for p in env.get('PYTHONPATH', '').split(os.pathsep) if p])
  return env


def _CheckoutParent(root):
  """The folder to put first on PYTHONPATH for checkout `root` (a folder
  named cadence, the package)."""
  root = os.path.abspath(root)
  if os.path.basename(root) != 'cadence':
    raise ValueError(f'--baseline_root={root!r}: the checkout must be a '
                     "folder named 'cadence' (the package).")
  return os.path.dirname(root)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--steps', type=int, default=4000,
                      help='Steps per tiny run (the wide one runs 1/4).')
  parser.add_argument('--lm', action='store_true',
                      help='Only the Tiny LM start-up table (3.).')
  parser.add_argument('--baseline_root', default=None,
                      help='With --lm or --lm_steps: a checkout to compare '
                      'against.')
  parser.add_argument('--grappler', action='store_true',
                      help='Only the grappler on/off table (4.).')
  parser.add_argument('--watcher', action='store_true',
                      help='Only the preemption watcher table (5.).')
  parser.add_argument('--lm_steps', action='store_true',
                      help='Only the Tiny LM train step table (6.); '
                      '--steps: steps a timing (default here 3).')
  parser.add_argument('--lm_steps_child', action='store_true',
                      help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.lm_steps or args.lm_steps_child:
    steps = 3 if args.steps == parser.get_default('steps') else args.steps
    if args.lm_steps_child:
      LmStepsChild(steps, rounds=5)
    else:
      LmSteps(args.repeats, steps, args.baseline_root)
    return
  if args.lm:
    LmStartup(args.repeats, args.baseline_root)
    return
  if args.grappler:
    LmGrappler(args.repeats)
    return
  tf.get_logger().setLevel('ERROR')
  from absl import logging  # pylint: disable=g-import-not-at-top
  logging.set_verbosity(logging.WARNING)
  if args.watcher:
    Watcher(args.repeats, args.steps)
    return

  print(f'TensorFlow {tf.__version__}, {os.cpu_count()} CPU cores, '
        f'{args.repeats} repeats (median)\n')
  print('| model | steps | hand-written loop (steps/s) | trainer loop '
        '(steps/s) | trainer / hand-written | max weight diff at the end |')
  print('| --- | --- | --- | --- | --- | --- |')
  for name, cfg in _CONFIGS.items():
    steps = args.steps if cfg['batch'] <= 32 else args.steps // 4
    hand, trainer, diff = [], [], 0.0
    for r in range(args.repeats):
      bench_log.Say(f'{name}, repeat {r + 1} of {args.repeats}: {steps} '
                    'steps of the hand-written loop, then of the trainer\'s...')
      rate, hand_weights = HandWrittenLoop(cfg, steps)
      hand.append(rate)
      rate, trainer_weights = TrainerLoop(cfg, steps)
      trainer.append(rate)
      # Same model, data and updates: both end with the same weights.
      diff = max(diff, max(float(np.max(np.abs(hand_weights[k] -
                                                trainer_weights[k])))
                           for k in hand_weights))
    h, t = statistics.median(hand), statistics.median(trainer)
    print(f'| {name} | {steps} | {h:.0f} | {t:.0f} | {t / h:.2f}x | '
          f'{diff:.1e} |')

  print('\n| start-up | seconds |')
  print('| --- | --- |')
  bench_log.Say(f'start-up: import tensorflow, then a 1-step trainer, '
                f'{args.repeats} times each...')
  imports = [ImportSeconds() for _ in range(args.repeats)]
  runs = [StartupSeconds() for _ in range(args.repeats)]
  print(f'| `python -c "import tensorflow"` | '
        f'{statistics.median(imports):.2f} |')
  print(f'| trainer command start -> first train step done | '
        f'{statistics.median(r[0] for r in runs):.2f} |')
  print(f'| trainer command, 1 step, whole process | '
        f'{statistics.median(r[1] for r in runs):.2f} |')


if __name__ == '__main__':
  main()
