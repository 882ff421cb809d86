"""Every built-in layer through the test kit (cadence.framework.testing):
its FPropMeta held to its FProp.

One row per layer class under layers/ (a test below checks that none is
missing), on inputs small enough to be cheap: output shapes, the
products' FLOPs against the traced graph's, act / act_weights / residuals
against the bytes the real gradient keeps (where the layer states them:
a figure left to cost.Complete's default is an estimate the kit reports
without failing), a gradient for every trainable variable, randomness
replayed by the step seed. Tolerances are the kit's defaults (FLOPs 2%,
bytes 5%), but where a row says why.

What a layer leaves to the defaults, measured here (the docstrings say
so): FeedForwardNet, MultiHeadedAttention, PoolingLayer,
GlobalPoolingLayer and the combinators' chains of such parts. A
pipeline's memory (PipeliningLayer, GPipeTransformerStack with its
pipeline) is the memory estimate's (its schedule and remat, framework/
pipeline/memory_estimate.py), not one trace's: those rows skip bytes.
"""
import importlib
import inspect
import os

import keras
import numpy as np
import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import testing
from cadence.layers import attention
from cadence.layers import batch_norm
from cadence.layers import combinators
from cadence.layers import conv
from cadence.layers import dropout
from cadence.layers import embedding
from cadence.layers import gpipe
from cadence.layers import gpipe_resnet
from cadence.layers import gpipe_stack
from cadence.layers import gpipe_transformer
from cadence.layers import keras_layer
from cadence.layers import linear
from cadence.layers import losses
from cadence.layers import normalization
from cadence.layers import resnet
from cadence.layers import softmax
from cadence.layers import transformer
from cadence.tests import test_utils

_B, _T, _D = 2, 4, 8
_NO_BYTES = ('contract', 'out_shapes', 'flops', 'gradients', 'step_seed')
# Abstract bases: what their subclasses' rows check.
_ABSTRACT = ('BatchStatsLayer',)


def _Proj(i, o, name='fc', act='NONE'):
  return linear.ProjectionLayer.Params().Set(name=name, input_dim=i,
                                             output_dim=o, activation=act)


def _Xformer(**kw):
  return transformer.TransformerLayer.Params().Set(
      input_dim=_D, hidden_dim=16, num_heads=2, **kw)


def _Cells():
  return [combinators.FeatureExtractionLayer.Params().Set(
      name=f'cell{i}', sub=[_Proj(_D, _D, act='RELU')]) for i in range(2)]


