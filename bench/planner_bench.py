"""The layout planner's predictions next to real runs on this machine.

For two models, the Tiny LM (lm.one_billion_wds.OneBWdsGPipeTransformerTiny)
and the bench Transformer (bench/gpipe_bench.py's dimensions: vocab 1024,
d 256, 8 layers of 4 heads and feed-forward 1024, sequences of 64, batch 32;
run as that LM task with those overrides: its positions and Adam come
along), and for each of `LAYOUTS` (replicas R, devices K, cells per device
v, micro-batches M, schedule, remat), in one run:

  predicted: framework/jobs/planner.py with --plan_cluster=cpu and
    --plan_measure: each layer timed on this host, the host's concurrency
    and memory bandwidth calibrated (medians over the rounds, measured
    between the steps' rounds);
  measured, R = 1: one training step (the task's forward, gradients and
    Adam update, inspect_pipeline.TrainStep) of every layout built in one
    process of 4 logical CPUs, timed in interleaved rounds (each round
    times every layout `--steps` steps); the median over rounds;
  measured, R > 1: the real trainer (--job=trainer, its MirroredStrategy
    and per-stage all-reduce) in a process of its own per layout, run
    `--replica_runs` times; the median of its steps_per_sec summaries
    after the first window;
  memory, R = 1: each device's peak in a profiled step, from the
    allocator's events (framework/pipeline/memory_profile.py, as
    bench/gpipe_memory.py --per_device: pipelines built with trace_actions
    so every op is placed), plus its variables, next to the planner's
    per-device estimate.

It prints per model a table (predicted, measured, error), the median and
worst |error| of the step time, Spearman's rank correlation of the
predicted and measured step times, the memory ratios, and the targets
(median <= 10%, worst <= 25%, Spearman >= 0.8, memory within 20%). Then
the planner's best plans for the published-scale LM
(lm.one_billion_wds.OneBWdsGPipeTransformer) on 8 x H100 and a TPU v4-8,
from FLOPs and public specs: nothing here can check those.

The machine is shared (other engineers' jobs run on its 2 cores): the
load changes during the run, so every figure is a median of interleaved
repeats, and the predictions use costs measured between the same rounds.

Run:
  .venv/bin/python bench/planner_bench.py [--rounds 5] [--steps 3]
      [--models tiny,bench] [--replica_runs 2] [--skip_memory]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TINY = 'lm.one_billion_wds.OneBWdsGPipeTransformerTiny'
_BIG = 'lm.one_billion_wds.OneBWdsGPipeTransformer'
# The bench Transformer (bench/gpipe_bench.py) as the LM task.
MODELS = {
    'tiny': [],
    'bench': [('task.vocab_size', 1024), ('task.model_dim', 256),
              ('task.stack_tpl.num_layers', 8),
              ('task.stack_tpl.transformer_tpl.num_heads', 4),
              ('task.stack_tpl.transformer_tpl.hidden_dim', 1024)],
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
]


def _Quiet():
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')


def _Params(name):
  from cadence.framework import model_registry  # pylint: disable=g-import-not-at-top
  params = model_registry.GetParams(_TINY, 'Train')
  for key, value in MODELS[name]:
    params.Set(**{key: value})
  return params


def _Layout(spec):
  from cadence.framework.jobs import plan_model  # pylint: disable=g-import-not-at-top
  r, k, s, m, schedule, remat = spec
  return plan_model.Layout(r, k, s, m, schedule, remat, None)


def _SetDevices(n):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf.config.set_logical_device_configuration(
      tf.config.list_physical_devices('CPU')[0],
      [tf.config.LogicalDeviceConfiguration()] * n)


def _Build(model, layout, trace=False):
  """(task, train step, batch) of `layout`, built on CPU:0..K-1."""
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
    step = inspect_pipeline.TrainStep(task)
  run = lambda s: float(step(batch, tf.constant(s, tf.int64)))  # pylint: disable=unnecessary-lambda-assignment
  return task, step, batch, run


def _MeasureCosts(model, hw_text, devices, batches):
  """(MeasuredCosts, calibrated Hardware) of one round."""
  from cadence.framework.jobs import plan_measure  # pylint: disable=g-import-not-at-top
  from cadence.framework.jobs import planner  # pylint: disable=g-import-not-at-top
  from cadence.framework.pipeline import hardware  # pylint: disable=g-import-not-at-top
  costs = planner.MeasuredCosts(model, devices[0],
                                model.params.task.train.learner)
  for mb in batches:
    costs.Parts(mb)
  probe = plan_measure.LmParts(model.symbolic_task, model.batch_size // 4,
                               model.BatchShapes(1).ids[1]).layer
  hw = plan_measure.Calibrate(hardware.Parse(hw_text), devices, probe)
  return costs, hw


def _MedianHardware(hws):
  conc = tuple(statistics.median(h.concurrency[i] for h in hws)
               for i in range(len(hws[0].concurrency)))
  return hws[0]._replace(
      concurrency=conc,
      memory_bandwidth=statistics.median(h.memory_bandwidth for h in hws),
      flops=statistics.median(h.flops for h in hws))


def ChildTime(name, rounds, steps):
  """Times every R = 1 layout and measures the planner's costs, in
  interleaved rounds; predicts every layout (R > 1 too) from the medians.
  Prints one JSON line."""
  _Quiet()
  _SetDevices(4)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from cadence.framework.jobs import plan_model  # pylint: disable=g-import-not-at-top
  from cadence.framework.jobs import planner  # pylint: disable=g-import-not-at-top
  model = plan_model.PlanModel(_Params(name))
  devices = [d.name for d in tf.config.list_logical_devices('CPU')]
  layouts = [_Layout(spec) for spec in LAYOUTS]
  runs = {}
  for layout in layouts:
    if layout.replicas == 1:
      start = time.perf_counter()
      runs[layout] = _Build(model, layout)[3]
      for s in range(2):
        runs[layout](s)
      print(f'[{name}] built {layout.Name()} in '
            f'{time.perf_counter() - start:.0f} s', file=sys.stderr,
            flush=True)
  batches = sorted({model.PerReplicaBatch(l) // l.micro_batches
                    for l in layouts} | {model.batch_size // 4})
  measured = {l: [] for l in runs}
  costs, hws = [], []
  for r in range(rounds):
    c, hw = _MeasureCosts(model, 'cpu', devices, batches)
    costs.append(c)
    hws.append(hw)
    for layout, run in runs.items():
      start = time.perf_counter()
      for s in range(steps):
        run(s)
      measured[layout].append((time.perf_counter() - start) / steps)
    print(f'[{name}] round {r + 1}/{rounds} done', file=sys.stderr,
          flush=True)
  hw = _MedianHardware(hws)
  plan = planner.Planner(model, hw, planner.MeasuredCosts.MedianOf(costs))
  out = []
  for layout in layouts:
    p = plan.Predict(layout)
    out.append(dict(spec=list(LAYOUTS[layouts.index(layout)]),
                    name=layout.Name(), predicted=p.step.time,
                    measured=measured.get(layout),
                    memory=p.memory))
  print(json.dumps(dict(layouts=out, hardware=hw.Describe())))


def ChildMemory(name, spec):
  """Each device's measured peak of one R = 1 layout's step, and the
  planner's estimate. Prints one JSON line."""
  _Quiet()
  _SetDevices(4)
  from cadence.framework.jobs import plan_model  # pylint: disable=g-import-not-at-top
  from cadence.framework.pipeline import memory_profile  # pylint: disable=g-import-not-at-top
  model = plan_model.PlanModel(_Params(name))
  layout = _Layout(spec)
  _, step, batch, run = _Build(model, layout, trace=True)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  placement = memory_profile.Placement(lambda: run(0))
  run(1)
  variables = step.get_concrete_function(
      batch, tf.constant(0, tf.int64)).variables
  totals = memory_profile.DeviceTotals(
      memory_profile.DevicePeaks(lambda: run(2), placement), variables)
  print(json.dumps(dict(
      measured=[totals.get(f'CPU:{d}', 0) for d in range(layout.devices)],
      unattributed=totals.get(memory_profile.UNATTRIBUTED, 0),
      predicted=model.DeviceMemory(layout)[0])))


