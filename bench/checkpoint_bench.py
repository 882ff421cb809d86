"""Checkpoint cost: synchronous vs TensorFlow's async checkpointing.

For the Tiny LM (lm.one_billion_wds.OneBWdsGPipeTransformerTiny: d 128, 4
layers, 2 pipeline stages on 2 logical CPUs) and a ~100M-parameter model of
the same family (d 768, 14 layers, feed-forward 3072, 12 heads, the same
512-piece vocabulary; batch 4 x 64 tokens so that a step takes seconds, not
minutes, on CPU), on the state the trainer checkpoints (model, Adam slots,
global step):

1. Save and restore: the seconds a save blocks the caller (synchronous:
   `CheckpointManager.save`; async: the same with
   `CheckpointOptions(enable_async=True)`, which
   copies the variables, then writes from a thread), the seconds until an
   async save is on disk (`Checkpoint.sync()`), the seconds to restore
   (`Checkpoint.restore`) and the bytes on disk. Interleaved repeats,
   medians. The writes land in the page cache (TensorFlow does not fsync),
   so these are the costs a trainer sees, not the disk's.
2. The step-time cost of saving every N steps: blocks of 3 x (N train
   steps (a tf.function step: forward, backward, Adam), then no save, a
   synchronous save or an async save), the blocks of the three kinds
   interleaved; an async write overlaps the steps after it, and each block
   waits for its last write; seconds per step (median over blocks) and the
   ratio to no save, in one run.

Run (about 5 minutes on 2 cores; `--models tiny` alone about 1 minute):
  .venv/bin/python bench/checkpoint_bench.py [--models tiny,100m]
      [--repeats 3] [--blocks 3]
"""
import argparse
import glob
import os
import shutil
import statistics
import tempfile
import time

from absl import logging
import bench_log
import tensorflow as tf

from cadence.framework.jobs import run_params
from cadence.framework.jobs import trainer_lib
from cadence.framework.train import checkpointer

_LM = 'lm.one_billion_wds.OneBWdsGPipeTransformerTiny'
# name -> (--model_params_override, save every N steps)
_MODELS = {
    'tiny': ('', 10),
    '100m': ('task.model_dim=768;task.train.learner.lr_schedule.model_dim='
             '768;task.stack_tpl.num_layers=14;task.stack_tpl.transformer_tpl'
             '.hidden_dim=3072;task.stack_tpl.transformer_tpl.num_heads=12;'
             'input.batch_size=4', 5),
}
_ASYNC = tf.train.CheckpointOptions(enable_async=True)


class _State:
  """A model's train state, its train step and checkpoint managers."""

  def __init__(self, overrides, cluster, directory):
    options = trainer_lib.TrainerOptions(model=_LM, worker_split_size=2,
                                         model_params_override=overrides)
    params = run_params.LoadParams(options, 'Train')
    with cluster:
      self.task = params.Instantiate().task
      self.learner = self.task.InstantiateLearner()
      self.learner.Build()
    self.step = tf.Variable(tf.constant(0, tf.int64), trainable=False)
    self.num_params = sum(v.shape.num_elements() for v in
                          checkpointer.TaskVariables(self.task).values())
    objects = dict(model=checkpointer.KeyedVariables(
        checkpointer.TaskVariables(self.task)),
                   optimizer=self.learner.checkpointables,
                   global_step=self.step)
    # Two Checkpoint objects: TF keeps the async copies per Checkpoint.
    self.sync = tf.train.Checkpoint(**objects)
    self.asyn = tf.train.Checkpoint(**objects)
    self.managers = {
        name: tf.train.CheckpointManager(ckpt, os.path.join(directory, name),
                                         max_to_keep=2)
        for name, ckpt in (('sync', self.sync), ('async', self.asyn))}
    self._batches = iter(params.input.Instantiate().Dataset())
    self._step_fn = tf.function(self._Step, autograph=False)

  def _Step(self, batch):
    with tf.GradientTape() as tape:
      metrics, _ = self.task.FPropTower(self.task.theta, batch)
    self.learner.Apply(self.step, tape, metrics.loss[0])
    self.step.assign_add(1)
    return metrics.loss[0]

  def Steps(self, n):
    for _ in range(n):
      loss = self._step_fn(next(self._batches))
    return float(loss.numpy())

  def Save(self, how, wait=True):
    """Saves sync or async; returns (seconds blocked, seconds until on disk
    (if `wait`), path)."""
    start = time.perf_counter()
    if how == 'sync':
      path = self.managers['sync'].save(int(self.step.numpy()))
      blocked = time.perf_counter() - start
      return blocked, blocked, path
    path = self.managers['async'].save(int(self.step.numpy()),
                                       options=_ASYNC)
    blocked = time.perf_counter() - start
    if wait:
      self.asyn.sync()
    return blocked, time.perf_counter() - start, path

  def Restore(self, path):
    start = time.perf_counter()
    self.sync.restore(path).assert_existing_objects_matched()
    return time.perf_counter() - start


