"""Tests for cadence.framework.jobs.memory_check."""
from absl import logging
import tensorflow as tf

from cadence.framework import base_model
from cadence.framework import cluster as cluster_lib
from cadence.framework.jobs import inspect_lib
from cadence.framework.jobs import memory_check
from cadence.framework import model_registry
from cadence.framework.pipeline import memory_estimate

_LM = 'lm.one_billion_wds.OneBWdsGPipeTransformerTiny'
_GIB = 2**30


def _Built(key, overrides=None, splits=1):
  """The task of experiment `key`, built without weights on `splits` CPUs."""
  params = model_registry.GetParams(key, 'Train')
  params.Set(**(overrides or {}))
  with cluster_lib.Cluster.Params().Set(
      num_devices=splits, worker_split_size=splits).Instantiate() as cluster:
    return base_model.BuildSymbolically(params)[0].task, cluster


class MemoryCheckTest(tf.test.TestCase):

  def testHostMemoryIsPhysicalMemory(self):
    with open('/proc/meminfo') as f:
      total_kib = int(f.readline().split()[1])   # MemTotal: ... kB
    self.assertAllClose(cluster_lib.HostMemoryBytes(), total_kib * 1024,
                        rtol=0, atol=4096)

  def testEstimateAgainstTheLimit(self):
    task, cluster = _Built(_LM, {'input.batch_size': 1024}, splits=2)
    with cluster:
      stages = inspect_lib.TaskStages(task)
      shared = inspect_lib.TaskStages(task, memory_estimate.SharedMemory)
      # Per device: the largest stage against --device_memory_gib.
      largest = max(s.total for s in stages)
      fits = memory_check.Check(task, 'CPU', 1, largest / _GIB)
      refused = memory_check.Check(task, 'CPU', 1, (largest - 1) / _GIB)
      # On the host: every local stage and replica together.
      host = [memory_check.Check(task, 'CPU', 3, host_memory=m)
              for m in (3 * shared.total, 3 * shared.total - 1)]
      gpu = memory_check.Check(task, 'GPU', 1)
    self.assertTrue(fits.fits)
    self.assertFalse(refused.fits)
    big = stages[max(range(2), key=lambda i: stages[i].total)]
    fmt = memory_estimate.FormatBytes
    self.assertEqual(
        refused.text,
        f'estimate {fmt(largest)} a device (stage {stages.index(big)} of 2 '
        'at its peak: weights, gradients and optimizer slots '
        f'{fmt(big.params + big.grads + big.slots)}, activations '
        f'{fmt(big.activations + big.transient)}) against '
        f'--device_memory_gib={(largest - 1) / _GIB:g}')
    self.assertEqual([v.fits for v in host], [True, False])
    self.assertRegex(
        host[1].text,
        rf"^estimate {fmt(3 * shared.total)} for this "
        r"host's 3 replica\(s\) x 2 stage\(s\) at the step's worst moment "
        r'\(weights, gradients and optimizer slots [\d.]+ MiB, activations '
        r"[\d.]+ [MG]iB a replica\) against the host's memory ")
    self.assertIsNone(gpu)   # Its memory is not known: no check.
    # The batch drives the activations: 1024 sequences need more than 10x
    # the experiment's own 32.
    small, _ = _Built(_LM, splits=2)
    with cluster:
      small = inspect_lib.TaskStages(small, memory_estimate.SharedMemory)
    self.assertGreater(shared.activations, 10 * small.activations)
    self.assertEqual(shared.params, small.params)

  def testFromParamsAloneEqualsTheBuiltTask(self):
    # What the trainer checks before it builds anything: the plan's units'
    # variables, not the model's: the same verdict, with and without stages
    # sharing a device.
    for key, overrides, splits in (
        (_LM, {'input.batch_size': 64}, 2),
        (_LM, {'task.stack_tpl.pipeline_tpl.schedule': 'interleaved_1f1b',
               'task.stack_tpl.pipeline_tpl.stages_per_device': 2}, 2),
        ('image.shapes_resnet.ShapesResNetTiny', None, 2)):
      with self.subTest(key=key, overrides=overrides):
        params = model_registry.GetParams(key, 'Train')
        params.Set(**(overrides or {}))
        task, cluster = _Built(key, overrides, splits)
        with cluster:
          devices = cluster.DevicesInModelSplit(0)
          for limit in (1.0, 1e-3):
            built = memory_check.Check(task, 'CPU', 1, limit)
            alone = memory_check.CheckParams(params, devices, 'CPU', 1, limit)
            self.assertEqual(built, alone)
          self.assertEqual(
              memory_check.Check(task, 'CPU', 2, host_memory=2**30),
              memory_check.CheckParams(params, devices, 'CPU', 2,
                                       host_memory=2**30))

  def testNoEstimateNoCheck(self):
    task, cluster = _Built('synthetic.linear_regression.RegressionTiny')
    with cluster, self.assertLogs(level='DEBUG') as logs:
      logging.set_verbosity(logging.DEBUG)
      try:
        self.assertIsNone(memory_check.Check(task, 'CPU', 1, 1e-9))
      finally:
        logging.set_verbosity(logging.INFO)
    self.assertIn('No memory check: RegressionModel has no FPropMeta memory '
                  'estimate.', logs.output[-1])


if __name__ == '__main__':
  tf.test.main()
