"""job_flag: --job's forms parsed before TensorFlow loads."""
import unittest

from cadence.framework.jobs import job_flag
from cadence.framework.jobs import user_error


class ParseJobTest(unittest.TestCase):

  def testParseJob(self):
    self.assertEqual(('evaler', 'Dev'), job_flag.ParseJob('evaler_dev'))
    self.assertEqual(('decoder', 'Test'), job_flag.ParseJob('decoder_Test'))
    self.assertEqual(('trainer', None), job_flag.ParseJob('trainer'))
    with self.assertRaisesRegex(user_error.UserError,
                                r"Did you mean 'decoder_test'"):
      job_flag.ParseJob('decoder_tset')
    with self.assertRaisesRegex(user_error.UserError,
                                r"--job='evaler_devv' is not one of .*Did you "
                                r"mean 'evaler_dev'"):
      job_flag.ParseJob('evaler_devv')


if __name__ == '__main__':
  unittest.main()
