"""Tests for cadence.framework.testing's CheckPipelinedExperiment
(pipeline_check.py): the README's pipelined experiment passes every
layout; a unit whose FProp depends on the batch (each micro-batch its own
mean) fails exactly the layouts with several micro-batches, with the
numbers; a model without a pipeline and too few devices are refused."""
import numpy as np
import tensorflow as tf

from cadence.framework import model_registry
from cadence.framework import testing
from cadence.tests import bad_units

_KEY = 'examples.pipelined_mlp.PipelinedMlp'


class CheckPipelinedExperimentTest(tf.test.TestCase):

  def testTheReadmeExperimentIsTransparent(self):
    report = testing.CheckPipelinedExperiment(
        _KEY, schedules=('gpipe', 'zb_h1', ('interleaved_1f1b', 2)),
        splits=(1, 2), micro_batches=(1, 4))
    self.assertTrue(report.ok, str(report))
    self.assertEqual(
        ['gpipe K=1 M=1', 'gpipe K=1 M=4', 'gpipe K=2 M=1', 'gpipe K=2 M=4',
         'zb_h1 K=1 M=1', 'zb_h1 K=1 M=4', 'zb_h1 K=2 M=1', 'zb_h1 K=2 M=4',
         'interleaved_1f1b K=1 M=1 v=2', 'interleaved_1f1b K=1 M=4 v=2',
         'interleaved_1f1b K=2 M=1 v=2', 'interleaved_1f1b K=2 M=4 v=2'],
        [c.what for c in report.comparisons])
    for c in report.comparisons:
      self.assertAllClose(c.want_loss, c.loss, atol=1e-5, rtol=1e-5)
      self.assertLessEqual(c.grad_diff, 1e-4)

  def testABatchDependentUnitFailsWithSeveralMicroBatches(self):
    params = model_registry.GetParams(_KEY, 'Train')
    params.task.net_tpl.units[1].cls = bad_units.BatchCentred
    with self.assertRaises(AssertionError) as ctx:
      testing.CheckPipelinedExperiment(params, schedules=('1f1b',),
                                       splits=(2,), micro_batches=(1, 4))
    text = str(ctx.exception)
    lines = text.splitlines()
    self.assertEqual("model 'regression': 1 layout(s) differ from the "
                     'unpipelined model beyond atol 1e-05, rtol 1e-05:',
                     lines[0])
    self.assertLen(lines, 2, text)
    self.assertRegex(lines[1], r'^  - 1f1b K=2 M=4: loss [\d.]+ \(unpipelined'
                     r' [\d.]+, \|diff\| [\d.e-]+\), largest \|gradient '
                     r'diff\| [\d.e-]+ in net\.units\[\d\]\.\w+ \(FAILED\)$')
    report = ctx.exception.report
    self.assertEqual([True, False], [c.ok for c in report.comparisons])

  def testCompareLossAndGrads(self):
    want = (1.0, {'a': np.ones(3), 'b': np.zeros(2)})
    ok = testing.CompareLossAndGrads('x', want, (1.0 + 1e-7, {
        'a': np.ones(3) + 1e-7, 'b': np.zeros(2)}), 1e-5, 1e-5)
    self.assertTrue(ok.ok)
    off = testing.CompareLossAndGrads('x', want, (1.0, {
        'a': np.ones(3) + [0, 0.5, 0], 'b': np.zeros(2)}), 1e-5, 1e-5)
    self.assertEqual((False, 'a', 0.5), (off.ok, off.grad_name,
                                         off.grad_diff))
    missing = testing.CompareLossAndGrads('x', want, (1.0, {
        'a': np.ones(3), 'b': None}), 1e-5, 1e-5)
    self.assertEqual((False, 'b'), (missing.ok, missing.grad_name))

  def testRefusals(self):
    with self.assertRaisesRegex(ValueError, r'synthetic\.linear_regression\.'
                                r'RegressionTiny runs no pipeline'):
      testing.CheckPipelinedExperiment(
          'synthetic.linear_regression.RegressionTiny')
    with self.assertRaisesRegex(ValueError, r'splits=\[2, 8\] needs 8 '
                                r'devices; this process has 4\. On CPU call '
                                r'testing\.SetLogicalCpus\(8\)'):
      testing.CheckPipelinedExperiment(_KEY, splits=(2, 8))
    with self.assertRaisesRegex(ValueError, 'must be a registered key'):
      testing.CheckPipelinedExperiment(42)


if __name__ == '__main__':
  tf.test.main()
