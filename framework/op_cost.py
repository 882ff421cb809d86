"""The ops of a layer's forward, by kind, so an accelerator can time them.

A layer's cost record (framework/cost.py) carries `ops`: what one forward
runs, as `Op`s. The hardware model (framework/planning/hardware.py,
`Hardware.OpSeconds`) turns each into seconds: a product (`MATMUL`) by its
FLOPs at the device's peak times an efficiency that falls as its shape
shrinks (tiles, waves), or by its bytes if it reads more than it computes;
the other kinds by the bytes they read and write; every op pays a launch.
`Backward` gives the ops of its gradient.

Kinds:
  matmul       [batch, m, k] x [k, n] (a weight shared over the batch, or
               [batch, k, n] when both sides are activations: attention's
               scores and context); dims (batch, m, k, n, weight, size:
               bytes an element).
  elementwise  activations, dropout, residual additions, casts, scaling;
               dims (streams, bytes of one): the full-size passes it
               still makes through memory when fused into the op before
               it (on a cluster that fuses element-wise ops, hardware's
               `fuse`): 0 for a bias, an activation, a scale, a mask, a
               transpose;
               1 for a residual addition (its second input); 2 for a
               dropout (its random bits written and read).
  norm         layer norm, RMS norm: a reduction and a rescale per row.
  softmax      max, exp, sum and divide over the last dim (attention
               probabilities; the vocabulary's softmax and cross-entropy).
  gather       rows of a table (an embedding's look-up).
  attention    dot-product attention's core, scores to context
               (softmax(q k^T + mask) v, with its dropout): one op that
               holds the ops it runs unfused (`parts`: the two products,
               the mask, the softmax, the dropout). A cluster that runs
               attention as one kernel (hardware's `fuse`), or a layer
               whose record says it does (`fused`), times it as
               FlashAttention runs it: the products' FLOPs without the
               [batch, tq, tk] scores ever written to memory, q, k, v and
               the output read and written once, and a backward that
               recomputes the scores (`FusedAttention`); elsewhere its
               parts are timed one by one.
  other        FLOPs that a layer does not break down: costed as products
               at the device's flat efficiency (what a record that says
               nothing gets, cost.Complete).

Example:
  ops = (MatMul(batch=1, m=4096, k=2048, n=8192, size=2),
         Elementwise(4096 * 8192, size=2, flops_per_element=1))
  sum(op.flops for op in ops)           # 2 x 4096 x 2048 x 8192 + ...
  Backward(ops[0])                      # input and weight gradients
"""
import collections

MATMUL = 'matmul'
ELEMENTWISE = 'elementwise'
NORM = 'norm'
SOFTMAX = 'softmax'
GATHER = 'gather'
OTHER = 'other'
ATTENTION = 'attention'
KINDS = (MATMUL, ELEMENTWISE, NORM, SOFTMAX, GATHER, OTHER, ATTENTION)
# Kinds bound by memory on every accelerator preset: a few FLOPs a byte.
MEMORY_BOUND = (ELEMENTWISE, NORM, SOFTMAX, GATHER)


class Op(collections.namedtuple('Op', ['kind', 'flops', 'bytes', 'dims'])):
  """One op of a forward: its kind (KINDS), FLOPs, the bytes it reads and
  writes, and its dims: (batch, m, k, n, weight, size) for a MATMUL,
  (streams, bytes of one) for an ELEMENTWISE op, `AttentionDims` for an
  ATTENTION op, else None.
  """
  __slots__ = ()


AttentionDims = collections.namedtuple('AttentionDims', [
    'batch', 'tq', 'tk', 'dh', 'size', 'fused', 'backward', 'parts'])
AttentionDims.__doc__ = """An ATTENTION op's dims: `batch` (examples x
heads) of queries [tq, dh] attending to keys and values [tk, dh], `size`
bytes an element; `fused`, whether the layer itself runs it as one kernel
(timed fused on any cluster); `backward`, whether it is the gradient;
`parts`, the ops it runs unfused (a tuple of Ops)."""


def MatMul(batch, m, k, n, size, weight=True):
  """[batch, m, k] x [k, n] (`weight`: one [k, n] for the whole batch) or
  x [batch, k, n]; `size` bytes an element."""
  rhs = k * n if weight else batch * k * n
  return Op(MATMUL, 2 * batch * m * k * n,
            size * (batch * m * k + rhs + batch * m * n),
            (batch, m, k, n, weight, size))


def _MemoryOp(kind, elements, size, flops_per_element, reads, dims=None):
  return Op(kind, flops_per_element * elements,
            size * elements * (reads + 1), dims)


def Elementwise(elements, size, flops_per_element=1, reads=1, streams=0):
  """An element-wise op over `elements` (`reads` inputs, one output);
  `streams`: its full-size passes when fused (the kinds' list above)."""
  return _MemoryOp(ELEMENTWISE, elements, size, flops_per_element, reads,
                   (streams, size * elements))


def FusedBytes(op):
  """The bytes an ELEMENTWISE op still moves when fused into the op before
  it: its streams' (each one full-size tensor)."""
  streams, stream_bytes = op.dims
  return streams * stream_bytes


