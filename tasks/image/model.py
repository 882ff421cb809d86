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
from cadence.framework import hyperparams
from cadence.framework import inference
from cadence.framework.nested_map import NestedMap
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

  def ComputeLoss(self, theta, predictions, input_batch):
    logits = tf.cast(predictions.logits, tf.float32)
    labels = tf.cast(input_batch.label, tf.int32)
    xent = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
    correct = tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32),
                               labels), tf.float32)
    n = tf.cast(tf.size(labels), tf.float32)
    metrics = NestedMap(loss=(tf.reduce_mean(xent), n),
                        accuracy=(tf.reduce_mean(correct), n))
    return metrics, NestedMap(xent=xent, correct=correct)

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
      NestedMap(flops, out_shapes=(), breakdown=[(unit, flops)],
      partitions=[flops per cell] (the loss counted in the last),
      memory=the activations per cell for memory_estimate; None if the
      batch is unknown).
    """
    net = base_layer.InheritParams(params, params.resnet_tpl)
    image = shapes.AsShape(input_shapes.image)
    meta = net.cls.FPropMeta(net, image)
    b = image[0]
    loss = shapes.Mul(b, 5 * net.num_classes)   # softmax, xent, argmax
    units = net.cls.UnitParams(net)
    metas = net.cls.UnitMetas(net, image)
    breakdown = [(name, m.flops) for (name, _), m in zip(units, metas)]
    breakdown.append(('loss', loss))
    out = NestedMap(flops=shapes.Add(meta.flops, loss), out_shapes=(),
                    breakdown=breakdown)
    parts = net.cls.CellFlops(net, image)
    parts[-1] = shapes.Add(parts[-1], loss)
    out.partitions = parts
    out.memory = cls._MemoryMeta(net, image)
    return out

  @classmethod
  def _MemoryMeta(cls, net, image):
    """memory_estimate's NestedMap: per cell its activation bytes for one
    micro-batch (the whole batch unpipelined); None if the batch is
    unknown."""
    if image[0] is None:
      return None
    pipe = net.pipeline_tpl
    if pipe is None:
      return NestedMap(schedule=None, remat=None, num_micro_batches=1,
                       backward_window=None,
                       cells=net.cls.CellMemory(net, image))
    m, size = pipe.cls.MicroBatching(pipe, image[0])
    micro = image.WithDim(0, size)
    return pipe.cls.MemoryMeta(
        pipe, m, net.cls.CellMemory(net, micro),
        input_bytes=micro.num_elements() * pipe.cls.StateDtype(pipe).size)


_PREDICT_DOC = """predict(images) -> probabilities, classes
  images [batch, {h}, {w}, {c}] float32: pixels scaled to [-1, 1]
    (uint8 / 127.5 - 1, as tasks/image/input_generator.py gives them).
  probabilities [batch, {n}] float32: the class probabilities (softmax).
  classes [batch] int32: the most probable class."""
