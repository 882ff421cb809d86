"""Train steps/s of the Tiny LM with and without XLA (--xla), same run.

For each configuration, two `programs.TrainProgram`s over the same task
params and input: one with `xla=True` (each replica's forward and backward
compiled with `tf.function(jit_compile=True)`), one without. Each is
warmed up (the first loop call traces and compiles; its time is reported
as "first call"), then timed over `--steps` steps in one loop call
(`RunSteps`, what the trainer runs between boundaries). The two programs
alternate over `--repeats` rounds; the table gives median steps/s and the
ratio XLA / plain of the medians.

Configurations: the Tiny LM (d 128, 4 layers, batch 32 x 64 tokens) on one
device, pipelined (2 cells, 4 micro-batches: the experiment's pipeline,
stages in turn on one device) and not (1 cell, 1 micro-batch).

Run:
  .venv/bin/python bench/xla_bench.py [--repeats 3] [--steps 10]
"""
import argparse
import statistics
import tempfile
import time

import bench_log
import tensorflow as tf

from cadence.framework import model_registry
from cadence.framework.train import programs

_KEY = 'lm.one_billion_wds.OneBWdsGPipeTransformerTiny'
_CONFIGS = {
    'pipelined (2 cells, 4 micro-batches)': dict(splits=2, micro_batches=4),
    'unpipelined (1 cell, 1 micro-batch)': dict(splits=1, micro_batches=1),
}


def _Program(config, xla):
  p = model_registry.GetParams(_KEY, 'Train')
  p.task.stack_tpl.splits = config['splits']
  p.task.stack_tpl.pipeline_tpl.num_micro_batches = config['micro_batches']
  return programs.TrainProgram(p.Instantiate().task, tempfile.mkdtemp(),
                               peak_flops=1e12, xla=xla)


def _Bench(config, repeats, steps):
  runs = {}
  for xla in (False, True):
    bench_log.Say(f'{"xla" if xla else "plain"}: building the program, its '
                  'first loop call (traces and compiles)...')
    program = _Program(config, xla)
    iterator = program.Iterator()
    start = time.perf_counter()
    program.RunSteps(iterator, 1)
    first = time.perf_counter() - start
    program.RunSteps(iterator, 2)  # Warm.
    runs[xla] = dict(program=program, iterator=iterator, first=first,
                     rates=[])
  for r in range(repeats):
    bench_log.Say(f'round {r + 1} of {repeats}: {steps} steps of each...')
    for xla in (False, True):
      run = runs[xla]
      start = time.perf_counter()
      run['program'].RunSteps(run['iterator'], steps)
      run['rates'].append(steps / (time.perf_counter() - start))
  return {xla: (statistics.median(r['rates']), r['first'])
          for xla, r in runs.items()}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--steps', type=int, default=10)
  args = parser.parse_args()
  print(f'TensorFlow {tf.__version__}; {args.steps} steps per timed loop '
        f'call, median of {args.repeats} interleaved rounds.')
  print(f'{"configuration":40s} {"plain st/s":>10s} {"xla st/s":>9s} '
        f'{"xla/plain":>9s} {"first call plain / xla":>23s}')
  for name, config in _CONFIGS.items():
    bench_log.Say(f'{name}...')
    out = _Bench(config, args.repeats, args.steps)
    (plain, plain_first), (xla, xla_first) = out[False], out[True]
    print(f'{name:40s} {plain:10.2f} {xla:9.2f} {xla / plain:8.2f}x '
          f'{plain_first:10.1f} s / {xla_first:5.1f} s', flush=True)


if __name__ == '__main__':
  main()
