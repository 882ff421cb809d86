"""--mode=plan through the real trainer: the table, the best layout's flags
and params file, the simulated timeline."""
import json
import os
import re

import tensorflow as tf

from cadence.framework import base_model
from cadence.framework import cluster as cluster_lib
from cadence.framework import model_registry
from cadence.tests import test_utils

_TINY = 'lm.one_billion_wds.OneBWdsGPipeTransformerTiny'


class TrainerPlanTest(tf.test.TestCase):

  def testPlanRanksAppliesAndDraws(self):
    tmp = self.get_temp_dir()
    logdir = os.path.join(tmp, 'run')
    apply = os.path.join(tmp, 'best_plan.txt')
    code, out, err = test_utils.TrainerRun(
        f'--model={_TINY}', '--mode=plan', '--plan_cluster=h100x8,devices=4',
        '--plan_top=3', f'--plan_apply={apply}', '--plan_explain=2',
        f'--logdir={logdir}', script=True).Finish()
    self.assertEqual(0, code, err[-3000:])
    rows = [l for l in out.splitlines() if re.match(r'^ +\d+ +\d+ +\d+ ', l)]
    self.assertLen(rows, 3)
    times = [float(l.split()[8]) for l in rows]    # step ms, fastest first.
    self.assertEqual(sorted(times), times)
    best = re.search(r'Best layout \(rank (\d)[^)]*\): R=(\d+) K=(\d+) '
                     r'v=(\d+) M=(\d+) (\S+) (\S+) cut=\S+: ([\d.]+) ms', out)
    self.assertIsNotNone(best, out)
    rank, r, k, v, m = (int(x) for x in best.groups()[:5])
    schedule, remat = best.group(6), best.group(7)
    self.assertEqual(float(best.group(8)), times[rank - 1])
    self.assertTrue(rows[rank - 1].endswith('*'), rows)   # The layout chosen.
    # As pasted in the checkout: the README's interpreter, the logdir
    # given to the plan.
    self.assertIn(f'\n  .venv/bin/python trainer.py --model={_TINY} '
                  f'--worker_replicas={r} --worker_split_size={k} '
                  f'--model_params_file_override={apply} '
                  f'--logdir={logdir}\n', out)
    # Presets are not measurements, and the plan says so.
    self.assertIn('How sure: the costs are each op\'s FLOPs and bytes on '
                  'the cluster\'s public specifications, not measured', out)
    # The params file runs that layout: the model built with it has K x v
    # cells on K devices, M micro-batches, the schedule and the remat.
    params = model_registry.GetParams(_TINY, 'Train')
    with open(apply) as f:
      params.FromText(f.read())
    pipe = params.task.stack_tpl.pipeline_tpl
    self.assertEqual((m, schedule, remat, 32 // r),
                     (pipe.num_micro_batches, pipe.schedule, pipe.remat,
                      params.input.batch_size))
    with cluster_lib.Cluster.Params().Set(
        job='check', num_devices=k, worker_split_size=k).Instantiate():
      model, _ = base_model.BuildSymbolically(params)
    self.assertEqual(k * v, model.task.stack.num_cells)
    # The report is written with the chart of plan 2.
    with open(os.path.join(logdir, 'plan', 'plan.txt')) as f:
      self.assertEqual(out, f.read())
    self.assertIn('Simulated timeline of plan 2', out)
    with open(os.path.join(logdir, 'plan', 'plan_timeline.svg')) as f:
      svg = f.read()
    self.assertTrue(svg.startswith('<svg'))
    # Its title (its lines, wrapped) gives plan 2's step time of the table;
    # its time axis ends there.
    title = ' '.join(re.findall(r'<text x="4" y="\d+">([^<]*)</text>', svg))
    self.assertIn(f'(planner): {rows[1].split()[8]} ms (the step time of '
                  'the plan\'s table)', title)
    self.assertIn(f'>{rows[1].split()[8]} ms</text>', svg)
    self.assertTrue(os.path.exists(os.path.join(logdir, 'plan',
                                                'plan_timeline.txt')))
    # layouts.json: the table's rows, the layout chosen marked.
    with open(os.path.join(logdir, 'plan', 'layouts.json')) as f:
      layouts = json.load(f)
    self.assertEqual([1, 2, 3], [l['rank'] for l in layouts])
    self.assertEqual([rank], [l['rank'] for l in layouts if l['chosen']])


if __name__ == '__main__':
  tf.test.main()
