"""`--mode=inspect_pipeline`: a timeline of one real training step.

The model of any registered experiment is built with its weights (on the
cluster's devices, as in training) and fed one batch of its Train input;
its training step (the task's FPropTower, the learner's gradients and
update: the ops TrainProgram's step runs) runs once to trace and warm up,
then once under TensorFlow's profiler. `pipeline_timeline.Timeline` turns
the profile into per-device forward, backward and idle times, the measured
bubble next to the ideal one, and a Gantt chart, written to
`<logdir>/inspect_pipeline/`: pipeline_timeline.svg (.png with
matplotlib) and a TensorBoard image summary `pipeline_timeline`.

Example:
  with cluster:
    timeline = InspectPipeline(params, '/tmp/run')
  print(timeline.Report())
"""
import os

import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import cluster as cluster_lib
from cadence.framework import pipeline_timeline
from cadence.framework import step_seed
from cadence.framework import summary_utils
from cadence.framework.nested_map import NestedMap

NoPipelineError = pipeline_timeline.NoPipelineError


def TrainStep(task):
  """A tf.function `step(batch, global_step) -> loss` that trains `task`
  one step (forward, gradients, learner update)."""
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

  return tf.function(_Step, autograph=False)


def TraceActions(params):
  """A copy of model params with every pipeline's `trace_actions` on (the
  cells inlined per call, so that the profile names each op's action)."""
  params = params.Copy()
  for line in str(params).splitlines():
    key = line.split(' : ', 1)[0]
    if key.rsplit('.', 1)[-1] == 'trace_actions':
      params.Set(**{key: True})
  return params


def InspectPipeline(params, logdir=None):
  """Profiles one training step of the model of `params`; see the module
  docstring.

  Args:
    params: model params (e.g. model_registry.GetParams(key, 'Train')).
    logdir: where the chart, the profile and the summary go; None: nowhere.

  Returns:
    The pipeline_timeline.Timeline of the step.
  """
  model = TraceActions(params).Instantiate()
  task = model.task
  batch = next(iter(task.params.input.Instantiate().Dataset()))
  batch = NestedMap(batch)
  step = TrainStep(task)
  step(batch, tf.constant(0, tf.int64))   # Trace and warm up.
  out = os.path.join(logdir, 'inspect_pipeline') if logdir else None
  ops = pipeline_timeline.ProfileOps(
      lambda: step(batch, tf.constant(1, tf.int64)).numpy(), out)
  timeline = pipeline_timeline.Timeline(
      ops, cluster_lib.Cluster.Current().DevicesInModelSplit(0))
  if out:
    timeline.WritePictures(out)
    writer = summary_utils.SummaryWriter(out)
    writer.WriteImage(1, 'pipeline_timeline', timeline.Image())
    writer.WriteText(1, 'pipeline_timeline_report',
                     '```\n' + timeline.Report() + '```')
    writer.Close()
  return timeline
