"""What the layout planner measures on this host: its speed, its layers'.

Calibration (`Calibrate`, the 'measure' values of a cluster text,
framework/planning/hardware.py):
  flops             one device's matmul FLOP/s (train_report's probe);
  memory_bandwidth  bytes/s of an elementwise add of 32 MiB tensors (it
                    reads two and writes one);
  concurrency       the throughput of n equal workloads run at once on n
                    logical devices (n = 1, 2, 4, ... up to the host's
                    devices), relative to one alone: n x t(1) / t(n). The
                    workload is `probe`: a layer's forward and backward
                    (the model's own when measuring it), else a chain of
                    matrix products. Logical devices share the host's cores
                    and thread pools, so with 2 cores t(2) is well above
                    t(1): this is what a pipeline's stages lose by running
                    on one host.

Unit costs (`MeasureParts` of `UnitPart`s, --plan_measure): each unit of
the model's pipeline plan (framework/pipeline/plan.py) built from its
params, what runs before the pipeline and the loss likewise. What a part's
forward, and
its forward and backward (the gradients of its weights and of its float
inputs), add to a compiled step, on a device, on random inputs of its
micro-batch shapes (int inputs, e.g. token ids, uniform below their
`maxval`): the median time of one tf.function running `copies` + 1 of it
in a chain (each copy's float inputs depend on the previous copy's
result, so none runs early and none is merged with another), less that
of one copy, over `copies`. A call of its own would add the call's
dispatch and the fetch of its results, a fixed cost a step's actions do
not pay, which on small units is most of what a lone call measures
(figures: the README, "Measured on the development machine"). And of the optimizer update of a layer's
weights (`MeasureUpdate`). Like PartitionSequentialLayers(cost='measured')
(layers/gpipe_partition.py), which times forward + backward together; the
planner needs the forward alone too (a re-run costs a forward).

Whole steps (`BuildStep`): a step of the trainer's own compiled loop for a
layout, on a random batch, which the planner times for a few layouts
(plan_costs.MeasuredCosts.MeasureSteps) to fit what layer costs leave out:
the executor's cost per layer and micro-batch, the step's fixed cost
(the loop, metrics, gradient norm and clipping), each extra replica's,
and how much devices sharing the host gain together (plan_costs.Overheads,
calibration.FitConcurrency).

Timings on a shared machine are noisy: every figure is a median of `runs`.

The process's allocator: with TensorFlow's default CPU allocator (malloc
per tensor) a compiled step's speed depends on what the process built and
ran before it: a step slowed by a quarter or more once a step of another
layout had been built in the process (even one never run again), and
stayed slow after that one was freed. With the BFC allocator
(TF_CPU_ALLOCATOR_USE_BFC=true; `trainer.py --mode=plan --plan_measure`
sets it unless the environment does) the same step ran as fast
throughout, as a trainer running one layout does (figures: the README, "Measured on the development machine"). The planner measures
many functions in one process, so it asks for BFC.

Example:
  hw = Calibrate(hardware.Parse('cpu'), devices)
  part = Part(layers=[layer], fn=lambda th, x: layer.FProp(th[0], x),
              specs=[tf.TensorSpec([8, 64, 128])])
  MeasureParts([part], device)       # [(forward s, forward+backward s)]
"""
import collections
import math
import statistics
import time

from absl import logging
import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import cluster as cluster_lib
from cadence.framework.distribute import local
from cadence.framework import step_seed
from cadence.framework.train import programs
from cadence.framework.train import replicas
from cadence.framework.train import train_report

# A measurable part of a model: its layers (built), fn(thetas, *inputs) ->
# tensors (the thetas of `layers`, in order), input TensorSpecs and, for
# int inputs, the bound of their values.
Part = collections.namedtuple('Part', ['layers', 'fn', 'specs', 'maxval'],
                              defaults=[None])


def _Median(fn, runs, warmup):
  """Median seconds of fn() (its results fetched), after `warmup` calls."""
  times = []
  for i in range(warmup + runs):
    start = time.perf_counter()
    for x in tf.nest.flatten(fn()):
      x.numpy()
    if i >= warmup:
      times.append(time.perf_counter() - start)
  return statistics.median(times)


def _Inputs(part, seed):
  out = []
  for i, spec in enumerate(part.specs):
    if spec.dtype.is_integer:
      out.append(tf.random.stateless_uniform(
          spec.shape, [seed, i], maxval=part.maxval or 2, dtype=spec.dtype))
    else:
      out.append(tf.random.stateless_normal(spec.shape, [seed, i],
                                            dtype=spec.dtype))
  return out


def _Dense(g):
  return g.values if isinstance(g, tf.IndexedSlices) else g


def _Sum(out):
  return tf.add_n([tf.reduce_sum(tf.cast(o, tf.float32))
                   for o in tf.nest.flatten(out) if o.dtype.is_floating])


def _Thetas(part):
  return [base_layer.WithStepSeed(l.theta, step_seed.MakeStepSeed(0))
          for l in part.layers]


def _Weights(part):
  return [v for l in part.layers for v in l.vars.Flatten()
          if v.trainable and v.dtype.is_floating]


