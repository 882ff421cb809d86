"""Seconds from the trainer's last log line to its exit, idle and loaded.

Each mode runs the real `trainer.py` in a fresh logdir and times, from the
parent, when the process wrote its last stderr line and when it exited:

  lm1      the Tiny GPipe LM (1 replica of 2 stages), --job=trainer,
           --max_steps=2;
  lm2      the same with --worker_replicas=2 (MirroredStrategy);
  keras2   keras.regression.KerasMlpTiny, --worker_replicas=2,
           --max_steps=20, trainer_and_evaler (eval and decode after);
  hosts2   two TF_CONFIG workers on 127.0.0.1 (MultiWorkerMirroredStrategy),
           RegressionTiny, --job=trainer, --max_steps=10: the later of the
           two exits, and the log lines of either that read as a crash
           (E0000, StartAbort, "crashed");
  sigterm  RegressionTiny with --max_steps=10**6, SIGTERM 1 s after its
           first step: also the seconds from the signal to the exit.

Every mode runs `--repeats` times with no load and with `--load` CPU-bound
processes (`while True: pass`) beside it (the machine is shared, so "no
load" means what others run), for this checkout and, with
`--baseline_root DIR` (a checkout of another revision in a folder named
`cadence`, e.g. `mkdir -p /tmp/base/cadence && git archive main | tar -x -C
/tmp/base/cadence`), for that one too, interleaved. The table gives the
median and every run.

Run:
  .venv/bin/python bench/exit_bench.py --repeats 2 --load 4 \
      --baseline_root /tmp/base/cadence [--modes lm2,hosts2]
"""
import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import bench_log

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LM = 'lm.one_billion_wds.OneBWdsGPipeTransformerTiny'
_REGRESSION = 'synthetic.linear_regression.RegressionTiny'
_CRASH = re.compile(r'E0000|StartAbort|crashed')
MODES = ('lm1', 'lm2', 'keras2', 'hosts2', 'sigterm')


