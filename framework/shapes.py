"""Static shapes for FPropMeta: tuples of int dims, None where unknown.

`FPropMeta` works on shapes alone (no tensors are built), so the partitioner
can cost a model before it exists.

Example:
  s = Shape([None, 128, 512])
  s.rank                 # 3
  s[-1]                  # 512
  s.num_elements()       # None (batch unknown)
  s.ToTensorShape()      # TensorShape([None, 128, 512])
"""
import tensorflow as tf


class Shape(tuple):
  """An immutable tuple of dims; each dim is a non-negative int or None.

  A NestedMap holds a Shape as one leaf (it does not descend into it), so a
  NestedMap of shapes flattens and transforms shape by shape.
  """

  IS_NESTED_MAP_LEAF = True

  def __new__(cls, dims=()):
    if isinstance(dims, tf.TensorShape):
      if dims.rank is None:
        raise ValueError('Shape needs a known rank; got TensorShape(None).')
      dims = dims.as_list()
    out = []
    for d in dims:
      if isinstance(d, tf.compat.v1.Dimension):
        d = d.value
      if d is not None:
        if isinstance(d, bool) or int(d) != d or d < 0:
          raise ValueError(
              f'Shape dims must be non-negative ints or None; got {d!r} in '
              f'{list(dims)!r}.')
        d = int(d)
      out.append(d)
    return super().__new__(cls, out)

  @classmethod
  def FromTensorShape(cls, tensor_shape):
    return cls(tf.TensorShape(tensor_shape))

  def ToTensorShape(self):
    return tf.TensorShape(list(self))

  @property
  def rank(self):
    return len(self)

  @property
  def is_fully_defined(self):
    return all(d is not None for d in self)

  def num_elements(self):
    """Product of the dims, or None if any is unknown."""
    return Mul(*self)

  def WithDim(self, axis, value):
    """Returns a copy with dim `axis` replaced by `value`."""
    dims = list(self)
    dims[axis] = value
    return Shape(dims)

  def __getitem__(self, key):
    item = super().__getitem__(key)
    return Shape(item) if isinstance(key, slice) else item

  def __add__(self, other):
    return Shape(tuple(self) + tuple(other))

  def __repr__(self):
    return f'Shape({list(self)!r})'


def AsShape(x):
  """Normalises a Shape, tuple, list, TensorShape or tensor to a Shape."""
  if isinstance(x, Shape):
    return x
  if isinstance(x, (tf.Tensor, tf.Variable)):
    return Shape(x.shape)
  return Shape(x)


def Mul(*factors):
  """Product of ints; None if any factor is None (an unknown dim)."""
  result = 1
  for f in factors:
    if f is None:
      return None
    result *= f
  return result


def Add(*terms):
  """Sum of ints; None if any term is None."""
  if any(t is None for t in terms):
    return None
  return sum(terms)
