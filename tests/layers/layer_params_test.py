"""Every layer's FPropMeta checks its params before it makes a shape.

FPropMeta runs on params before any layer is built (a task's static check
at build time), so a dim of the wrong type ('8' for 8, 1.5 for an int)
must be reported there as the layer's own ValueError, naming its class,
its params path, the field, the value and the rule, not as a shape error
without a path. One row per layer class with checks; no weights are made.
"""
import tensorflow as tf

from cadence.framework import hyperparams
from cadence.layers import attention
from cadence.layers import batch_norm
from cadence.layers import combinators
from cadence.layers import conv
from cadence.layers import dropout
from cadence.layers import embedding
from cadence.layers import linear
from cadence.layers import normalization
from cadence.layers import resnet
from cadence.layers import softmax
from cadence.layers import transformer


def _Placed(p):
  """`p` as the params at 'net.layer_tpl' of an experiment's tree."""
  net = hyperparams.Params()
  net.Define('layer_tpl', p, 'The layer under test.')
  root = hyperparams.Params()
  root.Define('net', net, 'Its parent.')
  return root.net.layer_tpl


# (layer params, bad field=value as set, inputs of FPropMeta, the rule).
_ROWS = [
    (linear.ProjectionLayer.Params().Set(name='proj', input_dim=8,
                                         output_dim=4),
     dict(input_dim='8'), ([2, 8],), r"input_dim='8' must be an int >= 1\."),
    (linear.FeedForwardNet.Params().Set(name='ffn', input_dim=8,
                                        hidden_layer_dims=[16, 8]),
     dict(hidden_layer_dims=[16.5, 8]), ([2, 8],),
     r'hidden_layer_dims\[0\]=16\.5 must be an int >= 1\.'),
    (attention.MultiHeadedAttention.Params().Set(name='atten', input_dim=8,
                                                 num_heads=2),
     dict(num_heads='2'), ([2, 5, 8],), r"num_heads='2' must be an int"),
    (normalization.LayerNorm.Params().Set(name='ln', input_dim=8),
     dict(input_dim=8.0), ([2, 8],), r'input_dim=8\.0 must be an int'),
    (normalization.RMSNorm.Params().Set(name='rms', input_dim=8),
     dict(epsilon='1e-6'), ([2, 8],), r"epsilon='1e-6' must be a number > "
     r'0\.'),
    (softmax.SimpleFullSoftmax.Params().Set(name='softmax', input_dim=8,
                                            num_classes=10),
     dict(num_classes='10'), ([2, 8],), r"num_classes='10' must be an int"),
    (embedding.EmbeddingLayer.Params().Set(name='emb', vocab_size=10,
                                           embedding_dim=8),
     dict(embedding_dim='8'), ([2, 5],), r"embedding_dim='8' must be an int"),
    (embedding.PositionalEmbedding.Params().Set(name='pos', embedding_dim=8),
     dict(embedding_dim=7), (5,), r'embedding_dim=7 must be even'),
    (embedding.LearnedPositionalEmbedding.Params().Set(
        name='pos', max_seq_len=16, embedding_dim=8),
     dict(max_seq_len='16'), (5,), r"max_seq_len='16' must be an int"),
    (transformer.TransformerLayer.Params().Set(name='x', input_dim=8,
                                               hidden_dim=16, num_heads=2),
     dict(hidden_dim='16'), ([2, 5, 8],), r"hidden_dim='16' must be an int"),
    (dropout.DropoutLayer.Params().Set(name='drop', keep_prob=0.9),
     dict(keep_prob='0.9'), ([2, 8],), r"keep_prob='0\.9' must be a number"),
    (conv.Conv2DLayer.Params().Set(name='conv', filter_shape=[3, 3, 3, 4]),
     dict(filter_stride=[1.5, 1]), ([2, 8, 8, 3],),
     r'filter_stride=\[1\.5, 1\] must be a list of 2 ints >= 1\.'),
    (conv.PoolingLayer.Params().Set(name='pool'),
     dict(window_shape=['2', 2]), ([2, 8, 8, 3],),
     r"window_shape=\['2', 2\] must be a list of 2 ints"),
    (conv.GlobalPoolingLayer.Params().Set(name='gap'),
     dict(pooling_type='MEAN'), ([2, 8, 8, 3],),
     r"pooling_type='MEAN' must be one of"),
    (resnet.ResidualBlock.Params().Set(name='block', input_dim=4,
                                       output_dim=4),
     dict(output_dim='8'), ([2, 8, 8, 4],), r"output_dim='8' must be an int"),
    (resnet.ResNetStem.Params().Set(name='stem'),
     dict(kernel=7.0), ([2, 32, 32, 3],), r'kernel=7\.0 must be an int'),
    (batch_norm.BatchNormLayer.Params().Set(name='bn', dim=4),
     dict(dim='4'), ([2, 4],), r"dim='4' must be an int"),
    (combinators.SequentialLayer.Params().Set(
        name='seq', sub=[linear.ProjectionLayer.Params().Set(
            name='fc', input_dim=8, output_dim=8)]),
     dict(repeat='2'), ([2, 8],), r"repeat='2' must be an int"),
]


class LayerParamsTest(tf.test.TestCase):

  def testFPropMetaNamesTheBadParamWithItsPath(self):
    for p, bad, inputs, rule in _ROWS:
      cls = p.cls.__name__
      with self.subTest(layer=cls, **{k: str(v) for k, v in bad.items()}):
        good = _Placed(p.Copy())
        p.cls.FPropMeta(good, *inputs)   # The row is right but for `bad`.
        with self.assertRaisesRegex(
            ValueError, rf"^{cls} '{p.name}' \(params 'net\.layer_tpl'\): "
            + rule):
          p.cls.FPropMeta(_Placed(p.Copy().Set(**bad)), *inputs)


if __name__ == '__main__':
  tf.test.main()
