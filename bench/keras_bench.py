"""A Keras Transformer block trained three ways, timed in one run.

The block (pre-LN: LayerNorm -> MultiHeadAttention -> residual, LayerNorm
-> Dense(ffn, relu) -> Dense(d) -> residual) as
  * plain Keras: a keras.Model, a tf.function step of tf.GradientTape +
    optimizer.apply_gradients on model.trainable_variables (what
    `model.fit` runs per batch);
  * KerasLayer: the same keras.Model wrapped as a Cadence layer, FProp with
    theta (keras.StatelessScope), gradients by the layer's vars, the same
    Keras SGD applied to the same variables;
  * native Cadence: layers/transformer.py's TransformerLayer of the same
    sizes, gradients by its vars, SGD by assign_sub.
Each step is one tf.function (forward, backward, SGD update), warmed up,
then timed in interleaved repeats; the table gives medians and the ratio
to plain Keras (target for KerasLayer: <= 1.05).

Run:
  .venv/bin/python bench/keras_bench.py [--repeats 20] [--batch 8]
"""
import argparse
import statistics
import time

import keras
import tensorflow as tf

from cadence.layers import keras_layer
from cadence.layers import transformer

_LR = 1e-3


def KerasTransformerBlock(seq_len=64, dim=256, num_heads=4, ffn_dim=1024):
  """A pre-LN Transformer block as a functional keras.Model.

  Returns:
    keras.Model mapping [batch, seq_len, dim] to [batch, seq_len, dim].
  """
  x = keras.Input((seq_len, dim))
  h = keras.layers.LayerNormalization(epsilon=1e-6)(x)
  h = keras.layers.MultiHeadAttention(num_heads, dim // num_heads)(h, h)
  x = x + h
  h = keras.layers.LayerNormalization(epsilon=1e-6)(x)
  h = keras.layers.Dense(ffn_dim, activation='relu')(h)
  return keras.Model(x, x + keras.layers.Dense(dim)(h))


def _Loss(y):
  return tf.reduce_mean(tf.square(y))


def _PlainKerasStep(sizes):
  model = KerasTransformerBlock(**sizes)
  opt = keras.optimizers.SGD(_LR)
  opt.build(model.trainable_variables)   # Before the tf.function traces.

  @tf.function(autograph=False)
  def Step(x):
    with tf.GradientTape() as tape:
      loss = _Loss(model(x))
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    return loss

  return Step


def _KerasLayerStep(sizes):
  layer = keras_layer.KerasLayer.Params().Set(
      name='block', layer=KerasTransformerBlock, kwargs=sizes).Instantiate()
  # The Keras weights behind the layer's vars, in the vars' order.
  by_id = {id(w.value): w for w in layer.keras_object.trainable_variables}
  variables = layer.vars.Flatten()
  keras_weights = [by_id[id(v)] for v in variables]
  opt = keras.optimizers.SGD(_LR)
  opt.build(keras_weights)

  @tf.function(autograph=False)
  def Step(x):
    with tf.GradientTape() as tape:
      loss = _Loss(layer.FProp(layer.theta, x))
    grads = tape.gradient(loss, variables)
    opt.apply_gradients(zip(grads, keras_weights))
    return loss

  return Step


def _NativeStep(sizes):
  layer = transformer.TransformerLayer.Params().Set(
      name='block', input_dim=sizes['dim'], hidden_dim=sizes['ffn_dim'],
      num_heads=sizes['num_heads']).Instantiate()
  variables = layer.vars.Flatten()

  @tf.function(autograph=False)
  def Step(x):
    with tf.GradientTape() as tape:
      loss = _Loss(layer.FProp(layer.theta, x))
    for v, g in zip(variables, tape.gradient(loss, variables)):
      v.assign_sub(_LR * g)
    return loss

  return Step


def _Time(step, x):
  start = time.perf_counter()
  step(x).numpy()
  return time.perf_counter() - start


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--repeats', type=int, default=20,
                      help='Timed repeats of each step (median taken).')
  parser.add_argument('--warmup', type=int, default=3,
                      help='Untimed runs of each step first.')
  parser.add_argument('--batch', type=int, default=8, help='Batch size.')
  args = parser.parse_args(argv)
  sizes = dict(seq_len=64, dim=256, num_heads=4, ffn_dim=1024)
  x = tf.random.stateless_normal([args.batch, sizes['seq_len'],
                                  sizes['dim']], [1, 2])
  steps = {'plain Keras': _PlainKerasStep(sizes),
           'KerasLayer (Cadence)': _KerasLayerStep(sizes),
           'native TransformerLayer': _NativeStep(sizes)}
  for step in steps.values():
    for _ in range(args.warmup):
      step(x).numpy()
  times = {name: [] for name in steps}
  for _ in range(args.repeats):   # Interleaved: load drifts hit all alike.
    for name, step in steps.items():
      times[name].append(_Time(step, x))
  base = times['plain Keras']
  device = 'GPU' if tf.config.list_physical_devices('GPU') else 'CPU'
  print(f'\nTransformer block d={sizes["dim"]} heads={sizes["num_heads"]} '
        f'ffn={sizes["ffn_dim"]} batch={args.batch} seq={sizes["seq_len"]}: '
        f'forward + backward + SGD, median of {args.repeats} interleaved '
        f'repeats on {device} (TF {tf.__version__}, Keras '
        f'{keras.__version__})')
  print('ratio = median / median plain Keras; pair ratio = median of the '
        'per-repeat ratios.')
  print(f'{"step":<26} {"ms":>8} {"ratio":>7} {"pair ratio":>11}')
  for name, ts in times.items():
    ratio = statistics.median(ts) / statistics.median(base)
    pair = statistics.median(t / b for t, b in zip(ts, base))
    print(f'{name:<26} {1e3 * statistics.median(ts):>8.2f} {ratio:>7.3f} '
          f'{pair:>11.3f}')


if __name__ == '__main__':
  main()
