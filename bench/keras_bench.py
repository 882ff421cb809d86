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
then timed in interleaved repeats (the order alternating); the table gives
median wall and CPU (process) milliseconds and the ratios to plain Keras
(targets: KerasLayer <= 1.05, native <= 1.00). Before timing, the Keras
model takes the native layer's weights and both outputs are compared
(`same math`: their largest difference, relative to the largest output),
so the two compute the same block (parameter counts equal too).

Sizes (`--sizes`, default both): d256 = d 256, 4 heads, ffn 1024, batch
8 x 64; d512 = d 512, 8 heads, ffn 2048, batch 16 x 128.

Run:
  .venv/bin/python bench/keras_bench.py [--repeats 20] [--sizes d256,d512]
"""
import argparse
import statistics
import time

import bench_log
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
  inputs = keras.Input((seq_len, dim))
  h = keras.layers.LayerNormalization(epsilon=1e-6)(inputs)
  h = keras.layers.MultiHeadAttention(num_heads, dim // num_heads)(h, h)
  x = inputs + h
  h = keras.layers.LayerNormalization(epsilon=1e-6)(x)
  h = keras.layers.Dense(ffn_dim, activation='relu')(h)
  return keras.Model(inputs, x + keras.layers.Dense(dim)(h))


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


def _NativeLayer(sizes):
  return transformer.TransformerLayer.Params().Set(
      name='block', input_dim=sizes['dim'], hidden_dim=sizes['ffn_dim'],
      num_heads=sizes['num_heads']).Instantiate()


def _NativeStep(sizes):
  layer = _NativeLayer(sizes)
  variables = layer.vars.Flatten()

  @tf.function(autograph=False)
  def Step(x):
    with tf.GradientTape() as tape:
      loss = _Loss(layer.FProp(layer.theta, x))
    for v, g in zip(variables, tape.gradient(loss, variables)):
      v.assign_sub(_LR * g)
    return loss

  return Step


def _CopyNativeWeights(model, layer):
  """Gives the Keras block the native layer's weights (heads: contiguous
  dh-slices of the hidden dim in both)."""
  norms = [l for l in model.layers
           if isinstance(l, keras.layers.LayerNormalization)]
  mha, = [l for l in model.layers
          if isinstance(l, keras.layers.MultiHeadAttention)]
  dense = [l for l in model.layers if isinstance(l, keras.layers.Dense)]
  v = layer.vars
  for norm, ln in zip(norms, (v.ln_atten, v.ln_ffn)):
    norm.set_weights([ln.scale.numpy(), ln.bias.numpy()])
  a = v.atten
  weights = []
  for name in ('query', 'key', 'value'):
    w = a[f'{name}_w'].numpy()
    heads = mha.get_weights()[len(weights)].shape[1:]
    weights += [w.reshape((w.shape[0],) + heads),
                a[f'{name}_b'].numpy().reshape(heads)]
  post = a.post_w.numpy()
  weights += [post.reshape(weights[0].shape[1:] + post.shape[-1:]),
              a.post_b.numpy()]
  mha.set_weights(weights)
  for d, fc in zip(dense, v.ffn.fc):
    d.set_weights([fc.w.numpy(), fc.b.numpy()])


def _SameMath(sizes, x):
  """(max |output difference| / max |output|, Keras params, native params)
  of the two blocks on the same weights."""
  model = KerasTransformerBlock(**sizes)
  layer = _NativeLayer(sizes)
  _CopyNativeWeights(model, layer)
  want = model(x)
  diff = tf.reduce_max(tf.abs(want - layer.FProp(layer.theta, x)))
  count = lambda vs: sum(int(v.shape.num_elements()) for v in vs)
  return (float(diff / tf.reduce_max(tf.abs(want))),
          count(model.trainable_variables), count(layer.vars.Flatten()))


def _Time(step, x):
  """(wall, CPU) seconds of one step."""
  start, cpu = time.perf_counter(), time.process_time()
  step(x).numpy()
  return time.perf_counter() - start, time.process_time() - cpu


def _Bench(name, sizes, batch, repeats, warmup):
  bench_log.Say(f'{name}: comparing the math, building and warming up the '
                '3 steps...')
  x = tf.random.stateless_normal([batch, sizes['seq_len'], sizes['dim']],
                                 [1, 2])
  diff, keras_params, native_params = _SameMath(sizes, x)
  if keras_params != native_params:
    raise RuntimeError(f'{name}: the Keras block has {keras_params} '
                       f'parameters, the native {native_params}.')
  steps = {'plain Keras': _PlainKerasStep(sizes),
           'KerasLayer (Cadence)': _KerasLayerStep(sizes),
           'native TransformerLayer': _NativeStep(sizes)}
  for step in steps.values():
    for _ in range(warmup):
      step(x).numpy()
  times = {name: [] for name in steps}
  for r in range(repeats):   # Interleaved: load drifts hit all alike.
    if r % 5 == 0:
      bench_log.Say(f'{name}: timing repeats {r + 1}-{min(r + 5, repeats)} '
                    f'of {repeats}...')
    for step_name in (list(steps) if r % 2 == 0 else list(steps)[::-1]):
      times[step_name].append(_Time(steps[step_name], x))
  print(f'\n{name}: Transformer block d={sizes["dim"]} '
        f'heads={sizes["num_heads"]} ffn={sizes["ffn_dim"]} batch={batch} '
        f'seq={sizes["seq_len"]}, {keras_params:,} parameters; same math: '
        f'max output difference {diff:.1e} of the largest output')
  print(f'{"step":<26} {"wall ms":>8} {"ratio":>7} {"pair ratio":>11} '
        f'{"CPU ms":>8} {"CPU ratio":>10}')
  base = times['plain Keras']
  med = lambda ts, i: statistics.median(t[i] for t in ts)
  for step_name, ts in times.items():
    pair = statistics.median(t[0] / b[0] for t, b in zip(ts, base))
    print(f'{step_name:<26} {1e3 * med(ts, 0):>8.2f} '
          f'{med(ts, 0) / med(base, 0):>7.3f} {pair:>11.3f} '
          f'{1e3 * med(ts, 1):>8.2f} {med(ts, 1) / med(base, 1):>10.3f}')


_SIZES = {
    'd256': (dict(seq_len=64, dim=256, num_heads=4, ffn_dim=1024), 8),
    'd512': (dict(seq_len=128, dim=512, num_heads=8, ffn_dim=2048), 16),
}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--repeats', type=int, default=20,
                      help='Timed repeats of each step (median taken).')
  parser.add_argument('--warmup', type=int, default=3,
                      help='Untimed runs of each step first.')
  parser.add_argument('--sizes', default='d256,d512',
                      help=f'Comma-separated, of {", ".join(_SIZES)}.')
  parser.add_argument('--batch', type=int, default=0,
                      help='Batch size; 0: the size\'s own (8, 16).')
  args = parser.parse_args(argv)
  names = args.sizes.split(',')
  for name in names:
    if name not in _SIZES:
      parser.error(f'--sizes: unknown size {name!r}; known: '
                   f'{", ".join(_SIZES)}.')
  device = 'GPU' if tf.config.list_physical_devices('GPU') else 'CPU'
  print(f'Forward + backward + SGD, median of {args.repeats} interleaved '
        f'repeats on {device} (TF {tf.__version__}, Keras '
        f'{keras.__version__}); ratio = median / median plain Keras; pair '
        'ratio = median of the per-repeat wall ratios.')
  for name in names:
    sizes, batch = _SIZES[name]
    _Bench(name, sizes, args.batch or batch, args.repeats, args.warmup)


if __name__ == '__main__':
  main()
