"""Step time of the pipelined Transformer against the same model unpipelined.

Model (the DESIGN.md benchmark): token embedding (vocab 1024, d 256), 8
pre-LN causal Transformer layers (4 heads, feed-forward 1024), softmax
cross-entropy; batch 32 x seq 64. One training step = forward + backward +
SGD update, compiled with tf.function.

  unpipelined: transformer.TransformerStack on /device:CPU:0;
  pipelined:   gpipe_transformer.GPipeTransformerStack on K logical CPUs
               with K x v stages (`splits`=K, stages_per_device v) and M
               micro-batches, for each variant schedule:remat[:v<N>] of
               --variants: any registered schedule (framework/pipeline/
               schedules.py; all but GPipe run the softmax and
               cross-entropy of each micro-batch inside the pipeline,
               PipeliningLayer.FPropLoss), remat as PipeliningLayer.remat.
               A size a schedule does not allow (zb_v: v other than 2)
               prints n/a.

Both start from the same weights (identical variable paths). The script
configures 4 logical CPUs at start; they share this machine's cores, so the
table measures the pipeline's overhead, not a speed-up. Each configuration
is warmed up, then timed in interleaved rounds; the tables give the median
step time as a ratio to the unpipelined median, wall-clock and CPU time of
the process (the latter is less sensitive to other load on a shared
machine). Lingvo 0.14.2's GPipe on this machine: 7x at K=1, M=4; 11x at
K=2, M=8.

Micro-batching alone has a cost on a CPU (M smaller matrix products, M
times the per-op overhead): 'accumulated' is the unpipelined model
accumulating the gradients of M micro-batches run one after the other, the
floor of any M-micro-batch schedule on this machine; each table is followed
by that row and by pipelined / accumulated, the pipeline's own cost.

Then one step of each pipelined configuration (rebuilt with trace_actions,
so that the profile names each op's action) runs under the TF profiler
(framework/pipeline/timeline.py): its measured bubble (idle share of the
devices' time between the first and the last pipeline action) next to (a)
the bubble its paper gives when F, B and W take the same time
(schedules.FormulaBubble), (b) the bubble of its own action lists simulated
with the time each action took in that step (schedules.Simulate: what the
planner predicts from), (c) the same at unit times.

With --grappler, instead: the unpipelined step and the first variant at
K=2, M=4 and M=8, each built, warmed up and timed with TensorFlow's graph
optimiser on and off (framework/jobs/graph_optimizer.py; the trainer's
--graph_optimizer), interleaved: the warm-up (tracing, optimising and the
first two steps) and the step's median wall and CPU time, off / on.

Run:
  .venv/bin/python bench/gpipe_bench.py [--rounds 5]
      [--variants gpipe:except_last,1f1b:never,zb_h1:never,zb_v:never:v2,
       interleaved_1f1b:never:v2] [--backward_window 1|2|None]
  .venv/bin/python bench/gpipe_bench.py --grappler [--rounds 5]
"""
import argparse
import collections
import os
import statistics
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import bench_log
import tensorflow as tf

_CPUS = tf.config.list_physical_devices('CPU')
tf.config.set_logical_device_configuration(
    _CPUS[0], [tf.config.LogicalDeviceConfiguration()] * 4)

from cadence.framework import base_layer
from cadence.framework import cluster as cluster_lib
from cadence.framework.jobs import graph_optimizer
from cadence.framework import nested_map
from cadence.framework.pipeline import memory_estimate
from cadence.framework.pipeline import schedules
from cadence.framework.pipeline import timeline as timeline_lib
from cadence.framework import shapes
from cadence.framework import step_seed
from cadence.layers import embedding
from cadence.layers import gpipe
from cadence.layers import gpipe_transformer
from cadence.layers import softmax
from cadence.layers import transformer
from cadence.tasks.lm import model as lm_model

VOCAB, DIM, HEADS, HIDDEN, LAYERS, SEQ, BATCH = 1024, 256, 4, 1024, 8, 64, 32


def _LayerParams():
  return transformer.TransformerLayer.Params().Set(
      input_dim=DIM, hidden_dim=HIDDEN, num_heads=HEADS, mask_self_atten=True)


