"""Tests for tasks/image/model.py: the Tiny experiment learns; FPropMeta."""
import time

import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import cluster as cluster_lib
from cadence.framework import lr_schedule
from cadence.framework import model_registry
from cadence.framework.nested_map import NestedMap
from cadence.framework import optimizer
from cadence.framework import step_seed
from cadence.tasks.image import model

_TINY = 'image.shapes_resnet.ShapesResNetTiny'
_STEPS = 200


def _TinyParams(dataset, **input_kw):
  """The Tiny experiment shrunk to 16x16 images (a quarter of the FLOPs)."""
  params = model_registry.GetParams(_TINY, dataset)
  params.input.Set(image_size=[16, 16], **input_kw)
  params.task.resnet_tpl.image_size = [16, 16]
  return params


class ImageClassifierTest(tf.test.TestCase):

  def testTinyLearnsWellAboveChance(self):
    """_STEPS steps of the Tiny experiment's model, unpipelined (tracing
    the pipeline's backward would triple this test's time; the pipelined
    model equals it: tests/layers/gpipe_resnet_test.py), on 16x16 images
    with Adam: Dev accuracy with the BN moving averages (an is_inference
    copy of the task) from chance, 0.1, to > 0.5."""
    train = _TinyParams('Train', num_examples=_STEPS * 32)
    train.task.resnet_tpl.Set(splits=1, pipeline_tpl=None)
    train.task.train.learner.Set(
        optimizer=optimizer.Adam.Params(), learning_rate=0.005,
        lr_schedule=lr_schedule.ConstantSchedule.Params())
    dev = _TinyParams('Dev', num_examples=256, batch_size=256)
    dev.task.is_inference = True
    dev.task.resnet_tpl.Set(splits=1, pipeline_tpl=None)
    with cluster_lib.Cluster.Params().Set(num_devices=2,
                                          worker_split_size=2).Instantiate():
      task = train.Instantiate().task
      evaler = dev.Instantiate().task
    learner = task.InstantiateLearner()
    learner.Build()

    @tf.function
    def _Step(batch, step):
      theta = base_layer.WithStepSeed(task.theta,
                                      step_seed.MakeStepSeed(step))
      with tf.GradientTape() as tape:
        metrics, _ = task.FPropTower(theta, batch)
      learner.Apply(step, tape, metrics.loss[0])
      return metrics.loss[0]

    @tf.function
    def _Accuracy(batch):
      return evaler.FPropTower(evaler.theta, batch)[0].accuracy[0]

    dev_batch = next(iter(dev.input.Instantiate().Dataset()))
    start = time.time()
    batches = train.input.Instantiate().Dataset().take(_STEPS)
    for step, batch in enumerate(batches):
      loss = _Step(batch, tf.constant(step, tf.int64))
    for src, dst in zip(task.vars.Flatten(), evaler.vars.Flatten()):
      dst.assign(src)
    accuracy = float(_Accuracy(dev_batch))
    print(f'{_STEPS} steps in {time.time() - start:.1f} s: last loss '
          f'{float(loss):.3f}, Dev accuracy {accuracy:.3f}')
    self.assertGreater(accuracy, 0.5)
    moving = task.vars.net.stem.bn.moving_variance.numpy()
    self.assertNotAllClose(moving, tf.ones_like(moving))   # it was updated

  def testFPropMetaPartitionsAndMemory(self):
    params = _TinyParams('Train')
    shapes = params.input.cls.BatchShapes(params.input)
    meta = model.ImageClassifier.FPropMeta(params.task, shapes)
    partitions = meta.plan.StageFlops()
    self.assertLen(partitions, 2)
    self.assertEqual(meta.flops, sum(partitions))
    self.assertEqual(meta.flops, sum(f for _, f in meta.breakdown))
    self.assertEqual([n for n, _ in meta.breakdown],
                     ['stem', 'block0', 'block1', 'block2', 'head', 'loss'])
    self.assertEqual((4, 'gpipe'), (meta.plan.num_micro_batches,
                                    meta.plan.schedule.name))
    self.assertLen(meta.plan.cells, 2)

  def testInferencePredictIsTheEvalersSoftmax(self):
    p = model.ImageClassifier.Params().Set(name='image', is_inference=True)
    p.resnet_tpl.Set(image_size=[8, 8], stage_dims=[4], stage_blocks=[1],
                     num_classes=5, pipeline_tpl=None)
    task = p.Instantiate()
    graph = task.Inference(batch_size=3)
    predict = graph.signatures['predict']
    self.assertEqual(predict.inputs['images'].shape.as_list(), [3, 8, 8, 3])
    images = tf.random.stateless_uniform([3, 8, 8, 3], seed=[1, 2],
                                         minval=-1, maxval=1)
    out = predict.fn(task.theta, images)
    logits = task.ComputePredictions(task.theta, NestedMap(image=images))
    self.assertAllClose(out['probabilities'], tf.nn.softmax(logits.logits),
                        atol=1e-6)
    self.assertAllEqual(out['classes'], tf.argmax(logits.logits, -1))
    with self.assertRaisesRegex(
        ValueError, r"ImageClassifier 'image' Inference: max_len=4 has no "
        'meaning for this task: it has no sequence length.'):
      task.Inference(max_len=4)

  def testBadResNetTemplate(self):
    p = model.ImageClassifier.Params().Set(name='image', resnet_tpl=NestedMap())
    with self.assertRaisesRegex(ValueError, r"ImageClassifier 'image': "
                                'resnet_tpl=.* must be a gpipe_resnet.ResNet'):
      p.Instantiate()


if __name__ == '__main__':
  tf.test.main()
