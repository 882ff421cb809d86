"""Tests for cadence.tasks.synthetic.regression."""
import os
import re

import numpy as np
import tensorflow as tf

from cadence.framework import base_input_generator
from cadence.tasks.synthetic import regression


class RegressionInputTest(tf.test.TestCase):

  def testSyntheticDataIsALinearTeacherPlusNoise(self):
    x, y = regression.SyntheticData(2000, 3, teacher_seed=5,
                                    noise_stddev=0.1)
    self.assertEqual(x.shape, (2000, 3))
    # Least squares recovers a linear fit whose residual is the noise.
    design = np.concatenate([x, np.ones([2000, 1], np.float32)], 1)
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    self.assertAllClose(np.std(y - design @ coef), 0.1, atol=0.01)
    # Example i depends on i only, not on the range it is drawn in.
    x2, y2 = regression.SyntheticData(10, 3, teacher_seed=5,
                                      noise_stddev=0.1, first_example=1995)
    self.assertAllClose(x2[:5], x[1995:], atol=0)
    self.assertAllClose(y2[:5], y[1995:], atol=1e-6)

  def testCsvFilesAndMemoryGiveTheSameBatches(self):
    path = os.path.join(self.get_temp_dir(), 'train.csv')
    regression.WriteCsv(path, 40, 3, teacher_seed=2)
    common = dict(input_dim=3, teacher_seed=2, batch_size=8,
                  num_examples=40, shuffle=False, repeat=False)
    from_file = regression.RegressionInput.Params().Set(
        file_pattern=path, **common).Instantiate()
    in_memory = regression.RegressionInput.Params().Set(
        **common).Instantiate()
    batches = list(zip(from_file.Dataset(), in_memory.Dataset()))
    self.assertLen(batches, 5)
    for a, b in batches:
      self.assertAllClose(a.x, b.x, atol=1e-6)
      self.assertAllClose(a.y, b.y, atol=1e-6)

  def testAFileThatIsNotCsvExamplesIsAnInputError(self):
    d = self.get_temp_dir()
    for name, text, found in (
        ('words.csv', 'the cat sees alice\n', 'holds something else'),
        ('short.csv', '1,2,3\n4,5,6\n', 'has 3 value(s)')):
      path = os.path.join(d, name)
      with open(path, 'w') as f:
        f.write(text)
      first = repr(text.split('\n')[0])
      with self.assertRaisesRegex(
          base_input_generator.InputError, re.escape(
              f"RegressionInput 'input': line 1 of {path!r} ({first}) "
              f'{found}; each line must be input_dim + 1 = 9 comma-separated '
              'numbers (x_0,...,x_{d-1},y).')):
        regression.RegressionInput.Params().Set(
            file_pattern=path, input_dim=8).Instantiate()

  def testPerRecordPathEqualsVectorisedPath(self):
    gen = regression.RegressionInput.Params().Set(
        input_dim=3, num_examples=16, shuffle=False, repeat=False,
        batch_size=4).Instantiate()
    records = tf.range(16, dtype=tf.int64)
    batch = gen._ProcessRecordBatch(records)  # pylint: disable=protected-access
    one = gen._ProcessRecord(records[7])  # pylint: disable=protected-access
    self.assertAllClose(batch.x[7], one.x, atol=0)
    self.assertAllClose(batch.y[7], one.y, atol=0)


class RegressionModelTest(tf.test.TestCase):

  def testBadParamsNamedByTheTask(self):
    names = 'GELU, NONE, RELU, SIGMOID, SILU, SWISH, TANH'
    for kw, rule in (
        (dict(activation='RELUU'), "activation='RELUU' is invalid: Unknown "
         f"activation 'RELUU'; valid names (case-insensitive): {names}. Did "
         "you mean 'RELU'?"),
        (dict(activation=['RELU', 'TANH']), "activation=['RELU', 'TANH'] has "
         '2 entries but hidden_dims has 1; give one per hidden layer or a '
         'single string.'),
        (dict(activation=['GELU', 'gelu'], hidden_dims=[4, 'x']),
         "hidden_dims[1]='x' must be an int >= 1."),
        (dict(pipeline_tpl='gpipe'), "pipeline_tpl='gpipe' must be None (a "
         'FeedForwardNet) or a gpipe.PipeliningLayer.Params().')):
      with self.subTest(kw=kw):
        p = regression.RegressionModel.Params().Set(
            name='reg', input_dim=3, hidden_dims=[4]).Set(**kw)
        with self.assertRaisesWithLiteralMatch(
            ValueError, f"RegressionModel 'reg': {rule}"):
          p.Instantiate()


if __name__ == '__main__':
  tf.test.main()
