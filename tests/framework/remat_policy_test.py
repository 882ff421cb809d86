"""Tests for cadence.framework.remat_policy and CellProgram's kept forward."""
import tensorflow as tf

from cadence.framework import cell_program
from cadence.framework import remat_policy
from cadence.framework.nested_map import NestedMap


def _Cell(theta, state, inputs):
  """A weight product, elementwise work, an activation-activation product."""
  del state
  h = tf.matmul(inputs.h, theta.w)                # [4, 8] kept by 'weights'
  a = tf.tanh(h) * 2.0
  return NestedMap(h=tf.matmul(tf.matmul(a, a, transpose_b=True), a) + a)


def _Program():
  spec = NestedMap(h=tf.TensorSpec([4, 8]))
  return cell_program.CellProgram(
      _Cell, NestedMap(w=tf.TensorSpec([8, 8])), spec, spec, None, False,
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

  def testSameGradientsInAGraph(self):
    program = _Program()
    w = tf.Variable(tf.random.stateless_normal([8, 8], [1, 2]))
    x = tf.random.stateless_normal([4, 8], [3, 4])
    d_out = tf.random.stateless_normal([4, 8], [5, 6])

    @tf.function
    def _Grads(policy):
      grad_fn, out = program.ForwardKeep([w], [x], [x], policy=policy)
      return out, grad_fn([d_out])

    with tf.GradientTape() as tape:
      tape.watch(x)
      want_out = _Cell(NestedMap(w=w), None, NestedMap(h=x)).h
    want = tape.gradient(want_out, [w, x], output_gradients=d_out)
    for policy in remat_policy.POLICIES:
      with self.subTest(policy=policy):
        out, (d_theta, _, d_inputs) = _Grads(policy)
        self.assertAllClose(want_out, out[0], atol=1e-5)
        self.assertAllClose(want, [d_theta[0], d_inputs[0]], atol=1e-5)


if __name__ == '__main__':
  tf.test.main()
