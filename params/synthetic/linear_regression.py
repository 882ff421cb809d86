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
from cadence.layers import gpipe
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


@model_registry.RegisterSingleTaskModel
class RegressionGPipeTiny(RegressionTiny):
  """8 -> 16 -> 16 -> 16 -> 1 cut into 2 pipeline cells x 4 micro-batches.

  The smallest pipelined experiment (one device per cell): with
  --worker_replicas=R it trains R data-parallel replicas of the 2-stage
  pipeline on R x 2 logical CPUs.
  """

  HIDDEN_DIMS = [16, 16, 16]
  PIPELINE_CELLS = 2
  WORKER_SPLIT_SIZE = 2
  NUM_MICRO_BATCHES = 4

  def _Input(self, first_example, num_examples, repeat):
    # A pipeline cuts static batches into micro-batches.
    return super()._Input(first_example, num_examples, repeat).Set(
        fixed_input_shape=True)

  def Task(self):
    p = super().Task()
    p.pipeline_tpl = gpipe.PipeliningLayer.Params().Set(
        num_micro_batches=self.NUM_MICRO_BATCHES)
    p.pipeline_cells = self.PIPELINE_CELLS
    return p
