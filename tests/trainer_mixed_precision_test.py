"""Mixed precision through the real trainer: one knob, two replicas.

`--model_params_override=task.fprop_dtype=tf.bfloat16` trains the Tiny
GPipe LM (shrunk; 2 stages on 2 logical CPUs a replica) with
`--worker_replicas=2`: activations in bfloat16, variables, gradients (and
so their all-reduce) and the Adam slots in float32. The numerics (bfloat16
against float32, pipelined against plain, XLA) are tested in-process:
layers/gpipe_transformer_test, tasks/lm/model_test,
framework/distribute/tpu_programs_test; the loss curve against float32 is
measured by bench/bf16_bench.py.
"""
import os

import numpy as np
import tensorflow as tf

from cadence.framework.train import checkpointer
from cadence.tests import test_utils


class MixedPrecisionTrainerTest(tf.test.TestCase):

  def testBfloat16TinyLmTrainsWithTwoReplicas(self):
    tmp = self.get_temp_dir()
    logdir = os.path.join(tmp, 'run')
    overrides = (f'{test_utils.SmallLmOverrides(tmp)};'
                 'task.fprop_dtype=tf.bfloat16;'
                 'task.train.save_interval_steps=1')
    code, _, err = test_utils.TrainerRun(
        f'--model={test_utils.TINY_LM}', f'--logdir={logdir}',
        '--job=trainer', '--max_steps=3', '--worker_replicas=2',
        f'--model_params_override={overrides}').Finish()
    self.assertEqual(code, 0, err[-3000:])
    self.assertNotIn('Traceback', err)
    self.assertIn('2 replica(s) (2 on this host) x 2 stage(s)', err)
    with open(os.path.join(logdir, 'params.txt')) as f:
      self.assertIn('task.fprop_dtype : tf.bfloat16\n', f.read())
    train_dir = os.path.join(logdir, 'train')
    first, last = (checkpointer.ReadValues(os.path.join(train_dir, f'ckpt-{n}'),
                                           '') for n in (1, 3))
    floats = {k: v for k, v in last.items()
              if isinstance(v, np.ndarray) and v.dtype.kind == 'f'}
    # The model's variables and Adam's two slots of each: float32, finite.
    model = [k for k in floats if k.startswith('model/')]
    slots = [k for k in floats if k.startswith('optimizer/slots/')]
    self.assertGreater(len(model), 10)
    self.assertLen(slots, 2 * len(model))
    self.assertLen(floats, len(model) + len(slots))
    for key, value in floats.items():
      self.assertEqual(value.dtype, np.float32, key)
      self.assertTrue(np.isfinite(value).all(), key)
    moved = max(np.abs(last[k] - first[k]).max() for k in model)
    self.assertGreater(moved, 0.0)


if __name__ == '__main__':
  tf.test.main()
