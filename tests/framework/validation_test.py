"""Tests for cadence.framework.validation: checks and their messages."""
import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import validation
from cadence.layers import linear


class OwnerTest(tf.test.TestCase):

  def testLayerClassAndParams(self):
    layer = linear.ProjectionLayer.Params().Set(
        name='proj', input_dim=2, output_dim=3).Instantiate()
    self.assertEqual("ProjectionLayer 'proj'", validation.Owner(layer))
    self.assertEqual("ProjectionLayer 'x'",
                     validation.Owner(linear.ProjectionLayer, 'x'))
    self.assertEqual('ProjectionLayer',
                     validation.Owner(linear.ProjectionLayer.Params()))

  def testParamsPathIsNamed(self):
    root = base_layer.hyperparams.Params()
    root.Define('task', linear.ProjectionLayer.Params().Set(name='p'), 'A.')
    child = root.task
    self.assertEqual("ProjectionLayer 'p' (params 'task')",
                     validation.Owner(child))
    layer = child.Copy().Set(input_dim=1, output_dim=1).Instantiate()
    self.assertEqual("ProjectionLayer 'p' (params 'task')",
                     validation.Owner(layer))


class ChecksTest(tf.test.TestCase):

  def testInts(self):
    self.assertEqual(3, validation.CheckInt('o', 'n', 3))
    for bad in (0, -1, 1.5, True, '2', None):
      with self.assertRaisesRegex(ValueError,
                                  rf'^o: n={bad!r} must be an int >= 1\.$'):
        validation.CheckInt('o', 'n', bad)
    with self.assertRaisesRegex(ValueError, r'^o: n=5 must be an int in '
                                r'\[0, 4\]\.$'):
      validation.CheckInt('o', 'n', 5, 0, 4)
    self.assertIsNone(validation.CheckOptionalInt('o', 'n', None))
    with self.assertRaisesRegex(ValueError, r'must be None or an int >= 1'):
      validation.CheckOptionalInt('o', 'n', 0)

  def testNumbersAndProbabilities(self):
    validation.CheckNumber('o', 'x', 0.5, 0, 1)
    for value, low, high, lo_open, hi_open, rule in (
        (0, 0, None, True, False, r'a number > 0'),
        (-1, 0, None, False, False, r'a number >= 0'),
        (2, None, 1, False, True, r'a number < 1'),
        (1, 0, 1, False, True, r'a number in \[0, 1\)'),
        (True, 0, 1, False, False, r'a number in \[0, 1\]')):
      with self.assertRaisesRegex(ValueError, rf'x={value!r} must be {rule}'):
        validation.CheckNumber('o', 'x', value, low, high, lo_open, hi_open)
    validation.CheckProb('o', 'p', 0.0)
    # Booleans are not probabilities (the copies this module replaced
    # disagreed on that).
    for bad in (1.0, -0.1, True, False):
      with self.assertRaisesRegex(ValueError, r'must be a probability in '
                                  r'\[0, 1\)'):
        validation.CheckProb('o', 'p', bad)

  def testChoicesListsDividesBools(self):
    with self.assertRaisesRegex(
        ValueError, r"^o: padding='same' must be one of 'SAME', 'VALID'\. "
        r"Did you mean 'SAME'\?$"):
      validation.CheckOneOf('o', 'padding', 'same', ('SAME', 'VALID'))
    with self.assertRaisesRegex(ValueError, r'^o: k=\[1, 0\] must be a list '
                                r'of 2 ints >= 1\.$'):
      validation.CheckIntList('o', 'k', [1, 0], 2)
    with self.assertRaisesRegex(ValueError, r'^o: heads=3 must divide '
                                r'dim=8; 8 % 3 = 2\.$'):
      validation.CheckDivides('o', 'heads', 3, 8, 'dim')
    with self.assertRaisesRegex(ValueError, r'^o: flag=1 must be True or '
                                r'False\.$'):
      validation.CheckBool('o', 'flag', 1)

  def testLongValuesAreShortened(self):
    tpl = linear.ProjectionLayer.Params()
    self.assertEqual('ProjectionLayer.Params()', validation.ShortRepr(tpl))
    self.assertEqual('[ProjectionLayer.Params(), ProjectionLayer.Params()]',
                     validation.ShortRepr([tpl, tpl]))
    text = validation.ShortRepr(list(range(1000)), limit=20)
    self.assertLen(text, 20)
    self.assertTrue(text.endswith('...'))
    # A path is kept whole up to string_limit; longer, it keeps its start
    # and its file's name.
    path = '/tmp/' + 'x' * 300 + '/blank.txt'
    self.assertEqual(repr(path), validation.ShortRepr(path))
    text = validation.ShortRepr(path, string_limit=40)
    self.assertLen(text, 40)
    self.assertEqual(text, repr(path)[:18] + '...' + repr(path)[-19:])
    self.assertTrue(text.startswith("'/tmp/x"))
    self.assertTrue(text.endswith("/blank.txt'"))
    error = validation.Error('o', 'f', 'v', 'rule.', error_cls=KeyError)
    self.assertIsInstance(error, KeyError)


if __name__ == '__main__':
  tf.test.main()
