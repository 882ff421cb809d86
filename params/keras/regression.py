"""A Keras model trained by Cadence: regression on synthetic data.

The network is a functional keras.Model built by
`tasks.synthetic.keras_regression.Mlp`, wrapped in a KerasLayer. Run it
replicated over 2 logical CPUs (the batch split, the gradients all-reduced;
about 15 s; measured: loss 3.3 at step 100, 0.06 at step 300):

  python -m cadence.trainer --model=keras.regression.KerasMlpTiny \
      --logdir=/tmp/keras_reg --worker_replicas=2 --max_steps=300
"""
from cadence.framework import model_registry
from cadence.params.synthetic import linear_regression
from cadence.tasks.synthetic import keras_regression


@model_registry.RegisterSingleTaskModel
class KerasMlpTiny(linear_regression.RegressionTiny):
  """RegressionTiny's 8 -> 16 -> 1 ReLU network, as a keras.Model."""

  def Task(self):
    base = super().Task()
    p = keras_regression.KerasRegressionModel.Params().Set(
        name='regression', input_dim=self.INPUT_DIM, random_seed=1,
        train=base.train, eval=base.eval)
    p.net_tpl.kwargs = {'input_dim': self.INPUT_DIM,
                        'hidden_dims': list(self.HIDDEN_DIMS)}
    return p
