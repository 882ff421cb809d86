"""Tests for cadence.layers.activations."""
import math

import numpy as np
import tensorflow as tf

from cadence.layers import activations


def _NpGelu(x):
  return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def _NpSigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


_REFERENCES = {
    'NONE': lambda x: x,
    'RELU': lambda x: np.maximum(x, 0.0),
    'SIGMOID': _NpSigmoid,
    'TANH': np.tanh,
    'SWISH': lambda x: x * _NpSigmoid(x),
    'SILU': lambda x: x * _NpSigmoid(x),
    'GELU': _NpGelu,
}


class ActivationsTest(tf.test.TestCase):

  def testAllNamesHaveAReference(self):
    self.assertCountEqual(activations.Names(), list(_REFERENCES))

  def testValuesMatchNumpy(self):
    x = np.linspace(-4.0, 4.0, 41).astype(np.float64)
    for name, ref in _REFERENCES.items():
      for spelled in (name, name.lower()):
        got = activations.GetFn(spelled)(tf.constant(x))
        self.assertAllClose(got, ref(x), atol=1e-12, msg=spelled)

  def testBfloat16KeepsDtype(self):
    x = tf.constant([-1.0, 0.5, 2.0], tf.bfloat16)
    for name in activations.Names():
      y = activations.GetFn(name)(x)
      self.assertEqual(y.dtype, tf.bfloat16, msg=name)
      self.assertAllClose(tf.cast(y, tf.float32),
                          _REFERENCES[name](np.array([-1.0, 0.5, 2.0])),
                          atol=2e-2, msg=name)

  def testFlopsPerElement(self):
    self.assertEqual(activations.FlopsPerElement('none'), 0)
    self.assertEqual(activations.FlopsPerElement('RELU'), 1)
    self.assertEqual(activations.FlopsPerElement('SILU'),
                     activations.FlopsPerElement('SWISH'))
    self.assertEqual(activations.FlopsPerElement('SWISH'),
                     activations.FlopsPerElement('SIGMOID') + 1)
    for name in activations.Names():
      self.assertIsInstance(activations.FlopsPerElement(name), int)

  def testUnknownNameSuggests(self):
    with self.assertRaisesRegex(
        ValueError, r"Unknown activation 'RELLU'; valid names .*GELU.*RELU.*"
        r"Did you mean 'RELU'\?"):
      activations.GetFn('RELLU')
    with self.assertRaisesRegex(ValueError, 'Unknown activation'):
      activations.FlopsPerElement('softplus')
    with self.assertRaisesRegex(ValueError, 'must be a string'):
      activations.GetFn(None)


if __name__ == '__main__':
  tf.test.main()