def _StackParams(num_splits, num_micro_batches, **overrides):
  if num_splits is None:
    return transformer.TransformerStack.Params().Set(
        name='stack', num_layers=LAYERS, transformer_tpl=_LayerParams())
  p = gpipe_transformer.GPipeTransformerStack.Params().Set(
      name='stack', num_layers=LAYERS, transformer_tpl=_LayerParams(),
      splits=num_splits)
  p.pipeline_tpl.Set(num_micro_batches=num_micro_batches, **overrides)
  return p


class _Model(tf.Module):
  """Embedding -> stack -> softmax; `Step` trains one SGD step.

  Unpipelined (num_splits None) with num_micro_batches M > 1, the step
  accumulates the gradients of M micro-batches run one after the other
  (no pipeline): what micro-batching alone costs. `fprop_dtype` (e.g.
  tf.bfloat16) is the three layers' (bench/bf16_bench.py).
  """

  def __init__(self, num_splits=None, num_micro_batches=1, fprop_dtype=None,
               **overrides):
    super().__init__()
    self.accumulate = num_micro_batches if num_splits is None else 1
    n = num_splits or 1
    cluster = cluster_lib.Cluster.Params().Set(
        num_devices=n, worker_split_size=n).Instantiate()
    with cluster, tf.device(cluster.devices[0]):
      self.emb = embedding.EmbeddingLayer.Params().Set(
          name='emb', vocab_size=VOCAB, embedding_dim=DIM,
          fprop_dtype=fprop_dtype).Instantiate()
      self.stack = _StackParams(num_splits, num_micro_batches,
                                **overrides).Set(
                                    fprop_dtype=fprop_dtype).Instantiate()
    with tf.device(cluster.devices[-1]):
      self.softmax = softmax.SimpleFullSoftmax.Params().Set(
          name='softmax', input_dim=DIM, num_classes=VOCAB,
          fprop_dtype=fprop_dtype).Instantiate()
    self.last_device = cluster.devices[-1]
    self.first_device = cluster.devices[0]
    self.train_vars = (self.emb.vars.Flatten() + self.stack.vars.Flatten() +
                       self.softmax.vars.Flatten())
    self.Step = tf.function(self._Step, autograph=False)

  def Estimate(self):
    """The memory estimate of a step (framework/pipeline/memory_estimate.py)
    of the pipeline plan (framework/pipeline/plan.py) of the LM task's
    FPropMeta: this model is that task's without positions; SGD has no
    slots.

    Returns:
      (per device its peak bytes (DeviceMemory: its stages together), all
      stages together at the step's worst moment (SharedMemory)).
    """
    p = lm_model.LanguageModel.Params().Set(
        name='lm', vocab_size=VOCAB, model_dim=DIM,
        stack_tpl=self.stack.params.Copy())
    devices = self.DeviceBytes()
    plan = lm_model.LanguageModel.FPropMeta(p, nested_map.NestedMap(
        ids=shapes.Shape([BATCH, SEQ]))).plan.OnDevices(len(devices))
    params = [0] * plan.num_stages   # A device's variables: its first stage.
    for index, n in devices.items():
      params[plan.stage_devices.index(index)] += n
    zeros = [0] * plan.num_stages
    return ([s.total for s in memory_estimate.DeviceMemory(plan, params,
                                                            zeros)],
            memory_estimate.SharedMemory(plan, params, zeros).total)

  def DeviceBytes(self):
    """{device index: bytes of the trained variables on it}."""
    out = collections.Counter()
    for v in self.train_vars:
      out[tf.DeviceSpec.from_string(v.device).device_index or 0] += (
          v.shape.num_elements() * v.dtype.size)
    return dict(out)

  def _Loss(self, softmax_theta, x, side):
    out = self.softmax.FProp(softmax_theta, x, side.labels)
    return nested_map.NestedMap(loss=out.total_xent, tokens=out.total_weight)

  def _AccumulatedGrads(self, ids, labels, paddings, seed):
    """(loss, grads) of the batch as `accumulate` micro-batches in turn."""
    m = self.accumulate
    xent, tokens, dense, rows = 0.0, 0.0, {}, {}
    for j, (i, l, p) in enumerate(zip(tf.split(ids, m), tf.split(labels, m),
                                      tf.split(paddings, m))):
      with tf.GradientTape() as tape:
        sums = self._Sums(i, l, p, step_seed.MicroBatchSeed(seed, j))
      grads = tape.gradient(sums.loss, self.train_vars)
      xent, tokens = xent + sums.loss, tokens + sums.tokens
      for n, g in enumerate(grads):
        if isinstance(g, tf.IndexedSlices):
          rows.setdefault(n, []).append(g)
        else:
          dense[n] = g if n not in dense else dense[n] + g
    grads = []
    for n in range(len(self.train_vars)):
      if n in rows:
        grads.append(tf.IndexedSlices(
            tf.concat([g.values for g in rows[n]], 0) / tokens,
            tf.concat([g.indices for g in rows[n]], 0)))
      else:
        grads.append(dense[n] / tokens)
    return xent / tokens, grads

  def _Step(self, ids, labels, paddings, step):
    seed = step_seed.MakeStepSeed(step)
    if self.accumulate > 1:
      loss, grads = self._AccumulatedGrads(ids, labels, paddings, seed)
      self._Apply(grads)
      return loss
    with tf.GradientTape() as tape:
      sums = self._Sums(ids, labels, paddings, seed)
      loss = sums.loss / sums.tokens
    self._Apply(tape.gradient(loss, self.train_vars))
    return loss

  def _Sums(self, ids, labels, paddings, seed):
    """The batch's cross-entropy and token sums: embedding, stack (or
    pipeline), softmax."""
    with tf.device(self.first_device):
      x = self.emb.FProp(self.emb.theta, ids)
    theta = base_layer.WithStepSeed(self.stack.theta, seed)
    side = nested_map.NestedMap(labels=labels)
    # The stack runs the loss where its schedule needs it: per micro-batch
    # inside the pipeline (1F1B), after it (GPipe), or once (unpipelined).
    return self.stack.FPropLoss(theta, x, paddings, gpipe.PipelineCell(
        fprop=self._Loss, theta=self.softmax.theta, meta=None), side)

  def _Apply(self, grads):
    for v, g in zip(self.train_vars, grads):
      if isinstance(g, tf.IndexedSlices):     # The embedding table.
        v.scatter_sub(tf.IndexedSlices(0.01 * g.values, g.indices))
      else:
        v.assign_sub(0.01 * g)


