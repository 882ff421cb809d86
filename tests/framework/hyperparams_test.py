"""Tests for cadence.framework.hyperparams."""
import enum
import json
import math
import re

import tensorflow as tf

from cadence.framework import hyperparams


class _Color(enum.Enum):
  RED = 1
  BLUE = 2


def _Square(x):
  return x * x


class _Built:

  def __init__(self, params, scale=1):
    self.params = params
    self.scale = scale


def _Tree():
  """A root with a nested Params and a list of Params."""
  p = hyperparams.Params()
  p.Define('dim', 8, 'Model width.')
  p.Define('encoder', hyperparams.Params(), 'Encoder.')
  p.encoder.Define('dim', 4, 'Encoder width.')
  p.encoder.Define('ffn', hyperparams.Params(), 'Feed-forward block.')
  p.encoder.ffn.Define('hidden', 16, 'Hidden width.')
  p.encoder.ffn.Define('hidden_act', 'relu', 'Activation name.')
  layers = []
  for i in range(2):
    lp = hyperparams.Params()
    lp.Define('dim', i, 'Layer width.')
    layers.append(lp)
  p.Define('layers', layers, 'Per-layer params.')
  return p


class ParamsTest(tf.test.TestCase):

  def testDefineAndAttributes(self):
    p = hyperparams.Params()
    p.Define('dim', 3, 'Width.')
    self.assertEqual(p.dim, 3)
    p.dim = 5
    self.assertEqual(p.dim, 5)
    self.assertEqual(p.GetDescription('dim'), 'Width.')
    self.assertIn('dim', p)
    self.assertNotIn('other', p)
    self.assertLen(p, 1)

  def testDefineErrors(self):
    p = hyperparams.Params()
    p.Define('dim', 3, 'Width.')
    with self.assertRaisesRegex(ValueError,
                                r"'<root>': param 'dim' is already defined"):
      p.Define('dim', 4, 'Again.')
    with self.assertRaisesRegex(ValueError, r"'Dim' must match .*snake_case"):
      p.Define('Dim', 4, 'Width.')
    with self.assertRaisesRegex(ValueError, r"'1x' must match"):
      p.Define('1x', 4, 'Width.')
    with self.assertRaisesRegex(ValueError, r"'x' needs a non-empty descr"):
      p.Define('x', 4, '  ')
    tree = _Tree()
    with self.assertRaisesRegex(ValueError,
                                r"'encoder.ffn': param 'hidden' is already"):
      tree.encoder.ffn.Define('hidden', 1, 'Again.')

  def testUnknownNameDidYouMean(self):
    p = _Tree()
    with self.assertRaisesRegex(
        AttributeError,
        r"Params 'encoder.ffn' has no param 'hiden'; did you mean "
        r"'hidden', 'hidden_act'\?"):
      _ = p.encoder.ffn.hiden
    with self.assertRaisesRegex(AttributeError,
                                r"'encoder.ffn' has no param 'hiden'"):
      p.encoder.ffn.hiden = 3
    with self.assertRaisesRegex(AttributeError,
                                r"'<root>' has no param 'dimm'; did you mean "
                                r"'dim'\?"):
      p.Set(dimm=3)
    with self.assertRaisesRegex(AttributeError,
                                r"'layers\[1\]' has no param 'dum'; did you "
                                r"mean 'dim'\?"):
      p.Get('layers[1].dum')
    with self.assertRaisesRegex(AttributeError, r"defined params: dim"):
      p.layers[0].zzz = 1

  def testUnknownNameFoundDeeperIsSuggestedByFullKey(self):
    # A knob that moved into a sub-template: the error says where it lives.
    pipe = hyperparams.Params()
    pipe.Define('num_micro_batches', 1, 'M.')
    stack = hyperparams.Params()
    stack.Define('pipeline_tpl', pipe, 'Pipeline.')
    task = hyperparams.Params()
    task.Define('stack_tpl', stack, 'Stack.')
    root = hyperparams.Params()
    root.Define('task', task, 'Task.')
    with self.assertRaisesRegex(
        AttributeError, r"Params 'task' has no param 'num_micro_batches'; did "
        r"you mean 'task\.stack_tpl\.pipeline_tpl\.num_micro_batches'\?$"):
      root.Set(**{'task.num_micro_batches': 3})
    self.assertEqual('task.stack_tpl.pipeline_tpl',
                     root.task.stack_tpl.pipeline_tpl.Path())
    self.assertEqual('task.stack_tpl', root.task.stack_tpl.Copy().Path())

  def testDottedGetSet(self):
    p = _Tree()
    self.assertIs(p.Set(**{'encoder.ffn.hidden': 32, 'layers[1].dim': 7}), p)
    self.assertEqual(p.Get('encoder.ffn.hidden'), 32)
    self.assertEqual(p.encoder.ffn.hidden, 32)
    self.assertEqual(p.Get('layers[1].dim'), 7)
    self.assertEqual(p.Get('layers[0].dim'), 0)
    self.assertIs(p.Get('layers[1]'), p.layers[1])
    with self.assertRaisesRegex(IndexError, r"'layers' has 2 items; index "):
      p.Get('layers[5].dim')
    with self.assertRaisesRegex(AttributeError, r"'dim' is a int, not Params"):
      p.Set(**{'dim.x': 1})
    with self.assertRaisesRegex(ValueError, r"Bad params key 'a..b'"):
      p.Get('a..b')

  def testSetListAndTupleItems(self):
    p = hyperparams.Params()
    p.Define('xs', [1, 2], 'A list.')
    p.Define('ts', (1, 2), 'A tuple.')
    p.Set(**{'xs[1]': 5, 'ts[0]': 9})
    self.assertEqual(p.xs, [1, 5])
    self.assertEqual(p.ts, (9, 2))
    new_layer = hyperparams.Params()
    new_layer.Define('dim', 3, 'Width.')
    tree = _Tree()
    tree.Set(**{'layers[0]': new_layer})
    with self.assertRaisesRegex(AttributeError, r"'layers\[0\]' has no param"):
      _ = tree.layers[0].nope

  def testDelete(self):
    p = _Tree()
    self.assertIs(p.Delete('dim', 'layers'), p)
    self.assertEqual([n for n, _ in p], ['encoder'])
    with self.assertRaisesRegex(AttributeError, r"no param 'dim'"):
      p.Delete('dim')

  def testIterationKeepsDefinitionOrder(self):
    p = hyperparams.Params()
    p.Define('zeta', 1, 'Z.')
    p.Define('alpha', 2, 'A.')
    self.assertEqual(list(p), [('zeta', 1), ('alpha', 2)])
    self.assertEqual(p.ToText(), 'alpha : 2\nzeta : 1\n')

  def testFreeze(self):
    p = _Tree()
    self.assertFalse(p.IsFrozen())
    p.Freeze()
    self.assertTrue(p.IsFrozen())
    self.assertTrue(p.encoder.ffn.IsFrozen())
    self.assertTrue(p.layers[1].IsFrozen())
    with self.assertRaisesRegex(TypeError, r"'<root>' is frozen; cannot set "
                                r"'dim'"):
      p.dim = 3
    with self.assertRaisesRegex(TypeError, r"'encoder.ffn' is frozen; cannot "
                                r"set 'hidden'"):
      p.encoder.ffn.hidden = 3
    with self.assertRaisesRegex(TypeError, r"'encoder' is frozen"):
      p.Set(**{'encoder.dim': 1})
    with self.assertRaisesRegex(TypeError, r"'layers\[1\]' is frozen"):
      p.Set(**{'layers[1].dim': 1})
    with self.assertRaisesRegex(TypeError, r"is frozen; cannot define 'x'"):
      p.Define('x', 1, 'X.')
    with self.assertRaisesRegex(TypeError, r"is frozen; cannot delete 'dim'"):
      p.Delete('dim')
    q = p.Copy()
    self.assertFalse(q.IsFrozen())
    self.assertFalse(q.encoder.ffn.IsFrozen())
    q.encoder.ffn.hidden = 3
    self.assertEqual(p.encoder.ffn.hidden, 16)

  def testCopyIsIndependent(self):
    p = _Tree()
    p.Define('table', {'a': [1, 2]}, 'Nested containers.')
    p.Define('cls', _Built, 'A class.')
    p.Define('dtype', tf.float32, 'A dtype.')
    p.Define('module', json, 'A module.')
    q = p.Copy()
    self.assertEqual(p, q)
    q.dim = 1
    q.encoder.ffn.hidden = 1
    q.layers[1].dim = 99
    q.table['a'].append(3)
    self.assertEqual(p.dim, 8)
    self.assertEqual(p.encoder.ffn.hidden, 16)
    self.assertEqual(p.layers[1].dim, 1)
    self.assertEqual(p.table, {'a': [1, 2]})
    self.assertIs(q.cls, _Built)
    self.assertIs(q.dtype, tf.float32)
    self.assertIs(q.module, json)
    self.assertNotEqual(p, q)

  def testEquality(self):
    self.assertEqual(_Tree(), _Tree())
    a, b = _Tree(), _Tree()
    b.layers[0].dim = 5
    self.assertNotEqual(a, b)
    c = _Tree()
    c.Define('extra', None, 'Extra.')
    self.assertNotEqual(a, c)
    self.assertNotEqual(hyperparams.Params(), hyperparams.InstantiableParams())

  def testStrAndRepr(self):
    p = hyperparams.Params()
    p.Define('fn', lambda x: x, 'Not writable to text.')
    p.Define('dim', 2, 'Width.')
    self.assertStartsWith(str(p), 'dim : 2\nfn : <function')
    self.assertStartsWith(repr(p), "Params('<root>'):\ndim : 2\n")
    with self.assertRaisesRegex(ValueError, r"cannot write 'fn' to text: .*"
                                r"lambdas and local"):
      p.ToText()


