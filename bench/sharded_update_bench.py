"""Sharded optimizer state (ZeRO-1) against whole slots, R replicas x K
stages of a wide residual MLP (examples.pipelined_mlp's blocks, dim 256:
12 MiB of weights a replica, Adam's slots twice that), or of a registered
experiment (--model, its own K and batch), in one run:

  memory  each device's measured peak of a training step (TF's BFC
          allocator events, memory_profile, plus its variables and batch),
          sharded / unsharded, and the saving measured against the
          expected one, (R-1)/R of the device's slots; and the memory
          estimate (inspect_lib.TaskStages, DeviceMemory) / measured;
  time    the trainer's own compiled step (programs.TrainProgram.
          StepRunner), sharded and unsharded in interleaved windows of one
          process, their median ratio.

Each memory measurement runs in a fresh process (one layout's allocator
events, nothing else's); the two step times share one (so the machine's
load hits both alike).

Run:
  .venv/bin/python bench/sharded_update_bench.py [--replicas 2] [--stages 2]
  .venv/bin/python bench/sharded_update_bench.py --model=image.shapes_resnet.ShapesResNetTiny
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap

import bench_log

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_COMMON = textwrap.dedent("""
    import json, os, sys, tempfile, time
    import tensorflow as tf
    R, K, DIM = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    PACK = int(os.environ.get('BENCH_PACK', '0'))
    MODEL = os.environ.get('BENCH_MODEL', '')
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices('CPU')[0],
        [tf.config.LogicalDeviceConfiguration()] * (R * K))
    from cadence.framework import cluster as cluster_lib, optimizer
    from cadence.framework import model_registry
    from cadence.framework.jobs import inspect_lib, inspect_pipeline
    from cadence.framework.pipeline import memory_estimate, memory_profile
    from cadence.framework.train import programs, replicas
    from cadence.params.examples import pipelined_mlp

    class Wide(pipelined_mlp.PipelinedMlp):
      INPUT_DIM = DIM

    STRATEGY = tf.distribute.MirroredStrategy(
        ['/device:CPU:%d' % (r * K) for r in range(R)])

    def Program(shard, trace=False):
      if MODEL:   # Its own K, batch and optimizer.
        p = model_registry.GetParams(MODEL, 'Train')
        p.task.train.learner.shard_optimizer_state = shard
      else:
        exp = Wide()
        p = exp.Model()
        p.input = exp.Train()
        p.input.batch_size = 32
        p.task.net_tpl.splits = K
        p.task.train.learner.Set(optimizer=optimizer.Adam.Params(),
                                 shard_optimizer_state=shard)
      p.task.train.max_steps = 10 ** 6
      p.task.train.allreduce_bytes_per_pack = PACK
      if trace:
        p = inspect_pipeline.TraceActions(p)
      cluster = cluster_lib.Cluster.Params().Set(
          num_devices=R * K, worker_split_size=K).Instantiate()
      with cluster:
        tasks = replicas.BuildReplicas(p, cluster)
        program = programs.TrainProgram(tasks, tempfile.mkdtemp(), STRATEGY,
                                        cluster=cluster)
        # The estimate of replica 0's stages, on its devices.
        estimate = inspect_lib.TaskStages(tasks[0],
                                          memory_estimate.DeviceMemory,
                                          num_replicas=R)
      return program, tasks, [s.total for s in estimate]
""")

_MEMORY = _COMMON + textwrap.dedent("""
    shard = sys.argv[4] == 'shard'
    program, tasks, estimate = Program(shard, trace=True)
    run = program.StepRunner()
    placement = memory_profile.Placement(lambda: run(1))
    run(1)
    variables = [v for t in tasks for v in t.vars.Flatten()]
    slots = []
    for learner in program.state.learners:
      state = learner.optimizer.checkpointables
      slots += [s for named in state.slots.values() for s in named.values()]
    totals = memory_profile.DeviceTotals(
        memory_profile.DevicePeaks(lambda: run(1), placement),
        variables + slots)
    # The process's peak: every buffer as one device's.
    together = sum(memory_profile.DevicePeaks(lambda: run(1), {}).values())
    print(json.dumps(dict(
        measured=[totals.get(f'CPU:{d}', 0) for d in range(R * K)],
        total=together + sum(v.shape.num_elements() * v.dtype.size
                             for v in variables + slots),
        slots=[sum(s.shape.num_elements() * s.dtype.size for s in slots
                   if memory_profile.ShortDevice(s.device) == f'CPU:{d}')
               for d in range(R * K)],
        unattributed=totals.get(memory_profile.UNATTRIBUTED, 0),
        estimate=estimate)))