def Norm(elements, size, flops_per_element=7):
  """A norm over the last dim: reads its input, writes its output."""
  return _MemoryOp(NORM, elements, size, flops_per_element, 1)


def Softmax(elements, size, flops_per_element=5):
  """A softmax over the last dim of `elements`."""
  return _MemoryOp(SOFTMAX, elements, size, flops_per_element, 1)


def Gather(rows, dim, size):
  """`rows` rows of `dim` from a table: reads and writes them."""
  return Op(GATHER, 0, 2 * size * rows * dim, None)


def Other(flops, num_bytes=0):
  """FLOPs without a breakdown: costed as products at the flat rate."""
  return Op(OTHER, flops, num_bytes, None)


def Attention(batch, tq, tk, dh, size, parts=None, fused=False):
  """Dot-product attention's core: queries [batch, tq, dh] (batch =
  examples x heads) attend to keys and values [batch, tk, dh]. `parts`:
  the ops it runs unfused, in order (default: the scores' product, the
  softmax and the context's product); `fused`: the layer runs it as one
  kernel (FlashAttention) whatever the cluster. Its flops and bytes are
  its parts' (what the unfused graph does; `FusedAttention` gives a
  fused kernel's)."""
  if parts is None:
    parts = (MatMul(batch, tq, dh, tk, size, weight=False),
             Softmax(batch * tq * tk, size),
             MatMul(batch, tq, tk, dh, size, weight=False))
  parts = tuple(parts)
  return Op(ATTENTION, Sum(parts), Sum(parts, 'bytes'),
            AttentionDims(batch, tq, tk, dh, size, fused, False, parts))


# A fused attention's backward: the scores' product again (the kernel keeps
# no [tq, tk] scores), the gradients of the probabilities, of q, of k and
# of v: five products of the forward's two, 2.5 x its FLOPs.
FUSED_BACKWARD_PRODUCTS = 2.5


def FusedAttention(op):
  """(product FLOPs, bytes, product dims) of ATTENTION op `op` run as one
  kernel: forward 4 batch tq tk dh FLOPs (q k^T and the probabilities x
  v), reading q, k, v and writing the output; backward
  FUSED_BACKWARD_PRODUCTS x that, reading q, k, v, the output and its
  gradient and writing the gradients of q, k and v. The dims are the
  scores' product's ([batch, tq, dh] x [batch, dh, tk]), whose tiles the
  kernel runs. The softmax, the mask and the dropout run inside the
  products: no bytes, FLOPs left out (5 a score beside 4 dh)."""
  d = op.dims
  flops = 4 * d.batch * d.tq * d.tk * d.dh
  passes = 2   # Forward: q and the output; k and v.
  if d.backward:
    flops, passes = FUSED_BACKWARD_PRODUCTS * flops, 4
  num_bytes = passes * d.size * d.batch * (d.tq + d.tk) * d.dh
  return flops, num_bytes, (d.batch, d.tq, d.dh, d.tk, False, d.size)


def Unfused(ops):
  """`ops` with each ATTENTION op replaced by its parts: what the graph
  runs op by op."""
  out = []
  for op in ops:
    out.extend(Unfused(op.dims.parts) if op.kind == ATTENTION else (op,))
  return out


def Backward(op):
  """The ops of `op`'s gradient, a tuple.

  A product's input gradient ([batch, m, n] x [n, k]) and its other
  side's ([k, batch m] x [batch m, n] for a weight, summed over the
  batch; per batch element for activations): two products of its FLOPs.
  A memory-bound op reads its input (or output) and the gradient and
  writes the gradient: twice its bytes and FLOPs. A gather's gradient
  scatters the rows back (its bytes). `other`: 2 x its FLOPs (a product's
  two gradients). An attention's gradient is one ATTENTION op of its
  parts' gradients (`FusedAttention` gives its fused cost).
  """
  if op.kind == ATTENTION:
    parts = tuple(b for part in op.dims.parts for b in Backward(part))
    return (op._replace(flops=Sum(parts), bytes=Sum(parts, 'bytes'),
                        dims=op.dims._replace(backward=True, parts=parts)),)
  if op.kind == MATMUL:
    batch, m, k, n, weight, size = op.dims
    dx = MatMul(batch, m, n, k, size, weight)
    if weight:
      dw = MatMul(1, k, batch * m, n, size, weight=False)
    else:
      dw = MatMul(batch, k, m, n, size, weight=False)
    return (dx, dw)
  if op.kind == GATHER:
    return (op,)
  dims = op.dims
  if op.kind == ELEMENTWISE:   # Twice the passes, fused or not.
    dims = (2 * dims[0], dims[1])
  return (op._replace(flops=2 * op.flops, bytes=2 * op.bytes, dims=dims),)


def Gradient(ops):
  """The ops of the backward of a forward's `ops`, in order."""
  return [b for op in ops for b in Backward(op)]


def Sum(ops, field='flops'):
  """The sum of a field over ops."""
  return sum(getattr(op, field) for op in ops)
