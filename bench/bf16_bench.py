"""Mixed precision: bfloat16 against float32 training steps, in one run.

Two models, each unpipelined and pipelined, in float32 and with
fprop_dtype=bfloat16 (float32 variables, gradients and optimizer; see
README "Mixed precision"):

  Tiny LM:      `lm.one_billion_wds.OneBWdsGPipeTransformerTiny`'s task
                (batch 32 x seq 64, Adam), its train step as the trainer
                runs it (bench/lm_bench.py CadenceStep), on batches of its
                corpus already in memory; plain stack, and 2 cells x M=4
                on 2 logical CPUs (the experiment's setting);
  Transformer:  bench/gpipe_bench.py's (d 256, 8 layers, batch 32 x seq 64,
                SGD); unpipelined, and K=2 x M=4.

Steps are timed in interleaved rounds (all variants each round); the table
gives the median step time and bfloat16 / float32 per model and layout.
The logical CPUs share this machine's cores. On a CPU without bfloat16
arithmetic (no avx512_bf16 / amx_bf16 in /proc/cpuinfo) TensorFlow's
bfloat16 kernels convert to float32 and back, so bfloat16 costs time here;
the point of bfloat16 is an accelerator's (TPU) matrix units and half the
activation bytes.

Then the loss curve (--curve_steps, default 200; 0 skips it): the Tiny LM
(plain stack) trained from the same initial weights on the same batches in
float32 and in bfloat16, in lockstep; the table gives the training loss
averaged over 20-step windows and the difference. The margin this bench
holds bfloat16 to: the mean loss of the last window within 0.05 nats of
float32's (printed as OK/ABOVE).

Run:
  .venv/bin/python bench/bf16_bench.py [--rounds 5] [--steps 5]
      [--curve_steps 200]
"""
import argparse
import os
import statistics
import sys
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_log  # pylint: disable=g-import-not-at-top,wrong-import-position
# Each configures logical CPUs at import (before TensorFlow starts): the
# last, gpipe_bench's 4, holds.
import lm_bench  # pylint: disable=g-import-not-at-top,wrong-import-position
import gpipe_bench  # pylint: disable=g-import-not-at-top,wrong-import-position

from cadence.framework import cluster as cluster_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from cadence.framework.nested_map import NestedMap  # pylint: disable=g-import-not-at-top,wrong-import-position

DTYPES = (tf.float32, tf.bfloat16)
CURVE_WINDOW = 20
CURVE_MARGIN = 0.05   # nats a token, the last window's mean.


def _LmTask(data_dir, splits, micro_batches, dtype):
  p = lm_bench._Params(data_dir, splits, micro_batches)  # pylint: disable=protected-access
  p.task.fprop_dtype = dtype
  with cluster_lib.Cluster.Params().Set(
      num_devices=splits, worker_split_size=splits).Instantiate():
    return p.task.Instantiate()


def _LmBatches(data_dir, n):
  generator = lm_bench._Params(data_dir, 1, 1).input.Instantiate()  # pylint: disable=protected-access
  return [NestedMap({k: tf.constant(v) for k, v in
                     generator.InputBatchAt(i).items()}) for i in range(n)]


def _Variants(data_dir, lm_batches):
  """{(model, layout, dtype name): a function running one step}."""
  bench_log.Say('building the 8 variants (2 models x 2 layouts x 2 '
                'dtypes)...')
  variants = {}
  for dtype in DTYPES:
    for layout, (splits, m) in (('plain', (1, 1)), ('K=2 M=4', (2, 4))):
      step = lm_bench.CadenceStep(_LmTask(data_dir, splits, m, dtype))
      it = iter(range(10**9))
      variants['Tiny LM', layout, dtype.name] = (
          lambda step=step, it=it: step(lm_batches[next(it) %
                                                   len(lm_batches)]))
  ids = tf.random.stateless_uniform(
      [gpipe_bench.BATCH, gpipe_bench.SEQ], [1, 2],
      maxval=gpipe_bench.VOCAB, dtype=tf.int32)
  labels = tf.roll(ids, -1, axis=1)
  paddings = tf.zeros([gpipe_bench.BATCH, gpipe_bench.SEQ])
  for dtype in DTYPES:
    for layout, (k, m) in (('plain', (None, 1)), ('K=2 M=4', (2, 4))):
      model = gpipe_bench._Model(k, m, fprop_dtype=dtype)  # pylint: disable=protected-access
      step = tf.constant(0, tf.int64)
      variants['Transformer', layout, dtype.name] = (
          lambda model=model, step=step: model.Step(ids, labels, paddings,
                                                    step))
  return variants


