"""The built wheel, installed into a fresh venv, runs a user's project.

What a user of Cadence as a library does, in one test: build the wheel
(`pip wheel`, from a copy of the checkout, so that no stale build/ folder
leaks into it), install it with the `cpu` extra into a fresh venv (pip
resolves TensorFlow as a user's install does; here from the local wheel
cache), and, in a folder outside the checkout that holds the user's own
package (test_utils.USER_PACKAGE), run through the installed
`cadence-trainer` a few steps of the user's pipelined experiment by its
full key and of one of Cadence's own by its short key; then, at once, an
export, a plan and an inspect_model of the user's experiment, and `python
-m cadence.trainer` with another of the user's experiments on the same
logdir (it holds another model's checkpoints: exit 2, one line naming
the full key). The installed package must be the venv's, not the
checkout.

Subprocess-heavy: 110-170 s on the shared 2-core machine (load 6-15), the
venv and its install about 45 s of it.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

import tensorflow as tf

from cadence.tests import test_utils

# What the copy of the checkout leaves out: not part of a clean build.
_NOT_SOURCE = shutil.ignore_patterns(
    '.venv', '.git', 'build', 'dist', '*.egg-info', '__pycache__',
    '.pytest_cache')


def _Check(args, cwd, timeout=900):
  """Runs `args`; fails with its output's tail unless it exits 0."""
  proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True,
                        timeout=timeout, check=False)
  if proc.returncode:
    raise AssertionError(f'{" ".join(args)} exited {proc.returncode}:\n'
                         f'{(proc.stdout + proc.stderr)[-3000:]}')
  return proc.stdout


class WheelInstallTest(tf.test.TestCase):

  def testAUsersProjectRunsFromTheInstalledWheel(self):
    tmp = tempfile.mkdtemp(prefix='cadence_wheel_')   # Outside the checkout.
    self.addCleanup(shutil.rmtree, tmp, ignore_errors=True)
    src, wheels, venv = (os.path.join(tmp, d) for d in ('src', 'wheels',
                                                         'venv'))
    shutil.copytree(test_utils.ROOT, src, ignore=_NOT_SOURCE)
    _Check([sys.executable, '-m', 'pip', 'wheel', src, '-w', wheels,
            '--no-deps', '-q'], tmp)
    [wheel] = os.listdir(wheels)
    _Check([sys.executable, '-m', 'venv', venv], tmp)
    python, command = (os.path.join(venv, 'bin', name)
                       for name in ('python', 'cadence-trainer'))
    _Check([python, '-m', 'pip', 'install', '-q',
            os.path.join(wheels, wheel) + '[cpu]'], tmp)

    project = test_utils.WriteFiles(os.path.join(tmp, 'project'),
                                    test_utils.USER_PACKAGE)
    where = _Check([python, '-c', 'import cadence; print(cadence.__file__)'],
                   project).strip()
    self.assertTrue(where.startswith(os.path.join(venv, 'lib')), where)

    def Run(*flags, module=False):
      return test_utils.TrainerRun(
          *flags, cwd=project,
          command=[python, '-m', 'cadence.trainer'] if module else [command])

    user = os.path.join(tmp, 'user_run')
    pipelined = '--model=userexps.exps.MyPipelinedMlp'
    runs = [Run(pipelined, f'--logdir={user}', '--max_steps=4',
                '--job=trainer'),
            Run('--model=synthetic.linear_regression.RegressionTiny',
                f'--logdir={tmp}/short_key', '--max_steps=4')]
    for run in runs:
      code, _, err = run.Finish()
      self.assertEqual(code, 0, err[-3000:])
      self.assertIn('Training finished at step 4.', err)

    export = Run(pipelined, f'--logdir={user}', '--mode=export',
                 f'--export_dir={tmp}/export')
    plan = Run(pipelined, '--mode=plan', f'--logdir={tmp}/plan')
    inspect = Run(pipelined, '--mode=inspect_model')
    other = Run('--model=userexps.exps.MyRegression', f'--logdir={user}',
                '--max_steps=8', module=True)
    code, out, err = export.Finish()
    self.assertEqual(code, 0, err[-3000:])
    self.assertIn(f'Exported step 4 to {tmp}/export', out)
    self.assertTrue(os.path.isfile(os.path.join(tmp, 'export',
                                                'saved_model.pb')))
    code, out, err = plan.Finish()
    self.assertEqual(code, 0, err[-3000:])
    # The best plan's command is the installed one (not the checkout's).
    self.assertRegex(out, r'\n  cadence-trainer --model=userexps\.exps\.'
                     r'MyPipelinedMlp --worker_replicas=1 ')
    code, out, err = inspect.Finish()
    self.assertEqual(code, 0, err[-3000:])
    self.assertRegex(out, r'\ncell 1 +/device:CPU:1 ')
    code, _, err = other.Finish()
    test_utils.AssertUserErrorLine(
        self, code, err, rf'^Error: --logdir {re.escape(user)} holds '
        r'checkpoints of another model: \S+/train/ckpt-4 does not fit '
        r'--model=userexps\.exps\.MyRegression: ')


if __name__ == '__main__':
  tf.test.main()
