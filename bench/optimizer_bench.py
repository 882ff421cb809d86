"""One optimizer update of a whole model, four ways, timed in one run.

The model's variables are those of a registered experiment (default the
README's Tiny LM: 69 variables, 924,928 parameters), with fixed random
gradients. One compiled step applies them (reads the gradients, their
global norm, a skip on a non-finite norm, the update) with
  * Keras Adam: `keras.optimizers.Adam.apply_gradients` (the baseline);
  * Cadence Adam: `framework/optimizer.py`'s Adam, TF's fused kernel
    (`ResourceApplyAdam`) per variable, one `tf.cond` per device skipping;
  * Adam as pure ops: the same rule written out in TF ops per variable,
    its skip a `tf.where` per variable and slot (what Cadence's Adam was
    before the fused kernels);
  * Cadence Adafactor (no fused kernel: pure ops, under the skip's cond).
For each: ops in the step's graph, seconds to trace it and seconds of its
first call (grappler and the kernels' first run), medians of `--builds`
fresh builds (interleaved, after one warm-up trace), then the median
milliseconds a step over interleaved repeats (the order alternating), and
the ratios to Keras Adam. Before timing, the Adam variants' weights after
one update are compared to Keras's (`max |diff|`, relative to the largest
weight): the same rule, so the same numbers up to rounding.

Run:
  .venv/bin/python bench/optimizer_bench.py [--repeats 7] [--steps 50] \
      [--builds 3] [--model lm.one_billion_wds.OneBWdsGPipeTransformerTiny]
"""
import argparse
import statistics
import time

import bench_log
import keras
import numpy as np
import tensorflow as tf

from cadence.framework import model_registry
from cadence.framework import optimizer

_BETA1, _BETA2, _EPS, _LR = 0.9, 0.98, 1e-7, 1e-3


def _Shapes(model_key):
  task = model_registry.GetParams(model_key, 'Train').Instantiate().task
  return [v.shape for v in task.vars.Flatten()]


class _Setup:
  """Variables (the same initial values for every variant) and grads."""

  def __init__(self, shapes, seed=0):
    rng = np.random.RandomState(seed)
    self.inits = [rng.randn(*s).astype(np.float32) for s in shapes]
    self.grads = [tf.constant(rng.randn(*s).astype(np.float32) * 1e-2)
                  for s in shapes]

  def Variables(self):
    return [tf.Variable(x) for x in self.inits]


def _Norm(grads):
  norm = tf.linalg.global_norm(grads)
  return norm, tf.logical_not(tf.math.is_finite(norm))


def _KerasAdam(setup):
  variables = setup.Variables()
  opt = keras.optimizers.Adam(_LR, beta_1=_BETA1, beta_2=_BETA2,
                              epsilon=_EPS)
  opt.build(variables)

  def Step():
    grads = [tf.identity(g) for g in setup.grads]
    norm, skip = _Norm(grads)

    def _Apply():
      opt.apply_gradients(zip(grads, variables))
      return tf.no_op()
    tf.cond(skip, tf.no_op, _Apply)
    return norm
  return Step, variables


def _CadenceOptimizer(params):
  def Make(setup):
    variables = setup.Variables()
    opt = params.Instantiate()
    opt.Build([(f'v{i}', v) for i, v in enumerate(variables)])

    def Step():
      grads = [tf.identity(g) for g in setup.grads]
      norm, skip = _Norm(grads)
      opt.Apply(_LR, zip(grads, variables), skip=skip)
      return norm
    return Step, variables
  return Make


def _PureOpsAdam(setup):
  """Adam per variable as TF ops, skipping by tf.where (the old way)."""
  variables = setup.Variables()
  slots = [(tf.Variable(tf.zeros_like(v)), tf.Variable(tf.zeros_like(v)))
           for v in variables]
  count = tf.Variable(0.0)

  def Step():
    grads = [tf.identity(g) for g in setup.grads]
    norm, skip = _Norm(grads)
    t = count + 1.0
    lr_t = _LR * tf.sqrt(1.0 - _BETA2**t) / (1.0 - _BETA1**t)
    for g, var, (m_var, v_var) in zip(grads, variables, slots):
      with tf.control_dependencies([g]):
        old, m0, v0 = var.value(), m_var.value(), v_var.value()
      m = _BETA1 * m0 + (1.0 - _BETA1) * g
      v = _BETA2 * v0 + (1.0 - _BETA2) * tf.square(g)
      new = old - lr_t * m / (tf.sqrt(v) + _EPS)
      var.assign(tf.where(skip, old, new))
      m_var.assign(tf.where(skip, m0, m))
      v_var.assign(tf.where(skip, v0, v))
    count.assign_add(tf.cast(~skip, tf.float32))
    return norm
  return Step, variables


