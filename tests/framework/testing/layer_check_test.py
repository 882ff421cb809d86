"""Tests for cadence.framework.testing's CheckLayer (layer_check.py).

The kit passes a layer whose FPropMeta states what its FProp does, and
fails, with the numbers, each of tests/bad_units.py's layers that breaks
one rule: FPropMeta returning a number, stating a wrong shape, FLOPs or
act, a variable without gradient, stateful randomness. The measured
figures are worked out by hand for ResidualMlp (x + relu(x w1) w2).
"""
import re

import tensorflow as tf

from cadence.framework import model_registry
from cadence.framework import testing
from cadence.tests import bad_units

_N, _D = 4, 8   # Rows and width of the inputs.


def _Params(cls):
  return cls.Params().Set(dim=_D)


class CheckLayerTest(tf.test.TestCase):

  def testACorrectLayerPassesWithEveryFigureMeasured(self):
    report = testing.CheckLayer(_Params(bad_units.StatedMlp), [_N, _D])
    self.assertTrue(report.ok, str(report))
    self.assertEqual(list(testing.CHECKS), [f.name for f in report.figures])
    # Two products of 2 n d 4d FLOPs; x [n, d] and relu's output [n, 4d]
    # kept (float32); W reads them and both products' output gradients.
    self.assertEqual((16 * _N * _D * _D,) * 2,
                     (report['flops'].stated, report['flops'].measured))
    kept = 4 * _N * 5 * _D
    for name, want in (('act', kept), ('act_weights', kept),
                       ('residuals', 2 * kept)):
      self.assertEqual((want, want), (report[name].stated,
                                      report[name].measured), name)
    self.assertEqual('[4, 8]', report['out_shapes'].measured)
    self.assertIn('flops: stated 4,096, measured 4,096 (ok', str(report))

  def testDefaultedMemoryIsReportedNotFailed(self):
    # A layer stating FLOPs alone: cost.Complete's default act (its input
    # and output, 256 B) is not a statement of the layer.
    report = testing.CheckLayer(_Params(bad_units.FlopsOnlyMlp), [_N, _D])
    self.assertTrue(report.ok)
    act = report['act']
    self.assertEqual((256, 640, None), (act.stated, act.measured, act.ok))
    self.assertIn('defaulted by cost.Complete', act.note)
    with self.assertRaisesRegex(AssertionError, r'act: stated 256, '
                                r'measured 640 \(FAILED; defaulted'):
      testing.CheckLayer(_Params(bad_units.FlopsOnlyMlp), [_N, _D],
                         check_defaults=True)

  def _Fails(self, cls, *lines, **kwargs):
    """CheckLayer of `cls` raises one error holding each regex of
    `lines` (one failed check each), and no other failed check."""
    with self.assertRaises(AssertionError) as ctx:
      testing.CheckLayer(_Params(cls), [_N, _D], **kwargs)
    text = str(ctx.exception)
    self.assertRegex(text.splitlines()[0], rf'^{cls.__name__}: '
                     rf'{len(lines)} check\(s\) of FPropMeta against FProp '
                     r'failed on input\(s\) \[4, 8\]:$')
    failed = [l for l in text.splitlines()[1:]]
    self.assertLen(failed, len(lines), text)
    for regex, line in zip(lines, failed):
      self.assertRegex(line, regex)
    self.assertIsInstance(ctx.exception, testing.LayerCheckError)
    return ctx.exception.report

  def testAPlainNumberBreaksTheContract(self):
    self._Fails(bad_units.PlainNumber,
                r'^  - contract: .*FAILED; FPropMeta returned 4096 \(an int'
                r'\); FPropMeta\(params, \*input_shapes\) must return a cost '
                r'record, cost\.Cost\(out_shapes=')

  def testAWrongShape(self):
    self._Fails(bad_units.WrongShape, r'^  - out_shapes: stated \[4, 16\], '
                r'measured \[4, 8\] \(FAILED\)$')

  def testWrongFlops(self):
    report = self._Fails(
        bad_units.WrongFlops,
        r'^  - flops: stated 2,048, measured 4,096 \(FAILED; products: flops '
        r'\(the layer states no ops\), rtol 0\.02; total flops 2,048; '
        r'stated/measured 0\.500\)$')
    self.assertFalse(report['flops'].ok)
    # Within a looser tolerance it passes: the tolerance is the caller's.
    testing.CheckLayer(_Params(bad_units.WrongFlops), [_N, _D],
                       flops_rtol=0.6)

  def testWrongAct(self):
    self._Fails(bad_units.WrongAct, r'^  - act: stated 128, measured 640 '
                r'\(FAILED; bytes, rtol 0\.05; stated/measured 0\.200\)$')

  def testAVariableWithoutGradient(self):
    self._Fails(bad_units.UnusedVariable,
                r'^  - gradients: stated 3 trainable variable\(s\), measured '
                r'2 with a gradient; none for scale \(FAILED; a variable '
                'FProp does not use')

  def testStatefulRandomness(self):
    # Not replayed by the step seed: the re-run differs, and the op is
    # named. (Its memory differs too: the mask; memory is not checked.)
    self._Fails(bad_units.StatefulDropout,
                r'^  - step_seed: stated outputs replayed by the same seed, '
                r'measured outputs \[0\] differ on a re-run; stateful random '
                r'ops \[.*\(RandomUniform\)\'\] \(FAILED; draw randomness '
                r'from self\.OpSeed\(theta\)',
                checks=('contract', 'out_shapes', 'step_seed'))

  def testEveryFailureInOneError(self):
    class _Both(bad_units.WrongShape):
      @classmethod
      def FPropMeta(cls, p, x):
        return super().FPropMeta(p, x).Replace(flops=1)

    report = self._Fails(_Both, r'^  - out_shapes: .*FAILED',
                         r'^  - flops: stated 1, measured 4,096 \(FAILED')
    self.assertEqual(['out_shapes', 'flops'],
                     [f.name for f in report.failures])

  def testAUnitOfAnExperimentIsNamedByItsParamsPath(self):
    params = model_registry.GetParams('examples.pipelined_mlp.PipelinedMlp',
                                      'Train')
    unit = params.task.net_tpl.units[2]
    unit.cls = bad_units.WrongShape
    with self.assertRaisesRegex(AssertionError, re.escape(
        "WrongShape (params 'task.net_tpl.units[2]'): 1 check(s)")):
      testing.CheckLayer(unit, [_N, _D])
    report = testing.CheckLayer(unit, [_N, _D], raise_on_failure=False)
    self.assertEqual(['out_shapes'], [f.name for f in report.failures])

  def testInputsAsTensorsAndBadArguments(self):
    x = tf.ones([2, _D])
    report = testing.CheckLayer(_Params(bad_units.StatedMlp), x)
    self.assertEqual([[2, _D]], [list(s) for s in report.input_shapes])
    with self.assertRaisesRegex(ValueError, r"checks=\['flop'\]: unknown "
                                r"\['flop'\]"):
      testing.CheckLayer(_Params(bad_units.StatedMlp), x, checks=['flop'])
    with self.assertRaisesRegex(ValueError, r'input 0 has shape \[None, 8\]'
                                r'; give every dim'):
      testing.CheckLayer(_Params(bad_units.StatedMlp), [None, _D])


if __name__ == '__main__':
  tf.test.main()
