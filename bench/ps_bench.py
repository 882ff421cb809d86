"""Parameter-server training against the same model in one process.

For RegressionTiny (8 -> 16 -> 1, batch 32) and a wider variant
(256 -> 512 -> 512 -> 1, batch 256), each `--repeats` times, interleaved:

  local:  `trainer.py --job=trainer` in one process (no TF_CONFIG);
  ps:     the same command as 1 chief + 2 parameter servers + 2 workers on
          localhost (TF_CONFIG, least_loaded placement).

Steps/s is the trainer's own `steps_per_sec` summary, every 20 steps, the
first window (compilation) left out; the table gives the medians and ps /
local. A step is one batch either way (a worker's batch under PS), so the
ratio is also that of examples/s. The five processes share this machine's
cores with each other: this measures the cost of parameter-server training
(RPCs to the servers every step, asynchronous workers), not a speed-up.

Run:
  .venv/bin/python bench/ps_bench.py [--repeats 3] [--steps 600]
"""
import argparse
import os
import statistics
import tempfile

import bench_log
from cadence.framework.train import summary_utils
from cadence.tests import test_utils

_KEY = 'synthetic.linear_regression.RegressionTiny'
_CONFIGS = {
    'tiny (8-16-1, b32)': '',
    'wide (256-512-512-1, b256)': (
        'task.input_dim=256;input.input_dim=256;task.hidden_dims=[512,512];'
        'input.batch_size=256'),
}


def _StepsPerSec(logdir):
  """Median steps/s over the summaries after the first."""
  rates = summary_utils.ReadScalars(os.path.join(logdir, 'train'))[
      'steps_per_sec']
  return statistics.median(v for _, v in rates[1:])


def _Run(logdir, steps, override, ps):
  flags = [f'--model={_KEY}', f'--logdir={logdir}', '--job=trainer',
           f'--max_steps={steps}', f'--model_params_override={override}']
  if not ps:
    runs = [test_utils.TrainerRun(*flags, script=True)]
  else:
    cluster = test_utils.LocalCluster(chief=1, ps=2, worker=2)
    runs = [test_utils.TrainerRun(*flags, script=True, cluster=cluster,
                                  task=(job, i))
            for job, n in (('chief', 1), ('ps', 2), ('worker', 2))
            for i in range(n)]
  try:
    for run in runs:
      code, _, err = run.Finish(timeout=600)
      if code:
        raise RuntimeError(f'trainer exited {code}:\n{err[-3000:]}')
  finally:
    for run in runs:
      run.Kill()
  return _StepsPerSec(logdir)


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--steps', type=int, default=600)
  args = parser.parse_args()
  rates = {(name, ps): [] for name in _CONFIGS for ps in (False, True)}
  with tempfile.TemporaryDirectory() as tmp:
    for r in range(args.repeats):
      for name, override in _CONFIGS.items():
        for ps in (False, True):
          bench_log.Say(f'repeat {r + 1} of {args.repeats}: {name}, '
                        f'{args.steps} steps ' + (
                            'on 1 chief + 2 parameter servers + 2 workers'
                            if ps else 'in one process') + '...')
          logdir = os.path.join(tmp, f'{r}-{len(rates)}-{name[:4]}-{ps}')
          rates[name, ps].append(_Run(logdir, args.steps, override, ps))
  print(f'{"model":28s} {"local steps/s":>14s} {"ps steps/s":>11s} '
        f'{"ps / local":>10s}')
  for name in _CONFIGS:
    local = statistics.median(rates[name, False])
    ps = statistics.median(rates[name, True])
    print(f'{name:28s} {local:14.1f} {ps:11.1f} {ps / local:10.2f}')


if __name__ == '__main__':
  main()
