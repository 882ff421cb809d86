"""Export of the Tiny GPipe LM: its cost, its size, and its serving speed.

In one run, on the experiment's Dev params (a batch of 32 rows of 64
tokens; 2 logical CPUs, the 2-stage model split the decoder job uses):

  * export time: `--mode=export`'s work (framework/jobs/export.py: build,
    restore, trace, save) beside the decoder job's start-up (build on the
    model split, restore, and its first decode step, which traces);
  * SavedModel size beside the model's weights;
  * latency per batch, the median of interleaved rounds after a first call:
    the export's `score` and `sample` (loaded with tf.saved_model.load)
    against the in-framework evaler's step (FPropTower) and decoder's step
    (Decode: the batch's prompts, greedy and sampled, 2 x 32 rows), as the
    evaler and decoder jobs run them on the 2-device pipelined model, and
    the same in-framework steps on one device (what the export's graph
    computes: the cells in turn).

The weights are the checkpoint of --logdir (a run of the experiment), or
else fresh ones saved to a temporary checkpoint: an untrained model rarely
emits EOS, so `sample` and the decoder run every row to the end, the most
work per batch. The machine is shared: compare the ratios of one run.
Each phase says what it does on stderr as it starts (the table goes to
stdout).

Run:
  .venv/bin/python bench/export_bench.py [--logdir /tmp/cadence_lm] \
      [--rounds 3]
"""
import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import bench_log  # pylint: disable=g-import-not-at-top

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

_CPUS = tf.config.list_physical_devices('CPU')
tf.config.set_logical_device_configuration(
    _CPUS[0], [tf.config.LogicalDeviceConfiguration()] * 2)

from cadence.framework import base_layer  # pylint: disable=g-import-not-at-top
from cadence.framework import cluster as cluster_lib  # pylint: disable=g-import-not-at-top
from cadence.framework import model_registry  # pylint: disable=g-import-not-at-top
from cadence.framework.jobs import export  # pylint: disable=g-import-not-at-top
from cadence.framework.train import checkpointer  # pylint: disable=g-import-not-at-top
from cadence.framework.train import eval_programs  # pylint: disable=g-import-not-at-top

KEY = 'lm.one_billion_wds.OneBWdsGPipeTransformerTiny'


def _FolderBytes(folder):
  return sum(os.path.getsize(os.path.join(root, n))
             for root, _, names in os.walk(folder) for n in names)


def _SaveFresh(params, logdir):
  """A checkpoint (step 0) of fresh weights in logdir/train."""
  task = params.Instantiate().task
  objects = dict(model=checkpointer.KeyedVariables(
      checkpointer.TaskVariables(task)),
                 global_step=tf.Variable(tf.constant(0, tf.int64)))
  checkpointer.Checkpointer(os.path.join(logdir, 'train'), objects).Save(0)


def _InFramework(params, logdir, devices):
  """The evaler's and decoder's steps on `devices` devices, restored."""
  p = params.Copy()
  p.task.is_inference = True
  cluster = cluster_lib.Cluster.Params().Set(
      num_devices=devices, worker_split_size=devices).Instantiate()
  with cluster:
    task = p.Instantiate().task
    state = eval_programs.CheckpointState(task, os.path.join(logdir, 'train'))
    step = state.Restore(checkpointer.ListCheckpoints(
        os.path.join(logdir, 'train'))[-1])
    theta = base_layer.WithStepSeed(state.Theta(), task.SampleSeed(step))
  score = tf.function(lambda b: task.FPropTower(theta, b)[0].loss,
                      autograph=False)
  decode = tf.function(lambda b: task.Decode(theta, b), autograph=False)
  return task, score, decode


