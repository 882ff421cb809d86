"""Tests for cadence.framework.base_model and base_model_params."""
import numpy as np
import tensorflow as tf

from cadence.framework import base_model
from cadence.framework import base_model_params
from cadence.framework.nested_map import NestedMap
from cadence.framework import shapes
from cadence.tasks.synthetic import regression


def _TaskParams(**kw):
  return regression.RegressionModel.Params().Set(
      name='reg', input_dim=3, hidden_dims=[4], **kw)


class _Experiment(base_model_params.SingleTaskModelParams):

  def Train(self):
    return regression.RegressionInput.Params().Set(input_dim=3)

  def Task(self):
    return _TaskParams()


class BaseTaskTest(tf.test.TestCase):

  def testFPropTowerMatchesNumpy(self):
    task = _TaskParams().Instantiate()
    rng = np.random.RandomState(0)
    x = rng.randn(5, 3).astype(np.float32)
    y = rng.randn(5).astype(np.float32)
    metrics, per_example = task.FPropTower(
        task.theta, NestedMap(x=tf.constant(x), y=tf.constant(y)))
    fc = task.children.net.children.fc
    h = np.maximum(x @ fc[0].vars.w.numpy() + fc[0].vars.b.numpy(), 0)
    pred = (h @ fc[1].vars.w.numpy() + fc[1].vars.b.numpy())[:, 0]
    self.assertAllClose(metrics.loss[0], np.mean((pred - y) ** 2), atol=1e-5)
    self.assertAllClose(metrics.mae[0], np.mean(np.abs(pred - y)), atol=1e-5)
    self.assertEqual(float(metrics.loss[1]), 5.0)
    self.assertAllClose(per_example.squared_error, (pred - y) ** 2,
                        atol=1e-5)

  def testFPropMetaCountsTheNetwork(self):
    meta = regression.RegressionModel.FPropMeta(
        _TaskParams(), NestedMap(x=shapes.Shape([6, 3]),
                                 y=shapes.Shape([6])))
    # fc0: 2*3*4 + 4 (bias) + 4 (relu); fc1: 2*4*1 + 1; loss: 4 per example.
    per_example = (24 + 4 + 4) + (8 + 1) + 4
    self.assertEqual(meta.flops, 6 * per_example)
    self.assertEqual([name for name, _ in meta.breakdown],
                     ['net.fc[0]', 'net.fc[1]', 'loss'])

  def testParamsAreCheckedAgainstTheInputShapesWhenBuilt(self):

    class EvenBatchOnly(regression.RegressionModel):
      built = []

      def __init__(self, params):
        super().__init__(params)
        EvenBatchOnly.built.append(self.path)

      @classmethod
      def FPropMeta(cls, params, input_shapes):
        if input_shapes.x[0] is not None and input_shapes.x[0] % 2:
          raise ValueError(f'batch {input_shapes.x[0]} is odd')
        return super().FPropMeta(params, input_shapes)

    p = EvenBatchOnly.Params().Set(name='reg', input_dim=3, hidden_dims=[4])
    p.input = regression.RegressionInput.Params().Set(
        input_dim=3, batch_size=5, fixed_input_shape=True)
    with self.assertRaisesRegex(ValueError, 'batch 5 is odd'):
      p.Instantiate()
    self.assertEqual([], EvenBatchOnly.built)  # Failed before the children.
    p.input.batch_size = 6
    p.Instantiate()
    self.assertEqual(['reg'], EvenBatchOnly.built)
    # Without a static batch size there is nothing to check against.
    p.input.Set(batch_size=5, fixed_input_shape=False)
    p.Instantiate()

  def testBadTrainParams(self):
    p = _TaskParams()
    p.train.max_steps = -1
    with self.assertRaisesRegex(
        ValueError, r"RegressionModel 'reg': train.max_steps=-1 must be an "
        'int >= 0'):
      p.Instantiate()
    p = _TaskParams()
    p.train.ema_decay = 1.0
    with self.assertRaisesRegex(
        ValueError, r'train.ema_decay=1.0 must be a number in \[0, 1\)'):
      p.Instantiate()
    p = _TaskParams()
    p.train.log_interval_secs = -5
    with self.assertRaisesRegex(
        ValueError, r'train.log_interval_secs=-5 must be a number >= 0'):
      p.Instantiate()

  def testDistributionChoicesCheckedWithoutReplicas(self):
    # Read only by several replicas or parameter servers, yet a typo fails
    # when the task is built: on one replica too.
    for field, value, rule in (
        ('allreduce', 'rign', "must be one of 'auto', 'ring', 'nccl', "
         "'hierarchical_copy', 'one_device'. Did you mean 'ring'?"),
        ('allreduce_bytes_per_pack', -1, 'must be an int >= 0.'),
        ('ps_placement', 'round-robin', "must be one of 'least_loaded', "
         "'round_robin'. Did you mean 'round_robin'?")):
      p = _TaskParams()
      p.train.Set(**{field: value})
      with self.assertRaisesWithLiteralMatch(
          ValueError, f"RegressionModel 'reg': train.{field}={value!r} "
          f'{rule}'):
        p.Instantiate()

  def testLearnerParamsCheckedWhenTheTaskIsBuilt(self):
    # Before any learner is built: the memory estimate instantiates the
    # optimizer from these params.
    p = _TaskParams()
    p.train.learner.optimizer.cls = 'adam'
    with self.assertRaisesWithLiteralMatch(
        ValueError, "Learner 'learner' (params 'train.learner'): "
        "optimizer.cls='adam' must be one of SGD, Momentum, Adam, Adafactor "
        "(cadence.framework.optimizer). Did you mean type('cadence.framework."
        "optimizer.Adam') (a class, not a str)?"):
      p.Instantiate()

  def testCheckMetrics(self):
    with self.assertRaisesRegex(ValueError,
                                "must return metrics with a 'loss'"):
      base_model.CheckMetrics(NestedMap(mae=(1.0, 1.0)), 'T')
    with self.assertRaisesRegex(ValueError, r"metric 'loss' must be a \(value, "
                                'weight\\) pair'):
      base_model.CheckMetrics(NestedMap(loss=1.0), 'T')
    with self.assertRaisesRegex(ValueError, r"metric 'loss' value must be a "
                                r'scalar; got shape \[2\]'):
      base_model.CheckMetrics(NestedMap(loss=(tf.ones([2]), 1.0)), 'T')

  def testLearnerTrainsTheTaskVariables(self):
    task = _TaskParams().Instantiate()
    learner = task.InstantiateLearner()
    self.assertEqual([k for k, _ in learner.trainable],
                     ['net.fc[0].b', 'net.fc[0].w', 'net.fc[1].b',
                      'net.fc[1].w'])

  def testAverageMetric(self):
    m = base_model.AverageMetric()
    self.assertTrue(np.isnan(m.value))
    m.Update(2.0, weight=3.0)
    m.Update(6.0)
    self.assertAllClose(m.value, 3.0)
    self.assertEqual(m.total_weight, 4.0)


class SingleTaskModelTest(tf.test.TestCase):

  def testModelParamsCarryTheInput(self):
    p = _Experiment().Model()
    self.assertIsNone(p.task.input)  # One place to set it: p.input.
    p.input = _Experiment().Train().Set(batch_size=3)
    model = p.Instantiate()
    self.assertIsInstance(model.task, regression.RegressionModel)
    self.assertEqual(model.task.params.input.batch_size, 3)
    self.assertEqual(model.tasks, [model.task])
    self.assertEqual(model.params.name, 'reg')

  def testMissingTask(self):
    with self.assertRaisesRegex(ValueError, 'params.task is None'):
      base_model.SingleTaskModel.Params().Instantiate()

  def testExperimentMustDefineTrainAndTask(self):
    with self.assertRaisesRegex(NotImplementedError, 'must define Task'):
      base_model_params.SingleTaskModelParams().Model()


if __name__ == '__main__':
  tf.test.main()
