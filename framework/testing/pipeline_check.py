"""CheckPipelinedExperiment: every layout computes the unpipelined model.

A pipeline must be transparent: whatever its schedule, its cut into stages
and its micro-batches, one training step's loss and gradients are the
model's without a pipeline (torchgpipe's and Praxis's transparency
tests). CheckPipelinedExperiment builds an experiment's model once without
its pipeline (the stack's `pipeline_tpl` None: the units one after the
other on the whole batch, the same variable paths, so the same initial
weights) and once per layout on that many logical devices, runs one
forward and backward of the task on the same batch with the same step
seed, and compares.

The pipeline is found from the task's FPropMeta (its `plan`: the params
paths of the pipeline and of its cut), so any model made of units works:
a GPipeStack of one's own layers, the LM, the ResNet.

Example (in a pytest test of one's own experiment):
  from cadence.framework import testing

  def testMyExperimentPipelines():
    report = testing.CheckPipelinedExperiment(
        'my_pkg.exps.MyExp', schedules=('gpipe', '1f1b', 'zb_h1'),
        splits=(1, 2), micro_batches=(1, 4))
    print(report)      # per layout, the largest differences

The process needs as many devices as the largest `splits` (x stages per
device for interleaved schedules): on CPU, `testing.SetLogicalCpus(4)`
before TensorFlow runs anything (a conftest.py's first lines).
"""
import collections
import itertools

import numpy as np
import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import cluster as cluster_lib
from cadence.framework import hyperparams
from cadence.framework import model_registry
from cadence.framework import step_seed
from cadence.framework.nested_map import NestedMap


class Layout(collections.namedtuple(
    'Layout', ['schedule', 'splits', 'micro_batches', 'stages_per_device'])):
  """One way to run the pipeline: its schedule, the devices it is cut
  over (`splits`, K), the micro-batches (M) and the stages per device (v:
  2 for the interleaved and V schedules)."""
  __slots__ = ()

  def Name(self):
    return (f'{self.schedule} K={self.splits} M={self.micro_batches}' +
            (f' v={self.stages_per_device}'
             if self.stages_per_device != 1 else ''))


def Layouts(schedules, splits, micro_batches):
  """Every Layout of the grid: `schedules` names, or (name, v) pairs for
  several stages per device; `splits` and `micro_batches` ints."""
  out = []
  for schedule, k, m in itertools.product(schedules, splits, micro_batches):
    name, v = schedule if isinstance(schedule, tuple) else (schedule, 1)
    out.append(Layout(name, k, m, v))
  return out


class Comparison(collections.namedtuple(
    'Comparison', ['what', 'loss', 'want_loss', 'grad_diff', 'grad_name',
                   'ok'])):
  """A run against the reference: its loss and the reference's, the
  largest |gradient difference| and the variable it is in, whether both
  are within the tolerance."""
  __slots__ = ()

  def Line(self):
    return (f'{self.what}: loss {self.loss:.7g} (unpipelined '
            f'{self.want_loss:.7g}, |diff| {abs(self.loss - self.want_loss):.3g})'
            f', largest |gradient diff| {self.grad_diff:.3g} in '
            f'{self.grad_name or "-"} ({"ok" if self.ok else "FAILED"})')


def CompareLossAndGrads(what, want, got, atol, rtol):
  """A Comparison of `got` = (loss, {variable name: gradient}) with
  `want`, the reference's, within |got - want| <= atol + rtol |want|
  (elementwise); a variable missing or without gradient on one side
  fails."""
  want_loss, want_grads = want
  loss, grads = got
  ok = bool(np.isclose(loss, want_loss, atol=atol, rtol=rtol))
  worst, worst_name = 0.0, None
  for name in sorted(set(want_grads) | set(grads)):
    a, b = want_grads.get(name), grads.get(name)
    if a is None or b is None:
      if a is not None or b is not None:
        ok, worst, worst_name = False, float('inf'), name
      continue
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    diff = float(np.max(np.abs(a - b))) if a.size else 0.0
    if not np.allclose(b, a, atol=atol, rtol=rtol):
      ok = False
    if diff > worst or worst_name is None:
      worst, worst_name = diff, name
  return Comparison(what, float(loss), float(want_loss), worst, worst_name,
                    ok)


class PipelineReport:
  """What CheckPipelinedExperiment found: a Comparison per layout
  (`comparisons`), `failures`; str() is one line per layout."""

  def __init__(self, name, comparisons, atol, rtol):
    self.name = name
    self.comparisons = list(comparisons)
    self.atol, self.rtol = atol, rtol

  @property
  def failures(self):
    return [c for c in self.comparisons if not c.ok]

  @property
  def ok(self):
    return not self.failures

  def __str__(self):
    return '\n'.join(
        [f'{self.name} against its unpipelined model (atol {self.atol}, '
         f'rtol {self.rtol}):'] + [f'  {c.Line()}' for c in self.comparisons])


class PipelineCheckError(AssertionError):
  """A layout's step differs from the unpipelined model's; `report`."""

  def __init__(self, report):
    self.report = report
    super().__init__(
        f'{report.name}: {len(report.failures)} layout(s) differ from the '
        f'unpipelined model beyond atol {report.atol}, rtol {report.rtol}:\n'
        + '\n'.join(f'  - {c.Line()}' for c in report.failures))


