"""The README's code, as written.

Each code block of README.md says, in an HTML comment on the line before
it, how it is tested (tests/readme_blocks.py): `run` here, as written;
`module NAME` loaded here as that module and run as the text around it
says; `by tests/X.py`, read from the README and run by that test; or `not
run:` and why. The blocks not run are installs, trainings of 200 steps and
more (the main job's 500 steps are tried by hand from a fresh clone; the
CI runs the test command, which is this suite), several hosts or tasks,
a TPU and Bazel; most name the test that runs the same path through
trainer.py on a shrunk model. A block without a comment fails
testEveryBlockSaysHowItIsTested, so a new block is noticed.

testTheRunnableBlocksRun starts three fresh processes at once, each as a
user's would be (its devices made by its first command that needs them):

  1. the modules of "A trainer mode of one's own" and "A distribution
     option of one's own", loaded and registered as their two lines in
     modes.py and distribution.py would; then, through trainer.py's flag
     parsing and `main`: a mistyped flag of the option, and the mode's
     command with --count_to=0 (each exit 2, one line, before TensorFlow
     loads); the option's command (first: it must make /device:CPU:1 in a
     process that has no devices yet, where it once failed); the mode's
     command (prints 1 2 3 4);
  2. every other `run` shell command, in README order (the commands of one
     section of one process would share its devices): the 1.7B LM's and
     ResNet-34's memory by stage, a table schedule profiled without
     --logdir (its last line says no chart was written);
  3. the `run` Python blocks, each in a namespace of its own, `/tmp/` in a
     temporary folder (a `print(...)  # VALUE: ...` line must print VALUE),
     then the action kind's module (its schedule, and its letter in a
     table) and the experiment's (its key and knobs).
"""
import json
import os
import re
import shlex

import tensorflow as tf

from cadence.framework.jobs import inspect_pipeline_mode
from cadence.tests import readme_blocks
from cadence.tests import test_utils

_TRAINER = '.venv/bin/python trainer.py '
_MODE = 'cadence.framework.jobs.count_mode'
_OPTION = 'cadence.framework.distribute.one_device'
# The README's modules, then the lines it says to add beside them: the
# mode's class in modes.py's BUILT_IN (which that file registers in
# order), the option's Register line in distribution.py.
_PRELUDE = f"""
from absl import flags, logging
logging.use_absl_handler()   # The trainer's log, as app.run shows it: it
flags.FLAGS.set_default('verbosity', 0)   # names the option's devices.
from cadence.framework.distribute import distribution
from cadence.framework.jobs import mode_registry
from cadence.tests import readme_blocks
count_mode = readme_blocks.Module({_MODE!r})
one_device = readme_blocks.Module({_OPTION!r})
mode_registry.Register(count_mode.CountMode)
distribution.Register(one_device.OneDeviceSetup, before='local')
"""
# Runs the Python blocks (json: [[line, tmp]]), then checks what the
# README says of its action kind's module and its experiment's.
_PYTHON = """
import contextlib, io, json, sys, traceback
from cadence.tests import readme_blocks
lines, tmp = json.loads(sys.argv[1])
blocks = {b.line: b for b in readme_blocks.Blocks()}
results = []
for line in lines:
  out = io.StringIO()
  try:
    with contextlib.redirect_stdout(out):
      readme_blocks.Run(blocks[line], {'/tmp/': tmp + '/'})
    results.append([out.getvalue(), ''])
  except Exception:  # pylint: disable=broad-except
    results.append([out.getvalue(), traceback.format_exc()])
readme_blocks.Module('cadence.framework.pipeline.fused_1f1b')
from cadence.framework.pipeline import schedules
kind = [str(a) for a in schedules.Build('fused_1f1b', 2, 2, 4).actions[1]]
table = [str(a) for a in schedules.Build(
    'table', 2, 2, 2, table='F0:0 F0:1 B0:0 B0:1 | P1:0 P1:1').actions[1]]
my_lm = readme_blocks.Module('cadence.params.lm.my_lm')
from cadence.framework import model_registry
params = model_registry.GetParams('lm.my_lm.WiderTiny', 'Train')
print(json.dumps(dict(
    results=results, kind=kind, table=table,
    wider=[model_registry.GetClass('lm.my_lm.WiderTiny') is my_lm.WiderTiny,
           params.task.model_dim,
           params.task.stack_tpl.transformer_tpl.hidden_dim])))
"""


def _Commands(block, tmp):
  """The trainer command lines of a `run` shell block, as argvs (after
  `trainer.py`), `/tmp/` in `tmp`."""
  lines = [line for line in block.code.splitlines() if line.strip()]
  assert all(line.startswith(_TRAINER) for line in lines), block
  return [shlex.split(line[len(_TRAINER):].replace('/tmp/', f'{tmp}/'))
          for line in lines]


