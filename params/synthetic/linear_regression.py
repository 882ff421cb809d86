"""Regression on synthetic data: the trainer's smallest end-to-end experiment.

Run (a few seconds on one CPU core; the loss falls from ~2 to the noise
floor, 0.01):

  python -m cadence.trainer --model=synthetic.linear_regression.RegressionTiny \
      --logdir=/tmp/reg --max_steps=500

`--job=trainer_and_evaler` (the default) also evaluates the Dev set after
each checkpoint (TensorBoard: `tensorboard --logdir=/tmp/reg`); then
`--job=decoder_test` writes predictions to /tmp/reg/decoder_test/. To read
CSV files instead (lines `x_0,...,x_7,y`), add
`--model_params_override="input.file_pattern=/data/train-*.csv"`.
"""
from cadence.framework import base_model_params
from cadence.framework import model_registry
from cadence.framework import optimizer
from cadence.tasks.synthetic import regression


@model_registry.RegisterSingleTaskModel
class RegressionTiny(base_model_params.SingleTaskModelParams):
  """An 8 -> 16 -> 1 ReLU network on 8-dim synthetic data."""

  INPUT_DIM = 8
  HIDDEN_DIMS = [16]
  BATCH_SIZE = 32
  LEARNING_RATE = 0.01
  MAX_STEPS = 500
  TRAIN_DATA = ''  # Empty: synthetic examples generated on the fly.

  def _Input(self, first_example, num_examples, repeat):
    return regression.RegressionInput.Params().Set(
        input_dim=self.INPUT_DIM, batch_size=self.BATCH_SIZE,
        first_example=first_example, num_examples=num_examples,
        repeat=repeat, shuffle=repeat)

  def Train(self):
    return self._Input(0, 4096, True).Set(file_pattern=self.TRAIN_DATA)

  def Dev(self):
    return self._Input(1_000_000, 256, False)

  def Test(self):
    return self._Input(2_000_000, 256, False)

  def Task(self):
    p = regression.RegressionModel.Params().Set(
        name='regression', input_dim=self.INPUT_DIM,
        hidden_dims=self.HIDDEN_DIMS, random_seed=1)
    p.train.learner.Set(learning_rate=self.LEARNING_RATE,
                        optimizer=optimizer.Adam.Params())
    p.train.Set(max_steps=self.MAX_STEPS, save_interval_steps=100,
                summary_interval_steps=20, log_interval_steps=100)
    p.eval.Set(samples_per_summary=0, decoder_samples=64)
    return p
