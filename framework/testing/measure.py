"""What a layer's FProp really does, measured from its traced graph.

The figures a layer's FPropMeta states (framework/cost.py) are estimates
from shapes alone; these functions measure them from the graph TensorFlow
traces for one FProp (nothing is computed):

  Flops          the products' FLOPs (layers/graph_flops.py: MatMul,
                 BatchMatMul, Einsum, Conv2D), in the call's graph and the
                 functions it calls;
  SavedBytes     the bytes of the forward tensors the gradient reads
                 (framework/pipeline/memory_estimate.SavedBytes) under a
                 remat policy: 'all' is a record's `act`, 'weights' its
                 `act_weights`;
  ResidualBytes  what a deferred W reads between B and W (`residuals`);
  StatefulRandomOps  stateful random ops, which a re-run forward (remat, a
                 pipeline's backward) would not replay.

Each takes the layer built, the inputs' tf.TensorSpecs (an input that is
not one, e.g. an int sequence length, is passed as it is) and `outputs`, a
function picking from FProp's output what is differentiated (default:
every floating tensor of it), e.g. `lambda out: out.total_xent` for a
softmax whose training reads only the loss.

Example:
  layer = p.Instantiate()
  specs = [tf.TensorSpec([8, 16])]
  SavedBytes(layer, specs)                # what its backward keeps
  Flops(layer, specs)                     # 2 x 8 x 16 x out, a projection
"""
import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import step_seed
from cadence.framework.nested_map import NestedMap
from cadence.framework.pipeline import cell_program
from cadence.framework.pipeline import memory_estimate
from cadence.layers import graph_flops

# The step seed every measured FProp runs with (any fixed one will do).
_STEP = 1


def _Specs(inputs):
  """(the tf.TensorSpecs among FProp's `inputs`, fn(tensors for them) ->
  all the inputs): an input that is not a spec (a Python int, e.g. a
  sequence length) is passed to FProp as it is."""
  inputs = list(inputs)
  specs = [x for x in inputs if isinstance(x, tf.TensorSpec)]

  def _Merge(tensors):
    tensors = iter(tensors)
    return [next(tensors) if isinstance(x, tf.TensorSpec) else x
            for x in inputs]
  return specs, _Merge


def _Fn(layer, merge, num_inputs, outputs):
  """fn(*input tensors, *theta leaves) -> what is differentiated, for the
  memory_estimate measurements: the layer's FProp with a step seed."""
  def _Call(*args):
    theta = tf.nest.pack_sequence_as(layer.theta, list(args[num_inputs:]))
    theta = base_layer.WithStepSeed(theta, step_seed.MakeStepSeed(_STEP))
    out = layer.FProp(theta, *merge(args[:num_inputs]))
    return outputs(out) if outputs is not None else out
  return _Call


def _ThetaSpecs(layer):
  return [tf.TensorSpec(v.shape, v.dtype)
          for v in tf.nest.flatten(layer.theta)]


def SavedBytes(layer, input_specs, policy='all', outputs=None):
  """Bytes of the forward tensors FProp's gradient reads under remat
  policy `policy` ('all': a record's `act`; 'weights': its `act_weights`),
  the layer's weights not counted.

  Args:
    layer: a built layer.
    input_specs: tf.TensorSpecs of FProp's inputs.
    policy: a remat_policy policy, 'all' or 'weights'.
    outputs: None, or fn(FProp's output) -> what is differentiated.
  """
  specs, merge = _Specs(input_specs)
  return memory_estimate.SavedBytes(_Fn(layer, merge, len(specs), outputs),
                                    specs, _ThetaSpecs(layer), policy)


def ResidualBytes(layer, input_specs, outputs=None):
  """Bytes a deferred W of the layer reads after its B (a record's
  `residuals`); arguments as SavedBytes."""
  specs, merge = _Specs(input_specs)
  return memory_estimate.ResidualBytes(
      _Fn(layer, merge, len(specs), outputs), specs, _ThetaSpecs(layer))


def _Graph(layer, input_specs):
  """The graph of one FProp (with a step seed) on `input_specs`."""
  specs, merge = _Specs(input_specs)

  def _Call(*inputs):
    theta = base_layer.WithStepSeed(layer.theta,
                                    step_seed.MakeStepSeed(_STEP))
    return layer.FProp(theta, *merge(inputs))
  return tf.function(_Call, autograph=False).get_concrete_function(
      *specs).graph


def _Graphs(graph):
  """`graph` and the graphs of the functions its ops call, each once."""
  seen, todo = {}, [graph]
  while todo:
    g = todo.pop()
    if id(g) in seen:
      continue
    seen[id(g)] = g
    for op in g.get_operations():
      for attr in ('f', 'then_branch', 'else_branch', 'body', 'cond'):
        try:
          fn = op.get_attr(attr)
        except ValueError:
          continue
        sub = g._get_function(fn.name)  # pylint: disable=protected-access
        if sub is not None and getattr(sub, 'graph', None) is not None:
          todo.append(sub.graph)
  return list(seen.values())


# Ops that repeat a function a number of times the graph does not state.
_LOOPS = frozenset(['While', 'StatelessWhile'])


def Flops(layer, input_specs):
  """The FLOPs of the products one FProp runs (graph_flops.ProductFlops
  over its graph and the functions it calls), or None when it runs a loop
  (a while loop's trip count is not in the graph) or a product's dim is
  unknown."""
  graphs = _Graphs(_Graph(layer, list(input_specs)))
  ops = [op for g in graphs for op in g.get_operations()]
  if any(op.type in _LOOPS for op in ops):
    return None
  return graph_flops.ProductFlops(ops)


def StatefulRandomOps(layer, input_specs):
  """'name (Type)' of each stateful random op one FProp runs: ops that a
  re-run forward does not replay (draw from `self.OpSeed(theta)` with a
  tf.random.stateless_* op instead)."""
  return cell_program.FindStatefulRandomOps(
      _Graph(layer, list(input_specs)))


def FloatLeaves(out):
  """The floating tensors of a nest of FProp outputs, in tf.nest order."""
  if isinstance(out, NestedMap):
    out = out.Flatten()
  return [t for t in tf.nest.flatten(out)
          if isinstance(t, (tf.Tensor, tf.Variable)) and t.dtype.is_floating]
