"""The layout planner's predictions next to real runs on this machine.

For the models of --models (MODELS: by default the Tiny LM,
lm.one_billion_wds.OneBWdsGPipeTransformerTiny, and the bench Transformer,
bench/gpipe_bench.py's dimensions: vocab 1024, d 256, 8 layers of 4 heads
and feed-forward 1024, sequences of 64, batch 32, run as that LM task with
those overrides: its positions and Adam come along; also LM variants of
other depth and width, the pipelined ResNet and the README's model of
one's own), and for each of `LAYOUTS` that is a layout of the model
(replicas R, devices K, cells per device v, micro-batches M, schedule,
remat), in one run:

  predicted: framework/planning/planner.py with --plan_cluster=cpu and
    --plan_measure: each layer timed on this host, the host's concurrency
    and memory bandwidth calibrated, and the real steps of the planner's
    calibration layouts (calibration.CalibrationLayouts: R=1 K=1 M=1 and
    M=8 gpipe, M=8 zb_h1, R=1 K=2 M=8 and M=4 1f1b, R=2 K=1 M=1) timed, in
    every round (medians); the planner fits its overheads and the host's
    concurrency to those steps (the table names the calibration layouts
    that are among LAYOUTS: their errors are in-sample);
  measured: the trainer's own compiled train loop (programs.TrainProgram:
    the task's forward, gradients, all-reduce across replicas and Adam
    update), `--steps` steps at a time or as many more as take
    `--window` seconds; every R = 1 layout built in one process of 4
    logical CPUs and timed in interleaved rounds; an R > 1 layout (its
    MirroredStrategy) in a process of its own, `--rounds` times;
  memory, R = 1: each device's peak in a profiled step, from the
    allocator's events (framework/pipeline/memory_profile.py, as
    bench/gpipe_memory.py --per_device: pipelines built with trace_actions
    so every op is placed), plus its variables, next to the planner's
    per-device estimate.

Every timing is of those steps after one untimed step (a trainer runs
one layout step after step), in processes on TF's BFC allocator (with the
default one a step's speed depends on what else the process built:
framework/planning/plan_measure.py).

The machine is shared: other engineers' jobs come and go on its 2 cores,
and the speed a process gets changed 3x within minutes while this was
written. So every timing (each layout's steps, and each round's cost
measurement) is taken between steps of a reference layout (LAYOUTS[0]),
which measure the machine's speed at that moment; the tables compare the
predictions with the step times scaled to the median speed (t x the
median reference / the mean of the references just before and after it),
the costs likewise, and give the raw errors (no scaling) too. Windows of
3 Tiny LM steps (0.3 s) read the host's jitter: one layout's ranged
91-139 ms, and its reference 87-131 ms, within a run; hence `--window`.

It prints per model a table (predicted, measured, error), the median and
worst |error| of the step time, Spearman's rank correlation of the
predicted and measured step times, the memory ratios, and the targets
(median <= 10%, worst <= 25%, Spearman >= 0.8, memory within 20%).
Then per model an A/B row: the planner's best layout (its search over
every layout on the 4 devices, from the round's costs at the median
speed) against the experiment's default layout (its params as registered,
on its WORKER_SPLIT_SIZE devices: what `trainer.py --model=...` runs), in
a fresh process, each window of the best between two of the default:
best / default, and whether the best is faster, as fast within noise (the
default's own change between windows) or slower. Then the planner's best
plans for the published-scale LM
(lm.one_billion_wds.OneBWdsGPipeTransformer) on 8 x H100 and a TPU v4-8,
from FLOPs and public specs: nothing here can check those.

Run:
  .venv/bin/python bench/planner_bench.py [--rounds 5] [--steps 3]
      [--window 1.0] [--models tiny,bench] [--layouts 0,6,14] [--skip_memory]
      [--skip_published]
  --layouts picks a subset (indices into LAYOUTS or 'RxKxSxM:schedule:
  remat' specs; the reference LAYOUTS[0] always runs): the whole list
  takes about 45 minutes on this machine.

Its timings are the bench's own (the trainer's step in one process,
interleaved with a reference); bench/plan_vs_trainer.py puts the
planner's ranked layouts beside `trainer.py`'s own runs, timed as a user
reads them.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import bench_log

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TINY = 'lm.one_billion_wds.OneBWdsGPipeTransformerTiny'
_BIG = 'lm.one_billion_wds.OneBWdsGPipeTransformer'
# name -> (registry key, params overrides[, the experiment's class
# attributes changed]). 'bench': the bench Transformer (bench/gpipe_bench.py)
# as the LM task; 'deep' and 'wide': LM variants the planner was not tuned
# on; 'resnet': the pipelined ResNet (batch norm); 'mlp': the README's model
# of one's own, 512 wide on batches of 64 (as registered, 8 wide, a step
# takes under a millisecond here: below what a step time can resolve),
# no step limit (its 500 would end the timed loops: 0 ms a step) and a
# learning rate of 1e-4 (at its 0.01, 512 wide, the loss turns non-finite
# within ~15 steps and the loop's guard stops it: 0.2 ms a step).
MODELS = {
    'tiny': (_TINY, []),
    'bench': (_TINY, [('task.vocab_size', 1024), ('task.model_dim', 256),
                      ('task.stack_tpl.num_layers', 8),
                      ('task.stack_tpl.transformer_tpl.num_heads', 4),
                      ('task.stack_tpl.transformer_tpl.hidden_dim', 1024)]),
    'deep': (_TINY, [('task.stack_tpl.num_layers', 8)]),
    'wide': (_TINY, [('task.model_dim', 128),
                     ('task.stack_tpl.transformer_tpl.hidden_dim', 512)]),
    'resnet': ('image.shapes_resnet.ShapesResNetTiny', []),
    'mlp': ('examples.pipelined_mlp.PipelinedMlp', [],
            dict(INPUT_DIM=512, BATCH_SIZE=64, MAX_STEPS=10**9,
                 LEARNING_RATE=1e-4)),
}
# (R, K, S, M, schedule, remat): S = K v stages.
LAYOUTS = [
    (1, 1, 1, 1, 'gpipe', 'never'),
    (1, 1, 1, 4, 'gpipe', 'except_last'),
    (1, 2, 2, 1, 'gpipe', 'never'),
    (1, 2, 2, 2, 'gpipe', 'never'),
    (1, 2, 2, 4, 'gpipe', 'except_last'),
    (1, 2, 2, 4, 'gpipe', 'always'),
    (1, 2, 2, 4, '1f1b', 'never'),
    (1, 2, 2, 8, '1f1b', 'never'),
    (1, 2, 2, 4, '1f1b', 'selective'),
    (1, 2, 4, 4, '1f1b', 'never'),
    (1, 4, 4, 4, 'gpipe', 'except_last'),
    (1, 4, 4, 8, '1f1b', 'never'),
    (2, 1, 1, 1, 'gpipe', 'never'),
    (2, 2, 2, 2, '1f1b', 'never'),
    (1, 2, 2, 8, 'zb_h1', 'never'),
    (1, 2, 4, 4, 'interleaved_1f1b', 'never'),
    (1, 2, 4, 4, 'zb_v', 'never'),
]


def SelectLayouts(text):
  """The layouts of --layouts: comma-separated indices into LAYOUTS or
  specs 'RxKxSxM:schedule:remat' (e.g. '1x2x2x8:zb_h1:never'); LAYOUTS[0],
  the reference step, always comes first. '' = all of LAYOUTS."""
  if not text:
    return list(LAYOUTS)
  chosen = [LAYOUTS[0]]
  for item in text.split(','):
    if item.isdigit():
      if int(item) >= len(LAYOUTS):
        raise SystemExit(f'--layouts: index {item} is past LAYOUTS '
                         f'(0..{len(LAYOUTS) - 1})')
      spec = LAYOUTS[int(item)]
    else:
      try:
        sizes, schedule, remat = item.split(':')
        spec = tuple(int(x) for x in sizes.split('x')) + (schedule, remat)
      except ValueError:
        raise SystemExit(f'--layouts: {item!r} is neither an index into '
                         "LAYOUTS nor 'RxKxSxM:schedule:remat'") from None
      if len(spec) != 6:
        raise SystemExit(f'--layouts: {item!r} needs four sizes RxKxSxM')
    if spec not in chosen:
      chosen.append(spec)
  return chosen


def _Quiet():
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  # The planner's progress lines (INFO, naming their file): a child's
  # parent passes them on.
  from absl import logging  # pylint: disable=g-import-not-at-top
  logging.use_absl_handler()
  logging.set_verbosity(logging.INFO)


def _Params(name):
  from cadence.framework import model_registry  # pylint: disable=g-import-not-at-top
  key, overrides, *attrs = MODELS[name]
  params = model_registry.GetParams(key, 'Train')
  if attrs:   # The experiment with other class attributes (its knobs).
    experiment = type(name, (model_registry.GetClass(key),), attrs[0])()
    params = experiment.Model()
    params.input = experiment.Train()
  for path, value in overrides:
    params.Set(**{path: value})
  return params


def Runs(model, spec, num_devices=4):
  """Whether layout `spec` (R, K, S, M, schedule, remat) runs model
  (a plan_model.PlanModel) on `num_devices`: S stages of its units, R
  replicas dividing its batch, M micro-batches dividing a replica's, a
  schedule that takes those sizes."""
  from cadence.framework.pipeline import schedules  # pylint: disable=g-import-not-at-top
  r, k, s, m, schedule, _ = spec
  if r * k > num_devices or s > model.num_units or model.batch_size % r:
    return False
  if (model.batch_size // r) % m:
    return False
  try:
    schedules.Build(schedule, s, k, m)
  except ValueError:
    return False
  return True


def _Layout(spec):
  from cadence.framework.planning import plan_model  # pylint: disable=g-import-not-at-top
  r, k, s, m, schedule, remat = spec
  return plan_model.Layout(r, k, s, m, schedule, remat, None)


def _SetDevices(n):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf.config.set_logical_device_configuration(
      tf.config.list_physical_devices('CPU')[0],
      [tf.config.LogicalDeviceConfiguration()] * n)


def _Build(model, layout, trace=False):
  """(run(step), the variables it uses, the batch it runs on) of an R = 1
  `layout`'s train step, built on CPU:0..K-1 (inspect_pipeline.TrainStep:
  forward, gradients, update)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from cadence.framework import cluster as cluster_lib  # pylint: disable=g-import-not-at-top
  from cadence.framework.jobs import inspect_pipeline  # pylint: disable=g-import-not-at-top
  from cadence.framework.nested_map import NestedMap  # pylint: disable=g-import-not-at-top
  params = model.LayoutParams(layout)
  if trace:
    params = inspect_pipeline.TraceActions(params)
  cluster = cluster_lib.Cluster.Params().Set(
      num_devices=layout.devices,
      worker_split_size=layout.devices).Instantiate()
  with cluster:
    task = params.Instantiate().task
    batch = NestedMap(next(iter(task.params.input.Instantiate().Dataset())))
    step, variables = inspect_pipeline.TrainStep(task)
  run = lambda s: float(step(batch, tf.constant(s, tf.int64)))  # pylint: disable=unnecessary-lambda-assignment
  return run, variables, batch