def _Bytes(path):
  return sum(os.path.getsize(f) for f in glob.glob(path + '.*'))


def SaveRestore(state, repeats):
  """Rows of part 1 for one model."""
  bench_log.Say('compiling the train step (the first step)...')
  state.Steps(1)  # Compiles the step; creates nothing new after.
  bench_log.Say('a first async save (it builds its copies)...')
  state.Save('async')  # TF's first async save also builds its copies.
  runs = {'sync': [], 'async': []}
  for r in range(repeats):
    bench_log.Say(f'save and restore, repeat {r + 1} of {repeats}...')
    for how in (('sync', 'async') if r % 2 == 0 else ('async', 'sync')):
      blocked, done, path = state.Save(how)
      runs[how].append((blocked, done, state.Restore(path), _Bytes(path)))
  return {how: [statistics.median(x[i] for x in rows) for i in range(4)]
          for how, rows in runs.items()}


def StepCost(state, every, blocks, saves_per_block=3):
  """{how: median seconds per step} over blocks of `saves_per_block` x
  (`every` steps, then a save). An async save's write overlaps the next
  steps; the block waits for its last one (`sync()`), inside the timing."""
  hows = ('none', 'sync', 'async')
  per_step = {how: [] for how in hows}
  state.Steps(every)  # Warm.
  for b in range(blocks):
    for how in hows[b % 3:] + hows[:b % 3]:  # Rotated order.
      start = time.perf_counter()
      for i in range(saves_per_block):
        bench_log.Say(f'step cost, block {b + 1} of {blocks}, '
                      f'{i + 1} of {saves_per_block}: {every} steps, then '
                      f'{"no" if how == "none" else "a " + how} save...')
        state.Steps(every)
        if how != 'none':
          state.Save(how, wait=False)
      state.asyn.sync()
      per_step[how].append((time.perf_counter() - start) /
                           (every * saves_per_block))
  return {how: statistics.median(v) for how, v in per_step.items()}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--models', default='tiny,100m')
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--blocks', type=int, default=3)
  args = parser.parse_args()
  tf.get_logger().setLevel('ERROR')
  logging.set_verbosity(logging.WARNING)
  cluster = trainer_lib.ConfigureDevices(
      trainer_lib.TrainerOptions(worker_split_size=2)).cluster
  print(f'TensorFlow {tf.__version__}, {os.cpu_count()} CPU cores; '
        f'{args.repeats} repeats, {args.blocks} blocks (medians)\n')
  save_rows, cost_rows = [], []
  for name in args.models.split(','):
    overrides, every = _MODELS[name]
    directory = tempfile.mkdtemp(prefix=f'checkpoint_bench_{name}_')
    try:
      bench_log.Say(f'{name}: building the model and its train step...')
      state = _State(overrides, cluster, directory)
      label = f'{name} ({state.num_params / 1e6:.1f}M params)'
      rows = SaveRestore(state, args.repeats)
      for how, (blocked, done, restore, size) in rows.items():
        save_rows.append(
            f'| {label} | {how} | {blocked:.3f} | {done:.3f} | '
            f'{blocked / rows["sync"][0]:.2f} | {restore:.3f} | '
            f'{size / 2**20:.1f} |')
      cost = StepCost(state, every, args.blocks)
      for how in ('none', 'sync', 'async'):
        cost_rows.append(f'| {label} | {every} | {how} | {cost[how]:.4f} | '
                         f'{cost[how] / cost["none"]:.3f} |')
    finally:
      shutil.rmtree(directory, ignore_errors=True)
  print('| model | save | blocks the caller (s) | on disk after (s) | '
        'blocked / sync | restore (s) | MiB |')
  print('| --- | --- | --- | --- | --- | --- | --- |')
  print('\n'.join(save_rows))
  print('\n| model | save every N steps | save | s per step | / no save |')
  print('| --- | --- | --- | --- | --- |')
  print('\n'.join(cost_rows))


if __name__ == '__main__':
  main()
