"""Tests for cadence.framework.train.train_report."""
import os

import tensorflow as tf

from cadence.framework import cluster as cluster_lib
from cadence.framework import model_registry
from cadence.framework.train import programs
from cadence.framework.train import summary_utils
from cadence.framework.train import train_report

_KEY = 'synthetic.linear_regression.RegressionTiny'


def _Window(start, **sums):
  window = train_report.Window()
  window.Reset(start)
  window.Add(sums)
  return window


class ScalarsTest(tf.test.TestCase):

  def testAveragesRatesAndUtilisation(self):
    window = _Window(100.0, steps=10.0, examples=320.0, ok_steps=8.0,
                     skipped_steps=2.0, grad_norm=4.0, learning_rate=0.5,
                     **{'metrics.loss.vw': 6.0, 'metrics.loss.w': 12.0,
                        'metrics.mae.vw': 1.0, 'metrics.mae.w': 0.0})
    scalars = train_report.Scalars(window, 102.0, example_flops=1e9,
                                   peak_flops=4e12, learning_rate=0.5,
                                   skipped_steps_total=3)
    self.assertAllClose(scalars['loss'], 0.5)
    self.assertTrue(scalars['mae'] != scalars['mae'])   # No weight: NaN.
    self.assertAllClose(scalars['grad_norm'], 0.5)      # Over 8 ok steps.
    self.assertEqual(scalars['skipped_steps'], 2.0)
    self.assertEqual(scalars['skipped_steps_total'], 3)
    self.assertAllClose(scalars['steps_per_sec'], 5.0)
    self.assertAllClose(scalars['examples_per_sec'], 160.0)
    self.assertAllClose(scalars['model_tflops_per_sec'], 0.16)
    self.assertAllClose(scalars['mfu'], 0.16 / 4)
    self.assertNotIn('learning_rate', window.sums)      # Not summed.
    no_flops = train_report.Scalars(window, 102.0)
    self.assertNotIn('mfu', no_flops)
    self.assertNotIn('model_tflops_per_sec', no_flops)

  def testLines(self):
    window = _Window(0.0, steps=50.0, examples=1600.0,
                     **{'metrics.loss.vw': 98.0, 'metrics.loss.w': 20.0})
    self.assertEqual(train_report.ProgressLine(50, 500, window, 10.0),
                     'step 50/500  loss 4.9  5.0 steps/s  160 examples/s  '
                     'ETA 0:01:30')
    self.assertEqual(train_report.FirstStepLine(1, 6.5, 9.04, 14.2),
                     'First step done (global step 1, loss 6.5) in 9.0 s, '
                     'compiling the train step included; 14.2 s after '
                     'start.')


class NumStepDevicesTest(tf.test.TestCase):

  def testDevicesPerSplitTimesReplicas(self):
    default = tf.distribute.get_strategy()
    self.assertEqual(train_report.NumStepDevices(default), 1)
    two = cluster_lib.Cluster.Params().Set(
        device_type='CPU', num_devices=2, worker_split_size=2).Instantiate()
    self.assertEqual(train_report.NumStepDevices(default, two), 2)
    with two:
      self.assertEqual(train_report.NumStepDevices(default), 2)

  def testMfuDividesByThePeakOfEveryDeviceOfTheSplit(self):
    # mfu = model FLOP/s over the peak of every device of the split.
    mfu = {}
    for split in (1, 2):
      logdir = os.path.join(self.get_temp_dir(), str(split))
      p = model_registry.GetParams(_KEY, 'Train')
      p.task.train.Set(max_steps=21, summary_interval_steps=20)
      cluster = cluster_lib.Cluster.Params().Set(
          device_type='CPU', num_devices=split,
          worker_split_size=split).Instantiate()
      with cluster:
        programs.TrainProgram(p.Instantiate().task, logdir,
                              peak_flops=1e12).Run()
      scalars = summary_utils.ReadScalars(os.path.join(logdir, 'train'))
      step, mfu[split] = scalars['mfu'][0]
      examples = dict(scalars['examples_per_sec'])[step]
      flops = dict(scalars['model_tflops_per_sec'])[step] * 1e12
      self.assertAllClose(mfu[split], flops / (split * 1e12), rtol=1e-5)
      self.assertAllClose(flops / examples, 3 * 325, rtol=1e-5)


if __name__ == '__main__':
  tf.test.main()
