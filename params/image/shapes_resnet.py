"""Pipelined ResNet image classifiers on the embedded shapes data set.

The main job (2 pipeline stages on 2 logical CPUs, 4 micro-batches):

  python trainer.py --model=image.shapes_resnet.ShapesResNetTiny \
      --logdir=/tmp/cadence_image

What to expect: the data set (ten kinds of drawn shapes at 32x32,
tasks/image/shapes_data.py) is drawn in memory at start-up (~2 s). The
loss starts at ~2.3 nats (chance: 10 classes, accuracy 0.1); training
accuracy passes 0.9 within a few hundred steps. An eval of the 1,000 Dev
images follows every checkpoint, with the batch-norm moving averages; see
README.md for the accuracy and time measured.

`ShapesResNet34` is the published-scale network, ResNet-34 (He et al., 2016,
Table 1: 7x7/2 stem and 3x3/2 max pool, basic blocks [3, 4, 6, 3] of 64,
128, 256, 512 channels, 1000 classes, 224x224 images; 21.8M parameters,
3.6G multiply-adds), cut into 4 pipeline stages x 8 micro-batches of a
batch of 64. Its params, FLOPs per stage and memory per stage can be
inspected without building weights:

  python trainer.py --model=image.shapes_resnet.ShapesResNet34 \
      --mode=inspect_model

(it would train on the shapes drawn at 224x224, labels 0..9 of its 1000
classes; there is no ImageNet reader here).
"""
from cadence.framework import base_model_params
from cadence.framework import lr_schedule
from cadence.framework import model_registry
from cadence.framework import optimizer
from cadence.layers import gpipe
from cadence.tasks.image import input_generator
from cadence.tasks.image import model


@model_registry.RegisterSingleTaskModel
class ShapesResNet34(base_model_params.SingleTaskModelParams):
  """ResNet-34 at the published scale, 4 pipeline stages."""

  IMAGE_SIZE = [224, 224]
  NUM_TRAIN_EXAMPLES = 10000    # drawn in memory: 1.5 GB at 224x224
  NUM_EVAL_EXAMPLES = 5000
  BATCH_SIZE = 64
  STEM = dict(dim=64, kernel=7, stride=2, max_pool=True)
  STAGE_DIMS = [64, 128, 256, 512]
  STAGE_BLOCKS = [3, 4, 6, 3]
  NUM_CLASSES = 1000
  BN_DECAY = 0.9
  SPLITS = 4
  WORKER_SPLIT_SIZE = SPLITS   # One device per pipeline stage.
  NUM_MICRO_BATCHES = 8
  LEARNING_RATE = 0.1
  WARMUP_STEPS = 500
  MAX_STEPS = 100000
  SAVE_INTERVAL_STEPS = 1000
  LOG_INTERVAL_STEPS = 100

  def _Input(self, seed, num_examples, train):
    return input_generator.ShapesInput.Params().Set(
        name=f'shapes_{seed}', image_size=self.IMAGE_SIZE,
        num_examples=num_examples, data_seed=seed,
        batch_size=self.BATCH_SIZE, fixed_input_shape=True, repeat=train,
        shuffle=train)

  def Train(self):
    return self._Input(1, self.NUM_TRAIN_EXAMPLES, True)

  def Dev(self):
    return self._Input(2, self.NUM_EVAL_EXAMPLES, False)

  def Test(self):
    return self._Input(3, self.NUM_EVAL_EXAMPLES, False)

  def Task(self):
    p = model.ImageClassifier.Params().Set(name='image', random_seed=1)
    net = p.resnet_tpl
    net.Set(image_size=self.IMAGE_SIZE, input_dim=3,
            stage_dims=self.STAGE_DIMS, stage_blocks=self.STAGE_BLOCKS,
            num_classes=self.NUM_CLASSES, splits=self.SPLITS)
    net.stem_tpl.Set(**self.STEM)
    net.bn_tpl.Set(decay=self.BN_DECAY)
    net.pipeline_tpl = gpipe.PipeliningLayer.Params().Set(
        num_micro_batches=self.NUM_MICRO_BATCHES)
    p.train.learner.Set(
        optimizer=optimizer.Momentum.Params().Set(alpha=0.9),
        learning_rate=self.LEARNING_RATE,
        lr_schedule=lr_schedule.CosineSchedule.Params().Set(
            warmup_steps=self.WARMUP_STEPS, total_steps=self.MAX_STEPS))
    p.train.Set(max_steps=self.MAX_STEPS,
                save_interval_steps=self.SAVE_INTERVAL_STEPS,
                summary_interval_steps=self.LOG_INTERVAL_STEPS,
                log_interval_steps=self.LOG_INTERVAL_STEPS)
    p.eval.Set(samples_per_summary=0, decoder_samples=100)
    return p


@model_registry.RegisterSingleTaskModel
class ShapesResNetTiny(ShapesResNet34):
  """A small ResNet (3 stages of one block) at 32x32: minutes on 2 cores.

  2 pipeline stages x 4 micro-batches; see the module docstring.
  """

  IMAGE_SIZE = [32, 32]
  NUM_TRAIN_EXAMPLES = 10000
  NUM_EVAL_EXAMPLES = 1000
  BATCH_SIZE = 32
  STEM = dict(dim=16, kernel=3, stride=1, max_pool=False)
  STAGE_DIMS = [16, 32, 64]
  STAGE_BLOCKS = [1, 1, 1]
  NUM_CLASSES = 10
  SPLITS = 2
  WORKER_SPLIT_SIZE = SPLITS
  NUM_MICRO_BATCHES = 4
  LEARNING_RATE = 0.05
  WARMUP_STEPS = 50
  MAX_STEPS = 600
  SAVE_INTERVAL_STEPS = 200
  LOG_INTERVAL_STEPS = 50
