"""The README's "Pipeline your own model", as written, through the trainer.

The README's code block is params/examples/pipelined_mlp.py (its code,
under the module docstring); the commands the README gives for it run in
one subprocess (the trainer's flag parsing and `main`, case by case):
--mode=inspect_model (memory per stage), --mode=plan --plan_measure and
on a described cluster, and training with 1F1B and ZB-H1, which reach the
same loss (the schedules compute the same gradients); then the export
of the 1F1B run, whose `predict` equals numpy on the checkpoint's weights,
also through the README's loading snippet as written.
"""
import io
import os
import re
import sys
from unittest import mock

import numpy as np
import tensorflow as tf

from cadence.framework.train import summary_utils
from cadence.tests import readme_blocks
from cadence.tests import test_utils

_KEY = 'examples.pipelined_mlp.PipelinedMlp'


def _ReadmeSection():
  with open(os.path.join(test_utils.ROOT, 'README.md')) as f:
    text = f.read()
  section = text[text.index('## Pipeline your own model'):]
  return section[:section.index('\n## ', 3)]


class PipelineYourOwnModelTest(tf.test.TestCase):

  def testTheReadmeCodeIsTheRegisteredExample(self):
    block = re.search(r'```python\n(.*?)```', _ReadmeSection(), re.S).group(1)
    with open(os.path.join(test_utils.ROOT, 'params', 'examples',
                           'pipelined_mlp.py')) as f:
      source = f.read()
    self.assertEqual(block, source[source.index('import tensorflow'):])

  def testTheReadmeCommandsRun(self):
    section = _ReadmeSection()
    commands = re.findall(r'\.venv/bin/python trainer\.py (.*)', section)
    self.assertGreaterEqual(len(commands), 4, commands)
    root = self.get_temp_dir()
    argvs = []
    for command in commands:
      argv = [a.replace('"', '') for a in re.findall(r'(?:[^\s"]|"[^"]*")+',
                                                     command)]
      argvs.append([a.replace('/tmp/', f'{root}/') for a in argv] +
                   ['--max_steps=20', '--job=trainer'] * any(
                       a.startswith('--logdir') for a in argv))
    # The export reads what the training wrote: it runs after the others.
    exports = [i for i, c in enumerate(commands) if '--mode=export' in c]
    self.assertLen(exports, 1)
    export_argv = [a for a in argvs[exports[0]]
                   if a not in ('--max_steps=20', '--job=trainer')]
    commands.pop(exports[0])
    argvs.pop(exports[0])
    # --plan_measure first: its BFC allocator is set before TF loads.
    order = sorted(range(len(argvs)),
                   key=lambda i: '--plan_measure' not in argvs[i])
    results = test_utils.FinishTrainerMains(test_utils.StartTrainerMains(
        [argvs[i] for i in order]), timeout=1200, stdout=True)
    losses = []
    for i, (code, stderr, stdout) in zip(order, results):
      command = commands[i]
      with self.subTest(command=command):
        self.assertEqual(0, code, stderr[-3000:])
        self.assertNotIn('Traceback', stderr)
        if '--mode=inspect_model' in command:
          self.assertRegex(stdout, r'cell 1 +/device:CPU:1 .* unit3\.\.unit6')
        if '--mode=plan' in command:
          # A best layout, or, with a fit too far off on this host to tell
          # its best layouts apart, a layout to start from.
          self.assertRegex(stdout, r'\n(Best layout|A layout to start from, '
                           r'not a confident best) \(rank \d+[^)]*\): '
                           r'R=\d K=\d v=\d M=\d+ ')
        logdirs = [a.split('=', 1)[1] for a in argvs[i]
                   if a.startswith('--logdir=')]
        if logdirs:
          # The trainer's summaries (absl's INFO log is not captured here).
          scalars = summary_utils.ReadScalars(
              os.path.join(logdirs[0], 'train'))
          losses.append(dict(scalars['loss'])[20])
    # 1F1B and ZB-H1 (and GPipe, if run) train the same model alike.
    self.assertGreaterEqual(len(losses), 2)
    self.assertAllClose(losses, [losses[0]] * len(losses), rtol=1e-5)
    (code, stderr), = test_utils.FinishTrainerMains(
        test_utils.StartTrainerMains([export_argv]), timeout=600)
    self.assertEqual(0, code, stderr[-3000:])
    self._CheckExport(export_argv)

  def _CheckExport(self, argv):
    """The export's predict against numpy on the checkpoint's weights; the
    README's loading snippet, as written, on the export."""
    flags = dict(a[2:].split('=', 1) for a in argv if '=' in a)
    ckpt = tf.train.latest_checkpoint(os.path.join(flags['logdir'], 'train'))
    reader = tf.train.load_checkpoint(ckpt)
    w = lambda name: reader.get_tensor(  # pylint: disable=g-long-lambda
        f'model/vars/regression..net..{name}/.ATTRIBUTES/VARIABLE_VALUE')

    def Want(x):
      h = x.astype(np.float64)
      for i in range(6):
        h = h + np.maximum(h @ w(f'units[{i}]..w1'), 0) @ w(f'units[{i}]..w2')
      return (h @ w('units[6]..w') + w('units[6]..b'))[:, 0]

    x = np.random.default_rng(3).normal(size=[5, 8]).astype(np.float32)
    served = tf.saved_model.load(flags['export_dir'])
    got = served.predict(x=tf.constant(x))['y'].numpy()
    self.assertEqual(got.shape, (5,))
    self.assertAllClose(got, Want(x), rtol=1e-5, atol=1e-5)
    _, _, snippet = readme_blocks.Blocks('by tests/params/examples_test.py')
    self.assertEqual('python', snippet.language)
    with mock.patch.object(sys, 'stdout', io.StringIO()) as out:
      readme_blocks.Run(snippet,
                        {'/tmp/my_pipeline_export': flags['export_dir']})
    printed = re.fullmatch(r'tf\.Tensor\(\[(.*)\], shape=\(2,\), '
                           r'dtype=float32\)\n', out.getvalue())
    self.assertIsNotNone(printed, out.getvalue())
    self.assertAllClose([float(v) for v in printed.group(1).split()],
                        Want(np.zeros([2, 8], np.float32)), rtol=1e-5,
                        atol=1e-5)


if __name__ == '__main__':
  tf.test.main()
