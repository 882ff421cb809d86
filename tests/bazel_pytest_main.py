"""Entry point of the Bazel py_test targets: runs pytest on one test file.

Bazel runs it from `<runfiles>/cadence` (the workspace is named `cadence`,
see WORKSPACE) as `bazel_pytest_main.py tests/<...>_test.py`; pytest then
reads pyproject.toml and tests/conftest.py as in a plain run. The check
below makes sure `cadence` is the copy in the runfiles, not an editable
install of some checkout that the interpreter's site-packages point to;
HOME is the test's temporary folder (the sandbox's home is read-only).
"""
import os
import sys

import pytest

import cadence


def _CheckCadenceIsTheRunfilesCopy():
  runfiles_root = os.path.abspath(os.getcwd())
  package_dir = os.path.dirname(os.path.abspath(cadence.__file__))
  if package_dir != runfiles_root:
    sys.exit(f'bazel_pytest_main: `cadence` imports from {package_dir}, not '
             f'from the runfiles {runfiles_root}: is the workspace named '
             '"cadence" in WORKSPACE?')


def _HomeInTheTestsTemporaryFolder():
  """Bazel's sandbox leaves the real home read-only: the caches Cadence
  writes under ~/.cache (trained SentencePiece models, tokenised files) go
  to this test's own temporary folder, for it and the trainers it starts
  ($XDG_CACHE_HOME, which would win over HOME, is dropped)."""
  if os.environ.get('TEST_TMPDIR'):
    home = os.path.join(os.environ['TEST_TMPDIR'], 'home')
    os.makedirs(home, exist_ok=True)
    os.environ['HOME'] = home
    os.environ.pop('XDG_CACHE_HOME', None)


if __name__ == '__main__':
  _CheckCadenceIsTheRunfilesCopy()
  _HomeInTheTestsTemporaryFolder()
  sys.exit(pytest.main(['-q'] + sys.argv[1:]))
