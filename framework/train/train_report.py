"""What the train loop reports: throughput, FLOPs and MFU, summaries, log lines.

`TrainProgram` (framework/train/programs.py) runs the steps; this module turns
the sums its compiled loop returns into the numbers a user reads:

  * `Window`: the loop's summed stats since the last report, and the rates
    (steps/s, examples/s) over its wall time;
  * `Scalars`: the summary scalars of a window (metric averages, grad norm,
    skipped steps, rates, and with a FLOP count model TFLOP/s and MFU);
  * `ProgressLine` / `FirstStepLine`: the progress log lines;
  * FLOP accounting: `TrainFlopsPerExample` (3x the task's FPropMeta
    forward), `MeasurePeakFlops` (one device's matmul probe) and
    `NumStepDevices` (the devices one step runs on: the model splits' devices,
    one split per replica). MFU is achieved FLOP/s over
    peak-per-device x NumStepDevices.

Example:
  window = Window()
  window.Add({'steps': 10.0, 'examples': 320.0, 'metrics.loss.vw': 5.0,
              'metrics.loss.w': 10.0})
  Scalars(window, time.perf_counter(), example_flops=1e6,
          peak_flops=1e12)   # {'loss': 0.5, 'steps_per_sec': ..., 'mfu': ...}
"""
import math
import time

import tensorflow as tf

from cadence.framework import cluster as cluster_lib
from cadence.framework.nested_map import NestedMap
from cadence.framework import shapes
from cadence.framework.train import summary_utils

# Loop outputs that are not summed metrics.
_NOT_SUMMED = ('steps', 'examples', 'learning_rate', 'consecutive', 'stop')


def InputShapes(dataset, batch_size=None):
  """NestedMap of `shapes.Shape` of a dataset's batch (None: unknown dims).

  Args:
    dataset: a dataset of NestedMap batches.
    batch_size: if set, replaces dim 0 of every field.
  """

  def _Shape(spec):
    shape = shapes.Shape(spec.shape)
    return shape.WithDim(0, batch_size) if batch_size and shape.rank else shape

  return NestedMap(dataset.element_spec).Transform(_Shape)


def TrainFlopsPerExample(task, dataset, batch_size):
  """Train FLOPs per example: 3x (forward + backward) FPropMeta's forward.

  The forward is costed on one batch of `batch_size` examples (the
  per-replica batch: what FPropMeta's checks, e.g. a pipeline's
  micro-batching, expect) and divided by it, so batches of any size get
  their FLOPs as examples x this. Returns None when the task has no
  FPropMeta or another dim is unknown.
  """
  try:
    meta = type(task).FPropMeta(task.params, InputShapes(dataset, batch_size))
  except NotImplementedError:
    return None
  return None if meta.flops is None else 3 * meta.flops / batch_size


def MeasurePeakFlops(device=None, n=None, repeats=5):
  """FLOP/s of an n x n float32 matmul chain on one device: a peak estimate.

  n defaults to 1024 on CPU and 8192 when a GPU is visible.
  """
  if n is None:
    n = 8192 if tf.config.list_logical_devices('GPU') else 1024
  with tf.device(device):
    a = tf.random.stateless_normal([n, n], seed=[1, 2])
    b = tf.random.stateless_normal([n, n], seed=[3, 4])

    @tf.function
    def _Chain(a, b):
      for _ in range(4):
        a = tf.matmul(a, b) * 1e-3
      return tf.reduce_sum(a)

    _Chain(a, b).numpy()  # Compile.
    best = float('inf')
    for _ in range(repeats):
      start = time.perf_counter()
      _Chain(a, b).numpy()
      best = min(best, time.perf_counter() - start)
  return 4 * 2 * n ** 3 / best


def NumStepDevices(strategy, cluster=None):
  """Devices one train step runs on: devices per model split x replicas.

  Args:
    strategy: the tf.distribute strategy (one replica per model split).
    cluster: default `Cluster.Current()`.
  """
  cluster = cluster or cluster_lib.Cluster.Current()
  return cluster.num_devices_per_split * strategy.num_replicas_in_sync