def Overrides(variant, window):
  """PipeliningLayer settings of a 'schedule:remat[:v<N>][:traced]' variant
  (v<N>: N stages per device, e.g. zb_v:never:v2 or
  interleaved_1f1b:never:v2)."""
  schedule, remat, *rest = variant.split(':')
  v = [int(r[1:]) for r in rest if r.startswith('v')]
  return dict(schedule=schedule, remat=remat, backward_window=window,
              trace_actions='traced' in rest,
              stages_per_device=v[0] if v else 1)


def _Built(k, m, overrides, batch):
  """The model of K devices, traced and warmed up; None when its schedule
  does not allow (K, M): the tables print n/a."""
  try:
    model = _Model(k, m, **overrides)
    for s in range(2):
      model.Step(*batch, tf.constant(s, tf.int64))
  except ValueError as e:
    print(f'  {overrides["schedule"]} K={k} M={m}: n/a: {e}', flush=True)
    return None
  return model


def _Table(title, table, base, variants):
  print(f'\n{title}: pipelined / unpipelined ({base * 1000:.0f} ms); ms in '
        'brackets')
  print(f'{"":18}' + ''.join(f'{"M=" + str(m):>16}' for m in (1, 4, 8)))
  for variant in variants:
    for k in (1, 2, 4):
      cells = []
      for m in (1, 4, 8):
        if not table.get((variant, k, m)):
          cells.append('n/a')
          continue
        t = statistics.median(table[(variant, k, m)])
        cells.append(f'{t / base:6.2f}x ({t * 1000:4.0f})')
      print(f'{variant:>13} K={k}' + ''.join(f'{c:>16}' for c in cells))


def _TimeSteps(step, ids, labels, paddings, steps):
  """(wall, CPU) seconds per step, the mean of `steps` steps."""
  t0, c0 = time.perf_counter(), time.process_time()
  for s in range(steps):
    float(step(ids, labels, paddings, tf.constant(s, tf.int64)))
  return ((time.perf_counter() - t0) / steps,
          (time.process_time() - c0) / steps)