def _Program(model, layout, cluster=None, strategy=None, params=None):
  """run(n): n steps of the trainer's own compiled train loop
  (programs.TrainProgram, its replicas and all-reduce) for `layout` (or
  `params` as they are), on `cluster` (default: CPU:0..K-1, one replica)
  under `strategy`."""
  from cadence.framework import cluster as cluster_lib  # pylint: disable=g-import-not-at-top
  from cadence.framework.train import programs  # pylint: disable=g-import-not-at-top
  from cadence.framework.train import replicas  # pylint: disable=g-import-not-at-top
  if cluster is None:
    cluster = cluster_lib.Cluster.Params().Set(
        num_devices=layout.devices,
        worker_split_size=layout.devices).Instantiate()
  with cluster:
    tasks = replicas.BuildReplicas(params or model.LayoutParams(layout),
                                   cluster)
    program = programs.TrainProgram(tasks, tempfile.mkdtemp(), strategy,
                                    cluster=cluster)
  # The loop `Run` calls between its summaries: the trainer's own step,
  # without its checkpoints and logs.
  return program.StepRunner()


def _MeasureCosts(model, hw_text, devices, batches):
  """(MeasuredCosts, calibrated Hardware) of one round: the planner's own
  measurements (--plan_cluster=cpu --plan_measure)."""
  from cadence.framework.planning import plan_measure  # pylint: disable=g-import-not-at-top
  from cadence.framework.planning import calibration  # pylint: disable=g-import-not-at-top
  from cadence.framework.planning import plan_costs  # pylint: disable=g-import-not-at-top
  from cadence.framework.planning import hardware  # pylint: disable=g-import-not-at-top
  costs = plan_costs.MeasuredCosts(model, devices[0],
                                model.params.task.train.learner,
                                devices=devices)
  costs.MeasureParts(batches)
  costs.MeasureSteps(calibration.CalibrationLayouts(model, len(devices)))
  hw = plan_measure.Calibrate(hardware.Parse(hw_text), devices,
                              plan_costs.ConcurrencyProbe(model))
  return costs, hw


