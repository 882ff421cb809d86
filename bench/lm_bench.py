"""Training speed of the Tiny GPipe LM: Cadence (plain, pipelined) vs plain TF.

Model: `lm.one_billion_wds.OneBWdsGPipeTransformerTiny` (4 pre-LN causal
layers, d 128, 4 heads, feed-forward 512, vocab 512; batch 32 x seq 64 =
2048 tokens a step) on its embedded synthetic corpus. One training step =
forward + backward + gradient clipping + Adam with the rsqrt schedule,
compiled with tf.function, on batches already in memory:

  plain TF:       the same network written directly in TensorFlow ops (no
                  Cadence layers), on a copy of the Cadence weights; it
                  computes the same loss (checked: |diff| printed);
  splits=1:       LanguageModel with the plain TransformerStack;
  splits=2, M=4:  LanguageModel with the GPipe stack, 2 cells on 2 logical
                  CPUs, 4 micro-batches (the experiment's setting).

Steps are timed in interleaved rounds; the table gives the median step time,
tokens/s (b x t positions a second) and the ratio to plain TF. Achieved
FLOP/s = 3 x FPropMeta's forward FLOPs a step / step time; the peak is a
float32 1024^3 matmul chain measured in this run
(train_report.MeasurePeakFlops),
and MFU their ratio. The input pipeline alone (the Train `Dataset()` the
trainer iterates) must deliver at least 5x the fastest model's tokens/s.

The logical CPUs share this machine's cores, so the pipeline shows its
overhead here, not a speed-up.

Run:
  .venv/bin/python bench/lm_bench.py [--rounds 5]
"""
import argparse
import math
import os
import statistics
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import bench_log  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

_CPUS = tf.config.list_physical_devices('CPU')
tf.config.set_logical_device_configuration(
    _CPUS[0], [tf.config.LogicalDeviceConfiguration()] * 2)

from cadence.framework import base_layer  # pylint: disable=g-import-not-at-top
from cadence.framework import cluster as cluster_lib  # pylint: disable=g-import-not-at-top
from cadence.framework import model_registry  # pylint: disable=g-import-not-at-top
from cadence.framework.nested_map import NestedMap  # pylint: disable=g-import-not-at-top
from cadence.framework import shapes  # pylint: disable=g-import-not-at-top
from cadence.framework import step_seed  # pylint: disable=g-import-not-at-top
from cadence.framework.train import train_report  # pylint: disable=g-import-not-at-top
from cadence.layers import transformer  # pylint: disable=g-import-not-at-top
from cadence.tasks.lm import model  # pylint: disable=g-import-not-at-top

KEY = 'lm.one_billion_wds.OneBWdsGPipeTransformerTiny'
NUM_BATCHES = 8   # Distinct in-memory batches cycled by the timed steps.


def _Params(data_dir, splits, micro_batches):
  p = model_registry.GetParams(KEY, 'Train')
  if data_dir:
    p.input.data_dir = data_dir
  stack = p.task.stack_tpl
  if splits == 1 and micro_batches == 1:   # The plain TransformerStack.
    p.task.stack_tpl = transformer.TransformerStack.Params().Set(
        num_layers=stack.num_layers, transformer_tpl=stack.transformer_tpl)
  else:
    stack.splits = splits
    stack.pipeline_tpl.num_micro_batches = micro_batches
  return p


# --- the Cadence step ---------------------------------------------------------


def CadenceStep(task):
  """A tf.function train step of a LanguageModel, as the trainer runs it."""
  learner = task.InstantiateLearner()
  learner.Build()
  step = tf.Variable(0, dtype=tf.int64, trainable=False)

  @tf.function(autograph=False)
  def _Step(batch):
    seed = step_seed.MakeStepSeed(step, task.params.random_seed or 0)
    theta = base_layer.WithStepSeed(task.theta, seed)
    with tf.GradientTape() as tape:
      metrics, _ = task.FPropTower(theta, batch)
      loss = metrics.loss[0]
    grads = learner.ComputeGradients(tape, loss)
    learner.ApplyGradients(step, grads, loss=loss)
    step.assign_add(1)
    return loss

  return _Step


# --- the same network in plain TensorFlow ------------------------------------


def _Sinusoid(t, d, max_timescale=1.0e4):
  half = d // 2
  inv = np.exp(-math.log(max_timescale) / max(half - 1, 1) * np.arange(half))
  scaled = np.arange(t)[:, None] * inv[None, :]
  return tf.constant(np.concatenate([np.sin(scaled), np.cos(scaled)], 1),
                     tf.float32)                                   # [t, d]


def _LayerNorm(x, scale, bias, eps=1e-6):
  mean = tf.reduce_mean(x, -1, keepdims=True)
  var = tf.reduce_mean(tf.square(x - mean), -1, keepdims=True)
  return (x - mean) * tf.math.rsqrt(var + eps) * scale + bias


