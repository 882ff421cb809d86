"""A traced backward cut in two: B (input gradients) and W (weight gradients).

Zero-bubble schedules (Qi et al., 2024, arXiv:2401.10241) run a stage's
backward as two actions: B computes the gradient of the stage's input, which
the previous stage waits for, and W the gradient of its weights, which
nobody waits for, so it can fill a bubble later. For a product y = x w,
B computes dx = dy w^T and W computes dw = x^T dy: W reads x (a forward
tensor) and dy (a gradient B computed on the way to dx).

`CutBackward` cuts one traced gradient graph (a `tf.compat.v1.wrap_function`
whose outputs are the gradients, in `cell_program.CellProgram`'s backward)
exactly in two: every op the input gradients need goes to B; the ops only
the weight gradients need go to W. The *residuals* are the tensors W reads
that B computes or that are fed to the graph (forward tensors, kept
activations, the output gradients): B returns them and W takes them. Sum
of the two: the same ops as the whole backward, each run once, so the
gradients are bit-identical to the whole backward.

What B and W recompute or keep, by remat policy (executor.py): B does what
the whole backward did before its weight-gradient products (re-runs the
forward for 'always' and 'except_last', recomputes the cheap ops for
'selective', reads the kept activations for 'never'), and keeps for W the
inputs of those products (the activations x and the gradients dy); W only
runs the weight-gradient products and their reductions (bias gradients).

Example:
  traced = tf.compat.v1.wrap_function(fwd_and_grads, specs)
  b, w, residuals = CutBackward(traced, traced.inputs, traced.outputs,
                                num_weights)
  input_grads_and_residuals = b(*args)   # X + the residuals B computes
"""
import tensorflow as tf

# Ops W recomputes rather than reads from B (see CutBackward).
_SHAPE_OPS = frozenset(['Shape', 'ShapeN', 'Size', 'Rank'])


def _Ancestors(tensors, stop):
  """The ops `tensors` depend on, not walking past tensors in `stop`."""
  seen, todo = set(), [t.op for t in tensors if t.ref() not in stop]
  while todo:
    op = todo.pop()
    if op in seen:
      continue
    seen.add(op)
    todo += [t.op for t in op.inputs if t.ref() not in stop]
    todo += list(op.control_inputs)
  return seen


class Cut:
  """The two halves of a deferred W.

  Attributes:
    b: the pruned function feeds -> input gradients + `inner` residuals.
    w: the pruned function residuals -> weight gradients.
    residuals: the tensors W takes, in its argument order.
    fed: per residual, the index of the feed it is (or None: B computes
      it; those come after the input gradients in B's outputs, in order).
    num_input_grads: how many of B's outputs are input gradients.
  """

  def __init__(self, b, w, residuals, fed, num_input_grads):
    self.b = b
    self.w = w
    self.residuals = residuals
    self.fed = fed
    self.num_input_grads = num_input_grads

  def WeightArgs(self, feed_values, b_outputs):
    """W's arguments from the values fed to B and B's outputs."""
    inner = iter(b_outputs[self.num_input_grads:])
    return [feed_values[i] if i is not None else next(inner)
            for i in self.fed]


def CutBackward(traced, feeds, weight_grads, input_grads):
  """Cuts `traced`'s gradient graph in two; see the module docstring.

  Args:
    traced: a WrappedFunction holding the forward and its gradients.
    feeds: the tensors B is fed (graph inputs, or cut points such as kept
      activations), in B's argument order.
    weight_grads: the output tensors W computes (theta's gradients).
    input_grads: the output tensors B computes (state's and inputs').

  Returns:
    A `Cut`.
  """
  feed_index = {t.ref(): i for i, t in enumerate(feeds)}
  stop = set(feed_index)
  b_ops = _Ancestors(input_grads, stop)
  w_ops = _Ancestors(weight_grads, stop) - b_ops
  # A shape W reads (a convolution's filter gradient takes its input's
  # shape) W computes itself from what it reads anyway: a multi-output
  # ShapeN cannot be cut at one of its outputs, and the op is cheap.
  grown = True
  while grown:
    grown = False
    for op in list(w_ops):
      for t in op.inputs:
        if (t.op in b_ops and t.op.type in _SHAPE_OPS and
            t.op not in w_ops and t.ref() not in stop):
          w_ops.add(t.op)
          grown = True
  order = {op: n for n, op in enumerate(traced.graph.get_operations())}
  residuals, seen = [], set()

  def _Take(t):
    if t.ref() not in seen and (t.ref() in stop or t.op in b_ops) and (
        t.op not in w_ops):
      seen.add(t.ref())
      residuals.append(t)

  for op in sorted(w_ops, key=order.get):
    for t in op.inputs:
      _Take(t)
  for t in weight_grads:   # A weight gradient B computes anyway.
    _Take(t)
  inner = [t for t in residuals if t.ref() not in stop]
  b = traced.prune(feeds=list(feeds), fetches=list(input_grads) + inner)
  w = traced.prune(feeds=residuals, fetches=list(weight_grads))
  return Cut(b, w, residuals, [feed_index.get(t.ref()) for t in residuals],
             len(input_grads))


def WeightOps(cut):
  """The op types W computes its outputs with (what its function runs; the
  pruned graph may hold dead ops, which TF drops when it instantiates it):
  for tests, W must not re-run the forward."""
  return sorted({op.type for op in _Ancestors(cut.w.outputs, set())
                 if op.type not in ('Placeholder', 'Identity', 'NoOp')})


def Hold(tensors, after):
  """`tensors` made to wait for `after` (control dependencies), as fresh
  identities (in a graph; as they are eagerly or without `after`)."""
  if not after or tf.executing_eagerly():
    return list(tensors)
  with tf.control_dependencies(list(after)):
    return [tf.identity(t) for t in tensors]
