"""Helpers the tests share: one home for each (Lingvo's test_utils).

Test files import it as `from cadence.tests import test_utils` (the checkout
is the package `cadence`; tests/ is not installed).

  Rand(shape, seed)            numpy uniform(-1, 1) values, reproducible
  NpConv2D / NpPool2D          numpy references of conv and pooling
  Seeded(layer, step)          a layer's theta carrying a step seed
  DenseThetas(k, d, rng)       k NestedMap(w [d, d], b [d]) of variables
  LossAndGrads(fn, wrt)        fn() under a tape: its outputs and the
                               gradients of the first one
  RunPython(script, *args)     `python -c script` in a subprocess, checked
  StartPython / FinishPython   the same in two halves, so independent
                               subprocesses run at the same time
  OpDevices(script, op_types)  where each op type ran, from TF's placement
                               log of a script
  TrainerRun(*flags)           the trainer command line in a subprocess
                               (optionally one task of a TF_CONFIG
                               cluster): wait for a log line, signal it,
                               finish it
  AssertUserErrorLine(...)     exit 2 with one `Error:` line, no traceback
  AssertRealRunAgrees(...)     a real trainer process ends with that line
  BadInput, RunBadInputs       a table of bad trainer inputs, each: exit 2,
                               one `Error:` line, no step, logdir intact
  LogLines(stderr)             the log records in a process's stderr
  DamageCheckpoint(path, how)  a checkpoint as a dying disk leaves it
  FreePorts(n)                 n localhost ports free now (bound to port 0)
  LocalCluster(**tasks)        a TF_CONFIG cluster of localhost tasks
  SmallLmOverrides(tmp)        the Tiny GPipe LM (TINY_LM) shrunk, on a
                               small corpus and SentencePiece cache in tmp
  USER_PACKAGE, WriteFiles     a user's own package of experiments (full
                               keys), written into a folder
"""
import glob
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import typing

import numpy as np
import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import step_seed

NestedMap = base_layer.NestedMap

# A subprocess's environment with TF's C++ INFO lines hidden.
QUIET_ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')
# The checkout (the package `cadence`): where trainer.py is.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT = 300

# Runs argv[2:] under a file-size limit of argv[1] bytes. SIGXFSZ ignored
# (kept across exec): a write past the limit fails with EFBIG ("File too
# large"), as on a full disk or quota, instead of killing the process.
_FILE_SIZE_LIMITED = """
import os, resource, signal, sys
limit = int(sys.argv[1])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
os.execv(sys.argv[2], sys.argv[2:])
"""


def Rand(shape, seed, dtype=np.float32, scale=1.0):
  """`scale` * uniform(-1, 1) numpy values of `shape`, from `seed`."""
  values = np.random.RandomState(seed).uniform(-1, 1, shape)
  return (scale * values).astype(dtype)