def _Functions(part):
  """(forward, forward + backward) tf.functions of a part's inputs; the
  second returns the gradients of the weights and the float inputs."""
  thetas, weights = _Thetas(part), _Weights(part)

  def _Forward(*xs):
    return _Sum(part.fn(thetas, *xs))

  def _ForwardBackward(*xs):
    floats = [x for x in xs if x.dtype.is_floating]
    with tf.GradientTape() as tape:
      tape.watch(floats)
      loss = _Sum(part.fn(thetas, *xs))
    grads = tape.gradient(loss, weights + floats)
    return [_Dense(g) for g in grads if g is not None]

  return (tf.function(_Forward, autograph=False),
          tf.function(_ForwardBackward, autograph=False))


def _Chain(part, copies, backward):
  """A tf.function of `part`'s inputs running `copies` of its forward (and
  backward) one after another: each copy's float inputs add 0 x the sum
  of the previous copy's results. Returns that last sum."""
  forward, both = _Functions(part)
  fn = both if backward else forward

  def _Run(*xs):
    total = tf.constant(0.0)
    for _ in range(copies):
      ins = [x + tf.cast(0.0 * total, x.dtype) if x.dtype.is_floating
             else x for x in xs]
      total = _Sum(fn(*ins))
    return total

  return tf.function(_Run, autograph=False)


def MeasureParts(parts, device, runs=5, warmup=2, copies=4):
  """[(forward seconds, forward + backward seconds)] of each Part on
  `device`, as a step's action pays them (see the module docstring): the
  medians of `runs` after `warmup`, of a chain of copies + 1 less one."""
  out = []
  with tf.device(device):
    for part in parts:
      xs = _Inputs(part, len(out))
      times = []
      for backward in (False, True):
        one, more = _Chain(part, 1, backward), _Chain(part, copies + 1,
                                                      backward)
        for _ in range(warmup):
          one(*xs).numpy()
          more(*xs).numpy()
        diffs = []
        for _ in range(runs):   # Interleaved: the host's speed drifts.
          diffs.append(_Median(lambda: more(*xs), 1, 0) -  # pylint: disable=cell-var-from-loop
                       _Median(lambda: one(*xs), 1, 0))  # pylint: disable=cell-var-from-loop
        times.append(max(statistics.median(diffs), 0.0) / copies)
      out.append(tuple(times))
  return out


def MeasureUpdate(learner_params, layers, device, runs=5, warmup=2):
  """(seconds, bytes) of the optimizer update of the trained weights of
  `layers` (a list) by a learner of `learner_params` (its clipping, skip
  test and rule)."""
  with tf.device(device):
    var_map = base_layer.NestedMap(
        {f'l{i}': layer.vars for i, layer in enumerate(layers)})
    learner = learner_params.Copy().Instantiate(var_map=var_map)
    learner.Build()
    grads = learner.trainable_vars.Transform(
        lambda v: tf.random.stateless_normal(v.shape, [1, 2], dtype=v.dtype)
        * 1e-6)
    apply = tf.function(lambda g: learner.ApplyGradients(1, g).grad_norm,
                        autograph=False)
    seconds = _Median(lambda: apply(grads), runs, warmup)
  size = sum(v.shape.num_elements() * v.dtype.size
             for _, v in learner.trainable)
  return seconds, size


def UnitPart(unit):
  """The Part of a plan.Unit (framework/pipeline/plan.py): its layers built
  for real from their params (on the device in scope), its forward on
  random inputs of its shapes (ints below its maxval)."""
  if unit.build is None:
    raise ValueError(f'--plan_measure: unit {unit.name!r} cannot be built '
                     'to time it (its plan.Unit has no build).')
  layers, fn, specs, maxval = unit.build()
  return Part(layers, fn, specs, maxval)


def _FirstBatch(params):
  """One batch of the Train input of model `params` (numpy): what a
  calibration step runs on, over and over."""
  options = tf.data.Options()
  options.autotune.enabled = False   # Freeing its iterator waits for it.
  dataset = params.input.Instantiate().Dataset().with_options(options)
  return tf.nest.map_structure(lambda x: x.numpy(), next(iter(dataset)))


def SteadySeconds(run, steps, min_seconds=0.0):
  """Seconds a step of `run` (run(n) -> seconds a step, e.g. BuildStep's)
  over `steps` steps, or as many more as take about `min_seconds` (as the
  untimed step took), after one untimed step: the first step after another
  layout's pays for the switch, which a trainer running one layout step
  after step does not. A short window reads the shared host's jitter
  (figures: the README, "Measured on the development machine")."""
  first = run(1)
  if min_seconds > 0 and first > 0:
    steps = max(steps, math.ceil(min_seconds / first))
  return run(steps)