def SetLogicalCpus(n):
  """Splits the host's CPU into `n` logical devices (a pipeline's stages
  on one CPU); call before TensorFlow runs anything (conftest.py)."""
  cpus = tf.config.list_physical_devices('CPU')
  tf.config.set_logical_device_configuration(
      cpus[0], [tf.config.LogicalDeviceConfiguration()] * n)


def _ModelParams(experiment, dataset):
  if isinstance(experiment, str):
    return experiment, model_registry.GetParams(experiment, dataset)
  if isinstance(experiment, hyperparams.Params) and 'task' in experiment:
    name = experiment.name if 'name' in experiment else ''
    return f'model {name!r}' if name else 'the model', experiment.Copy()
  raise ValueError(
      f'CheckPipelinedExperiment: experiment={experiment!r} must be a '
      "registered key ('examples.pipelined_mlp.PipelinedMlp') or a model's "
      'params (model_registry.GetParams(key, "Train")).')


def _Plan(params, name):
  """The task's pipeline plan, from its FPropMeta on the input's shapes."""
  p = params.task.Copy()
  p.input = params.input
  batch_shapes = None
  if p.input is not None:
    batch = p.input.batch_size
    batch_shapes = p.input.cls.BatchShapes(p.input).Transform(
        lambda s: s.WithDim(0, batch) if s.rank and s[0] is None else s)
  plan = p.cls.FPropMeta(p, batch_shapes).get('plan') if batch_shapes else (
      None)
  if plan is None or not plan.path or not plan.splits_path:
    raise ValueError(
        f'CheckPipelinedExperiment: {name} runs no pipeline (its task\'s '
        'FPropMeta has no pipeline plan): a model made of units with a '
        'pipeline_tpl (layers/gpipe_units.py), e.g. a GPipeStack of '
        'one\'s own layers.')
  return plan


def _Build(params, num_devices):
  cluster = cluster_lib.Cluster.Params().Set(
      num_devices=num_devices, worker_split_size=num_devices).Instantiate()
  with cluster:
    return params.Instantiate().task


def _LossAndGrads(task, batch, step):
  """(loss, {variable path: gradient}) of one forward and backward."""
  trainable = [(k, v) for k, v in task.vars.FlattenItems() if v.trainable]
  seed = step_seed.MakeStepSeed(step, task.params.random_seed or 0)
  with tf.GradientTape() as tape:
    metrics, _ = task.FPropTower(base_layer.WithStepSeed(task.theta, seed),
                                 batch)
    loss = metrics.loss[0]
  grads = tape.gradient(loss, [v for _, v in trainable])
  return float(loss), {k: None if g is None else tf.convert_to_tensor(g)
                       for (k, _), g in zip(trainable, grads)}


def CheckPipelinedExperiment(experiment, schedules=('gpipe', '1f1b',
                                                    'zb_h1'),
                             splits=(1, 2), micro_batches=(1, 4),
                             atol=1e-5, rtol=1e-5, batch=None,
                             dataset='Train', step=0,
                             raise_on_failure=True):
  """One step of each layout against the unpipelined model.

  Args:
    experiment: a registered key, or a model's params (its task made of
      units with a pipeline_tpl).
    schedules: schedule names, or (name, stages per device) pairs, e.g.
      ('interleaved_1f1b', 2).
    splits: the K to cut the units over (devices of a replica).
    micro_batches: the M to split the batch into (each must divide it).
    atol, rtol: the tolerance of the loss and of every gradient.
    batch: the batch (a NestedMap of tensors); default the first of the
      experiment's input.
    dataset: the input the model and the default batch come from.
    step: the global step whose step seed every run uses.
    raise_on_failure: raise PipelineCheckError when a layout differs.

  Returns:
    A PipelineReport.

  Raises:
    PipelineCheckError (an AssertionError): listing every layout that
      differs, with its loss, the reference's and the largest gradient
      difference.
    ValueError: no pipeline in the model, or too few devices.
  """
  name, params = _ModelParams(experiment, dataset)
  plan = _Plan(params, name)
  stack = plan.splits_path.rsplit('.', 1)[0]
  layouts = Layouts(schedules, splits, micro_batches)
  devices = len(tf.config.list_logical_devices('CPU')) + len(
      tf.config.list_logical_devices('GPU'))
  most = max(k for _, k, _, _ in layouts)
  if most > devices:
    raise ValueError(
        f'CheckPipelinedExperiment: splits={list(splits)} needs {most} '
        f'devices; this process has {devices}. On CPU call '
        f'testing.SetLogicalCpus({most}) before TensorFlow runs anything '
        '(e.g. first in conftest.py).')
  if batch is None:
    batch = next(iter(params.input.Instantiate().Dataset()))
  batch = NestedMap(batch)
  ref = params.Copy()
  ref.Set(**{plan.splits_path: 1, f'{stack}.pipeline_tpl': None})
  want = _LossAndGrads(_Build(ref, 1), batch, step)
  comparisons = []
  for layout in layouts:
    run = params.Copy()
    run.Set(**{plan.splits_path: layout.splits,
               f'{plan.path}.schedule': layout.schedule,
               f'{plan.path}.num_micro_batches': layout.micro_batches,
               f'{plan.path}.stages_per_device': layout.stages_per_device})
    got = _LossAndGrads(_Build(run, layout.splits), batch, step)
    comparisons.append(CompareLossAndGrads(layout.Name(), want, got, atol,
                                           rtol))
  report = PipelineReport(name, comparisons, atol, rtol)
  if raise_on_failure and report.failures:
    raise PipelineCheckError(report)
  return report
