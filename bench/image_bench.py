"""Image examples/s of the pipelined ResNet against the same model unpipelined.

Model: the ShapesResNetTiny classifier (params/image/shapes_resnet.py:
32x32x3 images, a 3x3 stem of 16 channels, three stages of one residual
block of 16, 32, 64 channels, 10 classes) on batches of --batch shapes
images. One training step = forward + backward + SGD update + the BN
moving-average updates, compiled with tf.function.

  unpipelined: pipeline_tpl None, every unit on /device:CPU:0, whole batch;
  K x M:       `splits`=K cells on K logical CPUs, M micro-batches
               (PipeliningLayer, schedule 'gpipe', remat 'except_last').

All configurations start from the same weights (identical variable paths)
and run on the same batches. The script configures 4 logical CPUs; they
share this machine's cores, so the table measures the pipeline's overhead
(rematerialisation, per-micro-batch work, smaller convolutions), not a
speed-up. Each configuration is warmed up, then timed in interleaved rounds;
the table gives the median examples/s and the step time as a ratio to the
unpipelined median, wall-clock and CPU time of the process (the latter is
less sensitive to other load on a shared machine).

Run:
  .venv/bin/python bench/image_bench.py [--rounds 5] [--steps 10]
      [--batch 64] [--configs 1x1,1x4,2x4,2x8] [--remat except_last]
      [--small 4]
"""
import argparse
import functools
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
from cadence.framework import model_registry
from cadence.framework import step_seed
from cadence.tasks.image import input_generator

_TINY = 'image.shapes_resnet.ShapesResNetTiny'


def _Build(batch, splits, micro_batches, remat):
  """(task, step fn) of the Tiny classifier; splits None: unpipelined."""
  params = model_registry.GetParams(_TINY, 'Train')
  params.input.batch_size = batch
  net = params.task.resnet_tpl
  if splits is None:
    net.Set(splits=1, pipeline_tpl=None)
    k = 1
  else:
    net.splits = splits
    net.pipeline_tpl.Set(num_micro_batches=micro_batches, remat=remat)
    k = splits
  with cluster_lib.Cluster.Params().Set(num_devices=k,
                                        worker_split_size=k).Instantiate():
    task = params.Instantiate().task
  learner = task.InstantiateLearner()
  learner.Build()

  @tf.function
  def _Step(batch, step):
    theta = base_layer.WithStepSeed(task.theta, step_seed.MakeStepSeed(step))
    with tf.GradientTape() as tape:
      metrics, _ = task.FPropTower(theta, batch)
    learner.Apply(step, tape, metrics.loss[0])
    return metrics.loss[0]

  return task, _Step


def _Time(step_fn, batches, steps):
  """(wall s, process CPU s) per step over `steps` steps."""
  wall, cpu = time.perf_counter(), time.process_time()
  for i in range(steps):
    loss = step_fn(batches[i % len(batches)], tf.constant(i, tf.int64))
  loss.numpy()
  return ((time.perf_counter() - wall) / steps,
          (time.process_time() - cpu) / steps)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--rounds', type=int, default=5)
  parser.add_argument('--steps', type=int, default=10,
                      help='Steps per configuration per round.')
  parser.add_argument('--batch', type=int, default=64)
  parser.add_argument('--configs', default='1x1,1x4,2x4,2x8',
                      help='Pipelined configurations KxM.')
  parser.add_argument('--remat', default='except_last',
                      help='PipeliningLayer.remat of the pipelined ones.')
  parser.add_argument('--small', type=int, default=4,
                      help='Also time the unpipelined step on batch / this '
                      '(a micro-batch of M=this): what small convolutions '
                      'cost without the pipeline; 0: not.')
  args = parser.parse_args()
  configs = [('unpipelined', None, None, args.batch)]
  if args.small:
    configs.append((f'unpipel. b/{args.small}', None, None,
                    args.batch // args.small))
  configs += [(c, int(c.split('x')[0]), int(c.split('x')[1]), args.batch)
              for c in args.configs.split(',')]
  data = input_generator.ShapesInput.Params().Set(
      image_size=[32, 32], num_examples=4 * args.batch,
      batch_size=args.batch, fixed_input_shape=True).Instantiate()
  batches = list(data.Dataset().take(4))
  steps = {}
  for name, k, m, batch in configs:
    bench_log.Say(f'{name}: building, tracing, warming up...')
    _, step_fn = _Build(batch, k, m, args.remat)
    parts = [b.Transform(lambda x, n=batch: x[:n]) for b in batches]
    step_fn = functools.partial(_Time, step_fn, parts)
    step_fn(3)                                     # trace, compile, warm up
    steps[name] = step_fn
  wall = {c[0]: [] for c in configs}
  cpu = {c[0]: [] for c in configs}
  for r in range(args.rounds):
    bench_log.Say(f'round {r + 1} of {args.rounds}: {args.steps} steps of '
                  'each configuration...')
    for name, *_ in configs:
      w, c = steps[name](args.steps)
      wall[name].append(w)
      cpu[name].append(c)
  base_w = statistics.median(wall['unpipelined'])
  base_c = statistics.median(cpu['unpipelined'])
  print(f'\nShapesResNetTiny train step, batch {args.batch} of 32x32x3, '
        f'{args.rounds} rounds x {args.steps} steps (median), remat '
        f'{args.remat}; ratios: time per example over the unpipelined '
        'one in this run.')
  header = (f'{"config (KxM)":<16}{"batch":>6}{"step ms":>9}'
            f'{"examples/s":>12}{"wall x":>8}{"cpu x":>8}')
  print(header)
  print('-' * len(header))
  for name, _, _, batch in configs:
    w, c = statistics.median(wall[name]), statistics.median(cpu[name])
    scale = args.batch / batch
    print(f'{name:<16}{batch:>6}{1000 * w:>9.1f}{batch / w:>12.0f}'
          f'{scale * w / base_w:>8.2f}{scale * c / base_c:>8.2f}')


if __name__ == '__main__':
  main()
