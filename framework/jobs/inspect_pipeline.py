"""`--mode=inspect_pipeline`: a timeline of one real training step.

The model of any registered experiment is built with its weights (on the
cluster's devices, as in training) and fed one batch of its Train input;
its training step (the task's FPropTower, the learner's gradients and
update: the ops TrainProgram's step runs) runs once to trace and warm up,
then once under TensorFlow's profiler. `timeline.Timeline` turns
the profile into per-device forward, backward and idle times, the measured
bubble next to the ideal one, and a Gantt chart of what ran when
(framework/pipeline/timeline_chart.py), written to
`<logdir>/inspect_pipeline/`: pipeline_timeline.svg, pipeline_timeline.txt
(every action's exact times) and a TensorBoard image summary
`pipeline_timeline`, the same chart in pixels with its words
(framework/pipeline/timeline_image.py). The same
profile's allocator events give each device's measured memory peak
(memory_profile), printed next to its stage's estimate (memory_estimate).

Example:
  with cluster:
    timeline, memory = InspectPipeline(params, '/tmp/run')
  print(timeline.Report() + memory)
"""
import os

from absl import logging
import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import cluster as cluster_lib
from cadence.framework.jobs import inspect_lib
from cadence.framework.nested_map import NestedMap
from cadence.framework.pipeline import memory_estimate
from cadence.framework.pipeline import memory_profile
from cadence.framework.pipeline import timeline as timeline_lib
from cadence.framework import step_seed
from cadence.framework.train import summary_utils

NoPipelineError = timeline_lib.NoPipelineError


def TrainStep(task):
  """(step, variables): a tf.function `step(batch, global_step) -> loss`
  that trains `task` one step (forward, gradients, learner update), and
  the tf.Variables it uses: the task's, the optimizer's slots and counter
  (what memory_profile.DeviceTotals adds to a profile's peaks; the
  function's own `variables` lack the slots its fused updates reach
  through their handles inside a tf.cond)."""
  learner = task.InstantiateLearner()
  learner.Build()
  seed = task.params.random_seed or 0

  def _Step(batch, global_step):
    theta = base_layer.WithStepSeed(
        task.theta, step_seed.MakeStepSeed(global_step, seed))
    with tf.GradientTape() as tape:
      metrics, _ = task.FPropTower(theta, batch)
      loss = metrics.loss[0]
    grads = learner.ComputeGradients(tape, loss)
    learner.ApplyGradients(global_step, grads, loss=loss)
    return loss

  used = task.vars.Flatten() + list(learner.checkpointables.variables)
  # A variable shared by two layers counts once.
  return (tf.function(_Step, autograph=False),
          list({v.ref(): v for v in used}.values()))


def TraceActions(params):
  """A copy of model params with every pipeline's `trace_actions` on (the
  cells inlined per call, so that the profile names each op's action)."""
  params = params.Copy()
  for key in inspect_lib.PipelineKeys(params):
    params.Set(**{f'{key}.trace_actions': True})
  return params


def MemoryReport(task, devices, peaks, variables, inputs=()):
  """Per device: the measured peak (the step's tensors + its variables)
  next to the estimate of its stages (memory_estimate.StageMemory).

  Args:
    task: the built task (its FPropMeta gives the estimate).
    devices: the model split's devices.
    peaks: memory_profile.DevicePeaks of the step, or None (no events).
    variables: the tf.Variables the step uses (the task's, the optimizer's):
      memory_profile.DeviceTotals adds them to the peaks.
    inputs: the batch the step was called with (made before it), added
      likewise.
  """
  if peaks is None:
    return ('Memory per device: the profile holds no allocator event (on '
            'CPU, set TF_CPU_ALLOCATOR_USE_BFC=true before TensorFlow '
            'starts).\n')
  short = memory_profile.ShortDevice
  measured = memory_profile.DeviceTotals(peaks, variables, inputs)
  # Each device's stages at its worst moment together (DeviceMemory).
  per_device = inspect_lib.TaskStages(task, memory_estimate.DeviceMemory)
  estimate = {short(device): stage.total
              for device, stage in zip(devices, per_device or [])}
  lines = ['Memory per device (measured in this step: its tensors at their '
           'peak + its variables; estimate: '
           'framework/pipeline/memory_estimate.py):']
  for device in devices:
    d = short(device)
    total = measured.get(d, 0)
    line = f'  {d}: measured {memory_estimate.FormatBytes(total)}'
    if d in estimate:
      line += (f', estimate {memory_estimate.FormatBytes(estimate[d])} '
               f'({estimate[d] / max(total, 1):.2f}x)')
    lines.append(line)
  if measured.get(memory_profile.UNATTRIBUTED):
    unplaced = measured[memory_profile.UNATTRIBUTED]
    lines.append(f'  not placed by name: '
                 f'{memory_estimate.FormatBytes(unplaced)}')
  return '\n'.join(lines) + '\n'


def InspectPipeline(params, logdir=None):
  """Profiles one training step of the model of `params`; see the module
  docstring.

  Args:
    params: model params (e.g. model_registry.GetParams(key, 'Train')).
    logdir: where the chart, the profile and the summary go; None: nowhere.

  Returns:
    (the timeline.Timeline of the step, its MemoryReport).
  """
  model = TraceActions(params).Instantiate()
  task = model.task
  batch = next(iter(task.params.input.Instantiate().Dataset()))
  batch = NestedMap(batch)
  step, variables = TrainStep(task)
  logging.info('Compiling the train step and running it once (it traces '
               'and warms up), then profiling one more...')
  # Trace and warm up, recording where TF places every op.
  placement = memory_profile.Placement(
      lambda: step(batch, tf.constant(0, tf.int64)).numpy())
  out = os.path.join(logdir, 'inspect_pipeline') if logdir else None
  space = timeline_lib.ProfileSpace(
      lambda: step(batch, tf.constant(1, tf.int64)).numpy(), out)
  devices = cluster_lib.Cluster.Current().DevicesInModelSplit(0)
  # The schedule that ran: the task's plan's, on these devices.
  plan = inspect_lib.TaskPlan(inspect_lib.TaskMeta(task), devices)
  timeline = timeline_lib.Timeline(
      timeline_lib.OpEvents(space), devices,
      schedule=plan.schedule if plan is not None else None)
  events = memory_profile.AllocatorEvents(space)
  memory = MemoryReport(
      task, devices,
      memory_profile.Peaks(events, placement) if events else None,
      variables, batch)
  if out:
    timeline.WritePictures(out)
    writer = summary_utils.SummaryWriter(out)
    writer.WriteImage(1, 'pipeline_timeline', timeline.Image())
    writer.WriteText(1, 'pipeline_timeline_report',
                     '```\n' + timeline.Report() + memory + '```')
    writer.Close()
  return timeline, memory
