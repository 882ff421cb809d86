"""ImageClassifier: a (pipelined) ResNet trained with softmax cross-entropy.

Metrics: loss (mean cross-entropy, nats), accuracy (top-1), both per
example. In training the ResNet's batch-norm statistics of every
micro-batch come back from the network and the moving averages are updated
after the pipeline, once per micro-batch in order (layers/batch_norm.py);
eval and decode (is_inference) normalise with the moving averages.

Serving (`Inference`, written by `trainer.py --mode=export`): `predict`,
images -> class probabilities, normalised with the moving averages; a
pipelined ResNet exports its cells run one after the other on one device.
"""
import numpy as np
import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import base_model
from cadence.framework import cost
from cadence.framework import hyperparams
from cadence.framework import inference
from cadence.framework.nested_map import NestedMap
from cadence.framework.pipeline import plan as plan_lib
from cadence.framework import shapes
from cadence.framework import validation
from cadence.layers import gpipe_resnet


class ImageClassifier(base_model.BaseTask):
  """A ResNet image classifier (layers/gpipe_resnet.py).

  Example:
    p = ImageClassifier.Params().Set(name='image')
    p.resnet_tpl.Set(image_size=[32, 32], stage_dims=[8], stage_blocks=[1],
                     num_classes=10, pipeline_tpl=None)
    task = p.Instantiate()
    metrics, _ = task.FPropTower(task.theta, NestedMap(
        image=tf.zeros([2, 32, 32, 3]), label=tf.zeros([2], tf.int32)))
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('resnet_tpl', gpipe_resnet.ResNet.Params(), 'The network: '
             'image size, stages, classes, the partition (splits) and the '
             "pipeline's settings (pipeline_tpl).")
    return p

  def __init__(self, params):
    super().__init__(params)
    tpl = self.params.resnet_tpl
    if not (isinstance(tpl, hyperparams.InstantiableParams) and
            issubclass(tpl.cls, gpipe_resnet.ResNet)):
      raise validation.Error(validation.Owner(self), 'resnet_tpl',
                             getattr(tpl, 'cls', tpl),
                             'must be a gpipe_resnet.ResNet.Params().')
    self.CreateChild('net', tpl.Copy().Set(name='net'))

  def ComputePredictions(self, theta, input_batch):
    """logits [b, classes]; in training also updates the BN moving stats."""
    logits, stats = self.net.FPropStats(theta.net, input_batch.image)
    if not self.params.is_inference:
      self.net.UpdateMovingStats(stats)
    return NestedMap(logits=logits)

  @staticmethod
  def _LossSums(unused_theta, logits, side):
    """The cross-entropy and accuracy sums of logits [b, classes] for
    labels `side.label` [b] (a batch or a micro-batch): NestedMap(loss,
    correct, examples) scalars and [b] xent, correct."""
    logits = tf.cast(logits, tf.float32)
    labels = tf.cast(side.label, tf.int32)
    xent = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
    correct = tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32),
                               labels), tf.float32)
    return NestedMap(loss=tf.reduce_sum(xent),
                     correct_sum=tf.reduce_sum(correct),
                     examples=tf.cast(tf.size(labels), tf.float32),
                     xent=xent, correct=correct)

  @staticmethod
  def _Metrics(sums):
    n = sums.examples
    return (NestedMap(loss=(sums.loss / n, n),
                      accuracy=(sums.correct_sum / n, n)),
            NestedMap(xent=sums.xent, correct=sums.correct))

  def ComputeLoss(self, theta, predictions, input_batch):
    return self._Metrics(self._LossSums(theta, predictions.logits,
                                        input_batch))

  def FPropTower(self, theta, input_batch):
    """BaseTask's; in training the loss runs per micro-batch where the
    pipeline's schedule needs it (inside it for 1F1B and the zero-bubble
    schedules: ResNet.FPropLossStats), then the BN moving stats update."""
    if self.params.is_inference:
      return super().FPropTower(theta, input_batch)
    loss = gpipe_resnet.gpipe.PipelineCell(fprop=self._LossSums,
                                           theta=NestedMap(), meta=None)
    sums, stats = self.net.FPropLossStats(
        theta.net, input_batch.image, loss=loss,
        side_inputs=NestedMap(label=input_batch.label))
    self.net.UpdateMovingStats(stats)
    return self._Metrics(sums)

  def Decode(self, theta, input_batch):
    logits = self.ComputePredictions(theta, input_batch).logits
    return NestedMap(prediction=tf.argmax(logits, -1, output_type=tf.int32),
                     label=tf.cast(input_batch.label, tf.int32))

  def CreateDecoderMetrics(self):
    return {'accuracy': base_model.AverageMetric()}

  def PostProcessDecodeOut(self, decode_out, decoder_metrics):
    pred = np.asarray(decode_out.prediction)
    label = np.asarray(decode_out.label)
    decoder_metrics['accuracy'].Update(np.mean(pred == label), pred.size)
    return [f'label={l} prediction={y}' for l, y in zip(label, pred)]

  def Inference(self, batch_size=None, max_len=None):
    """`predict` for serving; see BaseTask.Inference.

    The network as the evaler runs it (batch-norm with the moving
    averages). A pipelined ResNet is built on one device for the export
    (framework/jobs/export.py): its PipeliningLayer runs the cells one
    after the other on the whole batch, with the same weights.

    Args:
      batch_size: None (dynamic) or the static batch size.
      max_len: must be None (images have no sequence length).

    Returns:
      An inference.InferenceGraph.
    """
    inference.CheckDims(f'{validation.Owner(self)} Inference', batch_size,
                        max_len, uses_max_len=False)
    net = self.params.resnet_tpl
    h, w = net.image_size

    def _Predict(theta, images):
      logits = tf.cast(self.ComputePredictions(
          theta, NestedMap(image=images)).logits, tf.float32)
      return dict(probabilities=tf.nn.softmax(logits),
                  classes=tf.argmax(logits, -1, output_type=tf.int32))

    spec = tf.TensorSpec([batch_size, h, w, net.input_dim], tf.float32)
    doc = _PREDICT_DOC.format(h=h, w=w, c=net.input_dim, n=net.num_classes)
    return inference.InferenceGraph(
        signatures=dict(predict=inference.Signature(
            _Predict, dict(images=spec), doc)),
        doc=f'{type(self).__name__} {self.path!r}: {net.num_classes} '
        'classes.')

  @classmethod
  def FPropMeta(cls, params, input_shapes):
    """Forward FLOPs of FPropTower on `input_shapes.image` [b, h, w, c].

    Returns:
      A cost.Cost: flops, out_shapes=(), breakdown=[(unit, flops)] and the
      network's `plan` (framework/pipeline/plan.py; None if the batch is
      unknown) with the loss per micro-batch.
    """
    net = base_layer.InheritParams(params, params.resnet_tpl)
    image = shapes.AsShape(input_shapes.image)
    meta = net.cls.FPropMeta(net, image)
    loss = cls._LossCost(net, image[0])
    units, _, _ = net.cls.UnitCosts(net, (image,))
    breakdown = [(u.name, u.cost.flops) for u in units]
    breakdown.append(('loss', loss.flops))
    plan = meta.plan
    if plan is not None:
      plan = plan.With(loss_fn=lambda size: cls._LossUnit(net, size))
    return cost.Cost(flops=shapes.Add(meta.flops, loss.flops), out_shapes=(),
                     breakdown=breakdown, plan=plan)

  @classmethod
  def _LossUnit(cls, net, batch):
    """The loss on `batch` examples, a plan.Unit (no layer: the
    cross-entropy of the logits)."""
    def _Build():
      def _FProp(unused_thetas, logits, labels):
        return cls._LossSums(None, logits, NestedMap(label=labels)).loss
      return ([], _FProp, [
          tf.TensorSpec([batch, net.num_classes], tf.float32),
          tf.TensorSpec([batch], tf.int32)], net.num_classes)
    return plan_lib.Unit('loss', cls._LossCost(net, batch), _Build, list)

  @staticmethod
  def _LossCost(net, batch):
    """The loss's cost on `batch` examples: the softmax cross-entropy and
    the argmax, 5 FLOPs a logit; it keeps the logits and their gradient
    (float32)."""
    logits = shapes.Mul(batch, net.num_classes)
    return cost.Complete(cost.Cost(
        flops=shapes.Mul(5, logits), out_shapes=(),
        act=shapes.Mul(4, logits), transient=shapes.Mul(4, logits)),
                         (), tf.float32)


_PREDICT_DOC = """predict(images) -> probabilities, classes
  images [batch, {h}, {w}, {c}] float32: pixels scaled to [-1, 1]
    (uint8 / 127.5 - 1, as tasks/image/input_generator.py gives them).
  probabilities [batch, {n}] float32: the class probabilities (softmax).
  classes [batch] int32: the most probable class."""
