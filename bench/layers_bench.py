"""Overhead of Cadence layers against the same math in plain TF ops.

Times one forward + backward step (loss = sum(out^2), gradients for every
variable) of
  * a TransformerLayer, causal, paddings on, dropout off: d 256, 4 heads,
    ffn 1024, batch 8, seq 64; and d 512, 8 heads, ffn 2048, batch 16,
    seq 128;
  * a conv block: two 3x3 SAME convs (64 -> 64, ReLU) and a 2x2 max pool on
    [32, 32, 32, 64], as a SequentialLayer;
each against a hand-written tf.function on the very same variables. Both run
in one process, warmed up, timed in interleaved repeats; the table gives
median wall and CPU (process) times, the ratios Cadence / plain (target
<= 1.00) and the op count of each traced step (Cadence / plain).

Run:
  .venv/bin/python bench/layers_bench.py [--repeats 15]
"""
import argparse
import statistics
import time

import bench_log
import tensorflow as tf

from cadence.layers import combinators
from cadence.layers import conv
from cadence.layers import transformer


# --- plain-TF references ---------------------------------------------------

def _PlainLayerNorm(x, scale, bias, eps=1e-6):
  mean = tf.reduce_mean(x, axis=-1, keepdims=True)
  centred = x - mean
  var = tf.reduce_mean(tf.square(centred), axis=-1, keepdims=True)
  return centred * tf.math.rsqrt(var + eps) * scale + bias


def _PlainTransformer(v, x, paddings, num_heads):
  """Pre-LN transformer layer on the Cadence layer's variables `v`."""
  b, t, d = x.shape
  dh = d // num_heads
  a = v['atten']

  def Heads(y):  # [b*t, d] -> [b, h, t, dh]
    return tf.transpose(tf.reshape(y, [b, t, num_heads, dh]), [0, 2, 1, 3])

  h = tf.reshape(_PlainLayerNorm(x, v['ln_atten']['scale'],
                                 v['ln_atten']['bias']), [b * t, d])
  q = Heads(tf.matmul(h, a['query_w']) + a['query_b']) * dh**-0.5
  k = Heads(tf.matmul(h, a['key_w']) + a['key_b'])
  val = Heads(tf.matmul(h, a['value_w']) + a['value_b'])
  logits = tf.matmul(q, k, transpose_b=True)              # [b, h, t, t]
  visible = tf.logical_and((paddings < 0.5)[:, None, None, :],
                           tf.linalg.band_part(tf.ones([t, t], tf.bool), -1,
                                               0))
  logits = tf.where(visible, logits, -0.7 * tf.float32.max)
  probs = tf.nn.softmax(logits)
  ctx = tf.reshape(tf.transpose(tf.matmul(probs, val), [0, 2, 1, 3]),
                   [b * t, d])
  x = x + tf.reshape(tf.matmul(ctx, a['post_w']) + a['post_b'], [b, t, d])
  fc0, fc1 = v['ffn']['fc']
  h = tf.reshape(_PlainLayerNorm(x, v['ln_ffn']['scale'], v['ln_ffn']['bias']),
                 [b * t, d])
  h = tf.nn.relu(tf.matmul(h, fc0['w']) + fc0['b'])
  return x + tf.reshape(tf.matmul(h, fc1['w']) + fc1['b'], [b, t, d])


def _PlainConvBlock(v, x):
  for layer in v['sub'][:2]:
    x = tf.nn.relu(tf.nn.bias_add(
        tf.nn.conv2d(x, layer['w'], strides=1, padding='SAME'), layer['b']))
  return tf.nn.max_pool2d(x, ksize=2, strides=2, padding='VALID')


# --- timing ----------------------------------------------------------------

def _TrainStep(forward, variables):
  """A tf.function: loss = sum(forward()^2) and its variable gradients."""

  @tf.function
  def Step(*inputs):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(tf.square(forward(*inputs)))
    return loss, tape.gradient(loss, variables)

  return Step


def _Time(fn, inputs):
  """(wall, CPU) seconds of one call."""
  start, cpu = time.perf_counter(), time.process_time()
  loss, grads = fn(*inputs)
  loss.numpy()
  for g in grads:
    g.numpy()
  return time.perf_counter() - start, time.process_time() - cpu


def _NumOps(fn, inputs):
  return len(fn.get_concrete_function(*inputs).graph.get_operations())