def _MedianHardware(hws):
  conc = tuple(statistics.median(h.concurrency[i] for h in hws)
               for i in range(len(hws[0].concurrency)))
  return hws[0]._replace(
      concurrency=conc,
      memory_bandwidth=statistics.median(h.memory_bandwidth for h in hws),
      flops=statistics.median(h.flops for h in hws))


def _Interleaved(ref, runs, steps, window, progress=''):
  """[(seconds a step of run, of the reference before it, after it)] for
  each of `runs` in turn, each between two windows of the reference (the
  one after a run is the one before the next): the reference measures the
  machine's speed at that moment. Every window is steady, of `steps`
  steps or more to take `window` seconds (plan_measure.SteadySeconds).
  With `progress`, a line '<progress> n/N' on stderr before each run."""
  from cadence.framework.planning import plan_measure  # pylint: disable=g-import-not-at-top
  before = plan_measure.SteadySeconds(ref, steps, window)
  out = []
  for i, run in enumerate(runs):
    if progress:
      print(f'{progress} {i + 1}/{len(runs)}', file=sys.stderr, flush=True)
    seconds = plan_measure.SteadySeconds(run, steps, window)
    after = plan_measure.SteadySeconds(ref, steps, window)
    out.append((seconds, before, after))
    before = after
  return out


