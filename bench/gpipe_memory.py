"""Peak memory of a training step vs depth: plain vs GPipe (M=8).

The model of bench/gpipe_bench.py (d 256, 4 heads, ff 1024, seq 64, batch
32, vocab 1024) with L = 4, 8, 16, 32 layers. Each configuration runs in a
fresh subprocess: build, 3 training steps (forward + backward + SGD, one
tf.function), then two numbers:

  tensor peak: the peak bytes of live tensors during the last step, from
    TF's BFC allocator stats (the child sets TF_CPU_ALLOCATOR_USE_BFC=true
    so that CPU tensors go through an allocator that counts);
  peak RSS: `ru_maxrss` of the process (also counts the TF runtime, the
    compiled graphs, whose size grows with L*M for the pipeline since each
    micro-batch calls the cells' functions, and allocator pools that are
    never returned).

Activations are what differ between the models:
  plain:      L * (activations of a layer on the full batch);
  pipelined:  M * boundary + (L / K) * (activations of a layer on one
              micro-batch) per device: the backward re-runs one cell on one
              micro-batch at a time (backward_window=1), the last
              micro-batch keeps its forward activations (remat
              'except_last') but is back-propagated first.
Weights, gradients and optimizer updates grow with L in every model. All
logical devices share this process, so for K > 1 the numbers are summed
over devices. The script prints a table and the least-squares slopes
(MiB per layer).

Run:
  cd /work/main && /work/venv/bin/python bench/gpipe_memory.py
      [--layers 4,8,16,32] [--splits 1,4] [--backward_window 1|2|None]
"""
import argparse
import json
import os
import subprocess
import sys

_CHILD = r"""
import os, json, resource, sys
os.environ['TF_CPP_MIN_LOG_LEVEL'] = '2'
sys.argv = [sys.argv[0]]
sys.path.insert(0, {bench_dir!r})
import gpipe_bench as gb
import tensorflow as tf
gb.LAYERS = {layers}
model = gb._Model({splits}, {micro_batches},
                  **({overrides!r} if {splits!r} else {{}}))
ids = tf.random.stateless_uniform([gb.BATCH, gb.SEQ], [1, 2], maxval=gb.VOCAB,
                                  dtype=tf.int32)
labels = tf.roll(ids, -1, axis=1)
pads = tf.zeros([gb.BATCH, gb.SEQ])
for s in range(3):
  tf.config.experimental.reset_memory_stats('CPU:0')
  float(model.Step(ids, labels, pads, tf.constant(s, tf.int64)))
print(json.dumps(dict(
    tensor_mib=tf.config.experimental.get_memory_info('CPU:0')['peak'] / 2**20,
    rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)))
"""


def _Measure(layers, splits, micro_batches, overrides):
  code = _CHILD.format(bench_dir=os.path.dirname(os.path.abspath(__file__)),
                       layers=layers, splits=splits,
                       micro_batches=micro_batches, overrides=overrides)
  env = dict(os.environ, TF_CPU_ALLOCATOR_USE_BFC='true')
  out = subprocess.run([sys.executable, '-c', code], capture_output=True,
                       text=True, check=True, env=env)
  return json.loads(out.stdout.strip().splitlines()[-1])


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
  parser.add_argument('--splits', default='1,4',
                      help='Comma-separated K of the pipelined models.')
  parser.add_argument('--backward_window', default='1',
                      help='PipeliningLayer.backward_window: an int or None.')
  args = parser.parse_args()
  window = (None if args.backward_window == 'None' else
            int(args.backward_window))
  overrides = dict(backward_window=window)
  depths = [int(x) for x in args.layers.split(',')]
  models = [('plain', None, 1)] + [
      (f'GPipe K={k} M=8', int(k), 8) for k in args.splits.split(',')]
  table = {}
  for name, splits, m in models:
    for n in depths:
      table[(name, n)] = _Measure(n, splits, m, overrides)
      print(f'{name:>14}  L={n:<3} tensor peak '
            f'{table[(name, n)]["tensor_mib"]:7.0f} MiB, peak RSS '
            f'{table[(name, n)]["rss_mib"]:7.0f} MiB', flush=True)
  for key, title in (('tensor_mib', 'tensor peak (MiB) of a training step'),
                     ('rss_mib', 'peak RSS (MiB) of the process')):
    print(f'\n{title}; pipelined: {overrides}')
    print(f'{"L":>14}' + ''.join(f'{n:>9}' for n in depths) +
          f'{"slope MiB/layer":>18}')
    for name, _, _ in models:
      ys = [table[(name, n)][key] for n in depths]
      print(f'{name:>14}' + ''.join(f'{y:9.0f}' for y in ys) +
            f'{_Slope(depths, ys):18.1f}')


if __name__ == '__main__':
  main()