class _Run:
  """A trainer.py process of checkout `root`; records when each stderr line
  came and when it exited."""

  def __init__(self, root, flags, baseline, env=None):
    env = dict(env or os.environ, TF_CPP_MIN_LOG_LEVEL='1')
    if baseline:  # Import the package from the checkout, not the install.
      env['PYTHONPATH'] = os.pathsep.join(
          [os.path.dirname(root)] +
          [p for p in env.get('PYTHONPATH', '').split(os.pathsep) if p])
    self.lines, self.last, self.exited = [], None, None
    self.proc = subprocess.Popen(
        [sys.executable, 'trainer.py'] + flags, cwd=root, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    self._reader = threading.Thread(target=self._Read, daemon=True)
    self._reader.start()
    self._waiter = threading.Thread(target=self._Wait, daemon=True)
    self._waiter.start()

  def _Read(self):
    for line in self.proc.stderr:
      self.last = time.monotonic()
      self.lines.append(line)

  def _Wait(self):
    self.proc.wait()
    self.exited = time.monotonic()

  def WaitFor(self, pattern, timeout=1800):
    deadline = time.monotonic() + timeout
    while not any(re.search(pattern, l) for l in list(self.lines)):
      if self.proc.poll() is not None or time.monotonic() > deadline:
        raise RuntimeError(f'no {pattern!r} line:\n' +
                           ''.join(self.lines[-20:]))
      time.sleep(0.05)

  def Finish(self, timeout=1800):
    """(seconds from the last line to the exit, exit code)."""
    self._waiter.join(timeout)
    self._reader.join(timeout)
    if self.exited is None:
      self.proc.kill()
      raise RuntimeError('did not exit:\n' + ''.join(self.lines[-20:]))
    if self.proc.returncode:
      raise RuntimeError(f'exit code {self.proc.returncode}:\n' +
                         ''.join(self.lines[-20:]))
    return self.exited - self.last

  @property
  def crash_lines(self):
    return sum(bool(_CRASH.search(l)) for l in self.lines)


def _FreePorts(n):
  sockets = [socket.socket() for _ in range(n)]
  for s in sockets:
    s.bind(('127.0.0.1', 0))
  ports = [s.getsockname()[1] for s in sockets]
  for s in sockets:
    s.close()
  return ports


def RunMode(mode, root, baseline, logdir):
  """Runs `mode` once; returns (seconds from the last line to the exit,
  crash lines, seconds from SIGTERM to the exit or None)."""
  common = [f'--logdir={logdir}']
  if mode in ('lm1', 'lm2'):
    flags = common + [f'--model={_LM}', '--job=trainer', '--max_steps=2']
    run = _Run(root, flags + (['--worker_replicas=2'] if mode == 'lm2'
                              else []), baseline)
    return run.Finish(), run.crash_lines, None
  if mode == 'keras2':
    run = _Run(root, common + ['--model=keras.regression.KerasMlpTiny',
                               '--worker_replicas=2', '--max_steps=20'],
               baseline)
    return run.Finish(), run.crash_lines, None
  if mode == 'hosts2':
    cluster = {'worker': [f'127.0.0.1:{p}' for p in _FreePorts(2)]}
    runs = [_Run(root, common + [f'--model={_REGRESSION}', '--job=trainer',
                                 '--max_steps=10'], baseline,
                 env=dict(os.environ, TF_CONFIG=json.dumps(
                     {'cluster': cluster,
                      'task': {'type': 'worker', 'index': i}})))
            for i in range(2)]
    waits = [run.Finish() for run in runs]
    return max(waits), sum(run.crash_lines for run in runs), None
  if mode == 'sigterm':
    run = _Run(root, common + [f'--model={_REGRESSION}', '--job=trainer',
                               '--max_steps=1000000'], baseline)
    run.WaitFor('First step done')
    time.sleep(1.0)
    signalled = time.monotonic()
    run.proc.send_signal(signal.SIGTERM)
    wait = run.Finish()
    return wait, run.crash_lines, run.exited - signalled
  raise ValueError(f'--modes: {mode!r} is not one of {", ".join(MODES)}.')


def _Load(n):
  return [subprocess.Popen([sys.executable, '-c', 'while True: pass'])
          for _ in range(n)]


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--modes', default=','.join(MODES))
  parser.add_argument('--repeats', type=int, default=2)
  parser.add_argument('--load', type=int, default=4,
                      help='CPU-bound processes beside the loaded runs.')
  parser.add_argument('--baseline_root', default=None)
  args = parser.parse_args()
  roots = {'this checkout': _ROOT}
  if args.baseline_root:
    base = os.path.abspath(args.baseline_root)
    if os.path.basename(base) != 'cadence':
      raise ValueError(f'--baseline_root={base!r}: the checkout must be a '
                       "folder named 'cadence' (the package).")
    roots = {'baseline': base, **roots}
  modes = args.modes.split(',')
  results = {}  # (mode, load, name) -> [(wait, crash lines, from signal)]
  for r in range(args.repeats):
    for load in (0, args.load):
      burners = _Load(load)
      try:
        for mode in modes:
          names = list(roots) if r % 2 == 0 else list(roots)[::-1]
          for name in names:
            bench_log.Say(f'repeat {r + 1} of {args.repeats}, {load} '
                          f'CPU burner(s) beside: {mode} ({name})...')
            with tempfile.TemporaryDirectory() as logdir:
              out = RunMode(mode, roots[name], name == 'baseline', logdir)
            results.setdefault((mode, load, name), []).append(out)
            print(f'{mode} load {load} {name}: {out[0]:.2f} s after the last '
                  f'line, {out[1]} crash line(s)' +
                  (f', {out[2]:.2f} s after SIGTERM' if out[2] else '') +
                  f'; load average {os.getloadavg()[0]:.1f}', flush=True)
      finally:
        for p in burners:
          p.kill()
          p.wait()
  print('\n| mode | load beside | ' + ' | '.join(
      f'{n}: s last line -> exit (median; runs)' for n in roots) +
        ' | crash lines | SIGTERM -> exit (s, median) |')
  print('| --- | --- |' + ' --- |' * (len(roots) + 2))
  for mode in modes:
    for load in (0, args.load):
      cells, crashes, signals = [], [], []
      for name in roots:
        got = results[(mode, load, name)]
        waits = [w for w, _, _ in got]
        cells.append(f'{statistics.median(waits):.2f} '
                     f'({", ".join(f"{w:.1f}" for w in waits)})')
        crashes.append(str(sum(c for _, c, _ in got)))
        if got[0][2] is not None:
          signals.append(f'{statistics.median(s for _, _, s in got):.2f}')
      print(f'| {mode} | {load} | ' + ' | '.join(cells) +
            f' | {" / ".join(crashes)} | {" / ".join(signals) or "-"} |')
  if len(roots) > 1:
    print('\ncrash lines and SIGTERM columns: ' + ' / '.join(roots) + '.')


if __name__ == '__main__':
  main()
