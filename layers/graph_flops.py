"""FLOPs of a traced graph's products: MatMul, BatchMatMul, Einsum, Conv2D.

A layer whose code Cadence does not own (a Keras layer, see
layers/keras_layer.py) gets its FLOPs from the ops it builds: each product
with a weight or between activations counts 2 FLOPs (a multiply and an add)
per multiply-accumulate, from the ops' static shapes. Embedding lookups
(Gather, ResourceGather) are data movement and count 0, as in
layers/embedding.py; element-wise ops (bias, activations, norms, softmax)
are not counted: the products dominate every layer this is meant for, and
the count is exact for Dense, Conv2D, Embedding and attention's
projections and score/context products.

Example:
  graph = tf.Graph()
  with graph.as_default():
    x = tf.compat.v1.placeholder(tf.float32, [8, 16])
    tf.matmul(x, tf.ones([16, 4]))
  ProductFlops(graph.get_operations())   # 2 * 8 * 16 * 4 = 1024
"""
from cadence.framework import shapes


def _Dims(tensor):
  """A tensor's static dims as a list (None for unknown ones)."""
  return list(tensor.shape.as_list()) if tensor.shape.rank is not None else (
      None)


def _MatMulFlops(op):
  a, b = _Dims(op.inputs[0]), _Dims(op.inputs[1])
  if a is None or b is None:
    return None
  if op.type == 'MatMul':
    m, k = (a[1], a[0]) if op.get_attr('transpose_a') else (a[0], a[1])
    n = b[0] if op.get_attr('transpose_b') else b[1]
    return shapes.Mul(2, m, k, n)
  # BatchMatMul{,V2,V3}: [..., m, k] x [..., k, n] with broadcast batch dims.
  adj_x, adj_y = op.get_attr('adj_x'), op.get_attr('adj_y')
  m, k = (a[-1], a[-2]) if adj_x else (a[-2], a[-1])
  n = b[-2] if adj_y else b[-1]
  out = _Dims(op.outputs[0])
  batch = shapes.Mul(*out[:-2]) if out is not None else None
  return shapes.Mul(2, batch, m, k, n)


def _EinsumFlops(op):
  """2 x the product of every distinct label's size (a two-operand
  contraction: one multiply-add per point of the joint index space)."""
  equation = op.get_attr('equation').decode()
  inputs = equation.split('->')[0].split(',')
  if len(inputs) != 2 or '.' in equation:
    return None   # Ellipses and single-operand einsums: not a product.
  sizes = {}
  for labels, tensor in zip(inputs, op.inputs):
    dims = _Dims(tensor)
    if dims is None:
      return None
    for label, dim in zip(labels, dims):
      if dim is not None:
        sizes[label] = dim
      else:
        sizes.setdefault(label, None)
  return shapes.Mul(2, *sizes.values())


def _ConvFlops(op):
  """Conv2D: 2 x output elements x kh x kw x input channels."""
  out, kernel = _Dims(op.outputs[0]), _Dims(op.inputs[1])
  if out is None or kernel is None:
    return None
  kh, kw, cin, _ = kernel
  return shapes.Mul(2, *out, kh, kw, cin)


_COUNTERS = {
    'MatMul': _MatMulFlops,
    'BatchMatMul': _MatMulFlops,
    'BatchMatMulV2': _MatMulFlops,
    'BatchMatMulV3': _MatMulFlops,
    'Einsum': _EinsumFlops,
    'Conv2D': _ConvFlops,
}


def ProductFlops(ops):
  """Sum of the FLOPs of the products among `ops`.

  Args:
    ops: tf.Operations of a graph (e.g. the ops one call added).

  Returns:
    An int; None if a product has an unknown dim (e.g. the batch).
  """
  total = 0
  for op in ops:
    counter = _COUNTERS.get(op.type)
    if counter is not None:
      total = shapes.Add(total, counter(op))
  return total
