"""Step time of the GPipe Transformer against the same model unpipelined.

Model (the DESIGN.md benchmark): token embedding (vocab 1024, d 256), 8
pre-LN causal Transformer layers (4 heads, feed-forward 1024), softmax
cross-entropy; batch 32 x seq 64. One training step = forward + backward +
SGD update, compiled with tf.function.

  unpipelined: transformer.TransformerStack on /device:CPU:0;
  pipelined:   gpipe_transformer.GPipeTransformerStack with `splits`=K cells
               on K logical CPUs and M micro-batches (remat 'except_last').

Both start from the same weights (identical variable paths). The script
configures 4 logical CPUs at start; they share this machine's cores, so the
table measures the pipeline's overhead, not a speed-up. Each configuration
is warmed up, then timed in interleaved rounds; the tables give the median
step time as a ratio to the unpipelined median, wall-clock and CPU time of
the process (the latter is less sensitive to other load on a shared
machine). Targets: <= 1.35 at K=1, <= 1.5 everywhere. Lingvo 0.14.2's GPipe
on this machine: 7x at K=1, M=4; 11x at K=2, M=8.

Run:
  cd /work/main && /work/venv/bin/python bench/gpipe_bench.py [--rounds 5]
      [--remat except_last|always|never] [--backward_window 1|2|None]
"""
import argparse
import os
import statistics
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import tensorflow as tf

_CPUS = tf.config.list_physical_devices('CPU')
tf.config.set_logical_device_configuration(
    _CPUS[0], [tf.config.LogicalDeviceConfiguration()] * 4)

from cadence.framework import base_layer
from cadence.framework import cluster as cluster_lib
from cadence.framework import step_seed
from cadence.layers import embedding
from cadence.layers import gpipe_transformer
from cadence.layers import softmax
from cadence.layers import transformer

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
  """Embedding -> stack -> softmax; `Step` trains one SGD step."""

  def __init__(self, num_splits=None, num_micro_batches=1, **overrides):
    super().__init__()
    n = num_splits or 1
    cluster = cluster_lib.Cluster.Params().Set(
        num_devices=n, worker_split_size=n).Instantiate()
    with cluster, tf.device(cluster.devices[0]):
      self.emb = embedding.EmbeddingLayer.Params().Set(
          name='emb', vocab_size=VOCAB, embedding_dim=DIM).Instantiate()
      self.stack = _StackParams(num_splits, num_micro_batches,
                                **overrides).Instantiate()
    with tf.device(cluster.devices[-1]):
      self.softmax = softmax.SimpleFullSoftmax.Params().Set(
          name='softmax', input_dim=DIM, num_classes=VOCAB).Instantiate()
    self.last_device = cluster.devices[-1]
    self.first_device = cluster.devices[0]
    self.train_vars = (self.emb.vars.Flatten() + self.stack.vars.Flatten() +
                       self.softmax.vars.Flatten())
    self.Step = tf.function(self._Step, autograph=False)

  def _Step(self, ids, labels, paddings, step):
    seed = step_seed.MakeStepSeed(step)
    with tf.GradientTape() as tape:
      with tf.device(self.first_device):
        x = self.emb.FProp(self.emb.theta, ids)
      theta = base_layer.WithStepSeed(self.stack.theta, seed)
      x = self.stack.FProp(theta, x, paddings)
      with tf.device(self.last_device):
        loss = self.softmax.FProp(self.softmax.theta, x, labels).avg_xent
    grads = tape.gradient(loss, self.train_vars)
    for v, g in zip(self.train_vars, grads):
      if isinstance(g, tf.IndexedSlices):     # The embedding table.
        v.scatter_sub(tf.IndexedSlices(0.01 * g.values, g.indices))
      else:
        v.assign_sub(0.01 * g)
    return loss


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--rounds', type=int, default=5,
                      help='Interleaved timing rounds.')
  parser.add_argument('--steps', type=int, default=3,
                      help='Steps per configuration per round.')
  parser.add_argument('--remat', default='except_last',
                      help='PipeliningLayer.remat of the pipelined models.')
  parser.add_argument('--backward_window', default='1',
                      help='PipeliningLayer.backward_window: an int or None.')
  args = parser.parse_args()
  window = (None if args.backward_window == 'None' else
            int(args.backward_window))
  overrides = dict(remat=args.remat, backward_window=window)

  ids = tf.random.stateless_uniform([BATCH, SEQ], [1, 2], maxval=VOCAB,
                                    dtype=tf.int32)
  labels = tf.roll(ids, -1, axis=1)
  paddings = tf.zeros([BATCH, SEQ])
  configs = [(None, 1)] + [(k, m) for k in (1, 2, 4) for m in (1, 4, 8)]
  models = {}
  for cfg in configs:
    models[cfg] = _Model(*cfg, **(overrides if cfg[0] else {}))
    t0 = time.perf_counter()
    for s in range(2):   # Trace and warm up.
      models[cfg].Step(ids, labels, paddings, tf.constant(s, tf.int64))
    print(f'built {cfg}: warm-up {time.perf_counter() - t0:.1f} s',
          flush=True)
  times = {cfg: [] for cfg in configs}
  cpu = {cfg: [] for cfg in configs}
  for _ in range(args.rounds):
    for cfg in configs:
      step = models[cfg].Step
      t0 = time.perf_counter()
      c0 = time.process_time()
      for s in range(args.steps):
        float(step(ids, labels, paddings, tf.constant(s, tf.int64)))
      times[cfg].append((time.perf_counter() - t0) / args.steps)
      cpu[cfg].append((time.process_time() - c0) / args.steps)
  for what, table in (('wall-clock', times), ('CPU (process) time', cpu)):
    base = statistics.median(table[(None, 1)])
    print(f'\nunpipelined step, {what}: {base * 1000:.0f} ms (median of '
          f'{args.rounds} rounds x {args.steps} steps)')
    print(f'pipelined / unpipelined, {what} (ms in brackets); {overrides}:')
    print('      ' + ''.join(f'{"M=" + str(m):>16}' for m in (1, 4, 8)))
    for k in (1, 2, 4):
      cells = []
      for m in (1, 4, 8):
        t = statistics.median(table[(k, m)])
        cells.append(f'{t / base:6.2f}x ({t * 1000:4.0f})')
      print(f'K={k}:  ' + ''.join(f'{c:>16}' for c in cells))


if __name__ == '__main__':
  main()
