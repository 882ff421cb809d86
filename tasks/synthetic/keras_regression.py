"""Regression with a Keras model: a `keras.Model` built by a function, trained
by Cadence (replicas, pipeline-free) as any task.

The network is a KerasLayer (layers/keras_layer.py) around the model that
`net_tpl.layer` builds; the data, loss, metrics and decoding are
RegressionModel's (tasks/synthetic/regression.py). Its export for serving
(`trainer.py --mode=export`) is the Keras model's own (`keras.Model.export`):
the trained weights in the model the user wrote, with Keras's 'serve'
endpoint, which TF Serving and `keras.layers.TFSMLayer` load.
"""
import keras
import tensorflow as tf

from cadence.framework import cost
from cadence.framework import inference
from cadence.framework import shapes
from cadence.framework import validation
from cadence.layers import keras_layer
from cadence.tasks.synthetic import regression


def Mlp(input_dim=8, hidden_dims=(16,), activation='relu'):
  """A functional keras.Model: input_dim -> hidden_dims (activation) -> 1.

  Returns:
    keras.Model mapping [batch, input_dim] to [batch, 1].
  """
  x = keras.Input((input_dim,), name='x')
  h = x
  for i, dim in enumerate(hidden_dims):
    h = keras.layers.Dense(dim, activation=activation, name=f'hidden{i}')(h)
  return keras.Model(x, keras.layers.Dense(1, name='out')(h), name='mlp')


class KerasRegressionModel(regression.RegressionModel):
  """RegressionModel whose network is a Keras model.

  Example:
    p = KerasRegressionModel.Params().Set(name='reg', input_dim=4)
    p.net_tpl.kwargs = {'input_dim': 4, 'hidden_dims': [8]}
    task = p.Instantiate()
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Delete('net_tpl')   # RegressionModel's, of any layer: here Keras'.
    p.Define('net_tpl', keras_layer.KerasLayer.Params().Set(layer=Mlp),
             'The network: a KerasLayer whose Keras model maps '
             '[batch, input_dim] to [batch, 1].')
    return p

  @classmethod
  def _NetParams(cls, p):
    return p.net_tpl.Copy().Set(name='net')

  def Inference(self, batch_size=None, max_len=None):
    """The Keras model, exported the Keras way; see BaseTask.Inference.

    Its variables are this task's, so the export holds the restored
    weights. The SavedModel's endpoint 'serve' (and signature
    'serving_default') maps x [batch, input_dim] float32 to
    [batch, 1] float32, the model's output (`predictions.y` unsqueezed).
    """
    inference.CheckDims(f'{validation.Owner(self)} Inference', batch_size,
                        max_len, uses_max_len=False)
    spec = tf.TensorSpec([batch_size, self.params.input_dim], tf.float32,
                         name='x')
    return inference.InferenceGraph(
        keras_model=self.net.keras_object, keras_inputs=[spec],
        doc=f'{type(self).__name__} {self.path!r}: the Keras model '
        f'{self.net.keras_object.name!r}; serve(x [batch, '
        f'{self.params.input_dim}] float32) -> [batch, 1] float32.')

  @classmethod
  def FPropMeta(cls, params, input_shapes):
    x = shapes.AsShape(input_shapes.x)
    net = cls._NetParams(params)
    flops = net.cls.FPropMeta(net, x).flops
    # Loss: a subtract, square and sum per example, and |err| for mae.
    loss = shapes.Mul(x[0], 4)
    return cost.Cost(flops=shapes.Add(flops, loss), out_shapes=(),
                     breakdown=[('net', flops), ('loss', loss)])
