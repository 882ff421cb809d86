"""Peak memory of a training step vs depth: plain vs pipelined, measured
and estimated.

The model of bench/gpipe_bench.py (d 256, 4 heads, ff 1024, seq 64, batch
32, vocab 1024) with L = 4, 8, 16, 32 layers, plain and pipelined (K cells,
M micro-batches, each --variants schedule:remat[:v<N>], as
gpipe_bench.py's). Each configuration runs in
a fresh subprocess: build, 3 training steps (forward + backward + SGD, one
tf.function), then

  tensor peak: the peak bytes of live tensors during the last step, from
    TF's BFC allocator stats (the child sets TF_CPU_ALLOCATOR_USE_BFC=true
    so that CPU tensors go through an allocator that counts; all logical
    CPUs share it, so for K > 1 it is the sum over devices);
  estimate: framework/pipeline/memory_estimate.py's estimate from
    FPropMeta and the schedule, before running: all stages at the step's
    worst moment (SharedMemory, what one memory holding every stage
    needs), compared with the process's tensor peak;
  per device (--per_device): each device's peak from the allocator's events
    of a profiled step (framework/pipeline/memory_profile.py: every allocation
    counted on the device TF placed its op on) plus its variables, next to
    its stage's estimate (StageMemory). Pipelines are then built with
    trace_actions (cells inlined, every op named and placed);
  peak RSS: `ru_maxrss` of the process (also counts the TF runtime, the
    compiled graphs and allocator pools that are never returned).

Activations are what differ between the models:
  plain:      L * (activations of a layer on the full batch);
  GPipe:      M outputs + (L / K) layers' activations of one micro-batch per
              device (remat re-runs one micro-batch at a time);
  1F1B never: min(K - i, M) micro-batches' activations of (L / K) layers
              on device i, no re-run.
Weights and gradients grow with L in every model. The script prints tables
and the least-squares slopes (MiB per layer), and the issue's targets: a
pipelined tensor slope <= 1.5 x plain slope / M, an RSS slope below the
plain one; and the same tensor target on the slope above a layer's weights
and one gradient of them (which every model holds, whatever M). With
--tiny_lm it measures and estimates the Tiny LM's training step (Adam) as
well.

Run:
  .venv/bin/python bench/gpipe_memory.py
      [--layers 4,8,16,32] [--splits 1,2,4] [--micro_batches 8]
      [--variants gpipe:except_last,1f1b:never,zb_h1:never,zb_v:never:v2]
      [--backward_window 1]
      [--per_device] [--tiny_lm]
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_log  # pylint: disable=g-import-not-at-top,wrong-import-position
import gpipe_bench  # pylint: disable=g-import-not-at-top,wrong-import-position

_TINY_LM = 'lm.one_billion_wds.OneBWdsGPipeTransformerTiny'

_CHILD = r"""
import os, json, resource, sys
os.environ['TF_CPP_MIN_LOG_LEVEL'] = '2'
sys.argv = [sys.argv[0]]
sys.path.insert(0, {bench_dir!r})
import gpipe_bench as gb
import tensorflow as tf
from cadence.framework.pipeline import memory_profile
gb.LAYERS = {layers}
model = gb._Model({splits}, {micro_batches}, **{overrides!r})
ids = tf.random.stateless_uniform([gb.BATCH, gb.SEQ], [1, 2], maxval=gb.VOCAB,
                                  dtype=tf.int32)
labels = tf.roll(ids, -1, axis=1)
pads = tf.zeros([gb.BATCH, gb.SEQ])
Step = lambda s: float(model.Step(ids, labels, pads, tf.constant(s, tf.int64)))
placement = memory_profile.Placement(lambda: Step(0))
for s in (1, 2):
  tf.config.experimental.reset_memory_stats('CPU:0')
  Step(s)
tensor = tf.config.experimental.get_memory_info('CPU:0')['peak']
devices = {{}}
if {per_device}:
  devices = {{d: b / 2**20 for d, b in memory_profile.DeviceTotals(
      memory_profile.DevicePeaks(lambda: Step(3), placement),
      model.train_vars, [ids, labels, pads]).items()}}
stages, shared = model.Estimate()
print(json.dumps(dict(
    tensor_mib=tensor / 2**20, estimate_mib=shared / 2**20,
    stage_estimates_mib=[s / 2**20 for s in stages], devices_mib=devices,
    weights_mib=sum(model.DeviceBytes().values()) / 2**20,
    rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)))
"""

_EXPERIMENT = r"""
import os, json, resource, sys
os.environ['TF_CPP_MIN_LOG_LEVEL'] = '2'
import tensorflow as tf
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices('CPU')[0],
    [tf.config.LogicalDeviceConfiguration()] * 2)