class ReadmeTest(tf.test.TestCase):

  def testEveryBlockSaysHowItIsTested(self):
    blocks = readme_blocks.Blocks()
    self.assertGreater(len(blocks), 30)
    for block in blocks:
      where = f'README.md:{block.line} ({block.section})'
      kind = block.marker.split(' ')[0]
      self.assertIn(kind, ('run', 'module', 'by', 'not'),
                    f'{where}: no <!-- readme_test: ... --> comment before '
                    'it says how it is tested (tests/readme_blocks.py)')
      if kind == 'run':
        self.assertIn(block.language, ('python', 'sh'), where)
      elif kind == 'by':
        path = block.marker[len('by '):]
        with open(os.path.join(test_utils.ROOT, path)) as f:
          self.assertIn('README', f.read(), where)
      elif kind == 'not':
        self.assertRegex(block.marker, r'^not run: \S.{8,}', where)
      else:
        self.assertEqual('python', block.language, where)
    modules = [b.marker for b in blocks if b.marker.startswith('module ')]
    self.assertCountEqual(set(modules), modules)

  def testTheRunnableBlocksRun(self):
    tmp = self.get_temp_dir()
    runs = readme_blocks.Blocks('run')
    shell = [b for b in runs if b.language == 'sh']
    mode, = [argv for b in shell if b.section.startswith('A trainer mode')
             for argv in _Commands(b, tmp)]
    option, = [argv for b in shell
               if b.section.startswith('A distribution option')
               for argv in _Commands(b, tmp)]
    self.assertIn('--count_to=4', mode)
    typo = [a.replace('--one_device_cpu=', '--one_device_cpuu=')
            for a in option]
    refused = [a.replace('--count_to=4', '--count_to=0') for a in mode]
    own = test_utils.StartTrainerMains([typo, refused, option, mode],
                                       prelude=_PRELUDE)
    others = [argv for b in shell for argv in _Commands(b, tmp)
              if argv not in (mode, option)]
    plain = test_utils.StartTrainerMains(others)
    python = test_utils.StartPython(_PYTHON, json.dumps(
        [[b.line for b in runs if b.language == 'python'], tmp]))

    # 3. The Python blocks, and the modules' claims.
    out = json.loads(test_utils.FinishPython(python, timeout=900)
                     .strip().splitlines()[-1])
    blocks = [b for b in runs if b.language == 'python']
    self.assertLen(out['results'], len(blocks))
    for block, (stdout, error) in zip(blocks, out['results']):
      with self.subTest(block=f'README.md:{block.line} ({block.section})'):
        self.assertEqual('', error)
        for value in re.findall(r'print\(.*\) +# (\S+):', block.code):
          self.assertIn(value, stdout.split())
    self.assertEqual(['P(1, 0)', 'P(1, 1)', 'P(1, 2)', 'P(1, 3)'],
                     out['kind'])
    self.assertEqual(['P(1, 0)', 'P(1, 1)'], out['table'])
    self.assertEqual([True, 256, 1024], out['wider'])

    # 1. The mode and the option of one's own, through trainer.py.
    (typo_code, typo_err, typo_tf, _), (refused_code, refused_err,
                                        refused_tf, _), \
        (option_code, option_err, _, _), (mode_code, mode_err, _,
                                          mode_out) = \
        test_utils.FinishTrainerMains(own, timeout=900, imports=True,
                                      stdout=True)
    test_utils.AssertUserErrorLine(self, typo_code, typo_err,
                                   r'--one_device_cpuu.*--one_device_cpu\b')
    test_utils.AssertUserErrorLine(
        self, refused_code, refused_err,
        r'^Error: --count_to=0 must be an int >= 1 \(how far\)\.$')
    self.assertFalse(typo_tf or refused_tf, 'TensorFlow loaded before the '
                     'flags were checked')
    self.assertEqual(0, option_code, option_err[-3000:])
    self.assertRegex(option_err, r"'/device:CPU:1'\].*: 1 replica\(s\) of 1 "
                     r'device\(s\), one host')
    logdir = [a.split('=', 1)[1] for a in option if a.startswith('--logdir')]
    self.assertEqual('20', tf.train.latest_checkpoint(
        os.path.join(logdir[0], 'train')).rsplit('-', 1)[1])
    self.assertEqual(0, mode_code, mode_err[-3000:])
    self.assertEqual('1 2 3 4\n', mode_out)

    # 2. The other shell commands.
    results = test_utils.FinishTrainerMains(plain, timeout=900, stdout=True)
    self.assertLen(results, len(others))
    for argv, (code, stderr, stdout) in zip(others, results):
      with self.subTest(command=' '.join(argv)):
        self.assertEqual(0, code, stderr[-3000:])
        self.assertNotIn('Traceback', stderr)
        if '--mode=inspect_model' in argv:
          self.assertRegex(stdout, r'cell 1 +/device:CPU:1 ')
        if '--device_memory_gib=16' in argv:
          self.assertRegex(stdout, r'fits 16 GiB per device')
        if '--mode=inspect_pipeline' in argv:
          self.assertRegex(stdout, r'bubble: measured 0\.\d+, ideal')
          self.assertTrue(stdout.endswith(
              f'\n{inspect_pipeline_mode.NO_LOGDIR_LINE}\n'), stdout[-500:])


if __name__ == '__main__':
  tf.test.main()
