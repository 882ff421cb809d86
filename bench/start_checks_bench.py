"""Start-up cost of the trainer's checks before writing, per experiment.

Before a trainer writes anything it builds the model without weights
(base_model.BuildSymbolically) for the memory check (memory_check.Check)
and the comparison with the logdir's checkpoints. This prints, for each
registered experiment that trains on this machine, the seconds of that
symbolic build and of the check, beside the seconds of the real build of
the model (replicas.BuildReplicas: eager variables with their initial
values), which every trainer pays anyway; medians of interleaved repeats,
and the ratio. The time from the start to the first step (TensorFlow's
import, the input, the compile) is much larger still: the trainer's log
prints it ('First step done ... s after start').

Run (about a minute on 2 cores):
  .venv/bin/python bench/start_checks_bench.py [--repeats 5]
"""
import argparse
import statistics
import time

import tensorflow as tf

from cadence.framework import base_model
from cadence.framework import cluster as cluster_lib
from cadence.framework.jobs import memory_check
from cadence.framework import model_registry
from cadence.framework.train import replicas

# The experiments the README trains on CPU (the published-scale LM and
# ResNet-34 are inspected, not trained, here).
_KEYS = ('synthetic.linear_regression.RegressionTiny',
         'keras.regression.KerasMlpTiny',
         'image.shapes_resnet.ShapesResNetTiny',
         'lm.one_billion_wds.OneBWdsGPipeTransformerTiny')


def _Seconds(fn):
  start = time.perf_counter()
  fn()
  return time.perf_counter() - start


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--repeats', type=int, default=5)
  args = parser.parse_args()
  splits = {k: getattr(model_registry.GetClass(k), 'WORKER_SPLIT_SIZE', 1)
            for k in _KEYS}
  cpus = tf.config.list_physical_devices('CPU')
  tf.config.set_logical_device_configuration(
      cpus[0], [tf.config.LogicalDeviceConfiguration()] * max(
          splits.values()))
  rows = [('experiment', 'symbolic build s', 'check s', 'real build s',
           'checks / real build')]
  for key in _KEYS:
    params = model_registry.GetParams(key, 'Train')
    cluster = cluster_lib.Cluster.Params().Set(
        num_devices=splits[key], worker_split_size=splits[key]).Instantiate()
    times = {'symbolic': [], 'check': [], 'real': []}
    with cluster:
      for _ in range(args.repeats):   # Interleaved.
        model = []
        times['symbolic'].append(_Seconds(lambda: model.append(
            base_model.BuildSymbolically(params)[0])))
        times['check'].append(_Seconds(lambda: memory_check.Check(
            model[0].task, 'CPU', 1)))
        times['real'].append(_Seconds(
            lambda: replicas.BuildReplicas(params, cluster)))
    med = {k: statistics.median(v) for k, v in times.items()}
    rows.append((key, f"{med['symbolic']:.3f}", f"{med['check']:.3f}",
                 f"{med['real']:.3f}",
                 f"{(med['symbolic'] + med['check']) / med['real']:.2f}"))
  widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
  for row in rows:
    print('  '.join(c.ljust(w) for c, w in zip(row, widths)).rstrip())


if __name__ == '__main__':
  main()