def _Scaled(costs, hw, factor):
  """Costs and hardware of a round at the median speed: times x factor."""
  from cadence.framework.planning import plan_costs  # pylint: disable=g-import-not-at-top
  parts = {mb: {n: (f * factor, fb * factor) for n, (f, fb) in p.items()}
           for mb, p in costs.parts.items()}
  steps = {l: t * factor for l, t in costs.steps.items()}
  scaled = plan_costs.MeasuredCosts(costs._model, costs._device, None, parts,  # pylint: disable=protected-access
                                 costs.update_rate * factor, steps)
  return scaled, hw._replace(memory_bandwidth=hw.memory_bandwidth / factor)


def ChildTime(name, rounds, steps, window, specs):
  """Times every R = 1 layout of `specs` (the trainer's loop) and
  measures the planner's costs, in interleaved rounds, each next to a
  reference step (LAYOUTS[0]); predicts every layout (R > 1 too) from the
  costs at the median speed. Prints one JSON line."""
  _Quiet()
  _SetDevices(4)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from cadence.framework.planning import plan_measure  # pylint: disable=g-import-not-at-top
  from cadence.framework.planning import plan_model  # pylint: disable=g-import-not-at-top
  from cadence.framework.planning import planner  # pylint: disable=g-import-not-at-top
  from cadence.framework.planning import plan_costs  # pylint: disable=g-import-not-at-top
  from cadence.framework.planning import plan_report  # pylint: disable=g-import-not-at-top
  model = plan_model.PlanModel(_Params(name))
  devices = [d.name for d in tf.config.list_logical_devices('CPU')]
  specs = [tuple(spec) for spec in specs]
  skipped = [s for s in specs if not Runs(model, s, len(devices))]
  if skipped:
    print(f'[{name}] skipped, not layouts of this model: ' + ', '.join(
        _Layout(s).Name() for s in skipped), file=sys.stderr, flush=True)
  specs = [s for s in specs if s not in skipped]
  layouts = [_Layout(spec) for spec in specs]
  runs = {}
  for layout in layouts:
    if layout.replicas == 1:
      start = time.perf_counter()
      runs[layout] = _Program(model, layout)
      runs[layout](2)
      print(f'[{name}] built {layout.Name()} in '
            f'{time.perf_counter() - start:.0f} s', file=sys.stderr,
            flush=True)
  ref = runs[layouts[0]]
  batches = sorted({model.PerReplicaBatch(l) // l.micro_batches
                    for l in layouts} | {model.batch_size // 4})
  samples = {l: [] for l in runs}
  rounds_costs = []
  for r in range(rounds):
    print(f'[{name}] round {r + 1}/{rounds}: the planner\'s measurements...',
          file=sys.stderr, flush=True)
    before = plan_measure.SteadySeconds(ref, steps, window)
    costs, hw = _MeasureCosts(model, 'cpu', devices, batches)
    rounds_costs.append((costs, hw, (before + plan_measure.SteadySeconds(
        ref, steps, window)) / 2))
    timed = _Interleaved(ref, list(runs.values()), steps, window,
                         f'[{name}] round {r + 1}/{rounds}: timing layout')
    for layout, sample in zip(runs, timed):
      samples[layout].append(sample)
    print(f'[{name}] round {r + 1}/{rounds} done', file=sys.stderr,
          flush=True)
  speed = statistics.median(
      [x for v in samples.values() for _, b, a in v for x in (b, a)] +
      [x for _, _, x in rounds_costs])
  scaled = [_Scaled(c, hw, speed / x) for c, hw, x in rounds_costs]
  hw = _MedianHardware([h for _, h in scaled])
  raw_hw = _MedianHardware([h for _, h, _ in rounds_costs])
  plans = {
      'scaled': planner.Planner(model, hw, plan_costs.MeasuredCosts.MedianOf(
          [c for c, _ in scaled])),
      'raw': planner.Planner(model, raw_hw, plan_costs.MeasuredCosts.MedianOf(
          [c for c, _, _ in rounds_costs]))}
  out = []
  for spec, layout in zip(specs, layouts):
    p = plans['scaled'].Predict(layout)
    out.append(dict(
        spec=list(spec), name=layout.Name(), predicted=p.step.time,
        predicted_raw=plans['raw'].Predict(layout).step.time,
        samples=samples.get(layout, []), memory=p.memory))
  fitted = plans['scaled']
  ranked, _ = fitted.Search()
  plan = model.plan
  default = plan_model.Layout(1, _DefaultDevices(name), plan.num_stages,
                              plan.num_micro_batches, plan.schedule.name,
                              plan.remat, tuple(plan.bounds))
  chosen = plan_report.Best(ranked)
  best = chosen.layout
  print(json.dumps(dict(
      best=dict(spec=[best.replicas, best.devices, best.stages,
                      best.micro_batches, best.schedule, best.remat],
                name=best.Name(), predicted=chosen.step.time),
      default=dict(name=default.Name(),
                   predicted=fitted.Predict(default).step.time),
      layouts=out, hardware=fitted.hw.Describe(), speed=speed,
      concurrency=plan_report.ConcurrencyText(fitted.concurrency),
      replica_concurrency=fitted.replica_concurrency,
      probe=hw.concurrency, overheads=fitted.overheads._asdict(),
      calibration=[l.Name() for l in layouts if l in fitted.costs.steps])))


def ChildReplicas(name, spec, runs, steps, window):
  """Times an R > 1 layout with the trainer's loop, its replicas on a
  MirroredStrategy, each time next to the reference step (LAYOUTS[0], one
  replica on CPU:0). Prints one JSON line."""
  _Quiet()
  from cadence.framework import cluster as cluster_lib  # pylint: disable=g-import-not-at-top
  from cadence.framework.distribute import distribution  # pylint: disable=g-import-not-at-top
  from cadence.framework.planning import plan_model  # pylint: disable=g-import-not-at-top
  layout = _Layout(spec)
  setup = distribution.Create(worker_replicas=layout.replicas,
                              worker_split_size=layout.devices)
  model = plan_model.PlanModel(_Params(name))
  run = _Program(model, layout, setup.cluster, setup.strategy)
  one = cluster_lib.Cluster.Params().Set(
      devices=[setup.cluster.devices[0]]).Instantiate()
  ref = _Program(model, _Layout(LAYOUTS[0]), one)
  run(2)
  ref(2)
  samples = _Interleaved(ref, [run] * runs, steps, window)
  print(json.dumps(dict(samples=samples)))


def _DefaultDevices(name):
  """K of the experiment as `trainer.py --model=...` runs it: its class's
  WORKER_SPLIT_SIZE (trainer_lib's default), one replica."""
  from cadence.framework import model_registry  # pylint: disable=g-import-not-at-top
  return getattr(model_registry.GetClass(MODELS[name][0]),
                 'WORKER_SPLIT_SIZE', 1)


def ChildBestVsDefault(name, spec, rounds, steps, window):
  """The A/B row: the planner's best layout (`spec`, with the trainer's loop,
  its replicas on a MirroredStrategy) against the experiment's default
  layout (its params as registered, one replica on its WORKER_SPLIT_SIZE
  devices: what `trainer.py --model=...` runs), each window of the best
  between two of the default. Prints one JSON line."""
  _Quiet()
  _SetDevices(4)
  from cadence.framework import cluster as cluster_lib  # pylint: disable=g-import-not-at-top
  from cadence.framework.distribute import distribution  # pylint: disable=g-import-not-at-top
  from cadence.framework.planning import plan_model  # pylint: disable=g-import-not-at-top
  layout = _Layout(spec)
  setup = distribution.Create(worker_replicas=layout.replicas,
                              worker_split_size=layout.devices)
  model = plan_model.PlanModel(_Params(name))
  best = _Program(model, layout, setup.cluster, setup.strategy)
  k = _DefaultDevices(name)
  default = _Program(model, None, cluster_lib.Cluster.Params().Set(
      num_devices=k, worker_split_size=k).Instantiate(),
                     params=_Params(name))
  best(2)
  default(2)
  samples = _Interleaved(default, [best] * rounds, steps, window)
  print(json.dumps(dict(samples=samples)))


def ChildMemory(name, spec):
  """Each device's measured peak of one R = 1 layout's step, and the
  planner's estimate. Prints one JSON line."""
  _Quiet()
  _SetDevices(4)
  from cadence.framework.planning import plan_model  # pylint: disable=g-import-not-at-top
  from cadence.framework.pipeline import memory_profile  # pylint: disable=g-import-not-at-top
  model = plan_model.PlanModel(_Params(name))
  layout = _Layout(spec)
  run, variables, batch = _Build(model, layout, trace=True)
  placement = memory_profile.Placement(lambda: run(0))
  run(1)
  totals = memory_profile.DeviceTotals(
      memory_profile.DevicePeaks(lambda: run(2), placement), variables,
      batch)
  print(json.dumps(dict(
      measured=[totals.get(f'CPU:{d}', 0) for d in range(layout.devices)],
      unattributed=totals.get(memory_profile.UNATTRIBUTED, 0),
      predicted=model.DeviceMemory(layout)[0])))


# An absl INFO line of the planner's (its progress) in a child's stderr.
_PLANNER_LINE = re.compile(r'^I\d{4} [\d:.]+ +\d+ (?:planner|plan_measure)'
                           r'\.py:\d+\] ')


def _ChildRun(args):
  # BFC: the allocator's stats for memory; for time, steps as fast as in a
  # process that built one layout (framework/planning/plan_measure.py), as
  # `trainer.py --mode=plan --plan_measure` runs.
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2',
             TF_CPU_ALLOCATOR_USE_BFC='true')
  proc = subprocess.Popen([sys.executable, os.path.abspath(__file__),
                           '--child'] + [str(a) for a in args],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, env=env, cwd=_ROOT)
  stdout = []
  reader = threading.Thread(target=lambda: stdout.append(proc.stdout.read()))
  reader.start()
  stderr = []
  for line in proc.stderr:   # Passed on as it comes: the child's progress.
    stderr.append(line)
    if line.startswith('['):
      print('  ' + line.rstrip('\n'), flush=True)
    elif _PLANNER_LINE.search(line):
      bench_log.Say(f'{args[0]} {args[1]}: ' +
                    _PLANNER_LINE.split(line, 1)[1].rstrip('\n'))
  reader.join()
  if proc.wait():
    raise RuntimeError(''.join(stderr)[-3000:])
  return json.loads(stdout[0].strip().splitlines()[-1])


def Spearman(xs, ys):
  def _Ranks(v):
    order = sorted(range(len(v)), key=lambda i: v[i])
    ranks = [0.0] * len(v)
    i = 0
    while i < len(order):
      j = i
      while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
        j += 1
      for k in range(i, j + 1):
        ranks[order[k]] = (i + j) / 2
      i = j + 1
    return ranks
  rx, ry = _Ranks(xs), _Ranks(ys)
  mx, my = statistics.mean(rx), statistics.mean(ry)
  cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
  var = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
  return cov / var ** 0.5 if var else float('nan')


def _Published():
  """The planner's best layouts for the published-scale LM on two clusters
  (FLOPs and public specs)."""
  _Quiet()
  from cadence.framework import model_registry  # pylint: disable=g-import-not-at-top
  from cadence.framework.planning import planner  # pylint: disable=g-import-not-at-top
  from cadence.framework.planning import plan_costs  # pylint: disable=g-import-not-at-top
  from cadence.framework.planning import plan_report  # pylint: disable=g-import-not-at-top
  from cadence.framework.planning import plan_model  # pylint: disable=g-import-not-at-top
  from cadence.framework.planning import hardware  # pylint: disable=g-import-not-at-top
  model = plan_model.PlanModel(model_registry.GetParams(_BIG, 'Train'))
  own = plan_model.Layout(1, 4, 4, 32, 'gpipe', 'except_last', None)
  for text in ('h100x8', 'tpu_v4_8'):
    hw = hardware.Parse(text)
    plan = planner.Planner(model, hw, plan_costs.FlopsCosts(model, hw))
    start = time.perf_counter()
    predictions, counts = plan.Search()
    print(plan_report.Report(_BIG, model, hw, plan.costs, predictions, counts,
                         5, time.perf_counter() - start), end='')
    p = plan.Predict(own)
    print(f'  the experiment\'s own layout ({own.Name()}): '
          f'{1000 * p.step.time:.0f} ms, MFU {100 * p.mfu:.1f}%, memory/dev '
          f'{max(p.memory) / 2**30:.1f} GiB, fits {p.fits}')
    print(plan_report.BestText(_BIG, model, predictions, hw=hw))


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--rounds', type=int, default=5)
  parser.add_argument('--steps', type=int, default=3,
                      help='Steps per layout per round, at least.')
  parser.add_argument('--window', type=float, default=1.0,
                      help='Seconds per timing, at least: more steps than '
                      '--steps if they are short.')
  parser.add_argument('--models', default='tiny,bench',
                      help='Comma-separated names of MODELS: ' +
                      ', '.join(MODELS) + '.')
  parser.add_argument('--layouts', default='',
                      help='Comma-separated indices into LAYOUTS or specs '
                      "RxKxSxM:schedule:remat; default all. LAYOUTS[0] (the "
                      'reference) is always run.')
  parser.add_argument('--skip_memory', action='store_true')
  parser.add_argument('--skip_published', action='store_true')
  parser.add_argument('--child', nargs='*', help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    kind, name = args.child[:2]
    if kind == 'time':
      return ChildTime(name, int(args.child[2]), int(args.child[3]),
                       float(args.child[4]), json.loads(args.child[5]))
    if kind in ('replicas', 'ab'):
      child = ChildReplicas if kind == 'replicas' else ChildBestVsDefault
      return child(name, json.loads(args.child[2]), int(args.child[3]),
                   int(args.child[4]), float(args.child[5]))
    return ChildMemory(name, json.loads(args.child[2]))
  specs = SelectLayouts(args.layouts)
  results = {}
  for name in args.models.split(','):
    print(f'== {name}: {len(specs)} layouts, {args.rounds} interleaved '
          'rounds', flush=True)
    res = _ChildRun(['time', name, args.rounds, args.steps, args.window,
                     json.dumps(specs)])
    for entry in res['layouts']:
      spec = entry['spec']
      if spec[0] > 1:
        bench_log.Say(f'{name} {entry["name"]}: its replicas\' steps in a '
                      'fresh process...')
        entry['samples'] = _ChildRun(['replicas', name, json.dumps(spec),
                                      args.rounds, args.steps,
                                      args.window])['samples']
      entry['measured_memory'] = None
      if spec[0] == 1 and not args.skip_memory:
        bench_log.Say(f'{name} {entry["name"]}: its memory in a fresh '
                      'process...')
        entry['measured_memory'] = _ChildRun(['memory', name,
                                              json.dumps(spec)])
      print(f'  {entry["name"]}: predicted {1000 * entry["predicted"]:.0f} '
            f'ms; measured/reference before/after (ms): ' + ', '.join(
                f'{1000 * t:.0f}/{1000 * b:.0f}/{1000 * a:.0f}'
                for t, b, a in entry['samples']), flush=True)
    bench_log.Say(f'{name}: the best layout ({res["best"]["name"]}) against '
                  f'the experiment\'s default layout, interleaved, in a '
                  'fresh process...')
    res['ab'] = _ChildRun(['ab', name, json.dumps(res['best']['spec']),
                           args.rounds, args.steps, args.window])['samples']
    results[name] = res
  _Print(results)
  if not args.skip_published:
    print('\nThe published-scale LM (lm.one_billion_wds.'
          'OneBWdsGPipeTransformer), planned from FLOPs and public specs; no '
          'way to check it on this machine:')
    _Published()


def ABLine(name, best, default, samples):
  """One model's A/B row: best / default step time per round, against
  the noise of the default's own windows, and the verdict."""
  ratios = [2 * t / (b + a) for t, b, a in samples]
  noise = statistics.median(abs(a / b - 1) for _, b, a in samples)
  ratio = statistics.median(ratios)
  if ratio < 1 - noise:
    verdict = 'the best layout is faster'
  elif ratio <= 1 + noise:
    verdict = 'as fast as the default within noise'
  else:
    verdict = 'the best layout is SLOWER than the default'
  return (f'  {name}: best {best["name"]} (predicted '
          f'{1000 * best["predicted"]:.0f} ms) vs default {default["name"]} '
          f'(predicted {1000 * default["predicted"]:.0f} ms): best/default '
          f'{ratio:.2f} (rounds {min(ratios):.2f}..{max(ratios):.2f}, '
          f'predicted {best["predicted"] / default["predicted"]:.2f}), '
          f'noise {100 * noise:.0f}%: {verdict}')


def _Errors(entries, speed, scaled):
  """(predicted, measured medians, |errors|) of the entries: at the median
  speed (each step time x the median reference / the mean of the
  references just before and after it), or raw."""
  pred, meas = [], []
  for e in entries:
    if scaled:
      pred.append(e['predicted'])
      meas.append(statistics.median(2 * t * speed / (b + a)
                                    for t, b, a in e['samples']))
    else:
      pred.append(e['predicted_raw'])
      meas.append(statistics.median(t for t, _, _ in e['samples']))
  return pred, meas, [abs(p / m - 1) for p, m in zip(pred, meas)]


def _Print(results):
  totals = {True: [], False: []}
  all_mem = []
  for name, res in results.items():
    entries = res['layouts']
    o = res['overheads']
    print(f'\n{name}: {res["hardware"]}; reference step (median) '
          f'{1000 * res["speed"]:.0f} ms\nfitted to the real steps of the '
          f'calibration layouts (calibration.CalibrationLayouts; of those '
          f'here: '
          f'{", ".join(res["calibration"]) or "none"}): '
          f'{1000 * o["layer"]:.3f} ms a layer of an action, '
          f'{1000 * o["defer_w"]:.3f} ms a layer of a deferred W, '
          f'{1000 * o["step"]:.1f} ms a step, {1000 * o["replica"]:.1f} ms '
          f'a replica beyond the first; concurrency probed '
          f'{"/".join(f"{c:.2f}" for c in res["probe"])} (above), the '
          f'throughput of 2 actions at once fitted '
          f'{res.get("concurrency") or "to none"}, of 2 replicas on a host '
          + (f'{res["replica_concurrency"][1]:.2f}'
             if res.get('replica_concurrency') else 'from it'))
    pred, meas, errs = _Errors(entries, res['speed'], True)
    _, raw_meas, raw_errs = _Errors(entries, res['speed'], False)
    print(f'{"layout":<46}{"predicted":>10}{"measured":>10}{"error":>8}'
          f'{"raw error":>11}   memory/device MiB predicted/measured')
    for e, p, m, r in zip(entries, pred, meas, raw_errs):
      mem = ''
      if e['measured_memory']:
        mm = e['measured_memory']
        ratios = [a / b for a, b in zip(mm['predicted'], mm['measured'])]
        all_mem += ratios
        mem = ' '.join(f'{a / 2**20:.0f}/{b / 2**20:.0f} ({x:.2f})'
                       for a, b, x in zip(mm['predicted'], mm['measured'],
                                          ratios))
      print(f'{e["name"]:<46}{1000 * p:10.1f}{1000 * m:10.1f}'
            f'{100 * (p / m - 1):+7.1f}%{100 * r:10.1f}%   {mem}')
    totals[True] += errs
    totals[False] += raw_errs
    print(f'{name}: |error| median {100 * statistics.median(errs):.1f}%, '
          f'worst {100 * max(errs):.1f}%; Spearman {Spearman(pred, meas):.2f}'
          f' over {len(errs)} layouts (raw: median '
          f'{100 * statistics.median(raw_errs):.1f}%, worst '
          f'{100 * max(raw_errs):.1f}%, Spearman '
          f'{Spearman([e["predicted_raw"] for e in entries], raw_meas):.2f})')
  print('\nA/B: the planner\'s best layout against the experiment\'s '
        'default layout (its params as registered, as `trainer.py '
        '--model=...` runs them), each window of the best between two of '
        'the default; noise: the default\'s own change from the window '
        'before to the one after')
  for name, res in results.items():
    print(ABLine(name, res['best'], res['default'], res['ab']))
  print(f'\nall {len(totals[True])} layouts: step time |error| median '
        f'{100 * statistics.median(totals[True]):.1f}% (target <= 10%), worst '
        f'{100 * max(totals[True]):.1f}% (target <= 25%); raw median '
        f'{100 * statistics.median(totals[False]):.1f}%, worst '
        f'{100 * max(totals[False]):.1f}%')
  if all_mem:
    print(f'memory per device, predicted / measured: {min(all_mem):.2f} .. '
          f'{max(all_mem):.2f} (target 0.80 .. 1.20)')


if __name__ == '__main__':
  sys.exit(main())