""")

_TIME = _COMMON + textwrap.dedent("""
    rounds, window = int(sys.argv[4]), int(sys.argv[5])
    runs = {name: Program(name == 'shard')[0].StepRunner()
            for name in ('plain', 'shard')}
    for run in runs.values():
      run(3)   # Compiles.
    samples = {name: [] for name in runs}
    for _ in range(rounds):
      for name, run in runs.items():
        samples[name].append(run(window))
    print(json.dumps(samples))
""")


def _Child(script, *args):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2',
             TF_CPU_ALLOCATOR_USE_BFC='true',
             PYTHONPATH=os.path.dirname(_ROOT))
  proc = subprocess.run([sys.executable, '-c', script] +
                        [str(a) for a in args], capture_output=True,
                        text=True, env=env, cwd=_ROOT, check=False)
  if proc.returncode:
    sys.exit(f'child failed:\n{proc.stderr[-3000:]}')
  return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--replicas', type=int, default=2)
  parser.add_argument('--stages', type=int, default=2)
  parser.add_argument('--dim', type=int, default=256)
  parser.add_argument('--rounds', type=int, default=7)
  parser.add_argument('--window', type=int, default=20)
  parser.add_argument('--pack', type=int, default=0,
                      help='train.allreduce_bytes_per_pack, both runs')
  parser.add_argument('--model', default='',
                      help='a registered experiment instead of the wide MLP '
                      '(its own K: --stages must say it, batch and '
                      'optimizer), e.g. lm.one_billion_wds.'
                      'OneBWdsGPipeTransformerTiny')
  args = parser.parse_args()
  os.environ['BENCH_PACK'] = str(args.pack)
  os.environ['BENCH_MODEL'] = args.model
  r, k = args.replicas, args.stages
  memory = {}
  for name in ('plain', 'shard'):
    bench_log.Say(f'memory of a step, {name} (R={r}, K={k})...')
    memory[name] = _Child(_MEMORY, r, k, args.dim, name)
  bench_log.Say(f'step times, {args.rounds} interleaved windows of '
                f'{args.window}...')
  times = _Child(_TIME, r, k, args.dim, args.rounds, args.window)
  mib = 2.0 ** 20
  what = (f'{args.model} (its batch and optimizer)' if args.model else
          f'residual MLP dim {args.dim}, Adam, batch 32 a replica')
  print(f'Sharded optimizer state: R={r} replicas x K={k} stages, {what}, '
        f'allreduce_bytes_per_pack={args.pack} ({r * k} logical CPUs share '
        'the cores).\n')
  plain, shard = memory['plain'], memory['shard']
  devices = r * k

  def _Spread(res, d):
    # A device's peak, with the bytes the profile could not attribute
    # (XLA's compiled update and TF's branch functions allocate without an
    # op name) spread evenly over the devices, which hold alike.
    return res['measured'][d] + res['unattributed'] / devices

  print('| device | slots unsharded MiB | peak unsharded MiB | peak sharded '
        'MiB | sharded / unsharded | saving / expected (R-1)/R slots | '
        'estimate / measured, unsharded | sharded |')
  print('| --- | --- | --- | --- | --- | --- | --- | --- |')
  rows = [(f'CPU:{d}', plain['slots'][d], _Spread(plain, d),
           _Spread(shard, d), plain['estimate'][d], shard['estimate'][d])
          for d in range(k)]   # Replica 0's devices (the others alike).
  rows.append(('process', sum(plain['slots']), plain['total'],
               shard['total'], None, None))
  for name, slots, before, after, est_before, est_after in rows:
    saving = (before - after) / (slots * (r - 1) / r)
    estimates = ('| | |' if est_before is None else
                 f'| {est_before / before:.3f} | {est_after / after:.3f} |')
    print(f'| {name} | {slots / mib:.2f} | {before / mib:.2f} | '
          f'{after / mib:.2f} | {after / before:.3f} | {saving:.3f} '
          + estimates)
  print(f'\nUnattributed MiB (spread over the devices above): unsharded '
        f'{plain["unattributed"] / mib:.2f}, sharded '
        f'{shard["unattributed"] / mib:.2f}. The process row is the '
        'allocator\'s peak of every device together, its variables added.')
  ratios = [s / p for s, p in zip(times['shard'], times['plain'])]
  median = statistics.median(ratios)
  plain_ms = 1000 * statistics.median(times['plain'])
  print(f'\nStep time, sharded / unsharded: median {median:.3f} over '
        f'{len(ratios)} interleaved windows of {args.window} steps (range '
        f'{min(ratios):.3f}-{max(ratios):.3f}); unsharded {plain_ms:.1f} ms '
        'a step.')


if __name__ == '__main__':
  main()
