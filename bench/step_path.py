"""The path of a training step through Cadence's files.

Traces the first step of the README's main job (the Tiny LM, 2 stages, its
own schedule; --model and --override change it) and records every call
into Cadence's own code while the step's graph is built and run: the
Python of a step. Prints how many files and folders it crosses, its hops
(the distinct calls from one file into another) and how many of them go
into a file entered before: what a reader follows from the train loop to
the optimizer's update.

Run:
  .venv/bin/python bench/step_path.py [--model=lm.one_billion_wds.OneBWdsGPipeTransformerTiny]
      [--override='task.stack_tpl.pipeline_tpl.schedule=zb_h1'] [--files]
"""
import argparse
import collections
import os
import sys
import tempfile

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TINY_LM = 'lm.one_billion_wds.OneBWdsGPipeTransformerTiny'


def _Ours(name):
  return (name.startswith(_ROOT + os.sep) and
          not name.startswith(os.path.join(_ROOT, '.venv')) and
          '/bench/' not in name)


def _Path(step):
  """Every call `step()` makes into Cadence's files, in order: (the file
  of the nearest Cadence caller or None, the file called)."""
  calls = []

  def _Profile(frame, event, arg):
    del arg   # Unused.
    if event != 'call' or not _Ours(frame.f_code.co_filename):
      return
    caller = frame.f_back
    while caller is not None and not _Ours(caller.f_code.co_filename):
      caller = caller.f_back
    calls.append((None if caller is None else os.path.relpath(
        caller.f_code.co_filename, _ROOT),
                  os.path.relpath(frame.f_code.co_filename, _ROOT)))
  sys.setprofile(_Profile)
  try:
    step()
  finally:
    sys.setprofile(None)
  return calls


def Summary(calls):
  """(files, folders, hops, returns, per file its calls) of a call path: a
  hop is a distinct call from one file into another (caller -> callee), a
  return one into a file the path entered before by another hop."""
  edges = list(dict.fromkeys((a, b) for a, b in calls if a and a != b))
  entered, returns = set(), 0
  for _, callee in edges:
    if callee in entered:
      returns += 1
    entered.add(callee)
  files = {b for _, b in calls}
  folders = {os.path.dirname(name) for name in files}
  return (len(files), len(folders), len(edges), returns,
          collections.Counter(b for _, b in calls))


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--model', default=_TINY_LM)
  parser.add_argument('--override', default='')
  parser.add_argument('--files', action='store_true',
                      help='also list the files and their calls')
  args = parser.parse_args()
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf.config.set_logical_device_configuration(
      tf.config.list_physical_devices('CPU')[0],
      [tf.config.LogicalDeviceConfiguration()] * 2)
  from cadence.framework import cluster as cluster_lib  # pylint: disable=g-import-not-at-top
  from cadence.framework import model_registry  # pylint: disable=g-import-not-at-top
  from cadence.framework.train import programs  # pylint: disable=g-import-not-at-top
  from cadence.framework.train import replicas  # pylint: disable=g-import-not-at-top

  params = model_registry.GetParams(args.model, 'Train')
  if args.override:
    params.FromText(args.override.replace(';', '\n'))
  split = getattr(model_registry.GetClass(args.model), 'WORKER_SPLIT_SIZE', 1)
  cluster = cluster_lib.Cluster.Params().Set(
      num_devices=split, worker_split_size=split).Instantiate()
  with cluster:
    tasks = replicas.BuildReplicas(params, cluster)
    program = programs.TrainProgram(tasks, tempfile.mkdtemp(),
                                    tf.distribute.get_strategy(),
                                    cluster=cluster)
    run = program.StepRunner()
    calls = _Path(lambda: run(1))
  files, folders, hops, returns, per_file = Summary(calls)
  print(f'{args.model}: a training step crosses {files} files in {folders} '
        f'folders; {hops} hops (distinct calls from one file into another), '
        f'{returns} of them into a file entered before ({len(calls)} '
        'calls).')
  if args.files:
    for name, n in sorted(per_file.items()):
      print(f'  {n:6d}  {name}')
    for a, b in dict.fromkeys((a, b) for a, b in calls if a and a != b):
      print(f'  {a} -> {b}')


if __name__ == '__main__':
  main()