def _NpPads(n, k, s, padding):
  """(out, pad_before, pad_after) along one axis, TF's rule."""
  if padding == 'VALID':
    return (n - k) // s + 1, 0, 0
  out = -(-n // s)
  total = max((out - 1) * s + k - n, 0)
  return out, total // 2, total - total // 2


def _NpWindows(x, kh, kw, sh, sw, padding, fill):
  """Yields (i, j, window [b, kh, kw, c], valid mask [kh, kw])."""
  b, h, w, c = x.shape
  oh, top, bottom = _NpPads(h, kh, sh, padding)
  ow, left, right = _NpPads(w, kw, sw, padding)
  xp = np.full([b, h + top + bottom, w + left + right, c], fill, x.dtype)
  xp[:, top:top + h, left:left + w] = x
  valid = np.zeros(xp.shape[1:3], bool)
  valid[top:top + h, left:left + w] = True
  for i in range(oh):
    for j in range(ow):
      rows = slice(i * sh, i * sh + kh)
      cols = slice(j * sw, j * sw + kw)
      yield i, j, xp[:, rows, cols], valid[rows, cols]


def NpConv2D(x, w, bias, stride, padding):
  """Numpy reference of a 2-D convolution (NHWC, HWIO filter), float64."""
  kh, kw, _, cout = w.shape
  oh = _NpPads(x.shape[1], kh, stride[0], padding)[0]
  ow = _NpPads(x.shape[2], kw, stride[1], padding)[0]
  out = np.zeros([x.shape[0], oh, ow, cout], np.float64)
  for i, j, win, _ in _NpWindows(x, kh, kw, stride[0], stride[1], padding,
                                 0.0):
    out[:, i, j] = np.tensordot(win, w, axes=([1, 2, 3], [0, 1, 2]))
  return out + bias


def NpPool2D(x, window, stride, pooling_type, padding):
  """Numpy reference of 2-D MAX/AVG pooling (NHWC; AVG over valid cells)."""
  kh, kw = window
  oh = _NpPads(x.shape[1], kh, stride[0], padding)[0]
  ow = _NpPads(x.shape[2], kw, stride[1], padding)[0]
  out = np.zeros([x.shape[0], oh, ow, x.shape[3]], np.float64)
  fill = -np.inf if pooling_type == 'MAX' else 0.0
  for i, j, win, valid in _NpWindows(x, kh, kw, stride[0], stride[1],
                                     padding, fill):
    if pooling_type == 'MAX':
      out[:, i, j] = win.max(axis=(1, 2))
    else:
      out[:, i, j] = win.sum(axis=(1, 2)) / valid.sum()
  return out


def Seeded(layer, step=0, seed=None):
  """`layer.theta` with a step seed: MakeStepSeed(step), or `seed` given."""
  if seed is None:
    seed = step_seed.MakeStepSeed(step)
  return base_layer.WithStepSeed(layer.theta, seed)


def DenseThetas(k, d, rng):
  """k thetas NestedMap(w=[d, d], b=[d]) of normal(0, 1) tf.Variables drawn
  from the numpy RandomState `rng` (cells of pipeline tests)."""
  return [NestedMap(
      w=tf.Variable(rng.normal(size=[d, d]).astype(np.float32)),
      b=tf.Variable(rng.normal(size=[d]).astype(np.float32)))
      for _ in range(k)]


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


class TrainerRun:
  """The trainer command line running in a subprocess.

  Its stderr goes to a file, so the test can wait for a log line while it
  runs. Start several before finishing any: each pays TensorFlow's import.

  Args:
    *flags: the command line flags.
    script: run `python trainer.py` in the checkout instead of
      `python -m cadence.trainer`.
    file_size_limit: if set, the process may write no file larger than
      this many bytes (RLIMIT_FSIZE; a write past it fails).
    cluster: a TF_CONFIG cluster (`LocalCluster`); the process is its task
      `task` = (type, index). None: no TF_CONFIG.
    command: the trainer's command line before the flags (e.g. an
      installed `cadence-trainer`) instead of this interpreter's.
    cwd: the folder it runs in (the checkout by default).

  Example:
    run = TrainerRun('--model=...', '--logdir=/tmp/x')
    run.WaitForLog(r'First step done')
    run.Signal(signal.SIGTERM)
    code, stdout, stderr = run.Finish()
  """

  def __init__(self, *flags, script=False, file_size_limit=None,
               cluster=None, task=('worker', 0), command=None, cwd=ROOT):
    cmd = list(command or [sys.executable] + (
        ['trainer.py'] if script else ['-m', 'cadence.trainer']))
    if file_size_limit:
      cmd = [sys.executable, '-c', _FILE_SIZE_LIMITED,
             str(file_size_limit)] + cmd
    env = dict(QUIET_ENV)
    env.pop('TF_CONFIG', None)
    if cluster is not None:
      env['TF_CONFIG'] = json.dumps({'cluster': cluster, 'task': {
          'type': task[0], 'index': task[1]}})
    self._stderr = tempfile.TemporaryFile(mode='w+')
    self.proc = subprocess.Popen(cmd + list(flags), cwd=cwd, env=env,
                                 stdout=subprocess.PIPE, stderr=self._stderr,
                                 text=True)

  def Stderr(self):
    """What the process wrote to stderr so far."""
    self._stderr.seek(0)
    return self._stderr.read()

  def WaitForLog(self, regex, timeout=TIMEOUT):
    """Waits until stderr matches `regex`; returns the match.

    Raises:
      AssertionError: the process ended, or `timeout` seconds passed, first.
    """
    deadline = time.monotonic() + timeout
    while True:
      match = re.search(regex, self.Stderr(), re.M)
      if match:
        return match
      if self.proc.poll() is not None or time.monotonic() > deadline:
        raise AssertionError(f'no log line {regex!r} (exit code '
                             f'{self.proc.poll()}):\n{self.Stderr()[-3000:]}')
      time.sleep(0.02)

  def Signal(self, signum):
    self.proc.send_signal(signum)

  def Finish(self, timeout=TIMEOUT):
    """Waits for the end; returns (exit code, stdout, stderr)."""
    out, _ = self.proc.communicate(timeout=timeout)
    err = self.Stderr()
    self._stderr.close()
    return self.proc.returncode, out, err

  def Kill(self):
    """Ends the process now (SIGKILL) if it still runs."""
    if self.proc.poll() is None:
      self.proc.kill()
      self.proc.communicate()


_MAINS_DRIVER = """
import contextlib, io, json, os, sys
from absl import flags
from absl import logging
exec(sys.argv[2])   # The caller's prelude, before trainer.py defines flags.
from cadence import trainer
results = []
for argv, env in json.loads(sys.argv[1]):
  flags.FLAGS.unparse_flags()
  before = {k: os.environ.get(k) for k in env}
  os.environ.update(env)
  err, out = io.StringIO(), io.StringIO()
  logging.get_absl_handler().python_handler.stream = err   # The log too.
  with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
    try:   # The trainer's own flag parsing, then its main.
      code = trainer.main(trainer.ParseFlags(['trainer.py'] + argv))
    except SystemExit as e:   # A flag error.
      code = e.code
  for k, v in before.items():
    if v is None:
      os.environ.pop(k)
    else:
      os.environ[k] = v
  results.append([code, err.getvalue(), 'tensorflow' in sys.modules,
                  out.getvalue()])
print(json.dumps(results))
"""


def StartTrainerMains(argvs, env=None, case_envs=None, prelude=''):
  """Runs `trainer.main` on each argv in turn in ONE subprocess (through
  the trainer's own flag parsing; TensorFlow is imported once, when the
  first case needs it). `case_envs`: per argv, environment variables set
  for that case only (e.g. TF_CONFIG). `prelude`: Python run first, before
  trainer.py is imported (e.g. a mode or an option registered). Returns the
  Popen; `FinishTrainerMains` gives [(exit code, stderr and log)] per
  argv."""
  env = dict(env or QUIET_ENV)
  env.pop('TF_CONFIG', None)
  cases = list(zip(argvs, case_envs or [{}] * len(argvs)))
  return subprocess.Popen(
      [sys.executable, '-c', _MAINS_DRIVER, json.dumps(cases), prelude],
      cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      text=True)


def FinishTrainerMains(proc, timeout=600, imports=False, stdout=False):
  """[(exit code, stderr)] per argv of `StartTrainerMains`'s process; with
  `imports`, [(exit code, stderr, whether TensorFlow was imported after
  that argv's run)]; with `stdout`, [(exit code, stderr, stdout)]; with
  both, [(exit code, stderr, imported, stdout)]."""
  out, err = proc.communicate(timeout=timeout)
  if proc.returncode:
    raise AssertionError(f'trainer driver failed: {err[-3000:]}')
  results = json.loads(out.strip().splitlines()[-1])
  if stdout and imports:
    return [tuple(r) for r in results]
  if stdout:
    return [(r[0], r[1], r[3]) for r in results]
  return [r[:3] for r in results] if imports else [r[:2] for r in results]


def StartTrainer(argv, env=None):
  """`python trainer.py *argv` as a real process (stdout, stderr piped)."""
  return subprocess.Popen([sys.executable, 'trainer.py'] + list(argv),
                          cwd=ROOT, env=env or QUIET_ENV,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)


def StopOnceExists(proc, found, timeout=300, poll_secs=0.01):
  """Sends SIGTERM to `proc` (a Popen) as soon as `found()` is truthy (e.g.
  a folder it writes exists); returns its (exit code, stderr)."""
  deadline = time.monotonic() + timeout
  while not found() and proc.poll() is None and time.monotonic() < deadline:
    time.sleep(poll_secs)
  if proc.poll() is None:
    proc.send_signal(signal.SIGTERM)
  _, stderr = proc.communicate(timeout=timeout)
  return proc.returncode, stderr


def AssertUserErrorLine(test, code, stderr, regex):
  """Asserts exit code 2 and ONE `Error: ...` line, the last, matching
  `regex`, without a traceback."""
  test.assertEqual(2, code, stderr[-2000:])
  test.assertNotIn('Traceback', stderr)
  errors = [l for l in stderr.splitlines() if l.startswith('Error: ')]
  test.assertLen(errors, 1, stderr[-2000:])
  test.assertEqual(errors[0], stderr.strip().splitlines()[-1])
  test.assertRegex(errors[0], regex)


class BadInput(typing.NamedTuple):
  """One row of a table of bad trainer inputs (RunBadInputs).

  Attributes:
    name: the row's name (its logdir is <root>/<name>).
    argv: the flags after `trainer.py`; '{logdir}' in them is the row's
      logdir.
    regex: what the one `Error:` line must match (it names the input).
    prepare: None, or fn(logdir) that fills the logdir before the run;
      the logdir must then be byte-identical after it.
    env: environment variables of this row only (e.g. TF_CONFIG).
    real: also run it as a real `python trainer.py` process.
  """
  name: str
  argv: list
  regex: str
  prepare: object = None
  env: dict = {}
  real: bool = False


def _Snapshot(folder):
  """{path below folder: bytes of the file, or None for a folder}."""
  out = {}
  for root, dirs, files in os.walk(folder):
    for name in dirs:
      out[os.path.relpath(os.path.join(root, name), folder)] = None
    for name in files:
      path = os.path.join(root, name)
      with open(path, 'rb') as f:
        out[os.path.relpath(path, folder)] = f.read()
  return out


_STEP_LOG = re.compile(r'First step done|\] step \d+/\d+ ')


def AssertStoppedBeforeTraining(test, stderr, logdir, before):
  """No train step was logged, and the logdir is as it was (`before`, its
  _Snapshot), or, if it did not exist, was not created."""
  test.assertNotRegex(stderr, _STEP_LOG)
  if before is None:
    test.assertFalse(os.path.exists(logdir),
                     f'a refused run created {logdir}: '
                     f'{sorted(_Snapshot(logdir)) if os.path.isdir(logdir) else ""}')
  else:
    test.assertEqual(before, _Snapshot(logdir))


def RunBadInputs(test, groups, root, timeout=600, env=None):
  """Runs each row through the trainer; asserts what a user error must do.

  The rows of each group run through `trainer.py`'s flag parsing and
  `main` in ONE subprocess (StartTrainerMains), and the rows marked `real`
  also as real `python trainer.py` processes; all groups and processes at
  the same time. For each row: exit 2, exactly one `Error:` line, the
  last, matching the row's regex, no traceback, no train step, the logdir
  byte-identical if the row prepared one (else no train/ folder in it); a
  real process ends with the same line as the in-process run.

  Args:
    test: the TestCase.
    groups: {group name: [BadInput]}.
    root: a folder; row r of group g gets the logdir <root>/<g>/<r.name>.
    timeout: seconds per process.
    env: environment variables of every row (e.g. PYTHONPATH, read as the
      process starts).

  Returns:
    {group name: [(exit code, stderr, TensorFlow imported)] per row}.
  """
  runs = {}
  base = {k: v for k, v in QUIET_ENV.items() if k != 'TF_CONFIG'}
  base.update(env or {})
  for group, rows in groups.items():
    logdirs = [os.path.join(root, group, row.name) for row in rows]
    befores = []
    for row, logdir in zip(rows, logdirs):
      if row.prepare is not None:
        os.makedirs(logdir, exist_ok=True)
        row.prepare(logdir)
      befores.append(_Snapshot(logdir) if row.prepare is not None else None)
    argvs = [[a.replace('{logdir}', d) for a in row.argv]
             for row, d in zip(rows, logdirs)]
    driver = StartTrainerMains(argvs, env=base,
                               case_envs=[row.env for row in rows])
    reals = [(i, StartTrainer(argvs[i], env=dict(base, **rows[i].env)))
             for i, row in enumerate(rows) if row.real]
    runs[group] = (rows, logdirs, befores, driver, reals)
  out = {}
  for group, (rows, logdirs, befores, driver, reals) in runs.items():
    results = out[group] = FinishTrainerMains(driver, timeout=timeout,
                                              imports=True)
    for row, logdir, before, (code, stderr, _) in zip(rows, logdirs, befores,
                                                      results):
      with test.subTest(group=group, row=row.name):
        AssertUserErrorLine(test, code, stderr, row.regex)
        AssertStoppedBeforeTraining(test, stderr, logdir, before)
    for i, proc in reals:
      with test.subTest(group=group, row=rows[i].name, real=True):
        real_err = AssertRealRunAgrees(test, proc, results[i][1], timeout)
        AssertUserErrorLine(test, proc.returncode, real_err, rows[i].regex)
        AssertStoppedBeforeTraining(test, real_err, logdirs[i], befores[i])
  return out


def AssertRealRunAgrees(test, proc, stderr, timeout=600):
  """Asserts that `proc`, a real `python trainer.py` process, exits 2 with
  the same last line as `stderr` (the same command line run through
  `StartTrainerMains`); returns the real process's stderr."""
  _, real_err = proc.communicate(timeout=timeout)
  test.assertEqual(2, proc.returncode, real_err[-2000:])
  test.assertEqual(stderr.strip().splitlines()[-1],
                   real_err.strip().splitlines()[-1])
  return real_err


def LogLines(stderr):
  """The lines Python logged to stderr: absl's ('I1123 05:47:45.43 12
  trainer_lib.py:480] ...') and TensorFlow's own ('WARNING:tensorflow:')."""
  return [line for line in stderr.splitlines()
          if re.match(r'^[DIWEF]\d{4} [\d:.]+ +\d+ \S+\.py:\d+\] ', line) or
          line.startswith(('INFO:', 'WARNING:tensorflow', 'ERROR:'))]


CHECKPOINT_DAMAGE = ('truncated data', 'missing data shard', 'deleted index',
                     'garbage index')


def DamageCheckpoint(path, how):
  """Damages checkpoint `path` as a dying disk or a cut copy leaves it.

  Args:
    path: a checkpoint prefix ('/tmp/run/train/ckpt-300').
    how: one of CHECKPOINT_DAMAGE.
  """
  data = glob.glob(path + '.data-*')[0]
  if how == 'truncated data':
    with open(data, 'r+b') as f:
      f.truncate(100)
  elif how == 'missing data shard':
    os.remove(data)
  elif how == 'deleted index':
    os.remove(path + '.index')
  elif how == 'garbage index':
    with open(path + '.index', 'wb') as f:
      f.write(b'not an index' * 10)
  else:
    raise ValueError(f'DamageCheckpoint: how={how!r} is not one of '
                     f'{CHECKPOINT_DAMAGE}.')


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


TINY_LM = 'lm.one_billion_wds.OneBWdsGPipeTransformerTiny'


def SmallLmOverrides(tmp):
  """A --model_params_override of TINY_LM: a 2-layer d 32 model on rows of
  8 tokens, batch 4, reading a small grammar corpus in `tmp`/data (written
  at first use) with its SentencePiece model cached in `tmp`/spm."""
  return ('task.model_dim=32;task.stack_tpl.num_layers=2;'
          'task.stack_tpl.transformer_tpl.num_heads=2;'
          'task.stack_tpl.transformer_tpl.hidden_dim=64;'
          'task.stack_tpl.pipeline_tpl.num_micro_batches=2;'
          'input.max_seq_len=8;input.batch_size=4;'
          f'input.data_dir={tmp}/data;input.tokenizer.cache_dir={tmp}/spm;'
          'input.synthetic.num_train_shards=2;'
          'input.synthetic.sentences_per_shard=2000;'
          'input.synthetic.num_heldout_sentences=64')


# A user's own package outside Cadence (WriteFiles it into a folder, run
# it from there or with the folder on PYTHONPATH): experiments registered
# by their full keys, `userexps.exps.MyRegression` and `...MyPipelinedMlp`.
USER_PACKAGE = {
    'userexps/__init__.py': '',
    'userexps/exps.py': '''"""A user's experiments, run by their full keys."""
from cadence.framework import model_registry
from cadence.params.examples import pipelined_mlp
from cadence.params.synthetic import linear_regression


@model_registry.RegisterSingleTaskModel
class MyRegression(linear_regression.RegressionTiny):
  INPUT_DIM = 4


@model_registry.RegisterSingleTaskModel
class MyPipelinedMlp(pipelined_mlp.PipelinedMlp):
  INPUT_DIM = 6
''',
}


def WriteFiles(root, files):
  """Writes {path below root: text} (folders made); returns root."""
  for path, text in files.items():
    path = os.path.join(root, path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w') as f:
      f.write(text)
  return root