def GrapplerTable(args, window, ids, labels, paddings):
  """Prints grappler on / off per configuration (see the docstring)."""
  variant = args.variants.split(',')[0]
  configs = [('plain', None, 1), (variant, 2, 4), (variant, 2, 8)]
  models, warmup = {}, {}
  for i, cfg in enumerate(configs):
    for enabled in ((True, False) if i % 2 == 0 else (False, True)):
      bench_log.Say(f'building {cfg}, grappler {enabled}: tracing and '
                    'warming it up...')
      # Each model's functions are traced, optimised (or not) and run
      # inside its own scope.
      with graph_optimizer.Scope(enabled):
        t0 = time.perf_counter()
        overrides = Overrides(cfg[0], window) if cfg[1] else {}
        models[cfg, enabled] = _Model(cfg[1], cfg[2], **overrides)
        _TimeSteps(models[cfg, enabled].Step, ids, labels, paddings, 2)
        warmup[cfg, enabled] = time.perf_counter() - t0
      print(f'built {cfg}, grappler {enabled}: warm-up '
            f'{warmup[cfg, enabled]:.1f} s', flush=True)
  times = {key: [] for key in models}
  for r in range(args.rounds):   # Interleaved, alternating the order.
    bench_log.Say(f'round {r + 1} of {args.rounds}: {args.steps} steps of '
                  f'each of the {len(models)} models...')
    for key in (list(models) if r % 2 == 0 else list(models)[::-1]):
      with graph_optimizer.Scope(key[1]):
        times[key].append(_TimeSteps(models[key].Step, ids, labels,
                                     paddings, args.steps))
  print(f'\n{args.rounds} rounds x {args.steps} steps; medians; '
        'off / on ratios')
  print(f'{"":>28}{"warm-up s":>21}{"step wall ms":>23}{"step CPU ms":>23}')
  print(f'{"":>28}' + '  '.join([f'{"on":>8}{"off":>7}{"ratio":>6}'] * 3))
  for cfg in configs:
    row = [(warmup[cfg, True], warmup[cfg, False])]
    for i in (0, 1):
      row.append(tuple(statistics.median(t[i] for t in times[cfg, e]) * 1000
                       for e in (True, False)))
    name = (f'{cfg[0]} K={cfg[1]} M={cfg[2]}' if cfg[1] else
            'unpipelined')
    print(f'{name:>28}' + '  '.join(f'{on:8.1f}{off:7.1f}{off / on:6.2f}'
                                    for on, off in row))


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--rounds', type=int, default=5,
                      help='Interleaved timing rounds.')
  parser.add_argument('--steps', type=int, default=3,
                      help='Steps per configuration per round.')
  parser.add_argument('--variants', default='gpipe:except_last,1f1b:never',
                      help='Comma-separated schedule:remat pairs; '
                      'schedule:remat:traced inlines the cells per call '
                      '(trace_actions).')
  parser.add_argument('--grappler', action='store_true',
                      help='Only the grappler on / off table.')
  parser.add_argument('--backward_window', default='1',
                      help='PipeliningLayer.backward_window: an int or None.')
  args = parser.parse_args()
  window = (None if args.backward_window == 'None' else
            int(args.backward_window))
  variants = args.variants.split(',')

  ids = tf.random.stateless_uniform([BATCH, SEQ], [1, 2], maxval=VOCAB,
                                    dtype=tf.int32)
  labels = tf.roll(ids, -1, axis=1)
  paddings = tf.zeros([BATCH, SEQ])
  if args.grappler:
    GrapplerTable(args, window, ids, labels, paddings)
    return
  batch = (ids, labels, paddings)
  configs = [('plain', None, 1), ('accumulated', None, 4),
             ('accumulated', None, 8)] + [
      (v, k, m) for v in variants for k in (1, 2, 4) for m in (1, 4, 8)]
  models = {}
  for cfg in configs:
    variant, k, m = cfg
    bench_log.Say(f'building {cfg}, tracing and warming it up...')
    t0 = time.perf_counter()
    models[cfg] = _Built(k, m, Overrides(variant, window) if k else {},
                         batch)
    print(f'built {cfg}: warm-up {time.perf_counter() - t0:.1f} s',
          flush=True)
  configs = [cfg for cfg in configs if models[cfg] is not None]
  times = {cfg: [] for cfg in configs}
  cpu = {cfg: [] for cfg in configs}
  for r in range(args.rounds):
    for i, cfg in enumerate(configs):
      if i % 5 == 0:
        bench_log.Say(f'round {r + 1} of {args.rounds}: {args.steps} steps '
                      f'of configurations {i + 1}-{min(i + 5, len(configs))} '
                      f'of {len(configs)}...')
      step = models[cfg].Step
      t0 = time.perf_counter()
      c0 = time.process_time()
      for s in range(args.steps):
        float(step(*batch, tf.constant(s, tf.int64)))
      times[cfg].append((time.perf_counter() - t0) / args.steps)
      cpu[cfg].append((time.process_time() - c0) / args.steps)
  print(f'\n{args.rounds} rounds x {args.steps} steps; medians; '
        f'backward_window={window}')
  for what, table in (('wall-clock', times), ('CPU (process) time', cpu)):
    base = statistics.median(table[configs[0]])
    _Table(what, table, base, variants)
    floor = {m: statistics.median(table[('accumulated', None, m)]) / base
             if m > 1 else 1.0 for m in (1, 4, 8)}
    print(f'{"accumulated":>18}' + ''.join(f'{floor[m]:9.2f}x' + ' ' * 7
                                            for m in (1, 4, 8)))
    print(f'{what}, pipelined / accumulated (the pipeline\'s own cost)')
    for variant in variants:
      for k in (1, 2, 4):
        ratios = [statistics.median(table[(variant, k, m)]) / base /
                  floor[m] if table.get((variant, k, m)) else None
                  for m in (1, 4, 8)]
        print(f'{variant:>13} K={k}' + ''.join(
            (f'{ratio:9.2f}x' if ratio else f'{"n/a":>10}') + ' ' * 7
            for ratio in ratios))
  _Bubbles(variants, window, batch)