_VARIANTS = {
    'Keras Adam': _KerasAdam,
    'Cadence Adam (fused)': _CadenceOptimizer(
        optimizer.Adam.Params().Set(beta1=_BETA1, beta2=_BETA2,
                                    epsilon=_EPS)),
    'Adam as pure ops': _PureOpsAdam,
    'Cadence Adafactor': _CadenceOptimizer(optimizer.Adafactor.Params()),
}
_BASELINE = 'Keras Adam'


def _Ops(concrete):
  """Ops of the step's graph and of the functions it calls (cond branches)."""
  graph_def = concrete.graph.as_graph_def()
  return len(graph_def.node) + sum(len(f.node_def)
                                   for f in graph_def.library.function)


def _Build(setup, rounds):
  """{name: (step fn, variables, ops, trace s, first call s)}: each variant
  built `rounds` times, interleaved (the order alternating), its trace and
  first-call seconds the medians; the last build is the one kept."""
  tf.function(_Norm).get_concrete_function(setup.grads)  # TF's warm-up.
  found = {name: [] for name in _VARIANTS}
  built = {}
  for r in range(rounds):
    for name in list(_VARIANTS) if r % 2 == 0 else list(_VARIANTS)[::-1]:
      bench_log.Say(f'build {r + 1} of {rounds}: tracing {name} and its '
                    'first call...')
      fn, variables = _VARIANTS[name](setup)
      step = tf.function(fn, autograph=False)
      start = time.perf_counter()
      concrete = step.get_concrete_function()
      traced = time.perf_counter()
      step()
      found[name].append((traced - start, time.perf_counter() - traced))
      built[name] = (step, variables, _Ops(concrete))
  return {name: built[name] + tuple(statistics.median(x) for x in
                                    zip(*found[name]))
          for name in _VARIANTS}


def _SameMath(built):
  """{name: max |w - w_keras| / max |w_keras|} after the first update."""
  ref = built[_BASELINE][1]
  scale = max(float(np.max(np.abs(v.numpy()))) for v in ref)
  out = {}
  for name, (_, variables, *_) in built.items():
    if 'Adam' in name:
      out[name] = max(float(np.max(np.abs(a.numpy() - b.numpy())))
                      for a, b in zip(variables, ref)) / scale
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--model',
                      default='lm.one_billion_wds.OneBWdsGPipeTransformerTiny')
  parser.add_argument('--repeats', type=int, default=7)
  parser.add_argument('--steps', type=int, default=50)
  parser.add_argument('--builds', type=int, default=3,
                      help='Traces (and first calls) of each variant.')
  args = parser.parse_args()

  shapes = _Shapes(args.model)
  setup = _Setup(shapes)
  print(f'{args.model}: {len(shapes)} variables, '
        f'{sum(int(np.prod(s)) for s in shapes):,} parameters')
  built = _Build(setup, args.builds)
  same = _SameMath(built)
  times = {name: [] for name in built}
  for r in range(args.repeats):
    bench_log.Say(f'repeat {r + 1} of {args.repeats}: {args.steps} steps of '
                  f'each variant...')
    order = list(built) if r % 2 == 0 else list(built)[::-1]
    for name in order:
      step = built[name][0]
      start = time.perf_counter()
      for _ in range(args.steps):
        step()
      times[name].append((time.perf_counter() - start) / args.steps)
  base = built[_BASELINE]
  base_ms = statistics.median(times[_BASELINE]) * 1e3
  print(f'{"variant":<22} {"ops":>6} {"trace s":>8} {"first s":>8} '
        f'{"step ms":>8} {"x ops":>6} {"x trace":>8} {"x first":>8} '
        f'{"x step":>7} {"max |diff|":>10}')
  for name, (_, _, ops, trace, first) in built.items():
    ms = statistics.median(times[name]) * 1e3
    diff = f'{same[name]:.1e}' if name in same else '-'
    print(f'{name:<22} {ops:>6} {trace:>8.2f} {first:>8.2f} {ms:>8.2f} '
          f'{ops / base[2]:>6.2f} {trace / base[3]:>8.2f} '
          f'{first / base[4]:>8.2f} {ms / base_ms:>7.2f} {diff:>10}')
  print(f'(steps: median of {args.repeats} interleaved repeats of '
        f'{args.steps} steps; trace and first call: median of {args.builds} '
        'builds)')


if __name__ == '__main__':
  main()
