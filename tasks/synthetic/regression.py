"""Regression on synthetic or CSV data: the smallest complete task.

The data is y = x . w* + b* + noise for a fixed random teacher (w*, b*)
drawn from `teacher_seed`, x ~ N(0, I). With `file_pattern` empty the
generator draws `num_examples` examples once (example i from a stateless
seed of i, so it is deterministic) and serves them from memory; with a
pattern, each line of the files is `x_0,...,x_{d-1},y`. `WriteCsv` writes
such files from the same teacher.
"""
import numpy as np
import tensorflow as tf

from cadence.framework import base_input_generator
from cadence.framework import base_layer
from cadence.framework import base_model
from cadence.framework import cost
from cadence.framework import hyperparams
from cadence.framework import inference
from cadence.framework.nested_map import NestedMap
from cadence.framework import shapes
from cadence.framework import validation
from cadence.layers import activations
from cadence.layers import dropout
from cadence.layers import gpipe
from cadence.layers import gpipe_units
from cadence.layers import linear
from cadence.layers import losses


@tf.function(autograph=False)
def _Draws(seeds, width):
  """One stateless draw per seed: row i is N(0, 1)^width from seeds[i]."""
  return tf.map_fn(lambda s: tf.random.stateless_normal([width], seed=s),
                   seeds, fn_output_signature=tf.float32,
                   parallel_iterations=64)


def SyntheticData(num_examples, input_dim, teacher_seed=0, noise_stddev=0.1,
                  first_example=0):
  """The synthetic examples [first_example, first_example + num_examples).

  Example i depends on (teacher_seed, i) only, whatever range it is drawn
  in, so datasets with disjoint ranges never share an example.

  Returns:
    (x [num_examples, input_dim], y [num_examples]) float32 numpy arrays.
  """
  wb = tf.random.stateless_normal([input_dim + 1], seed=[teacher_seed, -1])
  index = tf.range(first_example, first_example + num_examples,
                   dtype=tf.int64)
  seeds = tf.stack([index, tf.fill(tf.shape(index), tf.cast(teacher_seed,
                                                              tf.int64))], 1)
  draws = _Draws(seeds, input_dim + 1)                # [n, input_dim + 1]
  x = draws[:, :-1]
  y = tf.linalg.matvec(x, wb[:-1]) + wb[-1] + noise_stddev * draws[:, -1]
  return x.numpy(), y.numpy()


def WriteCsv(path, num_examples, input_dim, teacher_seed=0,
             noise_stddev=0.1, first_example=0):
  """Writes synthetic examples as CSV lines `x_0,...,x_{d-1},y` to `path`."""
  x, y = SyntheticData(num_examples, input_dim, teacher_seed, noise_stddev,
                       first_example)
  with tf.io.gfile.GFile(path, 'w') as f:
    for xi, yi in zip(x, y):
      f.write(','.join(repr(float(v)) for v in list(xi) + [yi]) + '\n')


