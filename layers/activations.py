"""Element-wise activation functions, looked up by name.

Layers take an `activation` param (a string) and resolve it here, so a
params file says `activation : 'GELU'` rather than holding a function.
Names are case-insensitive.

FLOPs per element (the convention `FPropMeta` uses; a transcendental such as
exp, erf or tanh counts 1, like any other element-wise op):
  NONE     0  identity
  RELU     1  max(x, 0)
  SIGMOID  4  negate, exp, add 1, reciprocal
  TANH     4  counted like SIGMOID (tanh(x) = 2 * sigmoid(2x) - 1 minus the
              affine terms folded into the kernel)
  SWISH    5  SIGMOID plus a multiply by x (alias SILU)
  GELU     5  exact form 0.5 * x * (1 + erf(x / sqrt(2))): scale, erf, add,
              multiply, multiply

Example:
  fn = GetFn('gelu')
  y = fn(tf.constant([-1.0, 0.0, 1.0]))
  FlopsPerElement('GELU')  # 5
"""
import difflib

import tensorflow as tf


def _Gelu(x):
  return tf.nn.gelu(x, approximate=False)


# name -> (function, FLOPs per element); see the module docstring.
_ACTIVATIONS = {
    'NONE': (tf.identity, 0),
    'RELU': (tf.nn.relu, 1),
    'SIGMOID': (tf.math.sigmoid, 4),
    'TANH': (tf.math.tanh, 4),
    'SWISH': (tf.nn.silu, 5),
    'GELU': (_Gelu, 5),
}
_ALIASES = {'SILU': 'SWISH'}


def Names():
  """All accepted activation names (upper case), aliases included."""
  return sorted(list(_ACTIVATIONS) + list(_ALIASES))


def _Lookup(name):
  if not isinstance(name, str):
    raise ValueError(
        f'activation must be a string, one of {", ".join(Names())}; got '
        f'{name!r}.')
  key = name.upper()
  key = _ALIASES.get(key, key)
  if key not in _ACTIVATIONS:
    close = difflib.get_close_matches(name.upper(), Names(), n=1)
    hint = f' Did you mean {close[0]!r}?' if close else ''
    raise ValueError(
        f'Unknown activation {name!r}; valid names (case-insensitive): '
        f'{", ".join(Names())}.{hint}')
  return _ACTIVATIONS[key]


def GetFn(name):
  """Returns the activation function `name` (a callable on tensors).

  Args:
    name: one of `Names()`, case-insensitive, e.g. 'RELU' or 'gelu'.

  Raises:
    ValueError: unknown name; the message lists the valid ones.
  """
  return _Lookup(name)[0]


def CheckName(owner, field, name):
  """Raises a ValueError naming `owner` and `field` unless `name` is valid."""
  try:
    _Lookup(name)
  except ValueError as e:
    raise ValueError(f'{owner}: {field}={name!r} is invalid: {e}') from None
  return name


def FlopsPerElement(name):
  """FLOPs per element of activation `name`; see the module docstring."""
  return _Lookup(name)[1]