def _Compare(name, cadence_fn, plain_fn, inputs, repeats, warmup):
  """Warm up both, then alternate them; returns a table row."""
  bench_log.Say(f'{name}: tracing and warming up both steps...')
  a, b = cadence_fn(*inputs), plain_fn(*inputs)
  # Difference of the loss and all gradients together, relative to their
  # norm (per-tensor ratios mislead: some gradients are ~0 by symmetry).
  diff_sq = sum(float(tf.reduce_sum(tf.square(x - y)))
                for x, y in zip([a[0]] + list(a[1]), [b[0]] + list(b[1])))
  norm_sq = sum(float(tf.reduce_sum(tf.square(y))) for y in [b[0]] + b[1])
  rel = (diff_sq / max(norm_sq, 1e-30))**0.5
  for _ in range(warmup):
    _Time(cadence_fn, inputs)
    _Time(plain_fn, inputs)
  times_c, times_p = [], []
  for i in range(repeats):
    if i % 5 == 0:
      bench_log.Say(f'{name}: repeats {i + 1}-{min(i + 5, repeats)} of '
                    f'{repeats}...')
    # Alternate which goes first, so neither always runs on a warmer cache.
    if i % 2 == 0:
      times_c.append(_Time(cadence_fn, inputs))
      times_p.append(_Time(plain_fn, inputs))
    else:
      times_p.append(_Time(plain_fn, inputs))
      times_c.append(_Time(cadence_fn, inputs))
  med = lambda ts, i: statistics.median(t[i] for t in ts)
  # Ratio of adjacent pairs: robust to load that drifts during the run.
  pair_ratio = statistics.median(c[0] / p[0]
                                 for c, p in zip(times_c, times_p))
  return (name, med(times_c, 0) * 1e3, med(times_p, 0) * 1e3,
          med(times_c, 0) / med(times_p, 0), pair_ratio,
          med(times_c, 1) / med(times_p, 1), rel,
          f'{_NumOps(cadence_fn, inputs)}/{_NumOps(plain_fn, inputs)}')


def _TransformerCase(repeats, warmup, d, h, f, b, t):
  p = transformer.TransformerLayer.Params().Set(
      name='xformer', input_dim=d, hidden_dim=f, num_heads=h,
      mask_self_atten=True)
  layer = p.Instantiate()
  variables = layer.vars.Flatten()
  x = tf.random.stateless_normal([b, t, d], seed=[1, 2])
  lengths = tf.random.stateless_uniform([b], [3, 4], t // 2, t + 1, tf.int32)
  paddings = 1.0 - tf.sequence_mask(lengths, t, tf.float32)
  cadence_fn = _TrainStep(lambda x, pads: layer(x, pads), variables)
  plain_fn = _TrainStep(
      lambda x, pads: _PlainTransformer(layer.vars, x, pads, h), variables)
  return _Compare(f'TransformerLayer d{d} h{h} ff{f} [{b},{t}]', cadence_fn,
                  plain_fn, (x, paddings), repeats, warmup)


def _ConvCase(repeats, warmup):
  conv_p = conv.Conv2DLayer.Params().Set(filter_shape=[3, 3, 64, 64],
                                         activation='RELU')
  p = combinators.SequentialLayer.Params().Set(name='block', sub=[
      conv_p.Copy().Set(name='conv0'), conv_p.Copy().Set(name='conv1'),
      conv.PoolingLayer.Params().Set(name='pool')])
  layer = p.Instantiate()
  variables = layer.vars.Flatten()
  x = tf.random.stateless_normal([32, 32, 32, 64], seed=[5, 6])
  cadence_fn = _TrainStep(layer.FPropDefaultTheta, variables)
  plain_fn = _TrainStep(lambda x: _PlainConvBlock(layer.vars, x), variables)
  return _Compare('2x Conv3x3 64 + MaxPool [32,32,32,64]', cadence_fn,
                  plain_fn, (x,), repeats, warmup)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--repeats', type=int, default=15,
                      help='Timed repeats of each function (median taken).')
  parser.add_argument('--warmup', type=int, default=3,
                      help='Untimed runs of each function first.')
  args = parser.parse_args(argv)
  device = 'GPU' if tf.config.list_physical_devices('GPU') else 'CPU'
  rows = [_TransformerCase(args.repeats, args.warmup, 256, 4, 1024, 8, 64),
          _TransformerCase(args.repeats, args.warmup, 512, 8, 2048, 16, 128),
          _ConvCase(args.repeats, args.warmup)]
  print(f'\nFProp + backprop, median of {args.repeats} interleaved repeats '
        f'on {device} (TF {tf.__version__})')
  print('ratio = median cadence / median plain (wall); pair ratio = median '
        'of the per-repeat wall ratios; CPU ratio = of the median CPU '
        'times; rel diff = |loss, grads difference| / |plain|; ops = '
        'cadence/plain graph ops.')
  header = ('case', 'cadence ms', 'plain tf ms', 'ratio', 'pair ratio',
            'CPU ratio', 'rel diff', 'ops')
  print(f'{header[0]:<42} {header[1]:>11} {header[2]:>12} {header[3]:>7} '
        f'{header[4]:>11} {header[5]:>10} {header[6]:>9} {header[7]:>9}')
  for name, c, pl, ratio, pair, cpu, diff, ops in rows:
    print(f'{name:<42} {c:>11.2f} {pl:>12.2f} {ratio:>7.3f} {pair:>11.3f} '
          f'{cpu:>10.3f} {diff:>9.1e} {ops:>9}')


if __name__ == '__main__':
  main()
