"""Helpers the tests share: one home for each (Lingvo's test_utils).

Test files import it as `from cadence.tests import test_utils` (the checkout
is the package `cadence`; tests/ is not installed).

  Rand(shape, seed)            numpy uniform(-1, 1) values, reproducible
  Seeded(layer, step)          a layer's theta carrying a step seed
  LossAndGrads(fn, wrt)        fn() under a tape: its outputs and the
                               gradients of the first one
  RunPython(script, *args)     `python -c script` in a subprocess, checked
  StartPython / FinishPython   the same in two halves, so independent
                               subprocesses run at the same time
  OpDevices(script, op_types)  where each op type ran, from TF's placement
                               log of a script
  FreePorts(n)                 n localhost ports free now (bound to port 0)
  LocalCluster(**tasks)        a TF_CONFIG cluster of localhost tasks
  StartTrainer(flags, ...)     `python trainer.py flags...`, optionally with
                               TF_CONFIG; FinishTrainer waits for it
"""
import json
import os
import re
import socket
import subprocess
import sys

import numpy as np
import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import step_seed

# A subprocess's environment with TF's C++ INFO lines hidden.
QUIET_ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')
# The checkout's root, where trainer.py is.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def Rand(shape, seed, dtype=np.float32, scale=1.0):
  """`scale` * uniform(-1, 1) numpy values of `shape`, from `seed`."""
  values = np.random.RandomState(seed).uniform(-1, 1, shape)
  return (scale * values).astype(dtype)


def Seeded(layer, step=0, seed=None):
  """`layer.theta` with a step seed: MakeStepSeed(step), or `seed` given."""
  if seed is None:
    seed = step_seed.MakeStepSeed(step)
  return base_layer.WithStepSeed(layer.theta, seed)


def LossAndGrads(fn, wrt):
  """Runs `fn()` under a GradientTape; differentiates its first output.

  Args:
    fn: () -> a loss tensor, or a tuple/list whose first item is the loss.
    wrt: tensors and variables to differentiate by (tensors are watched).

  Returns:
    (fn's outputs, list of gradients; IndexedSlices made dense).
  """
  wrt = list(wrt)
  with tf.GradientTape() as tape:
    tape.watch([x for x in wrt if not isinstance(x, tf.Variable)])
    out = fn()
  loss = out[0] if isinstance(out, (tuple, list)) else out
  grads = [None if g is None else tf.convert_to_tensor(g)
           for g in tape.gradient(loss, wrt)]
  return out, grads


def RunPython(script, *args, env=None, timeout=300):
  """Runs `python -c script args...`; fails with its stderr tail if it fails.

  Returns:
    The CompletedProcess (text stdout and stderr).
  """
  proc = subprocess.run([sys.executable, '-c', script] + [str(a) for a in
                                                          args],
                        capture_output=True, text=True, timeout=timeout,
                        env=QUIET_ENV if env is None else env)
  if proc.returncode:
    raise AssertionError(f'subprocess exited {proc.returncode}:\n'
                         f'{proc.stderr[-4000:]}')
  return proc


def StartPython(script, *args, env=None):
  """Starts `python -c script args...`; finish it with FinishPython."""
  return subprocess.Popen(
      [sys.executable, '-c', script] + [str(a) for a in args],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      env=QUIET_ENV if env is None else env)


def FinishPython(proc, timeout=600):
  """Waits for a StartPython process; returns its stdout, or fails with its
  stderr tail if it failed."""
  out, err = proc.communicate(timeout=timeout)
  if proc.returncode:
    raise AssertionError(f'subprocess exited {proc.returncode}:\n'
                         f'{err[-4000:]}')
  return out


def OpDevices(script, op_types, group=None, timeout=300):
  """Where ops of `op_types` ran in `script`, from TF's placement log.

  The script must call `tf.debugging.set_log_device_placement(True)` and run
  its ops; it runs in a subprocess with TF's logging on.

  Args:
    script: the Python source to run.
    op_types: the op types of interest.
    group: optional fn(op name) -> a key (e.g. the replica an op belongs
      to); the result is then keyed by (op type, key).
    timeout: seconds.

  Returns:
    {op type (or (op type, group key)): set of short device names like
    'CPU:1'} for the op types that were placed.
  """
  proc = RunPython(script, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='0'),
                   timeout=timeout)
  placed = re.findall(r'^(?:\S+ )*?(\S+): \((\w+)\): (\S+)$',
                      proc.stdout + proc.stderr, re.M)
  devices = {}
  for name, op_type, device in placed:
    if op_type in op_types:
      key = op_type if group is None else (op_type, group(name))
      devices.setdefault(key, set()).add(device.split('device:')[-1])
  return devices


def FreePorts(n):
  """`n` distinct localhost ports that were free a moment ago."""
  socks = [socket.socket() for _ in range(n)]
  for s in socks:
    s.bind(('127.0.0.1', 0))
  ports = [s.getsockname()[1] for s in socks]
  for s in socks:
    s.close()
  return ports


def LocalCluster(**num_tasks):
  """A TF_CONFIG "cluster" of localhost tasks on free ports.

  Example:
    LocalCluster(chief=1, ps=2, worker=2)
    # {'chief': ['127.0.0.1:41234'], 'ps': [...], 'worker': [...]}
  """
  ports = iter(FreePorts(sum(num_tasks.values())))
  return {job: [f'127.0.0.1:{next(ports)}' for _ in range(n)]
          for job, n in num_tasks.items()}


def StartTrainer(flags, cluster=None, task_type=None, task_index=0):
  """Starts `python trainer.py flags...` in the checkout's root.

  Args:
    flags: the trainer's command-line flags.
    cluster: a TF_CONFIG cluster (`LocalCluster`); with `task_type` and
      `task_index`, this process's TF_CONFIG. None: no TF_CONFIG.

  Returns:
    The Popen (text stdout and stderr piped); see FinishTrainer.
  """
  env = dict(QUIET_ENV)
  env.pop('TF_CONFIG', None)
  if cluster is not None:
    env['TF_CONFIG'] = json.dumps({'cluster': cluster, 'task': {
        'type': task_type, 'index': task_index}})
  return subprocess.Popen([sys.executable, 'trainer.py'] + list(flags),
                          cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)


def FinishTrainer(proc, timeout=600):
  """Waits for a StartTrainer process; returns (exit code, stdout, stderr)."""
  out, err = proc.communicate(timeout=timeout)
  return proc.returncode, out, err