def _Timed(fn):
  start = time.perf_counter()
  out = fn()
  tf.nest.map_structure(lambda x: x.numpy() if hasattr(x, 'numpy') else x,
                        out)
  return time.perf_counter() - start


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--logdir', default='', help='A run of the experiment '
                      '(its latest checkpoint); default: fresh weights.')
  parser.add_argument('--rounds', type=int, default=3,
                      help='Timed calls of each step (after a first one).')
  args = parser.parse_args()
  params = model_registry.GetParams(KEY, 'Dev')
  tmp = tempfile.mkdtemp()
  logdir = args.logdir or tmp
  if not args.logdir:
    bench_log.Say('building the model, saving fresh weights...')
    _SaveFresh(params, logdir)
  bench_log.Say('reading a Dev batch...')
  batch = next(iter(params.input.Instantiate().Dataset()))

  # Export, and the decoder job's start-up: build, restore, first step.
  bench_log.Say('exporting (build, restore, trace, save)...')
  start = time.perf_counter()
  path, step = export.Export(params, logdir,
                             export_dir=os.path.join(tmp, 'export'))
  export_s = time.perf_counter() - start
  bench_log.Say('the decoder job\'s start-up on 2 stages (build, restore, '
                'first decode step)...')
  start = time.perf_counter()
  task, evaler, decoder = _InFramework(params, logdir, 2)
  decoder(batch)
  startup_s = time.perf_counter() - start
  bench_log.Say('building the evaler and decoder steps on 1 device...')
  _, evaler_1, decoder_1 = _InFramework(params, logdir, 1)
  saved_bytes = _FolderBytes(path)
  weight_bytes = sum(v.shape.num_elements() * v.dtype.size
                     for v in task.vars.Flatten())

  bench_log.Say('loading the SavedModel...')
  served = tf.saved_model.load(path)
  ids = tf.concat([batch.ids[:, :1], batch.labels], 1)
  paddings = tf.pad(1.0 - batch.weights, [[0, 0], [1, 0]])
  lengths = task.PromptLengths(batch.ids, batch.paddings)
  b = int(lengths.shape[0])
  prompts = dict(
      prompt_ids=tf.concat([batch.ids] * 2, 0),
      prompt_lengths=tf.concat([lengths] * 2, 0),
      temperature=tf.constant([0.0] * b + [1.0] * b),
      seed=tf.constant(step, tf.int64))
  calls = {
      'evaler step (2 stages)': lambda: evaler(batch),
      'evaler step (1 device)': lambda: evaler_1(batch),
      'export score': lambda: served.score(ids=ids, paddings=paddings),
      'decoder step (2 stages)': lambda: decoder(batch),
      'decoder step (1 device)': lambda: decoder_1(batch),
      'export sample': lambda: served.sample(**prompts),
  }
  bench_log.Say('the export\'s sample (its first call traces it), to compare '
                'with the decoder\'s ids...')
  out_sample = served.sample(**prompts)['ids']
  bench_log.Say('the decoder\'s ids, to compare...')
  out_decode = decoder(batch)
  same = np.array_equal(out_sample, tf.concat(
      [out_decode.greedy_ids, out_decode.sampled_ids], 0))
  times = {name: [] for name in calls}
  for name, fn in calls.items():
    bench_log.Say(f'an untimed first call of the {name}...')
    _Timed(fn)   # The first call traces.
  for r in range(args.rounds):
    for name, fn in calls.items():
      bench_log.Say(f'round {r + 1} of {args.rounds}: timing the {name}...')
      times[name].append(_Timed(fn))
  med = {name: statistics.median(t) for name, t in times.items()}

  print(f'weights: {"checkpoint of " + logdir if args.logdir else "fresh"}; '
        f'batch {b} rows of {int(batch.ids.shape[1])}; export sample ids '
        f'{"equal" if same else "DIFFER FROM"} the decoder\'s')
  print(f'{"":40}{"value":>10}{"ratio":>8}  baseline')
  print(f'{"export time, s":40}{export_s:>10.2f}'
        f'{export_s / startup_s:>8.2f}  decoder start-up {startup_s:.2f} s')
  print(f'{"SavedModel size, MB":40}{saved_bytes / 1e6:>10.2f}'
        f'{saved_bytes / weight_bytes:>8.2f}  model weights '
        f'{weight_bytes / 1e6:.2f} MB')
  for name, base in (('evaler step (1 device)', 'evaler step (2 stages)'),
                     ('export score', 'evaler step (2 stages)'),
                     ('decoder step (1 device)', 'decoder step (2 stages)'),
                     ('export sample', 'decoder step (2 stages)')):
    print(f'{name + " per batch, ms":40}{med[name] * 1e3:>10.1f}'
          f'{med[name] / med[base]:>8.2f}  {base} '
          f'{med[base] * 1e3:.1f} ms')


if __name__ == '__main__':
  main()
