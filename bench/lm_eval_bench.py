"""Dev eval time per checkpoint of the Tiny GPipe LM, by eval set size.

The README's main job (`--job=trainer_and_evaler`) evaluates Dev after each
of its 5 checkpoints. This builds that eval exactly as the trainer does
(`lm.one_billion_wds.OneBWdsGPipeTransformerTiny`, Dev params, an inference
task on a 2-device model split, `eval_programs.EvalProgram`) and times
`Run` at consecutive steps for each configuration asked for:
`eval.samples_per_summary` (0: the whole Dev set), the Dev rows' length
`max_seq_len` and the Dev batch size. The first run of each program
includes tracing; the table gives it apart from the median of the others.
Configurations are timed in interleaved rounds, so machine noise hits all
alike; compare the ratios, not the seconds. The default compares the
experiment's earlier Dev eval (the first 1024 sentences, rows of 48) with
its current one (all 2000, rows of 64), both in batches of 32. (Larger Dev
batches cut the per-batch overhead, but the decoder reads the same Dev
params and would decode every row of its batch.)

Run:
  .venv/bin/python bench/lm_eval_bench.py [--configs 1024:48:32,0:64:32] \
      [--rounds 4]
"""
import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import bench_log  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

_CPUS = tf.config.list_physical_devices('CPU')
tf.config.set_logical_device_configuration(
    _CPUS[0], [tf.config.LogicalDeviceConfiguration()] * 2)

from cadence.framework import cluster as cluster_lib  # pylint: disable=g-import-not-at-top
from cadence.framework import model_registry  # pylint: disable=g-import-not-at-top
from cadence.framework.train import eval_programs  # pylint: disable=g-import-not-at-top

KEY = 'lm.one_billion_wds.OneBWdsGPipeTransformerTiny'


def _Program(samples, max_seq_len, batch_size, logdir):
  p = model_registry.GetParams(KEY, 'Dev')
  p.input.Set(max_seq_len=max_seq_len, batch_size=batch_size)
  p.task.is_inference = True
  p.task.eval.samples_per_summary = samples
  task = p.Instantiate().task
  return eval_programs.EvalProgram(task, 'Dev', logdir), task


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--configs', default='1024:48:32,0:64:32',
                      help='Comma-separated samples_per_summary:max_seq_len:'
                      'batch_size.')
  parser.add_argument('--rounds', type=int, default=4,
                      help='Runs of each program (the first traces).')
  args = parser.parse_args()
  if args.rounds < 2:
    parser.error(f'--rounds={args.rounds}: must be >= 2 (the first traces '
                 'and is not timed)')
  sizes = [tuple(int(x) for x in c.split(':'))
           for c in args.configs.split(',')]
  cluster = cluster_lib.Cluster.Params().Set(
      num_devices=2, worker_split_size=2).Instantiate()
  times = {s: [] for s in sizes}
  evaluated = {}
  with cluster, tempfile.TemporaryDirectory() as logdir:
    bench_log.Say(f'building {len(sizes)} eval programs...')
    programs = {s: _Program(*s, os.path.join(logdir, '_'.join(map(str, s))))
                for s in sizes}
    for step in range(args.rounds):
      for s in sizes:
        bench_log.Say(
            f'round {step + 1} of {args.rounds}: evaluating {s[0] or "all"} '
            f'samples of {s[1]} tokens in batches of {s[2]}' +
            (' (the first run traces)...' if step == 0 else '...'))
        program, task = programs[s]
        start = time.perf_counter()
        result = program.Run(step, task.theta)
        times[s].append(time.perf_counter() - start)
        evaluated[s] = int(result['num_samples'])
  base = statistics.median(times[sizes[0]][1:])
  print(f'{"samples":>8} {"t":>4} {"batch":>5} {"examples":>8} {"first s":>8} '
        f'{"median s":>9} {"x first":>8}')
  for s in sizes:
    med = statistics.median(times[s][1:])
    print(f'{s[0] or "all":>8} {s[1]:>4} {s[2]:>5} {evaluated[s]:>8} '
          f'{times[s][0]:>8.2f} {med:>9.2f} {med / base:>8.2f}')


if __name__ == '__main__':
  main()