class PlainLm(tf.Module):
  """The Tiny LM in TF ops on copies of a LanguageModel's weights."""

  def __init__(self, task):
    super().__init__()
    p = task.params
    self._p = p
    self._schedule = p.train.learner.lr_schedule.Instantiate()
    self.w = {k: tf.Variable(v.read_value(), name='w')
              for k, v in task.vars.FlattenItems()}
    self.m = {k: tf.Variable(tf.zeros_like(v), name='m')
              for k, v in self.w.items()}
    self.v = {k: tf.Variable(tf.zeros_like(v), name='v')
              for k, v in self.w.items()}
    self.step = tf.Variable(0, dtype=tf.int64, trainable=False)

  def _Attention(self, pre, x, key_mask):
    w, p = self.w, self._p
    b, t, d = x.shape
    h = p.stack_tpl.transformer_tpl.num_heads
    dh = d // h

    def _Proj(name, y):
      out = tf.matmul(tf.reshape(y, [-1, d]), w[f'{pre}{name}_w'])
      return out + w[f'{pre}{name}_b']

    def _Heads(y):
      return tf.transpose(tf.reshape(y, [b, t, h, dh]), [0, 2, 1, 3])

    q = _Heads(_Proj('query', x)) * dh**-0.5
    k, v = _Heads(_Proj('key', x)), _Heads(_Proj('value', x))
    logits = tf.matmul(q, k, transpose_b=True)                  # [b,h,t,t]
    logits = tf.where(key_mask, logits, -0.7 * tf.float32.max)
    ctx = tf.matmul(tf.nn.softmax(logits), v)                   # [b,h,t,dh]
    ctx = tf.reshape(tf.transpose(ctx, [0, 2, 1, 3]), [-1, d])
    return tf.reshape(tf.matmul(ctx, w[f'{pre}post_w']) + w[f'{pre}post_b'],
                      [b, t, d])

  def Loss(self, batch):
    w, p = self.w, self._p
    ids = batch.ids
    b, t = ids.shape
    d = p.model_dim
    x = tf.gather(w['emb.emb'], ids) * math.sqrt(d) + _Sinusoid(t, d)
    causal = tf.range(t)[:, None] >= tf.range(t)[None, :]       # [t, t]
    key_mask = tf.logical_and(causal[None, None],
                              (batch.paddings < 0.5)[:, None, None, :])
    for i in range(p.stack_tpl.num_layers):
      pre = f'stack.x_layers[{i}].'
      y = _LayerNorm(x, w[pre + 'ln_atten.scale'], w[pre + 'ln_atten.bias'])
      x += self._Attention(pre + 'atten.', y, key_mask)
      y = _LayerNorm(x, w[pre + 'ln_ffn.scale'], w[pre + 'ln_ffn.bias'])
      y = tf.reshape(y, [-1, d])
      y = tf.nn.relu(tf.matmul(y, w[pre + 'ffn.fc[0].w']) +
                     w[pre + 'ffn.fc[0].b'])
      y = tf.matmul(y, w[pre + 'ffn.fc[1].w']) + w[pre + 'ffn.fc[1].b']
      x += tf.reshape(y, [b, t, d])
    x = _LayerNorm(x, w['stack.final_ln.scale'], w['stack.final_ln.bias'])
    logits = tf.matmul(tf.reshape(x, [-1, d]), w['softmax.w']) + w['softmax.b']
    xent = tf.nn.sparse_softmax_cross_entropy_with_logits(
        tf.reshape(batch.labels, [-1]), logits)
    weights = tf.reshape(batch.weights, [-1])
    return tf.reduce_sum(xent * weights) / tf.reduce_sum(weights)

  @tf.function(autograph=False)
  def Step(self, batch):
    """Forward, backward, clipping, Adam; returns the loss."""
    lp = self._p.train.learner
    opt = lp.optimizer
    keys = sorted(self.w)
    with tf.GradientTape() as tape:
      loss = self.Loss(batch)
    grads = tape.gradient(loss, [self.w[k] for k in keys])
    grads = [tf.convert_to_tensor(g) for g in grads]
    grads, _ = tf.clip_by_global_norm(grads, lp.clip_gradient_norm_to_value)
    n = tf.cast(self.step + 1, tf.float32)
    lr = lp.learning_rate * self._schedule.Value(self.step)
    lr *= tf.sqrt(1.0 - opt.beta2**n) / (1.0 - opt.beta1**n)
    for k, g in zip(keys, grads):
      m = self.m[k].assign(opt.beta1 * self.m[k] + (1.0 - opt.beta1) * g)
      v = self.v[k].assign(opt.beta2 * self.v[k] +
                           (1.0 - opt.beta2) * tf.square(g))
      self.w[k].assign_sub(lr * m / (tf.sqrt(v) + opt.epsilon))
    self.step.assign_add(1)
    return loss


