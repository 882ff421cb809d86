"""Whether TensorFlow's graph optimiser (grappler) runs on the job's steps.

Grappler rewrites every function a job calls before its first run
(constant folding, fusions, dependency and layout passes, for each of the
pipeline's nested functions). Off (the trainer's --nograph_optimizer), the
Tiny LM's first step compiles in about half the time on 2 CPU cores
(bench/trainer_bench.py --grappler: the logged first step 0.50-0.68x,
start to first step 0.60-0.87x), but its steady steps were not shown to
be as fast (0.98-1.12x CPU, 0.97-1.19x wall per step on a loaded shared
machine; bench/gpipe_bench.py --grappler: warm-up 0.52-0.65x, steps
1.01-1.05x CPU, 1.02-1.24x wall), so grappler stays on by default (off:
the compile is cheaper, the steps are not). The computation is the same
either way: grappler only rewrites a graph into an equivalent one
(tests/framework/jobs/graph_optimizer_test.py).

TensorFlow keeps this setting per process (tf.config.optimizer); `Scope`
sets it for one job and restores what was there before, so nothing leaks
into the caller (tests run several jobs in one process). A function is
optimised (or not) when it first runs, so trace and run it in the scope.

Example:
  with graph_optimizer.Scope(enabled=False):
    job.Run()
"""
import contextlib

from absl import logging
import tensorflow as tf

_KEY = 'disable_meta_optimizer'


@contextlib.contextmanager
def Scope(enabled):
  """Runs the block with grappler on (`enabled`) or off, then restores."""
  before = tf.config.optimizer.get_experimental_options()
  tf.config.optimizer.set_experimental_options({_KEY: not enabled})
  if not enabled:
    logging.info('Graph optimiser (grappler) off for this job '
                 '(--nograph_optimizer).')
  try:
    yield
  finally:
    tf.config.optimizer.set_experimental_options({_KEY: before.get(_KEY,
                                                                   False)})