def _ChildRun(args):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')
  if args[0] == 'memory':
    env['TF_CPU_ALLOCATOR_USE_BFC'] = 'true'
  out = subprocess.run([sys.executable, os.path.abspath(__file__),
                        '--child'] + [str(a) for a in args],
                       capture_output=True, text=True, check=False, env=env,
                       cwd=_ROOT)
  for line in out.stderr.splitlines():
    if line.startswith('['):
      print('  ' + line, flush=True)
  if out.returncode:
    raise RuntimeError(out.stderr[-3000:])
  return json.loads(out.stdout.strip().splitlines()[-1])


def _TrainerStepTime(name, spec, steps=40, window=10):
  """Median seconds a step of the real trainer's windows after the first
  (its steps_per_sec summaries), for layout `spec`."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from cadence.framework.jobs import plan_model  # pylint: disable=g-import-not-at-top
  model = plan_model.PlanModel(_Params(name))
  layout = _Layout(spec)
  items = MODELS[name] + model.Overrides(layout) + [
      ('task.train.summary_interval_steps', window),
      ('task.train.log_interval_steps', window),
      ('task.train.save_interval_steps', 100000)]
  override = ';'.join(f'{k}={v!r}' if isinstance(v, str) else f'{k}={v}'
                      for k, v in items)
  with tempfile.TemporaryDirectory() as logdir:
    cmd = [sys.executable, os.path.join(_ROOT, 'trainer.py'),
           f'--model={_TINY}', '--job=trainer', f'--logdir={logdir}',
           f'--worker_replicas={layout.replicas}',
           f'--worker_split_size={layout.devices}', f'--max_steps={steps}',
           f'--model_params_override={override}']
    out = subprocess.run(cmd, capture_output=True, text=True, check=False,
                         cwd=_ROOT)
    if out.returncode:
      raise RuntimeError(out.stderr[-3000:])
    rates = []
    for path in tf.io.gfile.glob(os.path.join(logdir, 'train',
                                              'events.out.tfevents.*')):
      for event in tf.compat.v1.train.summary_iterator(path):
        for v in event.summary.value:
          if v.tag == 'steps_per_sec':
            rates.append((event.step, float(tf.make_ndarray(v.tensor))))
  rates = [r for _, r in sorted(rates)][1:]
  return statistics.median(1.0 / r for r in rates)


def _Spearman(xs, ys):
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
  """The planner's best plans for the published-scale LM on two clusters
  (FLOPs and public specs)."""
  _Quiet()
  from cadence.framework import model_registry  # pylint: disable=g-import-not-at-top
  from cadence.framework.jobs import planner  # pylint: disable=g-import-not-at-top
  from cadence.framework.jobs import plan_model  # pylint: disable=g-import-not-at-top
  from cadence.framework.pipeline import hardware  # pylint: disable=g-import-not-at-top
  model = plan_model.PlanModel(model_registry.GetParams(_BIG, 'Train'))
  own = plan_model.Layout(1, 4, 4, 32, 'gpipe', 'except_last', None)
  for text in ('h100x8', 'tpu_v4_8'):
    hw = hardware.Parse(text)
    plan = planner.Planner(model, hw, planner.FlopsCosts(model, hw))
    start = time.perf_counter()
    predictions, counts = plan.Search()
    print(planner.Report(_BIG, model, hw, plan.costs, predictions, counts,
                         5, time.perf_counter() - start), end='')
    p = plan.Predict(own)
    print(f'  the experiment\'s own layout ({own.Name()}): '
          f'{1000 * p.step.time:.0f} ms, MFU {100 * p.mfu:.1f}%, memory/dev '
          f'{max(p.memory) / 2**30:.1f} GiB, fits {p.fits}')
    print(planner.BestText(_BIG, model, predictions[0]))


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--rounds', type=int, default=5)
  parser.add_argument('--steps', type=int, default=3,
                      help='Steps per layout per round.')
  parser.add_argument('--models', default='tiny,bench')
  parser.add_argument('--replica_runs', type=int, default=2,
                      help='Trainer runs of each R > 1 layout.')
  parser.add_argument('--skip_memory', action='store_true')
  parser.add_argument('--child', nargs='*', help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    kind, name = args.child[:2]
    if kind == 'time':
      return ChildTime(name, int(args.child[2]), int(args.child[3]))
    return ChildMemory(name, json.loads(args.child[2]))
  results = {}
  for name in args.models.split(','):
    print(f'== {name}: timing {sum(s[0] == 1 for s in LAYOUTS)} layouts '
          f'in {args.rounds} interleaved rounds', flush=True)
    res = _ChildRun(['time', name, args.rounds, args.steps])
    for entry in res['layouts']:
      spec = entry['spec']
      if spec[0] > 1:
        entry['measured'] = []
        for _ in range(args.replica_runs):
          entry['measured'].append(_TrainerStepTime(name, spec))
      entry['measured_memory'] = None
      if spec[0] == 1 and not args.skip_memory:
        entry['measured_memory'] = _ChildRun(['memory', name,
                                              json.dumps(spec)])
      print(f'  {entry["name"]}: predicted {1000 * entry["predicted"]:.0f} '
            f'ms, measured {[round(1000 * t) for t in entry["measured"]]}',
            flush=True)
    results[name] = res
  _Print(results)
  print('\nThe published-scale LM (lm.one_billion_wds.OneBWdsGPipeTransformer)'
        ', planned from FLOPs and public specs; no way to check it on this '
        'machine:')
  _Published()


def _Print(results):
  all_err, all_mem = [], []
  for name, res in results.items():
    print(f'\n{name}: {res["hardware"]}')
    print(f'{"layout":<46}{"predicted ms":>13}{"measured ms":>12}'
          f'{"error":>8}   memory/device predicted/measured')
    pred, meas, errs = [], [], []
    for e in res['layouts']:
      m = statistics.median(e['measured'])
      err = e['predicted'] / m - 1
      pred.append(e['predicted'])
      meas.append(m)
      errs.append(abs(err))
      mem = ''
      if e['measured_memory']:
        mm = e['measured_memory']
        ratios = [p / x for p, x in zip(mm['predicted'], mm['measured'])]
        all_mem += ratios
        mem = ' '.join(f'{p / 2**20:.0f}/{x / 2**20:.0f} MiB ({r:.2f})'
                       for p, x, r in zip(mm['predicted'], mm['measured'],
                                          ratios))
      print(f'{e["name"]:<46}{1000 * e["predicted"]:13.1f}{1000 * m:12.1f}'
            f'{100 * err:+7.1f}%   {mem}')
    all_err += errs
    print(f'{name}: step time |error| median {100 * statistics.median(errs):.1f}'
          f'%, worst {100 * max(errs):.1f}%; Spearman of the ranking '
          f'{_Spearman(pred, meas):.2f} over {len(errs)} layouts')
  print(f'\nall: |error| median {100 * statistics.median(all_err):.1f}% '
        f'(target <= 10%), worst {100 * max(all_err):.1f}% (target <= 25%)')
  if all_mem:
    print(f'memory per device, predicted / measured: '
          f'{min(all_mem):.2f} .. {max(all_mem):.2f} (target 0.80 .. 1.20)')


if __name__ == '__main__':
  sys.exit(main())
