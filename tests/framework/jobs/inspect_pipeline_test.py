"""Tests for cadence.framework.jobs.inspect_pipeline's TrainStep."""
import numpy as np
import tensorflow as tf

from cadence.framework import model_registry
from cadence.framework.jobs import inspect_pipeline
from cadence.framework.nested_map import NestedMap
from cadence.framework.pipeline import memory_profile

_KEY = 'synthetic.linear_regression.RegressionTiny'   # Adam: 2 slots.


class TrainStepTest(tf.test.TestCase):

  def testVariablesAreTheTasksAndTheOptimizers(self):
    # Adam's fused updates reach its slots by handle inside the skip's
    # tf.cond, so the step function's own `variables` lacks them: the
    # memory measured per device would miss two copies of the model.
    task = model_registry.GetParams(_KEY, 'Train').Instantiate().task
    step, variables = inspect_pipeline.TrainStep(task)
    batch = NestedMap(next(iter(task.params.input.Instantiate().Dataset())))
    names = {v.name for v in variables}
    task_vars = task.vars.Flatten()
    self.assertContainsSubset({v.name for v in task_vars}, names)
    slots = [v for v in variables if v.name not in
             {t.name for t in task_vars}]
    # m and v per trained variable, and the count of updates.
    self.assertLen(slots, 2 * len(task_vars) + 1)
    slots_before = [v.numpy().copy() for v in slots]
    step(batch, tf.constant(0, tf.int64))
    moved = [not np.array_equal(b, v.numpy())
             for b, v in zip(slots_before, slots)]
    self.assertTrue(all(moved), [v.name for v, m in zip(slots, moved)
                                 if not m])
    # What DeviceTotals adds to a profile's peaks: every byte of them.
    total = sum(memory_profile.DeviceTotals({}, variables).values())
    self.assertEqual(total, sum(v.shape.num_elements() * v.dtype.size
                                for v in task_vars + slots))
    params = sum(v.shape.num_elements() * 4 for v in task_vars)
    self.assertGreaterEqual(total, 3 * params)


if __name__ == '__main__':
  tf.test.main()
