"""Tests for cadence.framework.pipeline.remat_policy and CellProgram's kept
forward."""
import collections

import tensorflow as tf

from cadence.framework.nested_map import NestedMap
from cadence.framework.pipeline import cell_program
from cadence.framework.pipeline import remat_policy


def _Cell(theta, state, inputs):
  """A weight product, elementwise work, an activation-activation product."""
  del state
  h = tf.matmul(inputs.h, theta.w)                # [4, 8] kept by 'weights'
  a = tf.tanh(h) * 2.0
  return NestedMap(h=tf.matmul(tf.matmul(a, a, transpose_b=True), a) + a)


def _ChainCell(theta, state, inputs):
  """Weight products followed by their chains: a bias and an activation;
  a reshape and a transpose into heads."""
  del state
  h = tf.nn.relu(tf.matmul(inputs.h, theta.w) + theta.b)          # [4, 8]
  q = tf.transpose(tf.reshape(tf.matmul(inputs.h, theta.w2), [4, 2, 4]),
                   [1, 0, 2])                                       # [2, 4, 4]
  s = tf.reduce_sum(tf.matmul(q, q, transpose_b=True), axis=[0, 2])  # [4]
  return NestedMap(h=tf.matmul(h, theta.w3) + s[:, None])


def _Program(cell=_Cell):
  spec = NestedMap(h=tf.TensorSpec([4, 8]))
  theta = NestedMap(w=tf.TensorSpec([8, 8]))
  if cell is _ChainCell:
    theta.update(b=tf.TensorSpec([8]), w2=tf.TensorSpec([8, 8]),
                 w3=tf.TensorSpec([8, 8]))
  return cell_program.CellProgram(cell, theta, spec, spec, None, False,
                                  'test cell')


class KeptTensorsTest(tf.test.TestCase):

  def testPolicies(self):
    program = _Program()
    kept = {}
    for policy in remat_policy.POLICIES:
      _, bwd, _, n = program._KeepFunctions(policy)  # pylint: disable=protected-access
      library = bwd.graph.as_graph_def().library.function
      kept[policy] = n, sorted({node.op for f in library for node in
                                f.node_def if node.op in ('Tanh', 'MatMul')})
    # 'all' keeps what the gradient reads: the backward has its products
    # (MatMul) but no Tanh; 'weights' keeps the weight product's output
    # alone and recomputes the tanh and the activation products.
    self.assertEqual(['MatMul'], kept['all'][1])
    self.assertGreater(kept['all'][0], 1)
    self.assertEqual((1, ['MatMul', 'Tanh']), kept['weights'])
    with self.assertRaisesRegex(ValueError, "KeptTensors: policy='some'; "
                                r"expected one of \('all', 'weights'\)"):
      remat_policy.KeptTensors(tf.Graph(), [], [], 'some')

  def testChainsKeepTheTensorTheBackwardReads(self):
    # The gradient reads the activation after the bias (not the product)
    # and the heads after the transpose: those are kept instead, so the
    # backward recomputes neither the bias add, the activation nor the
    # layout ops.
    program = _Program(_ChainCell)
    _, bwd, _, n = program._KeepFunctions('weights')  # pylint: disable=protected-access
    self.assertEqual(2, n)
    library = bwd.graph.as_graph_def().library.function
    ops = collections.Counter(node.op for f in library for node in f.node_def)
    # No Relu (ReluGrad reads the kept activation); one Transpose, the
    # gradient's (a recomputation of the heads would add one).
    self.assertEqual((1, 0, 1), (ops['ReluGrad'], ops['Relu'],
                                 ops['Transpose']))
    # The kept tensors are those chains' ends.
    g = tf.Graph()
    with g.as_default():
      theta = NestedMap({k: tf.compat.v1.placeholder(tf.float32, shape)
                         for k, shape in (('w', [8, 8]), ('b', [8]),
                                          ('w2', [8, 8]), ('w3', [8, 8]))})
      x = tf.compat.v1.placeholder(tf.float32, [4, 8])
      out = _ChainCell(theta, None, NestedMap(h=x)).h
      tf.gradients(out, theta.Flatten() + [x], grad_ys=tf.ones([4, 8]))
    kept = remat_policy.KeptTensors(g, [out], [t.op for t in theta.Flatten()],
                                    'weights')
    self.assertCountEqual(['Relu', 'Transpose'], [t.op.type for t in kept])

  def testOpsNoOutputNeedsAreLeftOut(self):
    # tf.custom_gradient leaves an unused identity of its result in a
    # function's graph; it never runs, so the result is not kept for it.
    @tf.custom_gradient
    def _Square(x):
      return x * x, lambda dy: 2.0 * dy * x

    def _Traced(x):
      with tf.GradientTape() as tape:
        tape.watch(x)
        y = _Square(x)
      return [y], tape.gradient(y, x)

    graph = tf.function(_Traced, autograph=False).get_concrete_function(
        tf.TensorSpec([4])).graph
    forward_out = graph.outputs[:1]
    outputs = {t.ref() for t in graph.outputs}
    dead = [op for op in graph.get_operations() if op.type == 'Identity' and
            not op.outputs[0].consumers() and
            op.outputs[0].ref() not in outputs]
    self.assertNotEmpty(dead)   # The identity this test is about.
    kept, read = remat_policy.Walk(graph, forward_out, [], 'all')
    self.assertEqual([], kept)   # The gradient reads x alone.
    self.assertEqual(['x'], [t.op.name for t in read])

  def testSameGradientsInAGraph(self):
    rand = lambda shape, seed: tf.random.stateless_normal(shape, [seed, 2])
    w = tf.Variable(rand([8, 8], 1))
    extra = dict(b=tf.Variable(rand([8], 7)), w2=tf.Variable(rand([8, 8], 8)),
                 w3=tf.Variable(rand([8, 8], 9)))
    x = tf.random.stateless_normal([4, 8], [3, 4])
    d_out = tf.random.stateless_normal([4, 8], [5, 6])
    for cell in (_Cell, _ChainCell):
      program = _Program(cell)
      theta = NestedMap(w=w, **(extra if cell is _ChainCell else {}))
      flat = theta.Flatten()

      @tf.function
      def _Grads(policy):
        grad_fn, out = program.ForwardKeep(flat, [x], [x], policy=policy)  # pylint: disable=cell-var-from-loop
        return out, grad_fn([d_out])

      with tf.GradientTape() as tape:
        tape.watch(x)
        want_out = cell(theta, None, NestedMap(h=x)).h
      want = tape.gradient(want_out, flat + [x], output_gradients=d_out)
      for policy in remat_policy.POLICIES:
        with self.subTest(cell=cell.__name__, policy=policy):
          out, (d_theta, _, d_inputs) = _Grads(policy)
          self.assertAllClose(want_out, out[0], atol=1e-5)
          self.assertAllClose(want, list(d_theta) + [d_inputs[0]],
                              atol=1e-5)


if __name__ == '__main__':
  tf.test.main()