def _Speed(args, variants):
  compile_s = {}
  for key, fn in variants.items():   # Trace and warm up.
    bench_log.Say(f'{" ".join(key)}: the first steps (trace, compile)...')
    start = time.perf_counter()
    float(fn())
    compile_s[key] = time.perf_counter() - start
    float(fn())
    print(f'built {key}: first step {compile_s[key]:.1f} s', flush=True)
  times = {key: [] for key in variants}
  for r in range(args.rounds):
    bench_log.Say(f'round {r + 1} of {args.rounds}: {args.steps} steps of '
                  'each variant...')
    for key, fn in variants.items():
      start = time.perf_counter()
      for _ in range(args.steps):
        loss = fn()
      float(loss)
      times[key].append((time.perf_counter() - start) / args.steps)
  print(f'\n{args.rounds} rounds x {args.steps} steps, interleaved; median '
        'step time (ms) and bfloat16 / float32')
  header = (f'{"model":12s} {"layout":8s} {"float32":>9s} {"bfloat16":>9s} '
            f'{"bf16/fp32":>9s}')
  print(header)
  print('-' * len(header))
  for model in ('Tiny LM', 'Transformer'):
    for layout in ('plain', 'K=2 M=4'):
      ms = {d.name: 1e3 * statistics.median(times[model, layout, d.name])
            for d in DTYPES}
      print(f'{model:12s} {layout:8s} {ms["float32"]:9.1f} '
            f'{ms["bfloat16"]:9.1f} {ms["bfloat16"] / ms["float32"]:8.2f}x')


def _Curve(args):
  batches = _LmBatches(args.data_dir, args.curve_steps)
  steps = {d.name: lm_bench.CadenceStep(_LmTask(args.data_dir, 1, 1, d))
           for d in DTYPES}
  losses = {name: [] for name in steps}
  for i, batch in enumerate(batches):   # In lockstep: the same batches.
    if i % 25 == 0:
      bench_log.Say(f'loss curve: steps {i + 1}-'
                    f'{min(i + 25, len(batches))} of {len(batches)}...')
    for name, step in steps.items():
      losses[name].append(float(step(batch)))
  print(f'\nTiny LM (plain stack) loss, nats a token, mean of '
        f'{CURVE_WINDOW}-step windows; the same weights and batches')
  header = f'{"steps":>9s} {"float32":>8s} {"bfloat16":>8s} {"diff":>7s}'
  print(header)
  print('-' * len(header))
  diff = None
  for start in range(0, args.curve_steps, CURVE_WINDOW):
    window = slice(start, start + CURVE_WINDOW)
    f32 = np.mean(losses['float32'][window])
    b16 = np.mean(losses['bfloat16'][window])
    diff = b16 - f32
    print(f'{start + 1:4d}-{min(start + CURVE_WINDOW, args.curve_steps):<4d} '
          f'{f32:8.3f} {b16:8.3f} {diff:+7.3f}')
  verdict = 'OK' if abs(diff) <= CURVE_MARGIN else 'ABOVE'
  print(f'last window: bfloat16 - float32 = {diff:+.3f} nats ({verdict}: '
        f'margin {CURVE_MARGIN})')


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--rounds', type=int, default=5)
  parser.add_argument('--steps', type=int, default=5,
                      help='Steps per variant per round.')
  parser.add_argument('--curve_steps', type=int, default=200,
                      help='Steps of the loss curve (0: none).')
  parser.add_argument('--data_dir', default='',
                      help="Corpus directory (default: the experiment's).")
  args = parser.parse_args()
  flags = open('/proc/cpuinfo').read().split() if os.path.exists(
      '/proc/cpuinfo') else []
  print('CPU bfloat16 instructions: ' + (', '.join(sorted(
      {f for f in flags if f in ('avx512_bf16', 'amx_bf16')})) or 'none'))
  _Speed(args, _Variants(args.data_dir, _LmBatches(args.data_dir, 8)))
  if args.curve_steps:
    _Curve(args)


if __name__ == '__main__':
  main()