class Window:
  """Sums of the train loop's outputs since the last report.

  Example:
    window = Window()
    window.Add(loop_out)            # {'steps': 50.0, 'examples': ..., ...}
    window.Rates(time.perf_counter())   # (steps/s, examples/s)
    window.Reset(time.perf_counter())
  """

  def __init__(self):
    self.Reset(time.perf_counter())

  def Reset(self, now):
    self.start, self.steps, self.examples, self.sums = now, 0, 0.0, {}

  def Add(self, out):
    """Adds the {stat name: float} sums of one loop call."""
    self.steps += int(out.get('steps', 0))
    self.examples += out.get('examples', 0.0)
    for key, value in out.items():
      if key not in _NOT_SUMMED:
        self.sums[key] = self.sums.get(key, 0.0) + value

  def Rates(self, now):
    """(steps/s, examples/s) since the window's start."""
    secs = max(now - self.start, 1e-9)
    return self.steps / secs, self.examples / secs

  def Loss(self):
    """The weighted mean loss over the window (NaN without weight)."""
    weight = self.sums.get('metrics.loss.w', 0.0)
    return (self.sums.get('metrics.loss.vw', 0.0) / weight if weight else
            math.nan)


def LoopLoss(out):
  """The weighted mean loss of one loop call's outputs."""
  weight = out.get('metrics.loss.w', 0.0)
  return out.get('metrics.loss.vw', 0.0) / weight if weight else math.nan


def Scalars(window, now, example_flops=None, peak_flops=None,
            learning_rate=None, skipped_steps_total=None):
  """The train summary scalars of a window.

  Args:
    window: the `Window` of the steps to summarise.
    now: `time.perf_counter()` at the window's end.
    example_flops: train FLOPs per example, or None (no FLOP/s, no MFU).
    peak_flops: peak FLOP/s of all the step's devices together, or None.
    learning_rate: the last learning rate, or None.
    skipped_steps_total: skipped steps since training began, or None.

  Returns:
    {tag: float or None}: each metric's weighted average, grad_norm (over
    the applied steps), skipped_steps, skipped_steps_total, steps_per_sec,
    examples_per_sec, learning_rate, and with `example_flops`
    model_tflops_per_sec and (with `peak_flops`) mfu.
  """
  steps_per_sec, examples_per_sec = window.Rates(now)
  sums = window.sums
  ok = sums.get('ok_steps', 0.0)
  scalars = {}
  for key, value in sums.items():
    if key.startswith('metrics.') and key.endswith('.vw'):
      name = key[len('metrics.'):-len('.vw')]
      weight = sums[f'metrics.{name}.w']
      scalars[name] = value / weight if weight else float('nan')
  scalars.update(
      grad_norm=sums.get('grad_norm', 0.0) / ok if ok else float('nan'),
      skipped_steps=sums.get('skipped_steps', 0.0),
      skipped_steps_total=skipped_steps_total,
      steps_per_sec=steps_per_sec, examples_per_sec=examples_per_sec,
      learning_rate=learning_rate)
  if example_flops:
    achieved = example_flops * examples_per_sec
    scalars['model_tflops_per_sec'] = achieved / 1e12
    if peak_flops:
      scalars['mfu'] = achieved / peak_flops
  return scalars


def FirstStepLine(step, loss, step_secs, since_start=None):
  """The log line after the first step (which includes compiling it)."""
  since = '' if since_start is None else f'; {since_start:.1f} s after start'
  return (f'First step done (global step {step}, loss {loss:.6g}) in '
          f'{step_secs:.1f} s, compiling the train step included{since}.')


def ProgressLine(step, max_steps, window, now):
  """'step 50/500  loss 4.9  4.7 steps/s  149 examples/s  ETA 0:01:35'."""
  steps_per_sec, examples_per_sec = window.Rates(now)
  eta = (max_steps - step) / steps_per_sec if steps_per_sec else None
  skipped = int(window.sums.get('skipped_steps', 0))
  return (f'step {step}/{max_steps}  loss {window.Loss():.6g}  '
          f'{steps_per_sec:.1f} steps/s  {examples_per_sec:.0f} examples/s  '
          f'ETA {summary_utils.FormatDuration(eta)}' +
          (f'  ({skipped} skipped)' if skipped else ''))
