"""Which forward tensors a cell keeps for its backward (the rest is
recomputed): a pure analysis of one traced graph.

The graph holds a cell's forward (the ancestors of its outputs) and its
gradient (everything else); the gradient reads some forward tensors.
`KeptTensors` picks the ones the forward hands to the backward:

  'all':     every forward tensor the gradient reads (no recomputation;
             what a GradientTape keeps);
  'weights': only the outputs of matrix products and convolutions with a
             weight (theta) operand; every other tensor the gradient needs
             (attention scores and probabilities, norms, activations,
             dropout masks, residual sums) is recomputed from them and the
             inputs in the backward. Selective recomputation (Korthikanti
             et al., 2022, "Reducing Activation Recomputation in Large
             Transformer Models", arXiv:2205.05198): the kept products are
             the expensive part of the forward, what is recomputed is
             cheap in FLOPs but large in memory.

A reshape's output counts as its input (it shares the buffer).

Example:
  kept = KeptTensors(graph, outputs, weights=theta_placeholders,
                     policy='weights')
"""
POLICIES = ('all', 'weights')
_PRODUCTS = frozenset(['MatMul', 'BatchMatMul', 'BatchMatMulV2',
                       'BatchMatMulV3', 'Einsum', 'Conv2D', 'Conv3D',
                       'Conv1D', 'DepthwiseConv2dNative'])
# Ops through which a weight stays a weight (casts, reshapes, reads).
_PASS = frozenset(['Cast', 'Reshape', 'Identity', 'Transpose', 'ExpandDims',
                   'Squeeze', 'ReadVariableOp'])


def ForwardOps(outputs):
  """The ops the outputs depend on (data and control)."""
  seen, todo = set(), [t.op for t in outputs]
  while todo:
    op = todo.pop()
    if op not in seen:
      seen.add(op)
      todo += [t.op for t in op.inputs] + list(op.control_inputs)
  return seen


def _IsWeight(tensor, weights):
  while tensor.op.type in _PASS and tensor.op.inputs:
    tensor = tensor.op.inputs[0]
  return tensor.op in weights


def Walk(graph, outputs, weights, policy):
  """The forward tensors the gradient needs under `policy`.

  Args:
    graph: the graph of a forward and its gradient.
    outputs: the forward's output tensors (the forward is their ancestors).
    weights: the placeholder ops of the weights (theta).
    policy: one of POLICIES (see the module docstring).

  Returns:
    (kept, read): the forward tensors to keep (in graph order), and the
    placeholders the gradient and the recomputation read.
  """
  if policy not in POLICIES:
    raise ValueError(f'KeptTensors: policy={policy!r}; expected one of '
                     f'{POLICIES}.')
  forward = ForwardOps(outputs)
  weights = set(weights)
  todo = [t for op in graph.get_operations() if op not in forward
          for t in op.inputs if t.op in forward]
  kept, read, seen = [], [], set()
  while todo:
    t = todo.pop()
    if t.ref() in seen or t.op.type == 'Const':
      continue
    seen.add(t.ref())
    op = t.op
    if op.type == 'Placeholder':
      read.append(t)
    elif policy == 'all' or (op.type in _PRODUCTS and any(
        _IsWeight(x, weights) for x in op.inputs)):
      kept.append(t)
    else:   # Recomputed: what it reads is needed instead.
      todo += list(op.inputs)
  order = {op: n for n, op in enumerate(graph.get_operations())}
  return sorted(kept, key=lambda t: (order[t.op], t.value_index)), read


def KeptTensors(graph, outputs, weights, policy):
  """The forward tensors to keep for the gradient, in graph order: with
  them (and the forward's inputs) the gradient computes without the rest of
  the forward. Args as `Walk`'s."""
  return Walk(graph, outputs, weights, policy)[0]