class RegressionInput(base_input_generator.BaseInputGenerator):
  """Batches of NestedMap(x=[batch, input_dim], y=[batch]).

  Example:
    p = RegressionInput.Params().Set(input_dim=4, batch_size=8)
    batch = next(iter(p.Instantiate().Dataset()))  # synthetic data
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('input_dim', 8, 'Features per example, an int > 0.')
    p.Define('teacher_seed', 0, 'Seed of the teacher (w*, b*) and of the '
             'synthetic examples.')
    p.Define('noise_stddev', 0.1, 'Stddev of the label noise (synthetic).')
    p.Define('first_example', 0, 'Index of the first synthetic example; '
             'datasets use disjoint ranges.')
    p.Define('num_examples', 4096, 'Size of the synthetic dataset (cycled '
             'when repeat is True).')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self._data = None
    if not self.files:  # Generated once, then read by index.
      self._data = SyntheticData(p.num_examples, p.input_dim, p.teacher_seed,
                                 p.noise_stddev, p.first_example)
    elif p.file_type == 'text':
      self._CheckFirstLine()

  def _CheckFirstLine(self):
    """An InputError unless the first line of the files is a CSV example
    (x_0,...,x_{d-1},y): a wrong file or input_dim is found here, before
    any step, not by the first batch."""
    p = self.params
    path = next(f for f in self.files if tf.io.gfile.stat(f).length)
    with tf.io.gfile.GFile(path, 'rb') as f:
      line = f.readline().decode('utf-8', errors='replace').strip()
    try:
      values = [float(v) for v in line.split(',')]
    except ValueError:
      values = None
    if values is None or len(values) != p.input_dim + 1:
      found = ('holds something else' if values is None else
               f'has {len(values)} value(s)')
      raise base_input_generator.InputError(
          f'{type(self).__name__} {p.name!r}: line 1 of {path!r} '
          f'({validation.ShortRepr(line, string_limit=60)}) {found}; each '
          f'line must be input_dim + 1 = {p.input_dim + 1} comma-separated '
          'numbers (x_0,...,x_{d-1},y).')

  @classmethod
  def _CheckParams(cls, p, owner):
    super()._CheckParams(p, owner)
    validation.CheckInt(owner, 'input_dim', p.input_dim)
    validation.CheckInt(owner, 'teacher_seed', p.teacher_seed, 0)
    validation.CheckNumber(owner, 'noise_stddev', p.noise_stddev, 0)
    validation.CheckInt(owner, 'first_example', p.first_example, 0)
    validation.CheckInt(owner, 'num_examples', p.num_examples)

  @classmethod
  def BatchShapes(cls, params):
    """x [batch, input_dim], y [batch]; batch is None unless
    fixed_input_shape (the last batch of a pass may be short)."""
    b = params.batch_size if params.fixed_input_shape else None
    return NestedMap(x=shapes.Shape([b, params.input_dim]),
                     y=shapes.Shape([b]))

  def _NeedsFiles(self):
    return False

  def _RecordDataset(self):
    if self.files:
      return super()._RecordDataset()
    records = tf.data.Dataset.range(self.params.num_examples)
    return records.repeat() if self.params.repeat else records

  def _ProcessRecord(self, record):
    p = self.params
    if record.dtype == tf.string:  # A CSV line.
      values = tf.strings.to_number(tf.strings.split(record, ','), tf.float32)
      values = tf.ensure_shape(values, [p.input_dim + 1])
      return NestedMap(x=values[:-1], y=values[-1])
    x, y = self._data
    return NestedMap(x=tf.gather(x, record), y=tf.gather(y, record))

  def _ProcessRecordBatch(self, records):
    p = self.params
    if records.dtype == tf.string:  # [n] CSV lines.
      values = tf.strings.to_number(tf.strings.split(records, ','),
                                    tf.float32).to_tensor()
      values = tf.ensure_shape(values, [None, p.input_dim + 1])
      return NestedMap(x=values[:, :-1], y=values[:, -1])
    return self._ProcessRecord(records)


class RegressionModel(base_model.BaseTask):
  """A feed-forward regressor trained with mean squared error.

  Metrics: loss (MSE), mae. Decode: per-example predictions and targets.

  With `pipeline_tpl` (a gpipe.PipeliningLayer.Params()) the layers run as a
  pipeline of `pipeline_cells` cells of near-equal FLOPs (one per device of
  the model split): the smallest model that exercises pipelining and data
  parallelism together.

  With `net_tpl` the network is one's own: any layer mapping x [batch,
  input_dim] to [batch, 1], e.g. a gpipe_stack.GPipeStack of one's own
  layers (the README's "Pipeline your own model"). A network made of
  units (layers/gpipe_units.py) runs the loss of each micro-batch where
  its schedule needs it (FPropLoss), and its FPropMeta's pipeline plan is
  the task's: the memory estimate, inspect and --mode=plan read it.

  Example:
    p = RegressionModel.Params().Set(name='reg', input_dim=4,
                                     hidden_dims=[8])
    task = p.Instantiate()
    metrics, _ = task.FPropTower(task.theta, NestedMap(
        x=tf.ones([2, 4]), y=tf.zeros([2])))
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('input_dim', 8, 'Features per example, an int > 0.')
    p.Define('hidden_dims', [16], 'Widths of the hidden layers (may be '
             'empty: a linear model).')
    p.Define('activation', 'RELU', 'Activation of the hidden layers: a name, '
             'or a list of one name per hidden layer.')
    p.Define('dropout_prob', 0.0, 'Dropout between the layers, in [0, 1).')
    p.Define('pipeline_tpl', None, 'None (a FeedForwardNet), or a '
             'gpipe.PipeliningLayer.Params() whose cells are the layers cut '
             'into pipeline_cells cells.')
    p.Define('pipeline_cells', 1, 'Cells of the pipeline (with pipeline_tpl)'
             ', an int in [1, number of layers].')
    p.Define('net_tpl', None, 'None (the network of hidden_dims above), or '
             'the params of a network of one\'s own: a layer mapping x '
             '[batch, input_dim] to [batch, 1], e.g. a GPipeStack '
             '(layers/gpipe_stack.py).')
    return p

  @classmethod
  def _NetParams(cls, p):
    if p.net_tpl is not None:
      return p.net_tpl.Copy().Set(name='net')
    dims = list(p.hidden_dims) + [1]
    acts = (list(p.activation) if isinstance(p.activation, (list, tuple))
            else [p.activation] * len(p.hidden_dims)) + ['NONE']
    ffn = linear.FeedForwardNet.Params().Set(
        name='net', input_dim=p.input_dim, hidden_layer_dims=dims,
        activation=acts, dropout_prob=p.dropout_prob)
    if p.pipeline_tpl is None:
      return ffn
    layers = []
    for i, (d_in, d_out, act) in enumerate(
        zip([p.input_dim] + dims[:-1], dims, acts)):
      if i and p.dropout_prob:
        layers.append(dropout.DropoutLayer.Params().Set(
            name=f'drop{i}', keep_prob=1.0 - p.dropout_prob))
      layers.append(linear.ProjectionLayer.Params().Set(
          name=f'fc{i}', input_dim=d_in, output_dim=d_out, activation=act))
    cells = gpipe.PartitionSequentialLayers(
        layers, p.pipeline_cells, shapes.Shape([1, p.input_dim]))
    return p.pipeline_tpl.Copy().Set(name='net', cell_tpl=cells)

  def __init__(self, params):
    super().__init__(params)
    self.CheckParams(self.params, validation.Owner(self))
    self.CreateChild('net', self._NetParams(self.params))
    self.CreateChild('loss', self._LossParams())

  @staticmethod
  def _LossParams():
    """The loss after the network: its squared and absolute errors."""
    return losses.SquaredErrorLoss.Params().Set(name='loss')

  @classmethod
  def CheckParams(cls, p, owner):
    """Raises ValueError for a bad task param; __init__ and FPropMeta (so
    the task's static check) call it before the layers are made of them."""
    validation.CheckInt(owner, 'input_dim', p.input_dim)
    if not isinstance(p.hidden_dims, (list, tuple)):
      raise validation.Error(owner, 'hidden_dims', p.hidden_dims,
                             'must be a list of ints >= 1 (may be empty).')
    for i, d in enumerate(p.hidden_dims):
      validation.CheckInt(owner, f'hidden_dims[{i}]', d)
    if isinstance(p.activation, (list, tuple)):
      if len(p.activation) != len(p.hidden_dims):
        raise validation.Error(
            owner, 'activation', p.activation,
            f'has {len(p.activation)} entries but hidden_dims has '
            f'{len(p.hidden_dims)}; give one per hidden layer or a single '
            'string.')
      for i, name in enumerate(p.activation):
        activations.CheckName(owner, f'activation[{i}]', name)
    else:
      activations.CheckName(owner, 'activation', p.activation)
    validation.CheckProb(owner, 'dropout_prob', p.dropout_prob)
    pipe = p.pipeline_tpl
    if pipe is not None and not (
        isinstance(pipe, hyperparams.InstantiableParams) and
        isinstance(pipe.cls, type) and
        issubclass(pipe.cls, gpipe.PipeliningLayer)):
      raise validation.Error(owner, 'pipeline_tpl', getattr(pipe, 'cls', pipe),
                             'must be None (a FeedForwardNet) or a '
                             'gpipe.PipeliningLayer.Params().')
    validation.CheckInt(owner, 'pipeline_cells', p.pipeline_cells)
    net = p.net_tpl
    if net is not None:
      if not (isinstance(net, hyperparams.InstantiableParams) and
              isinstance(net.cls, type) and
              issubclass(net.cls, base_layer.BaseLayer)):
        raise validation.Error(owner, 'net_tpl', getattr(net, 'cls', net),
                               'must be None or a layer\'s Params() (e.g. '
                               'gpipe_stack.GPipeStack.Params()).')
      if pipe is not None:
        raise validation.Error(owner, 'pipeline_tpl', pipe.cls.__name__,
                               'must be None with net_tpl: the network of '
                               'one\'s own holds its pipeline.')

  def ComputePredictions(self, theta, input_batch):
    out = self.children.net.FProp(theta.net, input_batch.x)  # [batch, 1]
    return NestedMap(y=tf.squeeze(out, -1))                   # [batch]

  def _LossSums(self, theta, outputs, side):
    """Sums of the squared and absolute errors of outputs [b, 1] against
    `side.y` [b] (a batch or a micro-batch): the loss layer's
    NestedMap(loss, abs_error, examples) scalars and [b] squared_error."""
    return self.children.loss.FProp(theta, outputs, side.y)

  @staticmethod
  def _Metrics(sums):
    n = sums.examples
    return (NestedMap(loss=(sums.loss / n, n), mae=(sums.abs_error / n, n)),
            NestedMap(squared_error=sums.squared_error))

  def ComputeLoss(self, theta, predictions, input_batch):
    err = predictions.y - tf.cast(input_batch.y, predictions.y.dtype)
    n = tf.cast(tf.size(err), tf.float32)
    metrics = NestedMap(loss=(tf.reduce_mean(tf.square(err)), n),
                        mae=(tf.reduce_mean(tf.abs(err)), n))
    return metrics, NestedMap(squared_error=tf.square(err))

  def FPropTower(self, theta, input_batch):
    """BaseTask's; a network made of units (net_tpl) runs the loss of each
    micro-batch where its schedule needs it, and updates its batch norms'
    moving statistics after it."""
    net = self.children.net
    if self.params.is_inference or not isinstance(
        net, gpipe_units.UnitsPipeline):
      return super().FPropTower(theta, input_batch)
    loss = gpipe.PipelineCell(fprop=self._LossSums, theta=theta.loss,
                              meta=None)
    sums, stats = net.FPropLossStats(theta.net, input_batch.x, loss=loss,
                                     side_inputs=NestedMap(y=input_batch.y))
    net.UpdateMovingStats(stats)
    return self._Metrics(sums)

  def Inference(self, batch_size=None, max_len=None):
    """`predict` for serving; see BaseTask.Inference: x [batch, input_dim]
    float32 -> y [batch] float32, the network as the evaler runs it (a
    pipelined one built on one device for the export, its stages run one
    after the other on the whole batch, framework/jobs/export.py)."""
    inference.CheckDims(f'{validation.Owner(self)} Inference', batch_size,
                        max_len, uses_max_len=False)

    def _Predict(theta, x):
      y = self.ComputePredictions(theta, NestedMap(x=x)).y
      return dict(y=tf.cast(y, tf.float32))

    dim = self.params.input_dim
    spec = tf.TensorSpec([batch_size, dim], tf.float32)
    return inference.InferenceGraph(
        signatures=dict(predict=inference.Signature(
            _Predict, dict(x=spec),
            f'predict(x [batch, {dim}] float32) -> y [batch] float32: the '
            'regression\'s prediction of each row.')),
        doc=f'{type(self).__name__} {self.path!r}: [batch, {dim}] -> '
        '[batch].')

  def Decode(self, theta, input_batch):
    pred = self.ComputePredictions(theta, input_batch)
    return NestedMap(prediction=pred.y, target=input_batch.y)

  def CreateDecoderMetrics(self):
    return {'mae': base_model.AverageMetric(),
            'mse': base_model.AverageMetric()}

  def PostProcessDecodeOut(self, decode_out, decoder_metrics):
    err = np.asarray(decode_out.prediction) - np.asarray(decode_out.target)
    decoder_metrics['mae'].Update(np.mean(np.abs(err)), err.size)
    decoder_metrics['mse'].Update(np.mean(np.square(err)), err.size)
    return [f'target={t:.4f} prediction={y:.4f}' for t, y in
            zip(decode_out.target, decode_out.prediction)]

  @classmethod
  def FPropMeta(cls, params, input_shapes):
    cls.CheckParams(params, validation.Owner(params))
    x = shapes.AsShape(input_shapes.x)
    net_p = cls._NetParams(params)
    if params.net_tpl is not None:   # One's own network; its plan, if any.
      net_p = base_layer.InheritParams(params, net_p)
      meta = base_layer.FPropCost(net_p, x)   # The contract checked.
      plan = meta.get('plan')
      if plan is not None:   # Its loss, as a layer, after its units.
        plan = gpipe_units.Plan(net_p.cls, net_p, x, ends=gpipe_units.Ends(
            loss=gpipe_units.Layer('loss', cls._LossParams()),
            loss_inputs=lambda rows: [(tf.TensorSpec([rows], tf.float32),
                                       None)]))
      units = (list(plan.before) + plan.UnitsAt(x[0])
               if plan is not None and x[0] else [])
      breakdown = ([(u.name, u.cost.flops) for u in units] or
                   [('net', meta.flops)])
      breakdown.append(('loss', shapes.Mul(x[0], 4)))
      flops = 0
      for _, f in breakdown:
        flops = shapes.Add(flops, f)
      return cost.Cost(flops=flops, out_shapes=(), breakdown=breakdown,
                       plan=plan)
    breakdown, shape = [], x
    if params.pipeline_tpl is not None:
      net_p = base_model.base_layer.InheritParams(params, net_p)
      breakdown.append(('net', net_p.cls.FPropMeta(net_p, x).flops))
    for i, (d_in, d_out) in enumerate(() if breakdown else
        zip([params.input_dim] + net_p.hidden_layer_dims[:-1],
            net_p.hidden_layer_dims)):
      fc_p = linear.ProjectionLayer.Params().Set(
          name=f'fc{i}', input_dim=d_in, output_dim=d_out,
          activation=net_p.activation[i])
      meta = linear.ProjectionLayer.FPropMeta(fc_p, shape)
      breakdown.append((f'net.fc[{i}]', meta.flops))
      shape = meta.out_shapes[0]
    # Loss: a subtract, square and sum per example, and |err| for mae.
    breakdown.append(('loss', shapes.Mul(x[0], 4)))
    flops = 0
    for _, f in breakdown:
      flops = shapes.Add(flops, f)
    return cost.Cost(flops=flops, out_shapes=(), breakdown=breakdown)
