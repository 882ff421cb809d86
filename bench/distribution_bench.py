"""Replicas x pipeline stages: the Tiny LM's step cost, and the all-reduce.

Part 1 trains lm.one_billion_wds.OneBWdsGPipeTransformerTiny through
trainer.py for replicas x stages in {1x1, 2x1, 1x2, 2x2} on 4 logical CPUs
(each replica a batch of 32, so R replicas see R x 32 examples a step), in
interleaved rounds, and reads the steady-state steps/s of its progress lines
(the first step, which compiles, is not in them). It prints each
configuration's examples/s and its cost per example as a ratio to 1x1.
Logical CPUs share the machine's cores, so this measures overhead, not
speed-up: the issue's aim is 2x2 within 1.2x of 1x2's per-example cost.

Part 2 times the all-reduce alone over the Tiny LM's gradients (2 replicas
x 2 stages, framework/replicas.StageAllReduce) for each mode and pack size,
as a share of the 1x1 step.

Run:
  .venv/bin/python bench/distribution_bench.py [--rounds 2]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import textwrap

import bench_log

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_KEY = 'lm.one_billion_wds.OneBWdsGPipeTransformerTiny'
_CONFIGS = [(1, 1), (2, 1), (1, 2), (2, 2)]   # (replicas, stages)

_ALLREDUCE = textwrap.dedent("""
    import json, sys, time
    import tensorflow as tf
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices('CPU')[0],
        [tf.config.LogicalDeviceConfiguration()] * 4)
    from cadence.framework import cluster as cluster_lib, model_registry
    from cadence.framework.train import replicas
    params = model_registry.GetParams(%(key)r, 'Train')
    cluster = cluster_lib.Cluster.Params().Set(
        num_devices=4, worker_split_size=2).Instantiate()
    strategy = tf.distribute.MirroredStrategy(['/device:CPU:0',
                                               '/device:CPU:2'])
    with cluster:
      tasks = replicas.BuildReplicas(params, cluster)
    paths = [k for k, v in tasks[0].vars.FlattenItems() if v.trainable]
    out = {}
    for mode in ('one_device', 'hierarchical_copy', 'ring'):
      for pack in (0, 256 * 1024, 1024 * 1024):
        reducer = replicas.StageAllReduce(cluster, tasks, paths, mode, pack,
                                          strategy=strategy)

        def _Grads():
          ctx = tf.distribute.get_replica_context()
          r = tf.get_static_value(ctx.replica_id_in_sync_group)
          variables = dict(tasks[r].vars.FlattenItems())
          out = []
          for p in paths:
            with tf.device(variables[p].device):
              out.append(tf.identity(variables[p]) * 1.0001)
          return out

        @tf.function
        def _Reduce():
          grads = strategy.run(_Grads)
          reduced = reducer.Mean(strategy, grads)
          return tf.add_n([tf.reduce_sum(g) for g in reduced[0]])

        _Reduce().numpy()
        times = []
        for _ in range(20):
          start = time.perf_counter()
          _Reduce().numpy()
          times.append(time.perf_counter() - start)
        times.sort()
        out[f'{mode} pack={pack // 1024}KiB'] = times[len(times) // 2]
    print(json.dumps(out))
""") % dict(key=_KEY)


def _StepsPerSec(replicas, stages, steps, logdir):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')
  proc = subprocess.run(
      [sys.executable, 'trainer.py', f'--model={_KEY}', f'--logdir={logdir}',
       '--job=trainer', f'--max_steps={steps}',
       f'--worker_replicas={replicas}', f'--worker_split_size={stages}',
       '--model_params_override=task.train.log_interval_steps=10;'
       'task.train.summary_interval_steps=10;'
       f'task.train.save_interval_steps={steps}'],
      cwd=_ROOT, env=env, capture_output=True, text=True, check=True)
  rates = [float(m) for m in re.findall(r'step \d+/\d+ .* ([\d.]+) steps/s',
                                        proc.stderr)]
  return statistics.median(rates[1:] or rates)   # Skip the first window.


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--rounds', type=int, default=2)
  parser.add_argument('--steps', type=int, default=60)
  args = parser.parse_args()
  tmp = os.path.join('/tmp', f'distribution_bench_{os.getpid()}')
  rates = {c: [] for c in _CONFIGS}
  for rnd in range(args.rounds):
    for r, k in _CONFIGS:
      bench_log.Say(f'round {rnd}: trainer.py, {r} replica(s) x {k} '
                    f'stage(s), {args.steps} steps...')
      rate = _StepsPerSec(r, k, args.steps, f'{tmp}/{rnd}_{r}x{k}')
      rates[(r, k)].append(rate)
      print(f'round {rnd}: {r}x{k} {rate:.2f} steps/s', flush=True)
  base = statistics.median(rates[(1, 1)]) * 32   # examples/s of 1x1
  print('\nreplicas x stages  steps/s  examples/s  cost/example vs 1x1')
  cost = {}
  for r, k in _CONFIGS:
    steps = statistics.median(rates[(r, k)])
    examples = steps * 32 * r
    cost[(r, k)] = base / examples
    print(f'{r}x{k:<16} {steps:7.2f}  {examples:10.0f}  {cost[(r, k)]:8.2f}x')
  print(f'2x2 per-example cost / 1x2: {cost[(2, 2)] / cost[(1, 2)]:.2f} '
        '(aim <= 1.2)')
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')
  bench_log.Say('timing the all-reduce alone, each mode and pack size...')
  proc = subprocess.run([sys.executable, '-c', _ALLREDUCE], cwd=_ROOT,
                        env=env, capture_output=True, text=True, check=True)
  reduce_times = json.loads(proc.stdout.strip().splitlines()[-1])
  step = 1.0 / statistics.median(rates[(1, 1)])
  print('\nall-reduce of the Tiny LM gradients, 2 replicas x 2 stages')
  print(f'{"mode / pack":<30} {"ms":>6}   share of a 1x1 step')
  for name, seconds in reduce_times.items():
    print(f'{name:<30} {seconds * 1e3:6.2f}   {seconds / step:6.1%}')


if __name__ == '__main__':
  main()
