"""`trainer.py --mode=inspect_pipeline` over every schedule x remat policy.

One subprocess runs the trainer's flag parsing and `main` on each command
line in turn (test_utils.StartTrainerMains): the Tiny LM at its default
params (as the README runs it), then each registered schedule with each
remat policy, on a smaller model and batch (2 micro-batches of 2 rows of
16 tokens; 2 layers, or 4 for 2 stages per device) to keep the 25 profiled
steps cheap. Each must exit 0 without a traceback, time every
action of its schedule on the device the schedule puts it on (the chart's
table, pipeline_timeline.txt), and measure each device's memory (the
trainer turns TF's BFC allocator on for this mode).
"""
import os
import re

import tensorflow as tf

from cadence.framework.pipeline import executor
from cadence.framework.pipeline import schedules
from cadence.tests import test_utils

_LM = 'lm.one_billion_wds.OneBWdsGPipeTransformerTiny'
_PIPE = 'task.stack_tpl.pipeline_tpl'
_SMALL = (f'input.batch_size=4;input.max_seq_len=16;'
          f'{_PIPE}.num_micro_batches=2')
_TABLE = ('F0:0 F0:1 B0:0 W0:0 B0:1 W0:1 | F1:0 B1:0 W1:0 F1:1 B1:1 W1:1')
# What each schedule needs beyond its name: (overrides, stages).
_TWO_PER_DEVICE = f';{_PIPE}.stages_per_device=2', 4
_SETTINGS = {
    'interleaved_1f1b': _TWO_PER_DEVICE,
    'zb_v': _TWO_PER_DEVICE,
    'table': (f";{_PIPE}.schedule_table='{_TABLE}'", 2),
}
_ROW = re.compile(r'^([FBW])\((\d+), (\d+)\)\s+/device:CPU:(\d+)\s', re.M)


def _Cases():
  """[(name, schedule, micro-batches, stages, argv tail)]."""
  cases = [('default', 'gpipe', 4, 2, [])]
  for name in schedules.Names():
    extra, stages = _SETTINGS.get(name, ('', 2))
    for remat in executor.REMAT_MODES:
      cases.append((f'{name}_{remat}', name, 2, stages, [
          f'--model_params_override={_SMALL};{_PIPE}.schedule={name};'
          f'{_PIPE}.remat={remat};task.stack_tpl.num_layers={stages}'
          f'{extra}']))
  return cases


class InspectPipelineTest(tf.test.TestCase):

  def testEveryScheduleAndRematPolicy(self):
    root = self.get_temp_dir()
    cases = _Cases()
    self.assertLen(cases, 1 + len(schedules.Names()) *
                   len(executor.REMAT_MODES))
    results = test_utils.FinishTrainerMains(test_utils.StartTrainerMains([
        [f'--model={_LM}', '--mode=inspect_pipeline',
         f'--logdir={root}/{name}'] + tail
        for name, _, _, _, tail in cases]), timeout=1200, stdout=True)
    for (name, schedule, m, stages, _), (code, stderr, stdout) in zip(
        cases, results):
      with self.subTest(case=name):
        self.assertEqual(0, code, stderr[-3000:])
        self.assertNotIn('Traceback', stderr)
        table = _TABLE if schedule == 'table' else None
        want = schedules.Build(schedule, stages, 2, m, table=table)
        expected = sorted(
            (a.kind, a.stage, a.micro_batch, device)
            for device, actions in enumerate(want.actions) for a in actions)
        with open(os.path.join(root, name, 'inspect_pipeline',
                               'pipeline_timeline.txt')) as f:
          timed = sorted((k, int(s), int(b), int(d))
                         for k, s, b, d in _ROW.findall(f.read()))
        self.assertEqual(expected, timed)
        self.assertRegex(stdout, r'bubble: measured 0\.\d+, ideal')
        for device in (0, 1):
          self.assertRegex(stdout, rf'CPU:{device}: measured [\d.]+ [KM]iB, '
                           r'estimate [\d.]+ [KM]iB \([\d.]+x\)')


if __name__ == '__main__':
  tf.test.main()
