"""Tests for setup.py: its extras install together, without breaking TF;
its command `cadence-trainer` is declared and installed.

setup.py's `tpu` extra used to be cloud-tpu-client. Its only release pins
google-api-python-client 1.8.0, whose google-api-core 1.x pins protobuf < 4
(1.34.1: `protobuf<4.0.0dev,>=3.19.5`): `pip install -e ".[tpu]"` into a
TensorFlow 2.21 venv replaced protobuf 7 with 3.20.3, printed an ERROR
line, exited 0, and every later `import tensorflow` failed. Two cheap
checks keep that out:

  * this test environment's install is consistent (`pip check` on
    sys.executable's environment, as the README's install made it);
  * no extra names a package known to pin protobuf < 4 (setup.py is read,
    not run).

The full check, every extra and every pair of extras installed into fresh
venvs and `pip check`ed, takes minutes and gigabytes, so it is not run here
(issue 34 records it).
"""
import ast
import importlib
import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
import unittest

_SETUP = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'setup.py')

# Package -> (first version that no longer pins protobuf < 4, or None:
# none does; why).
_PINS_OLD_PROTOBUF = {
    'cloud-tpu-client': (None, 'its only release, 0.10, pins '
                         'google-api-python-client==1.8.0'),
    'google-api-python-client': ((2,), '1.x needs google-api-core < 2'),
    'google-api-core': ((2,), '1.34.1 pins protobuf<4.0.0dev'),
}


def _SetupArgument(name, path=_SETUP):
  """The value of setup.py's `name=` argument, read from its source
  (nothing is run)."""
  with open(path) as f:
    tree = ast.parse(f.read(), path)
  for node in ast.walk(tree):
    if isinstance(node, ast.keyword) and node.arg == name:
      return ast.literal_eval(node.value)
  raise AssertionError(f'{path}: no {name}= in setuptools.setup()')


def _Extras(path=_SETUP):
  """setup.py's extras_require."""
  return _SetupArgument('extras_require', path)


def _Version(text):
  """'2.16' -> (2, 16): the leading numbers of a version."""
  return tuple(int(p) for p in re.findall(r'\d+', text.split('+')[0])[:4])


def _Offenders(extras):
  """[(extra, requirement, why)] for each requirement of `extras` that may
  install a release of a package in _PINS_OLD_PROTOBUF that pins
  protobuf < 4 (no lower bound at or above its first safe version)."""
  found = []
  for extra, requirements in sorted(extras.items()):
    for requirement in requirements:
      match = re.match(r'\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?'
                       r'\s*([^;]*)', requirement)
      name = re.sub(r'[-_.]+', '-', match.group(1)).lower()
      if name not in _PINS_OLD_PROTOBUF:
        continue
      safe, why = _PINS_OLD_PROTOBUF[name]
      lows = [_Version(v) for op, v in re.findall(
          r'(>=|==|~=|>)\s*([0-9][^,\s]*)', match.group(3))]
      if safe is None or not any(low >= safe for low in lows):
        found.append((extra, requirement, why))
  return found


class ExtrasTest(unittest.TestCase):

  def testNoExtraInstallsAPackageThatPinsProtobufBelow4(self):
    self.assertEqual(_Offenders(_Extras()), [])

  def testTheCheckCatchesTheOldTpuExtra(self):
    self.assertEqual(
        [r for _, r, _ in _Offenders({'tpu': [
            'cloud-tpu-client', 'google-api-python-client',
            'google_api_core>=1.31', 'google-api-python-client>=2',
            'google-api-core[grpc]>=2.11; python_version>"3.9"']})],
        ['cloud-tpu-client', 'google-api-python-client',
         'google_api_core>=1.31'])

  def testTheDocumentedExtrasExist(self):
    self.assertLessEqual({'cpu', 'gpu', 'tf', 'test', 'tpu'},
                         set(_Extras()))


class EntryPointTest(unittest.TestCase):

  def testTheTrainerCommandIsDeclaredAndResolves(self):
    scripts = _SetupArgument('entry_points')['console_scripts']
    self.assertEqual(scripts, ['cadence-trainer = cadence.trainer:ConsoleMain'])
    module, _, attr = scripts[0].partition('=')[2].strip().partition(':')
    self.assertTrue(callable(getattr(importlib.import_module(module), attr)))

  def testThisInstallHasTheCommand(self):
    """The install the README's command made (pip install -e) wrote the
    script beside the interpreter (else: reinstall, pip install -e .)."""
    found = [e for e in importlib.metadata.entry_points(
        group='console_scripts') if e.name == 'cadence-trainer']
    self.assertEqual([e.value for e in found],
                     ['cadence.trainer:ConsoleMain'])
    self.assertTrue(os.path.isfile(os.path.join(
        os.path.dirname(sys.executable), 'cadence-trainer')))


class EnvironmentTest(unittest.TestCase):

  @unittest.skipIf(importlib.util.find_spec('pip') is None,
                   'no pip in this environment')
  def testPipCheckIsClean(self):
    """What the TPU install broke: pip printed the conflict, exited 0, and
    only `pip check` (or the next `import tensorflow`) said so."""
    proc = subprocess.run(
        [sys.executable, '-m', 'pip', 'check', '--disable-pip-version-check'],
        capture_output=True, text=True, timeout=120, check=False)
    self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)


if __name__ == '__main__':
  unittest.main()
