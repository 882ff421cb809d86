"""Tests for cadence.framework.train.xla_step: the static checks of a
compiled step.

The XLA compilation itself (the Tiny LM's step with jit_compile, pipelined
and not, equal to the uncompiled step) is
tests/framework/distribute/tpu_programs_test.py.
"""
import tensorflow as tf

from cadence.framework import cluster as cluster_lib
from cadence.framework import model_registry
from cadence.framework.nested_map import NestedMap
from cadence.framework.train import xla_step
from cadence.tasks.synthetic import regression

_KEY = 'synthetic.linear_regression.RegressionTiny'


class _MaskedRegression(regression.RegressionModel):
  """Keeps only the positive predictions: a data-dependent batch size."""

  def ComputePredictions(self, theta, input_batch):
    y = super().ComputePredictions(theta, input_batch).y
    return NestedMap(y=tf.boolean_mask(y, y > 0))

  def ComputeLoss(self, theta, predictions, input_batch):
    n = tf.cast(tf.size(predictions.y), tf.float32)
    return NestedMap(loss=(tf.reduce_mean(predictions.y), n)), NestedMap()


def _Task(cls=regression.RegressionModel, fixed=True):
  p = model_registry.GetParams(_KEY, 'Train')
  p.task.cls = cls
  p.input.fixed_input_shape = fixed
  return p.task.Instantiate(), p.input.Instantiate().Dataset().element_spec


class StaticShapesTest(tf.test.TestCase):

  def testStaticProgramPasses(self):
    task, spec = _Task()
    xla_step.CheckStepShapes(task, spec)   # No error.

  def testDynamicBatchIsNamed(self):
    task, spec = _Task(fixed=False)   # Batches without drop_remainder.
    with self.assertRaisesRegex(
        xla_step.StaticShapeError,
        r"^The input of task 'regression': input batch field 'x' has shape "
        r'\[\?, 8\]: dimension 0 is not fixed; TPU and --xla need fully '
        r'defined batch shapes: set fixed_input_shape=True'):
      xla_step.CheckStepShapes(task, spec)

  def testDataDependentShapeInFPropIsNamed(self):
    task, spec = _Task(_MaskedRegression)
    with self.assertRaisesRegex(
        xla_step.StaticShapeError,
        r"^Task 'regression': tensor 'boolean_mask/Where:0' \(op Where\) has "
        r'shape \[\?, 1\]: dimension 0 depends on the data; TPU and --xla need '
        r'static shapes in FProp: replace data-dependent ops '
        r'\(tf.boolean_mask'):
      xla_step.CheckStepShapes(task, spec)

  def testUnknownShapeInsideALoopBodyIsFound(self):
    def _Fn(x):
      def _Body(i, acc):
        return i + 1, acc + tf.reduce_sum(tf.boolean_mask(x, x > 0))
      return tf.while_loop(lambda i, _: i < 3, _Body, (0, 0.0))
    graph = tf.function(_Fn).get_concrete_function(
        tf.TensorSpec([4], tf.float32)).graph
    tensor, dim = xla_step.FirstUnknownShape(graph)
    self.assertIn('boolean_mask', tensor.name)
    self.assertNotEqual(tensor.graph, graph)   # Found in the loop's body.
    self.assertEqual(dim, 0)

  def testSeveralDevicesPerReplicaCannotBeOneXlaProgram(self):
    cluster = cluster_lib.Cluster.Params().Set(
        num_devices=2, worker_split_size=2).Instantiate()
    with self.assertRaisesRegex(
        xla_step.StaticShapeError,
        r"^lm's train: --xla compiles one replica's step as one XLA program "
        r'on one device, but a replica spans 2 devices \(/device:CPU:0, '
        r'/device:CPU:1; --worker_split_size=2\)\. Use --worker_split_size=1'):
      xla_step.CheckOneDevice(cluster, "lm's train")
    xla_step.CheckOneDevice(cluster_lib.Cluster.Params().Set(
        num_devices=2, worker_split_size=1).Instantiate(), 'x')


if __name__ == '__main__':
  tf.test.main()
