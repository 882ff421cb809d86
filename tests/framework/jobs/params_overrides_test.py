"""params_overrides: the override flags' text, read before TensorFlow loads
(applied to params: trainer_lib_test's LoadParamsTest)."""
import unittest

from cadence.framework.jobs import params_overrides
from cadence.framework.jobs import user_error


class ParamsOverridesTest(unittest.TestCase):

  def testParamsFileMustBeUtf8Text(self):
    with self.assertRaisesRegex(
        user_error.UserError, r"^--model_params_file_override='f\.bin' is "
        r'not UTF-8 text \(byte 1: invalid start byte\); it must hold Params '
        r"text, 'key : value' lines as in params\.txt\.$"):
      params_overrides.ParamsFileText('f.bin', b'a\xff')
    self.assertEqual('a : 1', params_overrides.ParamsFileText('f', b'a : 1'))

  def testOverrideItemsOrParamsText(self):
    self.assertEqual([('task.input_dim', '4'), ('input.batch_size', '8')],
                     params_overrides.ParseOverride(
                         'task.input_dim=4; input.batch_size=8;'))
    self.assertIsNone(params_overrides.ParseOverride('task.input_dim : 4'))
    with self.assertRaisesRegex(user_error.UserError,
                                r"^--model_params_override: 'b' is not "
                                r"'key=value' \(items are separated by "
                                r"';'\)\.$"):
      params_overrides.ParseOverride('a=1;b')


if __name__ == '__main__':
  unittest.main()
