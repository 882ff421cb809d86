"""How long the trainer takes to answer a user error, beside TF's import.

Each command line below is a mistake the trainer answers with exit 2 and
one `Error:` line; the table gives the wall seconds from start to exit
(median of interleaved repeats) and their ratio to `python -c "import
tensorflow"` measured in the same run. Flag, experiment-key, --logdir and
cluster mistakes are checked before TensorFlow loads
(framework/jobs/command_line.py); a bad params value needs the experiment,
hence TensorFlow, and is there for contrast. With `--baseline_root DIR` (a
checkout of another revision in a folder named `cadence`, e.g.
`git archive main | tar -x -C /tmp/base/cadence`) the same commands of
that checkout run too, interleaved; a command still running after
--timeout seconds (a hang) shows as inf.

Run:
  .venv/bin/python bench/trainer_errors_bench.py [--repeats 3]
      [--baseline_root /tmp/base/cadence]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import bench_log

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LM = 'lm.one_billion_wds.OneBWdsGPipeTransformerTiny'
_LOGDIR = '--logdir=/tmp/trainer_errors_bench'
# (name, flags, extra environment).
_CASES = [
    ('misspelt flag', [f'--modle={_LM}', _LOGDIR], {}),
    ('misspelt experiment', [f'--model={_LM[:-1]}', _LOGDIR], {}),
    ('missing --logdir', [f'--model={_LM}'], {}),
    ('--steps_per_loop=-1', [f'--model={_LM}', _LOGDIR,
                             '--steps_per_loop=-1'], {}),
    ('TF_CONFIG index -1', [f'--model={_LM}', _LOGDIR], {
        'TF_CONFIG': json.dumps({
            'cluster': {'worker': ['127.0.0.1:2222', '127.0.0.1:2223']},
            'task': {'type': 'worker', 'index': -1}})}),
    ('input.batch_size=32.5 (needs TF)', [
        f'--model={_LM}', _LOGDIR,
        '--model_params_override=input.batch_size=32.5'], {}),
]


def _Env(root, baseline, extra):
  env = {k: v for k, v in os.environ.items() if k != 'TF_CONFIG'}
  env.update(extra)
  if baseline:   # The checkout's parent first: `cadence` is imported there.
    env['PYTHONPATH'] = os.pathsep.join(
        [os.path.dirname(root)] +
        [p for p in env.get('PYTHONPATH', '').split(os.pathsep) if p])
  return env


def _Seconds(cmd, root, env, timeout):
  """Seconds to exit; `timeout` (inf in the table) if still running then,
  e.g. a revision that hangs on --steps_per_loop=-1."""
  start = time.perf_counter()
  try:
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True,
                          text=True, timeout=timeout)
  except subprocess.TimeoutExpired:
    return float('inf')
  seconds = time.perf_counter() - start
  if proc.returncode not in (1, 2):
    raise RuntimeError(f'{cmd}: exit {proc.returncode}\n{proc.stderr[-2000:]}')
  return seconds


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--baseline_root', default=None)
  parser.add_argument('--timeout', type=float, default=120,
                      help='Seconds before a command counts as hung.')
  args = parser.parse_args()
  roots = {'this checkout': _ROOT}
  if args.baseline_root:
    roots['baseline'] = os.path.abspath(args.baseline_root)
  runs = {}
  for r in range(args.repeats):
    bench_log.Say(f'round {r + 1} of {args.repeats}: import tensorflow...')
    start = time.perf_counter()
    subprocess.run([sys.executable, '-c', 'import tensorflow'], check=True,
                   capture_output=True)
    runs.setdefault('import tensorflow', []).append(
        time.perf_counter() - start)
    for name, flags, extra in _CASES:
      bench_log.Say(f'round {r + 1} of {args.repeats}: {name}...')
      order = list(roots) if r % 2 == 0 else list(roots)[::-1]
      for which in order:
        env = _Env(roots[which], which == 'baseline', extra)
        runs.setdefault((name, which), []).append(_Seconds(
            [sys.executable, 'trainer.py'] + flags, roots[which], env,
            args.timeout))
  tf_import = statistics.median(runs['import tensorflow'])
  print(f'\n`import tensorflow`: {tf_import:.2f} s (median of '
        f'{args.repeats}; the machine may be shared)\n')
  print('| error | ' + ' | '.join(f'{w}: s, / import' for w in roots) + ' |')
  print('| --- |' + ' --- |' * len(roots))
  for name, _, _ in _CASES:
    cells = []
    for which in roots:
      s = statistics.median(runs[(name, which)])
      cells.append(f'{s:.2f}, {s / tf_import:.2f}')
    print(f'| {name} | ' + ' | '.join(cells) + ' |')


if __name__ == '__main__':
  main()