class TextTest(tf.test.TestCase):

  def _RoundTrip(self, p, names):
    """Blanks `names` in a copy of p, then restores them from p.ToText()."""
    text = p.ToText()
    q = p.Copy().Set(**{name: 'placeholder' for name in names})
    q.FromText(text)
    self.assertEqual(q.ToText(), text)
    return q

  def testToTextFormat(self):
    p = _Tree()
    self.assertEqual(
        p.ToText(),
        'dim : 8\n'
        'encoder.dim : 4\n'
        'encoder.ffn.hidden : 16\n'
        "encoder.ffn.hidden_act : 'relu'\n"
        'layers[0].dim : 0\n'
        'layers[1].dim : 1\n')

  def testRoundTripEveryValueType(self):
    p = _Tree()
    tricky = 'say "hi" : it\'s\nback\\slash\ttab'
    values = {
        'text': tricky,
        'flag': True,
        'count': -3,
        'rate': 1e-5,
        'big': float('inf'),
        'neg': float('-inf'),
        'nothing': None,
        'shape': (2, 3),
        'single': (4,),
        'empty': (),
        'seq': [1, 'a : b', None, (1.5,)],
        'table': {'k': [1, 2], 'n': {'inner': False}},
        'cls': _Built,
        'builtin_cls': dict,
        'fn': _Square,
        'lib_fn': json.dumps,
        'color': _Color.BLUE,
        'dtype': tf.float32,
        'bf16': tf.bfloat16,
    }
    for name, value in values.items():
      p.Define(name, value, f'The {name}.')
    q = self._RoundTrip(p, values)
    for name, value in values.items():
      self.assertEqual(q.Get(name), value, msg=name)
      self.assertIs(type(q.Get(name)), type(value), msg=name)
    self.assertEqual(q.text, tricky)
    self.assertIs(q.cls, _Built)
    self.assertIs(q.fn, _Square)
    self.assertIs(q.color, _Color.BLUE)
    self.assertIs(q.bf16, tf.bfloat16)
    self.assertEqual(p, q)
    self.assertIn("text : 'say \"hi\" : it\\'s\\nback\\\\slash\\ttab'\n",
                  p.ToText())
    self.assertIn('cls : type(', p.ToText())

  def testLibraryClassesPrintTheirPublicName(self):
    # keras.layers.Dense is defined in keras.src.layers.core.dense and
    # exported as keras.layers.Dense (namex's `_api_export_path`); a
    # subclass inherits that attribute but is written by its own path.
    import keras  # pylint: disable=g-import-not-at-top

    class _Sub(keras.layers.Dense):
      pass

    p = hyperparams.Params()
    p.Define('layer', keras.layers.Dense, 'A Keras layer class.')
    p.Define('act', keras.activations.relu, 'A Keras function.')
    self.assertEqual("act : function('keras.activations.relu')\n"
                     "layer : type('keras.layers.Dense')\n", p.ToText())
    q = p.Copy().Set(layer=None, act=None).FromText(p.ToText())
    self.assertIs(q.layer, keras.layers.Dense)
    self.assertIs(q.act, keras.activations.relu)
    p.layer = _Sub
    with self.assertRaisesRegex(ValueError, r"cannot write 'layer' to text:"
                                r'.*_Sub.*has no import path'):
      p.ToText()

  def testRoundTripNan(self):
    p = hyperparams.Params()
    p.Define('x', float('nan'), 'Not a number.')
    self.assertEqual(p.ToText(), 'x : nan\n')
    self.assertTrue(math.isnan(p.Copy().FromText('x : nan').x))

  def testFromTextNestedAndListsOfParams(self):
    p = _Tree()
    p.Define('pair', (hyperparams.Params(), hyperparams.Params()), 'Tuple.')
    for item in p.pair:
      item.Define('w', 0, 'Weight.')
    self.assertIn('pair[1].w : 0\n', p.ToText())
    q = p.Copy().FromText('# comment\n\n  encoder.ffn.hidden : 64\n'
                          'layers[1].dim : 5\npair[1].w : 2\n')
    self.assertEqual(q.encoder.ffn.hidden, 64)
    self.assertEqual(q.layers[1].dim, 5)
    self.assertEqual(q.pair[1].w, 2)
    self.assertIsInstance(q.pair, tuple)
    self.assertIs(q.FromText(''), q)

  def testFromTextErrors(self):
    p = _Tree()
    with self.assertRaisesRegex(
        AttributeError,
        r"line 2: Params 'encoder.ffn' has no param 'hiddn'; did you mean "
        r"'hidden'"):
      p.FromText('dim : 1\nencoder.ffn.hiddn : 3\n')
    with self.assertRaisesRegex(
        ValueError, r"line 3: cannot parse the value of 'dim': '1 \+' "):
      p.FromText('# x\ndim : 2\ndim : 1 +\n')
    with self.assertRaisesRegex(
        ValueError, re.escape("line 1: cannot parse the value of 'dim': "
                              "'os.system(1)'")):
      p.FromText('dim : os.system(1)')
    with self.assertRaisesRegex(ValueError, r"line 1: expected 'key : value'"):
      p.FromText('dim = 3')
    with self.assertRaisesRegex(ValueError, r"line 1: .*cannot resolve "
                                r"'no_such_module_xyz.C'"):
      p.FromText("dim : type('no_such_module_xyz.C')")
    with self.assertRaisesRegex(ValueError, r"'json.dumps' is not a type"):
      p.FromText("dim : type('json.dumps')")
    with self.assertRaisesRegex(IndexError, r"line 1: 'layers' has 2 items"):
      p.FromText('layers[2].dim : 1')
    with self.assertRaisesRegex(TypeError, r"line 1: .*'<root>' is frozen"):
      p.Freeze().FromText('dim : 1')

  def testTextDiff(self):
    a, b = _Tree(), _Tree()
    self.assertEqual(a.TextDiff(b), '')
    b.dim = 9
    b.Define('extra', 'x', 'Only in b.')
    a.layers[0].Define('gain', 1.5, 'Only in a.')
    self.assertEqual(
        a.TextDiff(b),
        '- dim : 8\n'
        '+ dim : 9\n'
        "+ extra : 'x'\n"
        '- layers[0].gain : 1.5\n')


class InstantiableParamsTest(tf.test.TestCase):

  def testInstantiate(self):
    p = hyperparams.InstantiableParams(_Built)
    p.Define('dim', 2, 'Width.')
    obj = p.Instantiate(scale=3)
    self.assertIsInstance(obj, _Built)
    self.assertIs(obj.params, p)
    self.assertEqual(obj.scale, 3)

  def testCopyKeepsSubclassAndClsRoundTrips(self):
    p = hyperparams.InstantiableParams(_Built)
    q = p.Copy()
    self.assertIsInstance(q, hyperparams.InstantiableParams)
    self.assertIs(q.cls, _Built)
    r = hyperparams.InstantiableParams().FromText(p.ToText())
    self.assertIs(r.cls, _Built)
    self.assertEqual(p, r)

  def testInstantiateWithoutClsFails(self):
    with self.assertRaisesRegex(ValueError, r"cls is None; set p.cls"):
      hyperparams.InstantiableParams().Instantiate()


if __name__ == '__main__':
  tf.test.main()