# --- timing -------------------------------------------------------------------


def _TimeSteps(fn, batches, n):
  start = time.perf_counter()
  for i in range(n):
    loss = fn(batches[i % len(batches)])
  loss.numpy()
  return (time.perf_counter() - start) / n


def _InputRate(generator, num_batches):
  """Tokens/s of iterating the generator's Dataset (after a warm-up)."""
  it = iter(generator.Dataset())
  for _ in range(5):
    next(it)
  start = time.perf_counter()
  tokens = 0
  for _ in range(num_batches):
    batch = next(it)
    tokens += int(np.prod(batch.ids.shape))
  return tokens / (time.perf_counter() - start)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--rounds', type=int, default=5)
  parser.add_argument('--steps', type=int, default=10,
                      help='Steps per variant per round.')
  parser.add_argument('--input_batches', type=int, default=300)
  parser.add_argument('--data_dir', default='',
                      help='Corpus directory (default: the experiment\'s).')
  args = parser.parse_args()

  bench_log.Say('reading the input, building the 3 variants...')
  params = _Params(args.data_dir, 1, 1)
  generator = params.input.Instantiate()
  b, t = params.input.batch_size, params.input.max_seq_len
  batches = [NestedMap({k: tf.constant(v) for k, v in
                        generator.InputBatchAt(i).items()})
             for i in range(NUM_BATCHES)]

  variants = {}
  plain_task = params.task.Instantiate()
  plain_lm = PlainLm(plain_task)   # Kept alive: Step holds it weakly.
  variants['plain TF (tf.function)'] = plain_lm.Step
  variants['Cadence splits=1'] = CadenceStep(plain_task)
  with cluster_lib.Cluster.Params().Set(num_devices=2,
                                        worker_split_size=2).Instantiate():
    piped = _Params(args.data_dir, 2, 4).task.Instantiate()
  variants['Cadence splits=2, M=4 (2 CPUs)'] = CadenceStep(piped)

  # First calls trace and compile. The same model: step-0 losses agree.
  losses, compile_s = {}, {}
  for name, fn in variants.items():
    bench_log.Say(f'{name}: the first step (traces and compiles)...')
    start = time.perf_counter()
    losses[name] = float(fn(batches[0]))
    compile_s[name] = time.perf_counter() - start
  ref = losses['Cadence splits=1']
  for name, loss in losses.items():
    print(f'step-0 loss {name:32s} {loss:.6f}  |diff| {abs(loss - ref):.2e}')
  times = {name: [] for name in variants}
  for r in range(args.rounds):
    bench_log.Say(f'round {r + 1} of {args.rounds}: {args.steps} steps of '
                  'each variant...')
    for name, fn in variants.items():
      times[name].append(_TimeSteps(fn, batches, args.steps))
  step_s = {name: statistics.median(v) for name, v in times.items()}

  meta = model.LanguageModel.FPropMeta(
      params.task, NestedMap(ids=shapes.Shape([b, t]),
                             labels=shapes.Shape([b, t])))
  train_flops = 3 * meta.flops
  bench_log.Say('the peak FLOP/s probe, then the input alone...')
  peak = train_report.MeasurePeakFlops()
  input_rate = _InputRate(generator, args.input_batches)

  tokens = b * t
  plain = step_s['plain TF (tf.function)']
  print(f'\nTiny LM train step, batch {b} x seq {t} = {tokens} tokens; '
        f'{train_flops / 1e9:.2f} GFLOP a step (3 x FPropMeta forward); '
        f'{args.rounds} rounds x {args.steps} steps, median\n')
  header = (f'{"variant":32s} {"compile s":>9s} {"step ms":>8s} '
            f'{"tokens/s":>9s} '
            f'{"vs plain":>8s} {"GFLOP/s":>8s} {"MFU":>6s}')
  print(header)
  print('-' * len(header))
  for name, s in step_s.items():
    print(f'{name:32s} {compile_s[name]:9.1f} {1e3 * s:8.1f} '
          f'{tokens / s:9.0f} {s / plain:7.2f}x '
          f'{train_flops / s / 1e9:8.1f} {100 * train_flops / s / peak:5.1f}%')
  fastest = max(tokens / s for s in step_s.values())
  print(f'\npeak (float32 1024^3 matmul chain, this run): '
        f'{peak / 1e9:.1f} GFLOP/s')
  print(f'input pipeline alone (Train Dataset(), packed, SentencePiece): '
        f'{input_rate:.0f} tokens/s = {input_rate / fastest:.1f}x the fastest '
        f'model ({"OK" if input_rate >= 5 * fastest else "BELOW"} the 5x '
        'target)')


if __name__ == '__main__':
  main()