def _Rows():
  """(class name, params, inputs, CheckLayer's keyword arguments)."""
  x3, pads = [_B, _T, _D], tf.zeros([_B, _T])
  ids = tf.constant(np.arange(_B * _T).reshape(_B, _T) % 10, tf.int32)
  xent = dict(outputs=lambda out: out.total_xent)
  return [
      ('ProjectionLayer', _Proj(_D, 4, act='RELU'), [[_B, _D]], {}),
      ('FeedForwardNet', linear.FeedForwardNet.Params().Set(
          input_dim=_D, hidden_layer_dims=[16, _D],
          activation=['RELU', 'NONE'], dropout_prob=0.1), [[_B, _D]], {}),
      ('MultiHeadedAttention', attention.MultiHeadedAttention.Params().Set(
          input_dim=_D, hidden_dim=_D, num_heads=2, atten_dropout_prob=0.1),
       [x3], {}),
      ('BatchNormLayer', batch_norm.BatchNormLayer.Params().Set(dim=_D),
       [[_B, 3, 3, _D]], {}),
      ('SequentialLayer', combinators.SequentialLayer.Params().Set(
          sub=[_Proj(_D, 16, 'a', 'RELU'), _Proj(16, _D, 'b')]),
       [[_B, _D]], {}),
      ('FeatureExtractionLayer',
       combinators.FeatureExtractionLayer.Params().Set(
           sub=[_Proj(_D, 16, 'a', 'RELU'), _Proj(16, _D, 'b')]),
       [[_B, _D]], {}),
      ('Conv2DLayer', conv.Conv2DLayer.Params().Set(
          filter_shape=[3, 3, 3, 4], activation='RELU'), [[_B, 6, 6, 3]],
       {}),
      ('PoolingLayer', conv.PoolingLayer.Params(), [[_B, 6, 6, 3]], {}),
      ('FlattenLayer', conv.FlattenLayer.Params(), [[_B, 3, 3, 2]], {}),
      ('GlobalPoolingLayer', conv.GlobalPoolingLayer.Params(),
       [[_B, 3, 3, 4]], {}),
      ('DropoutLayer', dropout.DropoutLayer.Params().Set(keep_prob=0.8),
       [[_B, _D]], {}),
      ('SquaredErrorLoss', losses.SquaredErrorLoss.Params(),
       [[_B, 1], [_B]], dict(outputs=lambda out: out.loss)),
      ('EmbeddingLayer', embedding.EmbeddingLayer.Params().Set(
          vocab_size=10, embedding_dim=_D, scale_sqrt_depth=True), [ids], {}),
      ('PositionalEmbedding', embedding.PositionalEmbedding.Params().Set(
          embedding_dim=_D), [_T], {}),
      ('LearnedPositionalEmbedding',
       embedding.LearnedPositionalEmbedding.Params().Set(
           max_seq_len=_T, embedding_dim=_D), [_T], {}),
      ('KerasLayer', keras_layer.KerasLayer.Params().Set(
          layer=keras.layers.Dense, kwargs={'units': 4, 'activation': 'relu'},
          input_shape=(_D,)), [[_B, _D]], {}),
      ('LayerNorm', normalization.LayerNorm.Params().Set(input_dim=_D), [x3],
       {}),
      ('RMSNorm', normalization.RMSNorm.Params().Set(input_dim=_D), [x3], {}),
      ('ResNetStem', resnet.ResNetStem.Params().Set(
          input_dim=3, dim=4, kernel=3, stride=1, max_pool=True),
       [[_B, 8, 8, 3]], {}),
      ('ResidualBlock', resnet.ResidualBlock.Params().Set(
          input_dim=4, output_dim=8, stride=2), [[_B, 4, 4, 4]], {}),
      ('SimpleFullSoftmax', softmax.SimpleFullSoftmax.Params().Set(
          input_dim=_D, num_classes=10, label_smoothing=0.1), [x3, ids],
       xent),
      # Chunked, on rows enough that the few scalars its act leaves out
      # (20 bytes, its docstring) stay within the tolerance.
      ('SimpleFullSoftmax', softmax.SimpleFullSoftmax.Params().Set(
          input_dim=_D, num_classes=10, softmax_max_alloc=32),
       [[4, _D, _D], tf.zeros([4, _D], tf.int32)], xent),
      ('TransformerLayer', _Xformer(mask_self_atten=True,
                                    residual_dropout_prob=0.1),
       [x3, pads], {}),
      ('GPipeTransformerLayer', transformer.GPipeTransformerLayer.Params().Set(
          input_dim=_D, hidden_dim=16, num_heads=2), [x3, pads], {}),
      ('TransformerStack', transformer.TransformerStack.Params().Set(
          num_layers=2, transformer_tpl=_Xformer()), [x3, pads], {}),
      ('SeqLayer', gpipe.SeqLayer.Params().Set(cell_tpl=_Cells()),
       [[_B, _D]], {}),
      ('PipeliningLayer', gpipe.PipeliningLayer.Params().Set(
          num_micro_batches=2, cell_tpl=_Cells()), [[_B, _D]],
       dict(checks=_NO_BYTES)),
      ('GPipeStack', gpipe_stack.GPipeStack.Params().Set(
          units=[_Proj(_D, _D, act='RELU'), _Proj(_D, _D)],
          pipeline_tpl=None), [[_B, _D]], {}),
      ('GPipeTransformerStack',
       gpipe_transformer.GPipeTransformerStack.Params().Set(
           num_layers=2, transformer_tpl=_Xformer()), [x3, pads],
       dict(checks=_NO_BYTES)),
      ('ResNet', gpipe_resnet.ResNet.Params().Set(
          input_dim=3, image_size=[8, 8], stem_tpl=resnet.ResNetStem.Params(
          ).Set(dim=4, kernel=3, stride=1, max_pool=False),
          stage_dims=[4, 8], stage_blocks=[1, 1], num_classes=5,
          pipeline_tpl=None), [[_B, 8, 8, 3]], {}),
  ]


def _LayerClasses():
  """The names of the layer classes defined under layers/."""
  folder = os.path.join(test_utils.ROOT, 'layers')
  found = set()
  for name in sorted(os.listdir(folder)):
    if not name.endswith('.py') or name == '__init__.py':
      continue
    module = importlib.import_module(f'cadence.layers.{name[:-3]}')
    for cls_name, cls in inspect.getmembers(module, inspect.isclass):
      if (cls.__module__ == module.__name__ and
          issubclass(cls, base_layer.BaseLayer)):
        found.add(cls_name)
  return found - set(_ABSTRACT)


class LayerContractTest(tf.test.TestCase):

  def testEveryLayerClassHasARow(self):
    self.assertEqual(_LayerClasses(), {row[0] for row in _Rows()})

  def testEveryBuiltInLayerPassesTheKit(self):
    for name, params, inputs, kwargs in _Rows():
      with self.subTest(layer=name):
        report = testing.CheckLayer(params, *inputs, **kwargs)
        self.assertEqual(['contract', 'out_shapes', 'gradients',
                          'step_seed'],
                         [f.name for f in report.figures if f.ok and f.name
                          in ('contract', 'out_shapes', 'gradients',
                              'step_seed')], str(report))


if __name__ == '__main__':
  tf.test.main()
