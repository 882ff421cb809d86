"""The TPU step compiles with XLA and equals the uncompiled step (on CPU).

The closest check here that a step is TPU-compilable: the Tiny LM's train
step, shrunk, pipelined (2 cells on one device) and not, compiled with
`tf.function(jit_compile=True)` on CPU, trains to the same weights as the
uncompiled step. The pipelined case (2 cells, 2 micro-batches) runs
through `TpuTrainProgram` (the whole step inside `strategy.run`, gradients
all-reduced in the replica context, 2 steps in one device loop): the
program a TPU runs, under the default strategy. The unpipelined case (one
cell, one micro-batch) compares one forward and backward pass: loss and
every gradient.

Tolerance: XLA fuses and reorders float32 arithmetic, so values differ by
rounding: measured 2e-7 on the encoder outputs of one forward pass. The
comparison trains with SGD: Adam divides by the root of the second moment,
which turns rounding noise in a zero gradient (e.g. the attention key
bias, whose true gradient is 0) into a full-size step of either sign.
After 3 SGD steps the weights agree within 1e-5 relative, 1e-6 absolute;
one pass's gradients within 1e-4 relative, 1e-6 absolute.
"""
import functools
import tempfile

import numpy as np
import tensorflow as tf

from cadence.framework.distribute import tpu_programs
from cadence.framework import model_registry
from cadence.framework import optimizer
from cadence.framework.train import checkpointer
from cadence.framework.train import programs

_KEY = 'lm.one_billion_wds.OneBWdsGPipeTransformerTiny'
_STEPS = 3


def _Params(splits):
  """The Tiny LM shrunk to compile fast: 2 layers of d 16, [4, 8] batches."""
  p = model_registry.GetParams(_KEY, 'Train')
  p.task.model_dim = 16
  p.task.stack_tpl.Set(num_layers=2, splits=splits)
  p.task.stack_tpl.pipeline_tpl.num_micro_batches = 2
  p.task.stack_tpl.transformer_tpl.Set(num_heads=2, hidden_dim=32)
  p.task.train.learner.optimizer = optimizer.SGD.Params()
  p.task.train.Set(max_steps=_STEPS, save_interval_steps=_STEPS,
                   summary_interval_steps=_STEPS, log_interval_steps=_STEPS)
  p.input.Set(batch_size=4, max_seq_len=8)
  return p


def _Weights(program):
  path = program.checkpointer.latest_checkpoint
  return {k: v for k, v in checkpointer.ReadValues(path, '').items()
          if k.startswith('model/')}


class XlaStepTest(tf.test.TestCase):

  def _Dir(self):
    return tempfile.mkdtemp(dir=self.get_temp_dir())

  def _AssertSameWeights(self, got, want):
    self.assertEqual(sorted(got), sorted(want))
    self.assertGreater(len(want), 10)
    for k in want:
      self.assertAllClose(got[k], want[k], rtol=1e-5, atol=1e-6, msg=k)
    moved = max(np.abs(want[k] - got[k]).max() for k in want)
    self.assertLess(moved, 1e-5)

  def _Reference(self, splits):
    program = programs.TrainProgram(
        _Params(splits).Instantiate().task, self._Dir(),
        peak_flops=1e12)
    self.assertEqual(program.Run(), _STEPS)
    return _Weights(program)

  def testPipelinedTpuStepCompilesAndEqualsTheUncompiledStep(self):
    program = tpu_programs.TpuTrainProgram(
        _Params(splits=2), self._Dir(), peak_flops=1e12,
        steps_per_loop=2, xla=True)
    self.assertEqual(program.Run(), _STEPS)
    # The step was compiled: the XLA function traced once, for one shape.
    self.assertEqual(
        program.runner.forwards[0].experimental_get_tracing_count(), 1)
    self._AssertSameWeights(_Weights(program), self._Reference(splits=2))

  def testUnpipelinedStepCompilesAndEqualsTheUncompiledStep(self):
    p = _Params(splits=1)
    p.task.stack_tpl.pipeline_tpl.num_micro_batches = 1
    program = programs.TrainProgram(p.Instantiate().task, self._Dir(),
                                    peak_flops=1e12)
    batch = next(iter(program.runner.Batches(0)))
    step = tf.constant(0, tf.int64)
    fn = functools.partial(program.runner.Forward, local=0)
    want = tf.function(fn, autograph=False)(batch, step, 0)
    got = tf.function(fn, jit_compile=True, autograph=False)(batch, step, 0)
    self.assertAllClose(got.loss, want.loss, rtol=1e-6)
    self.assertLen(got.grads, len(program.learner.trainable))
    for g, w, (path, _) in zip(got.grads, want.grads,
                               program.learner.trainable):
      self.assertAllClose(tf.convert_to_tensor(g), tf.convert_to_tensor(w),
                          rtol=1e-4, atol=1e-6, msg=path)

  def testPipelinedBfloat16StepCompiles(self):
    # TPU users train in bfloat16: the pipelined step (2 cells on one
    # device, 2 micro-batches) with task.fprop_dtype=bfloat16 compiles, and
    # one pass equals the uncompiled one within bfloat16's rounding: XLA on
    # CPU computes bfloat16 element-wise ops in float32 and rounds once per
    # fusion, TF rounds after each op (measured: loss 8e-4, gradients 0.5%
    # of the largest apart).
    p = _Params(splits=2)
    p.task.fprop_dtype = tf.bfloat16
    program = programs.TrainProgram(p.Instantiate().task, self._Dir(),
                                    peak_flops=1e12)
    batch = next(iter(program.runner.Batches(0)))
    step = tf.constant(0, tf.int64)
    fn = functools.partial(program.runner.Forward, local=0)
    want = tf.function(fn, autograph=False)(batch, step, 0)
    got = tf.function(fn, jit_compile=True, autograph=False)(batch, step, 0)
    self.assertEqual(got.loss.dtype, tf.float32)
    self.assertAllClose(got.loss, want.loss, atol=0.01)
    dense = lambda grads: [tf.convert_to_tensor(g) for g in grads]
    want_grads = dense(want.grads)
    scale = max(np.abs(g).max() for g in want_grads)
    for g, w, (path, _) in zip(dense(got.grads), want_grads,
                               program.learner.trainable):
      self.assertEqual(g.dtype, tf.float32)
      self.assertAllClose(g, w, atol=2**-5 * scale, rtol=0, msg=path)


if __name__ == '__main__':
  tf.test.main()