def _Bubbles(variants, window, batch):
  """One profiled step per configuration: its measured bubble next to (a)
  its paper's formula (F = B = W), (b) its action lists simulated with the
  times each action took in that step, (c) simulated at unit times."""
  print('\nbubble of one profiled step: measured / formula / simulated at the '
        'measured action times / simulated at unit times')
  print(f'{"":18}' + ''.join(f'{"M=" + str(m):>26}' for m in (1, 4, 8)))
  gaps = []
  for variant in variants:
    for k in (1, 2, 4):
      cells = []
      for m in (1, 4, 8):
        # The cells inlined per call, so that the profile names each op's
        # action (trace_actions).
        overrides = dict(Overrides(variant, window), trace_actions=True)
        bench_log.Say(f'bubble of {variant} K={k} M={m}: building, one '
                      'profiled step...')
        model = _Built(k, m, overrides, batch)
        if model is None:
          cells.append('n/a')
          continue
        ops = timeline_lib.ProfileOps(lambda: float(model.Step(  # pylint: disable=cell-var-from-loop
            *batch, tf.constant(0, tf.int64))))
        devices = [f'/device:CPU:{i}' for i in range(k)]
        timeline = timeline_lib.Timeline(ops, devices,
                                         schedule=overrides['schedule'])
        plan = timeline.schedule
        busy = timeline.busy   # Each action's own time: its ops' union.
        simulated = plan.Bubble(cost=lambda a: busy.get(a, 0.0))  # pylint: disable=cell-var-from-loop
        formula = schedules.FormulaBubble(plan.name, plan.num_stages, k, m)
        gaps.append(abs(timeline.measured_bubble - simulated))
        cells.append(f'{timeline.measured_bubble:.2f}/'
                     f'{"-" if formula is None else f"{formula:.2f}"}/'
                     f'{simulated:.2f}/{plan.Bubble():.2f}')
      print(f'{variant:>13} K={k}' + ''.join(f'{c:>26}' for c in cells),
            flush=True)
  if gaps:
    print(f'|measured - simulated at measured times|: median '
          f'{statistics.median(gaps):.3f}, worst {max(gaps):.3f}')


if __name__ == '__main__':
  main()