from cadence.framework import cluster as cluster_lib
from cadence.framework.jobs import inspect_lib
from cadence.framework.jobs import inspect_pipeline
from cadence.framework import model_registry
from cadence.framework.nested_map import NestedMap
from cadence.framework.pipeline import memory_estimate
from cadence.framework.pipeline import memory_profile
params = model_registry.GetParams({key!r}, 'Train')
# The pipeline's params, wherever the model keeps it: its plan says.
params.Get(inspect_lib.CheckParamsAlone(params).plan.path).Set(
    **{overrides!r})
if {per_device}:
  params = inspect_pipeline.TraceActions(params)
with cluster_lib.Cluster.Params().Set(num_devices=2,
                                      worker_split_size=2).Instantiate():
  task = params.Instantiate().task
  batch = NestedMap(next(iter(task.params.input.Instantiate().Dataset())))
  step, variables = inspect_pipeline.TrainStep(task)
  Step = lambda s: float(step(batch, tf.constant(s, tf.int64)))
  placement = memory_profile.Placement(lambda: Step(0))
  for s in (1, 2):
    tf.config.experimental.reset_memory_stats('CPU:0')
    Step(s)
  tensor = tf.config.experimental.get_memory_info('CPU:0')['peak']
  devices = {{}}
  if {per_device}:
    devices = {{d: b / 2**20 for d, b in memory_profile.DeviceTotals(
        memory_profile.DevicePeaks(lambda: Step(3), placement),
        variables, batch).items()}}
  stages = [s.total for s in inspect_lib.TaskStages(
      task, memory_estimate.DeviceMemory)]
  shared = inspect_lib.TaskStages(task, memory_estimate.SharedMemory).total
print(json.dumps(dict(
    tensor_mib=tensor / 2**20, estimate_mib=shared / 2**20,
    stage_estimates_mib=[s / 2**20 for s in stages], devices_mib=devices,
    rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)))
