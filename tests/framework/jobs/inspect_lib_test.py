"""Tests for cadence.framework.jobs.inspect_lib: reports without weights or
data."""
import os
import re

import tensorflow as tf

from cadence.framework import cluster as cluster_lib
from cadence.framework.jobs import inspect_lib
from cadence.framework import model_registry
from cadence.tasks.lm import model as lm_model

_BIG = 'lm.one_billion_wds.OneBWdsGPipeTransformer'


class ModelReportTest(tf.test.TestCase):

  def testPublishedScaleLmWithoutDataOrWeights(self):
    params = model_registry.GetParams(_BIG, 'Train')
    data_dir = os.path.join(self.get_temp_dir(), 'no_such_data')
    params.input.data_dir = data_dir
    with cluster_lib.Cluster.Params().Set(num_devices=4,
                                          worker_split_size=4).Instantiate():
      report = inspect_lib.ModelReport(params, device_memory_gib=16)
    self.assertFalse(os.path.exists(data_dir))   # Nothing read or written.
    # The published model: 32 layers of d 2048, ff 8192, a 32k vocabulary.
    d, h, v, layers = 2048, 8192, 32000, 32
    per_layer = 4 * (d * d + d) + (d * h + h) + (h * d + d) + 4 * d
    total = layers * per_layer + 2 * d + v * d + (d * v + v)
    self.assertIn(f'517 variables, {total:,} parameters', report)
    self.assertRegex(report, r'lm\.stack\.x_layers\[31\]\.ffn\.fc\[0\]\.w +'
                     r'\[2048, 8192\] +float32 +/device:CPU:3')
    self.assertRegex(report, r'lm\.emb\.emb +\[32000, 2048\] +float32 +'
                     r'/device:CPU:0')
    # Per device: 8 layers each; the embedding on the first, the final norm
    # and the softmax on the last.
    rows = dict(re.findall(r'^(/device:CPU:\d) +\d+ +([\d,]+) ', report,
                           re.M))
    self.assertEqual(int(rows['/device:CPU:1'].replace(',', '')),
                     8 * per_layer)
    self.assertEqual(int(rows['/device:CPU:0'].replace(',', '')),
                     8 * per_layer + v * d)
    self.assertEqual(sum(int(r.replace(',', '')) for r in rows.values()),
                     total)
    # FLOPs: the task's FPropMeta on [32, 1024] batches, per pipeline cell.
    meta = lm_model.LanguageModel.FPropMeta(
        params.task, params.input.cls.BatchShapes(params.input))
    self.assertIn(f'Forward FLOPs per batch of 32: {meta.flops:,}', report)
    for i, flops in enumerate(meta.plan.StageFlops()):
      self.assertRegex(report, rf'cell {i} +/device:CPU:{i} +[\d,]+ +'
                       rf'{flops:,} ')
    # Memory per stage: weights, the gradients' sum and Adam's two slots
    # (4 x the parameters' 4 bytes), the activations of GPipe with remat; it
    # fits 16 GiB. All four stages on one memory would not.
    self.assertIn('Memory per stage at the step\'s peak (estimate, schedule '
                  'gpipe, remat except_last, 32 micro-batches', report)
    params_1 = 8 * per_layer
    self.assertRegex(report, rf'cell 1 +/device:CPU:1 +{params_1:,} +[\d,]+ '
                     rf'+[\d.]+% +{16 * params_1 / 2**30:.2f} GiB')
    self.assertIn('fits 16 GiB per device', report)
    together = re.search(r'all stages together at the step\'s worst '
                         r'moment (\d+\.\d\d) GiB', report)
    self.assertIsNotNone(together, report[-600:])
    # 4 stages of about 10 GiB, peaking at different moments: above the 16
    # GiB of one device, below the sum of the stages' peaks.
    self.assertBetween(float(together.group(1)), 16 * 2, 4 * 10.5)


if __name__ == '__main__':
  tf.test.main()
