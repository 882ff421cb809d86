"""The README's "Your own project", as written, from the built wheel.

What a user of Cadence as a library does, in one test: build the wheel
(`pip wheel`, from a copy of the checkout, so that no stale build/ folder
leaks into it), install it with the `cpu` and `test` extras into a fresh
venv (pip resolves TensorFlow as a user's install does; here from the
local wheel cache), write the README's project files (each block's first
line names its file) into a folder outside the checkout, and run the
README's commands there with the venv's `bin/` first on PATH: inspect,
plan with --plan_measure, train, export and the project's own tests with
the kit (cadence.framework.testing). The installed package must be the
venv's, not the checkout. Then a misspelt full key and another model on
the trained logdir: exit 2, one line each.

Subprocess-heavy: a few minutes on the shared 2-core machine, the venv and
its install about 45 s of it.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

import tensorflow as tf

from cadence.tests import readme_blocks
from cadence.tests import test_utils

_MARKER = 'by tests/wheel_install_test.py'
_SECTION = 'Your own project'
# What the copy of the checkout leaves out: not part of a clean build.
_NOT_SOURCE = shutil.ignore_patterns(
    '.venv', '.git', 'build', 'dist', '*.egg-info', '__pycache__',
    '.pytest_cache')


def _Check(args, cwd, env=None, timeout=900):
  """Runs `args`; fails with its output's tail unless it exits 0."""
  proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True,
                        timeout=timeout, check=False, env=env)
  if proc.returncode:
    raise AssertionError(f'{" ".join(args)} exited {proc.returncode}:\n'
                         f'{(proc.stdout + proc.stderr)[-3000:]}')
  return proc.stdout


def _ReadmeProject():
  """({path: text} of the section's files, [the commands of its last sh
  block, after its `cd`])."""
  blocks = [b for b in readme_blocks.Blocks(_MARKER) if b.section == _SECTION]
  files = {}
  for block in blocks:
    if block.language == 'python':
      first, _, rest = block.code.partition('\n')
      files[re.fullmatch(r'# (\S+)', first).group(1)] = rest
  commands = blocks[-1].code.strip().splitlines()
  assert commands[0] == 'cd my_project', commands
  return files, commands[1:]


class WheelInstallTest(tf.test.TestCase):

  def testTheReadmesProjectRunsFromTheInstalledWheel(self):
    files, commands = _ReadmeProject()
    self.assertGreaterEqual(len(files), 5)
    self.assertEqual(5, len(commands), commands)
    tmp = tempfile.mkdtemp(prefix='cadence_wheel_')   # Outside the checkout.
    self.addCleanup(shutil.rmtree, tmp, ignore_errors=True)
    src, wheels, venv = (os.path.join(tmp, d) for d in ('src', 'wheels',
                                                         'venv'))
    shutil.copytree(test_utils.ROOT, src, ignore=_NOT_SOURCE)
    _Check([sys.executable, '-m', 'pip', 'wheel', src, '-w', wheels,
            '--no-deps', '-q'], tmp)
    [wheel] = os.listdir(wheels)
    _Check([sys.executable, '-m', 'venv', venv], tmp)
    python = os.path.join(venv, 'bin', 'python')
    _Check([python, '-m', 'pip', 'install', '-q',
            os.path.join(wheels, wheel) + '[cpu,test]'], tmp)
    test_utils.WriteFiles(tmp, files)
    project = os.path.join(tmp, 'my_project')
    env = dict(test_utils.QUIET_ENV, PATH=os.path.join(venv, 'bin') +
               os.pathsep + os.environ.get('PATH', ''))
    env.pop('PYTHONPATH', None)
    where = _Check([python, '-c', 'import cadence; print(cadence.__file__)'],
                   project, env).strip()
    self.assertTrue(where.startswith(os.path.join(venv, 'lib')), where)

    outputs = []
    for command in commands:
      args = [a.replace('/tmp/', f'{tmp}/') for a in command.split()]
      with self.subTest(command=command):
        outputs.append(_Check(args, project, env))
    inspect, plan, _, export, tests = outputs
    self.assertRegex(inspect, r'\ncell 1 +/device:CPU:1 ')
    # The best layout's command is the installed one (not the checkout's).
    self.assertRegex(plan, r'\n  cadence-trainer --model=my_model\.exps\.'
                     r'MyPipeline --worker_replicas=1 ')
    self.assertIn(f'Exported step 200 to {tmp}/my_model_export', export)
    self.assertTrue(os.path.isfile(os.path.join(tmp, 'my_model_export',
                                                'saved_model.pb')))
    self.assertRegex(tests, r'\b2 passed\b')

    # Bad input to the installed command: one line, exit 2, the logdir
    # as it was.
    for args, regex in (
        (['--model=my_model.exps.MyPipelin', '--mode=inspect_params'],
         r"^Error: .*my_model\.exps\.MyPipelin\b.*(?i:did you mean) .*"
         r"my_model\.exps\.MyPipeline"),
        (['--model=examples.pipelined_mlp.PipelinedMlp',
          f'--logdir={tmp}/my_model', '--max_steps=300'],
         rf'^Error: --logdir {re.escape(tmp)}/my_model holds checkpoints '
         r'of another model: ')):
      run = test_utils.TrainerRun(*args, cwd=project,
                                  command=[os.path.join(venv, 'bin',
                                                        'cadence-trainer')])
      code, _, err = run.Finish()
      test_utils.AssertUserErrorLine(self, code, err, regex)


if __name__ == '__main__':
  tf.test.main()
