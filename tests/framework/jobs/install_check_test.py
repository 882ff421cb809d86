"""Tests for cadence.framework.jobs.install_check: one TensorFlow or a line.

The two-wheel case is given as data (installing it takes minutes and
~1 GB); tests/setup_test.py checks this test environment's own install.
"""
import unittest

from cadence.framework.jobs import command_line
from cadence.framework.jobs import install_check


class CheckOneTensorFlowTest(unittest.TestCase):

  def testOneDistributionPasses(self):
    for installed in ([], [('tensorflow-cpu', '2.21.0')],
                      [('tensorflow', '2.21.0')]):
      install_check.CheckOneTensorFlow(installed)

  def testCpuAndGpuWheelsTogetherAreOneLineSayingWhichToKeep(self):
    with self.assertRaisesRegex(
        command_line.UserError,
        r'^TensorFlow is installed 2 times in this environment \(tensorflow '
        r'2\.21\.0 and tensorflow_cpu 2\.21\.0; setup\.py\'s cpu, gpu and tf '
        r'extras are alternatives\): each writes the same tensorflow/ folder, '
        r'so the last one installed wins and uninstalling either breaks the '
        r'other; keep one: pip uninstall -y tensorflow tensorflow_cpu, then '
        r'pip install -e "\.\[cpu\]" \(or "\.\[gpu\]"\)\.$'):
      install_check.CheckOneTensorFlow(
          [('tensorflow', '2.21.0'), ('tensorflow_cpu', '2.21.0')])

  def testThisEnvironmentIsReadFromTopLevelNames(self):
    found = install_check.TensorFlowDistributions()
    self.assertLessEqual(len(found), 1, found)   # The test venv: one.
    for name, version in found:
      self.assertIn('tensorflow', name.lower())
      self.assertRegex(version, r'^\d+\.\d+')


if __name__ == '__main__':
  unittest.main()