def BuildStep(params, devices, logdir, num_replicas=1):
  """run(n) -> seconds a step: n steps of the trainer's compiled loop
  (programs.TrainProgram: forward, gradients, update, the step's metrics
  and counters) for model `params` as `num_replicas` replicas (a
  MirroredStrategy, as the trainer's local setup makes) of len(devices) /
  num_replicas devices each, warmed up, on the first batch of its Train
  input per replica over and over (any model: the input generator's own
  batch). The program's files (none are written) would go under
  `logdir`.

  The loop on an iterator's batches, not a bare forward, gradients and
  update on constants: that is what the trainer runs (and once, before
  device_call.OnDevice took fresh identities for its sources, a batch
  from an iterator made the Tiny LM's step 1.35x a constant batch's).

  The repeated batch has nothing for tf.data's autotuning to tune, and
  with it on, freeing the iterators of the planner's 6 calibration steps
  waited for its threads: 30 s in a script on this 2-core host at load 3,
  up to 90 s loaded (0.0 s with it off, the steps as fast; in the trainer
  the 2-replica step's iterator still took 15 s, see
  plan_costs.MeasuredCosts.MeasureSteps)."""
  cluster = cluster_lib.Cluster.Params().Set(
      devices=list(devices),
      worker_split_size=len(devices) // num_replicas).Instantiate()
  strategy = local.LocalStrategy(cluster)
  with cluster:
    tasks = replicas.BuildReplicas(params, cluster)
    program = programs.TrainProgram(tasks, logdir, strategy,
                                    cluster=cluster)
    with tf.device(devices[0]):
      batch = tf.nest.map_structure(tf.constant, _FirstBatch(params))
  options = tf.data.Options()
  options.autotune.enabled = False
  run = program.StepRunner(
      tf.data.Dataset.from_tensors(batch).repeat().with_options(options))
  run(2)
  return run


def MemoryBandwidth(device, megabytes=32, runs=5):
  """Bytes/s of an elementwise add on `device` (2 reads, 1 write)."""
  n = megabytes * 2**20 // 4
  with tf.device(device):
    a = tf.random.stateless_normal([n], [1, 2])
    b = tf.random.stateless_normal([n], [3, 4])
    add = tf.function(lambda x, y: tf.reduce_sum(x + y), autograph=False)
    seconds = _Median(lambda: add(a, b), runs, 2)
  return 3 * n * 4 / seconds


def MatmulProbe(size=384, depth=6):
  """A Part of `depth` [size, size] products with ReLUs: the concurrency
  workload when no model layer is given."""

  class _Chain:
    theta = base_layer.NestedMap()
    vars = base_layer.NestedMap()

  def _Fn(unused_thetas, x):
    for _ in range(depth):
      x = tf.nn.relu(tf.matmul(x, x) * (1.0 / size))
    return x

  return Part(layers=[_Chain()], fn=_Fn,
              specs=[tf.TensorSpec([size, size], tf.float32)])


def Concurrency(probe, devices, max_running, runs=5):
  """(1, c_2, c_4, ...): the throughput of n copies of `probe`'s forward
  and backward run at once, copy i on devices[i % len(devices)], relative
  to one alone; n = 1, 2, 4, ... <= max_running."""
  counts = [1]
  while counts[-1] * 2 <= max_running:
    counts.append(counts[-1] * 2)
  inputs = []
  calls = []
  for i in range(counts[-1]):
    with tf.device(devices[i % len(devices)]):
      inputs.append(_Inputs(probe, i))
      calls.append(_Functions(probe)[1])

  def _Together(n):
    def _Run():
      outs = []
      for i in range(n):
        with tf.device(devices[i % len(devices)]):
          outs.append(calls[i](*inputs[i]))
      return outs
    return tf.function(_Run, autograph=False)

  together = {n: _Together(n) for n in counts}
  times = {n: [] for n in counts}
  for _ in range(2):
    for n in counts:
      _Median(together[n], 1, 1)
  for _ in range(runs):   # Interleaved: the load of a shared host drifts.
    for n in counts:
      times[n].append(_Median(together[n], 1, 0))
  one = statistics.median(times[1])
  out = [1.0]
  for n in counts[1:]:
    out.append(max(out[-1], n * one / statistics.median(times[n])))
  return tuple(out)


def Calibrate(hw, devices, probe=None):
  """`hw` with its 'measure' values measured on this host's `devices`
  (logical devices; see the module docstring) and, where it has none, the
  host's memory (shared) as its memory."""
  measures = [(field, what, fn) for field, what, fn in (
      ('flops', 'a device\'s matmul FLOP/s',
       lambda: train_report.MeasurePeakFlops(devices[0])),
      ('memory_bandwidth', 'a device\'s memory bandwidth',
       lambda: MemoryBandwidth(devices[0])),
      ('concurrency', 'what devices running at once gain',
       lambda: Concurrency(probe or MatmulProbe(), devices,
                           hw.devices_per_host)))
              if getattr(hw, field) == 'measure']
  measured = {}
  for i, (field, what, fn) in enumerate(measures):
    logging.info('Measuring this host (%d of %d): %s...', i + 1,
                 len(measures), what)
    measured[field] = fn()
  memory = None
  if hw.memory is None and hw.shared:
    memory = cluster_lib.HostMemoryBytes()
  return hw.Calibrated(flops=measured.get('flops'),
                       memory_bandwidth=measured.get('memory_bandwidth'),
                       concurrency=measured.get('concurrency'), memory=memory)
