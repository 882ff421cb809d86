"""Does a training step fit in memory? Answered before the model is built.

`input.batch_size=1048576` used to build for minutes and then die in the
allocator. The trainer now estimates the memory of one training step from
the params alone, before it builds anything (`CheckParams`): the task's
FPropMeta `plan` on the input's batch shapes (framework/pipeline/plan.py:
its stages, schedule and activation bytes, and each unit's variables,
built without weights), through framework/pipeline/memory_estimate.py
(weights, gradients, optimizer slots, the activations the schedule and
remat keep). A step that needs more than the limit stops the trainer with
one line giving both. `Check` gives the same verdict of a task built
(symbolically).

The limit:
  * --device_memory_gib, when given: each device's own memory. Every
    device's worst moment must fit (memory_estimate.DeviceMemory: its
    stages together, when a schedule puts several on one device).
  * else, on CPU: the host's physical memory (SC_PHYS_PAGES x
    SC_PAGE_SIZE). Logical CPU devices are not separate memories: all the
    host's replicas and stages share it. So the check adds up what they
    hold at the step's worst moment (memory_estimate.SharedMemory of one
    replica's stages, times the replicas on this host) and compares the
    sum with the whole memory, rather than dividing the memory evenly by
    the devices: stages are not even (the LM's first and last hold the
    embedding and softmax), and an even split would refuse runs that fit.
    It is the total, not the free memory: other processes come and go, and
    the check is for configurations that cannot fit, not a forecast.
  * else (GPUs, a TPU, or parameter servers, whose steps run on other
    hosts): the memory is not known before TensorFlow sets the devices up,
    so there is no check (a debug line says so); give --device_memory_gib.

Experiments whose task has no FPropMeta `plan` (the regression and Keras
examples; LM and image tasks have one) are not checked: a debug line says
so.

Example:
  with cluster:
    model, _ = base_model.BuildSymbolically(params)
    verdict = Check(model.task, 'CPU', num_local_replicas=1)
  verdict.fits, verdict.text  # True, 'estimate 52.91 MiB of the host's ...'
"""
import collections

from absl import logging

from cadence.framework import cluster as cluster_lib
from cadence.framework.jobs import inspect_lib
from cadence.framework.pipeline import memory_estimate

Verdict = collections.namedtuple('Verdict', ['fits', 'text'])


def _Parts(stage):
  fmt = memory_estimate.FormatBytes
  return (f'weights, gradients and optimizer slots '
          f'{fmt(stage.params + stage.grads + stage.slots)}, activations '
          f'{fmt(stage.activations + stage.transient)}')


def Check(task, device_type, num_local_replicas, device_memory_gib=0.0,
          host_memory=None, num_replicas=1):
  """Whether a training step of built `task` fits; see the module
  docstring.

  Args:
    task: the task, built (symbolically) under the run's cluster, which
      gives the devices of its stages.
    device_type: the devices' type, e.g. 'CPU', 'GPU'.
    num_local_replicas: the replicas on this host (sharing its memory on
      CPU).
    device_memory_gib: --device_memory_gib (0: not given).
    host_memory: the host's memory in bytes (default:
      cluster_lib.HostMemoryBytes()).
    num_replicas: the replicas of every host (their update all-reduces;
      sharded optimizer slots are cut over them).

  Returns:
    A Verdict (fits, text: the estimate and the limit, in words), or None
    when there is no check (no estimate for the task, or no known limit).
  """
  stages = inspect_lib.TaskStages(task, num_replicas=num_replicas)
  if stages is None:
    logging.debug('No memory check: %s has no FPropMeta memory estimate. '
                  '(Its FPropMeta has no pipeline `plan`.)',
                  type(task).__name__)
    return None
  return _Verdict(
      lambda estimate: inspect_lib.TaskStages(task, estimate, num_replicas),
      device_type,
      num_local_replicas, device_memory_gib, host_memory)


def CheckParams(params, devices, device_type, num_local_replicas,
                device_memory_gib=0.0, host_memory=None, num_replicas=1,
                devices_from=''):
  """Check's verdict from model `params` alone, nothing built: the task's
  plan (framework/pipeline/plan.py) on the model split's `devices`, its
  units' weights (plan.Unit.Variables). None when the task has no plan,
  or a unit does not say its variables (Check on the built task then).
  A plan whose stages do not fit the devices is a ValueError ending with
  where they came from (`devices_from`: the cluster's split_size_from)
  and the fixes (inspect_lib.TaskPlan)."""
  task = params.task
  meta = inspect_lib.CheckParamsAlone(params)   # As a build checks them.
  plan = inspect_lib.TaskPlan(meta, devices, devices_from)
  if plan is None:
    logging.debug('No memory check: %s has no FPropMeta memory estimate. '
                  '(Its FPropMeta has no pipeline `plan`.)',
                  task.cls.__name__)
    return None
  weights = inspect_lib.PlanStageWeights(
      plan, inspect_lib.LearnerOptimizer(task.train, num_replicas))
  if weights is None:
    return None
  return _Verdict(lambda estimate: inspect_lib.PlanStages(
      plan, weights, estimate, num_replicas), device_type, num_local_replicas,
                  device_memory_gib, host_memory)


def _Verdict(stages_of, device_type, num_local_replicas, device_memory_gib,
             host_memory):
  """The Verdict of a step whose `stages_of(estimate)` gives its
  memory_estimate `estimate` (StageMemory, DeviceMemory, SharedMemory)."""
  fmt = memory_estimate.FormatBytes
  stages = stages_of(memory_estimate.StageMemory)
  if device_memory_gib:
    limit = device_memory_gib * 2**30
    devices = stages_of(memory_estimate.DeviceMemory)
    i = max(range(len(devices)), key=lambda d: devices[d].total)
    what = 'stage' if len(devices) == len(stages) else 'device'
    where = (f'{what} {i} of {len(devices)}' if len(stages) > 1 else
             'the model')
    text = (f'estimate {fmt(devices[i].total)} a device ({where} at its '
            f'peak: {_Parts(devices[i])}) against --device_memory_gib='
            f'{device_memory_gib:g}')
    return Verdict(devices[i].total <= limit, text)
  if device_type.upper() != 'CPU':
    logging.debug('No memory check: the memory of a %s is not known before '
                  'TensorFlow sets it up; give --device_memory_gib.',
                  device_type)
    return None
  limit = cluster_lib.HostMemoryBytes() if host_memory is None else host_memory
  shared = stages_of(memory_estimate.SharedMemory)
  total = shared.total * num_local_replicas
  text = (f"estimate {fmt(total)} for this host's {num_local_replicas} "
          f'replica(s) x {len(stages)} stage(s) at the step\'s worst moment '
          f'({_Parts(shared)} a replica) against the host\'s memory '
          f'{fmt(limit)}')
  return Verdict(total <= limit, text)