"""


def _Run(code):
  env = dict(os.environ, TF_CPU_ALLOCATOR_USE_BFC='true')
  out = subprocess.run([sys.executable, '-c', code], capture_output=True,
                       text=True, check=False, env=env)
  if out.returncode:
    raise RuntimeError(out.stderr[-3000:])
  return json.loads(out.stdout.strip().splitlines()[-1])


def _Measure(layers, splits, micro_batches, overrides, per_device):
  return _Run(_CHILD.format(
      bench_dir=os.path.dirname(os.path.abspath(__file__)), layers=layers,
      splits=splits, micro_batches=micro_batches, overrides=overrides,
      per_device=per_device))


def _Slope(xs, ys):
  if len(set(xs)) < 2:
    return float('nan')
  mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
  return (sum((x - mx) * (y - my) for x, y in zip(xs, ys)) /
          sum((x - mx) ** 2 for x in xs))


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--layers', default='4,8,16,32',
                      help='Comma-separated numbers of layers.')
  parser.add_argument('--splits', default='1,2,4',
                      help='Comma-separated K of the pipelined models.')
  parser.add_argument('--micro_batches', type=int, default=8,
                      help='M of the pipelined models.')
  parser.add_argument('--variants', default='gpipe:except_last,1f1b:never',
                      help='Comma-separated schedule:remat pairs; '
                      'schedule:remat:traced inlines the cells per call '
                      '(trace_actions).')
  parser.add_argument('--backward_window', default='1',
                      help='PipeliningLayer.backward_window: an int or None.')
  parser.add_argument('--per_device', action='store_true',
                      help='Also measure each device\'s peak from the '
                      'allocator\'s events (pipelines built with '
                      'trace_actions, so that every op is named and placed).')
  parser.add_argument('--tiny_lm', action='store_true',
                      help='Also measure and estimate the Tiny LM.')
  parser.add_argument('--experiments', default='',
                      help='Comma-separated registered pipelined '
                      'experiments to measure and estimate too, e.g. '
                      'image.shapes_resnet.ShapesResNetTiny,'
                      'examples.pipelined_mlp.PipelinedMlp.')
  parser.add_argument('--only_experiments', action='store_true',
                      help='Skip the depth sweep: only --tiny_lm and '
                      '--experiments.')
  args = parser.parse_args()
  window = (None if args.backward_window == 'None' else
            int(args.backward_window))
  if not args.only_experiments:
    _Sweep(args, window)
  for key in _Experiments(args):
    print(f'\n{key} (its own batch, optimizer and K=2), MiB: measured tensor '
          'peak, estimate')
    for variant in args.variants.split(','):
      overrides = gpipe_bench.Overrides(variant, window)
      overrides.pop('trace_actions')
      bench_log.Say(f'{key} {variant}: a fresh process builds it and runs '
                    'its steps...')
      r = _Run(_EXPERIMENT.format(key=key, overrides=overrides,
                                  per_device=args.per_device))
      per = ''
      if args.per_device:
        per = '  per device ' + '/'.join(
            f'{e / r["devices_mib"][f"CPU:{i}"]:.2f}'
            for i, e in enumerate(r['stage_estimates_mib'])) + (
                f' [{r["devices_mib"].get("unattributed", 0):.0f} MiB '
                'unattributed]')
      print(f'{variant:>26}  {r["tensor_mib"]:7.1f}  {r["estimate_mib"]:7.1f}'
            f'  ratio {r["estimate_mib"] / r["tensor_mib"]:.2f}{per}',
            flush=True)


def _Sweep(args, window):
  """The depth sweep of the bench model: its tables and targets."""
  depths = [int(x) for x in args.layers.split(',')]
  m = args.micro_batches
  models = [('plain', None, 1, {})]
  for variant in args.variants.split(','):
    for k in args.splits.split(','):
      traced = ':traced' if args.per_device and ':traced' not in variant else ''
      models.append((f'{variant} K={k} M={m}', int(k), m,
                     gpipe_bench.Overrides(variant + traced, window)))
  table = {}
  for name, splits, mbs, overrides in models:
    for n in depths:
      bench_log.Say(f'{name} L={n}: a fresh process builds it and runs 3 '
                    'steps...')
      table[(name, n)] = r = _Measure(n, splits, mbs, overrides,
                                      args.per_device)
      print(f'{name:>26}  L={n:<3} tensor peak {r["tensor_mib"]:7.0f} MiB '
            f'(estimate {r["estimate_mib"]:7.0f}), peak RSS '
            f'{r["rss_mib"]:7.0f} MiB', flush=True)
  slopes = {}
  for key, title in (('tensor_mib', 'tensor peak (MiB) of a training step'),
                     ('estimate_mib', 'estimate (MiB), before running'),
                     ('rss_mib', 'peak RSS (MiB) of the process')):
    print(f'\n{title}; backward_window={window}')
    print(f'{"L":>26}' + ''.join(f'{n:>8}' for n in depths) +
          f'{"slope MiB/layer":>17}')
    for name, _, _, _ in models:
      ys = [table[(name, n)][key] for n in depths]
      slopes[(name, key)] = _Slope(depths, ys)
      print(f'{name:>26}' + ''.join(f'{y:8.0f}' for y in ys) +
            f'{slopes[(name, key)]:17.1f}')
  print('\nestimate (all stages at the worst moment, SharedMemory) / '
        'measured tensor peak of the process')
  for name, _, _, _ in models:
    cells = [table[(name, n)] for n in depths]
    print(f'{name:>26}' + ''.join(
        f'{c["estimate_mib"] / c["tensor_mib"]:8.2f}' for c in cells))
  if args.per_device:
    print('\nper device: estimate (DeviceMemory: its stages together) / '
          'measured (the allocator\'s events of the step on that device + its '
          'variables), device 0..K-1; [MiB unattributed]')
    for name, _, _, _ in models:
      cells = []
      for n in depths:
        r = table[(name, n)]
        ratios = [e / r['devices_mib'][f'CPU:{i}']
                  for i, e in enumerate(r['stage_estimates_mib'])]
        cells.append('/'.join(f'{x:.2f}' for x in ratios) +
                     f' [{r["devices_mib"].get("unattributed", 0):.0f}]')
      print(f'{name:>26}  ' + '  '.join(f'{c:>22}' for c in cells))
  plain_t, plain_r = slopes[('plain', 'tensor_mib')], slopes[('plain',
                                                              'rss_mib')]
  print(f'\ntargets: tensor slope <= 1.5 x {plain_t:.1f} / {m} = '
        f'{1.5 * plain_t / m:.1f} MiB/layer; RSS slope < {plain_r:.1f}')
  for name, _, _, _ in models[1:]:
    t, r = slopes[(name, 'tensor_mib')], slopes[(name, 'rss_mib')]
    print(f'{name:>26}  tensor {t:5.1f} '
          f'{"ok" if t <= 1.5 * plain_t / m else "over"}   RSS {r:5.1f} '
          f'{"ok" if r < plain_r else "over"}')
  # Every model holds a layer's weights and (at least) one gradient of them
  # at its peak, whatever M: the part of the slope a pipeline can shrink is
  # what lies above those two copies.
  w = _Slope(depths, [table[('plain', n)]['weights_mib'] for n in depths])
  plain_a = plain_t - 2 * w
  print(f'\nweights {w:.1f} MiB/layer; tensor slope above weights + one '
        f'gradient (2 x {w:.1f}): plain {plain_a:.1f}; target <= 1.5 x '
        f'{plain_a:.1f} / {m} = {1.5 * plain_a / m:.1f}')
  for name, _, _, _ in models[1:]:
    a = slopes[(name, 'tensor_mib')] - 2 * w
    print(f'{name:>26}  {a:5.1f} {"ok" if a <= 1.5 * plain_a / m else "over"}')


def _Experiments(args):
  keys = [k for k in args.experiments.split(',') if k]
  if args.tiny_lm and _TINY_LM not in keys:
    keys.insert(0, _TINY_LM)
  return keys


if __name__ == '__main__':
  main()
