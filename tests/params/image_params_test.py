"""The image experiments of params/image/shapes_resnet.py, beyond
instantiation (tests/params/all_params_test.py builds the Tiny one): the
published-scale ResNet-34 is inspected without building weights."""
import tensorflow as tf

from cadence.framework import cluster as cluster_lib
from cadence.framework.jobs import inspect_lib
from cadence.framework import model_registry
from cadence.tasks.image import model

_BIG = 'image.shapes_resnet.ShapesResNet34'
# ResNet-34's weights (He et al., 2016; torchvision's resnet34 counts
# 21,797,672) plus the BN moving means and variances (2 x 8,512 channels).
_RESNET34_PARAMS = 21_797_672 + 2 * 8_512
_RESNET34_MULT_ADDS = 3.6e9          # per 224x224 image, the paper's Table 1


class ShapesResNetTest(tf.test.TestCase):

  def testPublishedScaleIsInspectedWithoutBuildingWeights(self):
    params = model_registry.GetParams(_BIG, 'Train')
    with cluster_lib.Cluster.Params().Set(num_devices=4,
                                          worker_split_size=4).Instantiate():
      report = inspect_lib.ModelReport(params)
    self.assertIn(f'{_RESNET34_PARAMS:,} parameters', report)
    for cell in range(4):
      self.assertIn(f'cell {cell}  /device:CPU:{cell}', report)
    shapes = params.input.cls.BatchShapes(params.input)
    meta = model.ImageClassifier.FPropMeta(params.task, shapes)
    per_image = meta.flops / params.input.batch_size
    # 2 FLOPs a multiply-add; BN, relu and adds are the few % above.
    self.assertBetween(per_image, 2 * _RESNET34_MULT_ADDS,
                       1.05 * 2 * _RESNET34_MULT_ADDS)
    self.assertLen(meta.plan.StageFlops(), 4)
    self.assertEqual(meta.flops, sum(meta.plan.StageFlops()))
    self.assertLess(max(meta.plan.StageFlops()), 0.3 * meta.flops)   # balanced


if __name__ == '__main__':
  tf.test.main()
