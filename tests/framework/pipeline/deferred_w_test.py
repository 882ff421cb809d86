"""Tests for cadence.framework.pipeline.deferred_w: B and W of a cell."""
import numpy as np
import tensorflow as tf

from cadence.framework.nested_map import NestedMap
from cadence.framework.pipeline import deferred_w
from cadence.framework.pipeline import cell_program

_B, _D, _H = 4, 8, 16


def _Flat(grads):
  """The gradients of (d_theta, d_state, d_inputs), Nones left out."""
  return [g for part in grads for g in part if g is not None]


def _Cell(theta, state, inputs):
  """Two products with a tanh between them, a bias and an int leaf."""
  del state
  h = tf.tanh(tf.matmul(inputs.x, theta.w1) + theta.b)
  return NestedMap(x=tf.matmul(h, theta.w2), n=inputs.n + 1)


def _Program():
  rng = np.random.RandomState(0)
  theta = NestedMap(w1=tf.constant(rng.normal(size=[_D, _H]), tf.float32),
                    b=tf.constant(rng.normal(size=[_H]), tf.float32),
                    w2=tf.constant(rng.normal(size=[_H, _D]), tf.float32))
  state = NestedMap(x=tf.zeros([_B, _D]), n=tf.constant(0))
  inputs = NestedMap(x=tf.constant(rng.normal(size=[_B, _D]), tf.float32),
                     n=tf.constant(3))
  program = cell_program.CellProgram(_Cell, theta, state, inputs,
                                     device=None, has_seed=False,
                                     owner='test cell')
  d_out = [tf.constant(rng.normal(size=[_B, _D]), tf.float32)]
  flat = [cell_program.ToTensors(x) for x in (theta, state, inputs)]
  return program, flat, d_out


class BackwardSplitTest(tf.test.TestCase):

  def testSplitEqualsTheWholeBackwardForEachRemat(self):
    program, (theta, state, inputs), d_out = _Program()

    @tf.function(autograph=False)
    def _Both(policy):
      if policy is None:
        whole = program.Backward(theta, state, inputs, None, d_out)
        weights, d_s, d_x = program.Backward(theta, state, inputs, None,
                                             d_out, defer_w=True)
      else:
        grad_fn, _ = program.ForwardKeep(theta, state, inputs, None,
                                         policy=policy, defer_w=True)
        whole = program.ForwardKeep(theta, state, inputs, None,
                                    policy=policy)[0](d_out)
        weights, d_s, d_x = grad_fn(d_out, defer_w=True)
      return whole, (weights(), d_s, d_x)

    for policy in (None, 'all', 'weights'):
      with self.subTest(policy=policy):
        whole, split = _Both(policy)
        self.assertLen(_Flat(split), 4)   # w1, b, w2, x; not the int leaf.
        self.assertAllClose(_Flat(whole), _Flat(split), atol=0, rtol=0)

  def testWeightHalfRunsOnlyTheWeightProducts(self):
    # W reads what B kept (the tanh's output, the products' inputs and
    # output gradients): it never re-runs the forward.
    program, _, _ = _Program()
    for policy in (None, 'all', 'weights'):
      if policy is not None:
        program._KeepFunctions(policy)  # pylint: disable=protected-access
      _, _, cut, _ = program._DeferredWFunctions(policy)  # pylint: disable=protected-access
      with self.subTest(policy=policy):
        ops = deferred_w.WeightOps(cut)
        self.assertNotIn('Tanh', ops)
        self.assertIn('MatMul', ops)
        self.assertLessEqual(set(ops), {'MatMul', 'Sum', 'Const', 'Reshape',
                                        'BiasAddGrad', 'Shape', 'ZerosLike'})

  def testEagerlyWHandsOverWhatBComputed(self):
    program, (theta, state, inputs), d_out = _Program()
    whole = program.Backward(theta, state, inputs, None, d_out)
    weights, d_s, d_x = program.Backward(theta, state, inputs, None, d_out,
                                         defer_w=True)
    self.assertAllClose(_Flat(whole), _Flat((weights(), d_s, d_x)))


if __name__ == '__main__':
  tf.test.main()
