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

Under 'weights' a kept product may be taken further down its *chain*: the
ops after it that have no other data input (bias adds, scalings, layout
ops, activations: `_CHAIN`). When the backward needs exactly one tensor of
a product's chain (and not the product itself), that tensor is kept
instead of the product: the same bytes (fewer after a cast down), and the
bias add, transpose or activation between them is not recomputed (e.g.
attention's heads after their transpose, the feed-forward's activation).
When it needs several, or a wider one (a cast up: bfloat16 logits cast to
float32 for the cross-entropy), the product is kept and the chain
recomputed, so a chain never costs more memory than its product.

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
# Ops that continue a product's chain when their only data input is the
# chain (other inputs: constants, weights, shapes or permutations).
_CHAIN = frozenset(['Cast', 'Reshape', 'Identity', 'Transpose', 'ExpandDims',
                    'Squeeze', 'BiasAdd', 'AddV2', 'Add', 'Sub', 'Mul',
                    'RealDiv', 'Neg', 'Relu', 'Relu6', 'Elu', 'Selu', 'Gelu',
                    'Tanh', 'Sigmoid', 'Softplus'])
# Of these, ops whose inputs after the first are never data.
_LAYOUT = frozenset(['Reshape', 'Transpose', 'ExpandDims', 'Squeeze'])


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


def _IsProduct(tensor, weights):
  op = tensor.op
  return op.type in _PRODUCTS and any(_IsWeight(x, weights)
                                      for x in op.inputs)


def _Chain(tensor, weights):
  """(product, ops from it to `tensor`) when `tensor` is on the chain of a
  product with a weight (see the module docstring), else None."""
  path = []
  while not _IsProduct(tensor, weights):
    op = tensor.op
    if op.type not in _CHAIN:
      return None
    inputs = op.inputs[:1] if op.type in _LAYOUT else op.inputs
    data = [x for x in inputs if x.op.type != 'Const' and
            not _IsWeight(x, weights)]
    if len(data) != 1:
      return None
    path.append(op)
    tensor = data[0]
  return (tensor, path) if path else None


def Walk(graph, outputs, weights, policy):
  """The forward tensors the gradient needs under `policy`.

  Args:
    graph: the graph of a forward and its gradient; when it has `outputs`
      (a function's graph), ops none of them needs never run and are left
      out (tf.custom_gradient leaves an unused identity of its result).
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
  ops = graph.get_operations()
  if getattr(graph, 'outputs', None):
    live = ForwardOps(graph.outputs)
    ops = [op for op in ops if op in live]
  todo = [t for op in ops if op not in forward
          for t in op.inputs if t.op in forward]
  kept, read, seen = [], [], set()
  chains = {}   # product ref -> (product, [(chain tensor needed, path)])
  while todo:
    t = todo.pop()
    if t.ref() in seen or t.op.type == 'Const':
      continue
    seen.add(t.ref())
    op = t.op
    if op.type == 'Placeholder':
      read.append(t)
    elif policy == 'all' or _IsProduct(t, weights):
      kept.append(t)
    elif (chain := _Chain(t, weights)) is not None:
      # Decided below, once all needs are known.
      product, path = chain
      chains.setdefault(product.ref(), (product, []))[1].append((t, path))
    else:   # Recomputed: what it reads is needed instead.
      todo += list(op.inputs)
  kept_refs = {t.ref() for t in kept}
  for ref, (product, needed) in chains.items():
    if (ref in kept_refs or len(needed) > 1 or
        needed[0][0].dtype.size > product.dtype.size):
      # Keep (or already keeping) the product; recompute its chain, whose
      # other inputs are constants and weights.
      if ref not in kept_refs:
        kept.append(product)
        kept_refs.add(ref)
      read += [x for _, path in needed for op in path for x in op.inputs
               if x.op.type == 'Placeholder']
    else:
      kept.append(needed[0][0])
  order = {op: n for n, op in enumerate(graph.get_operations())}
  return sorted(kept, key=lambda t: (order[t.op], t.value_index)), read


def KeptTensors(graph, outputs, weights, policy):
  """The forward tensors to keep for the gradient, in graph order: with
  them (and the forward's inputs) the gradient computes without the rest of
  the forward. Args as `Walk`'s."""
  return Walk(graph, outputs, weights, policy)[0]
