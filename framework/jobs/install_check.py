"""Whether this environment holds one TensorFlow, checked before it loads.

setup.py's TensorFlow extras are alternatives: `cpu` installs the
`tensorflow-cpu` distribution, `gpu` and `tf` the `tensorflow` one. Asked
for together (`.[cpu,gpu]`, `.[cpu,tf]`), pip installs both, and both write
the same `tensorflow/` folder (in 2.21, 14,857 files in common, 16 of them
different builds, e.g. libtensorflow_framework.so.2). `pip check` passes
and TensorFlow imports, but the wheel written last silently wins, and
uninstalling either deletes files the other needs. The trainer refuses such
an environment with one line saying how to keep one (`gpu` with `tf` is
one distribution, and fine).

Example:
  install_check.CheckOneTensorFlow()   # command_line.UserError if not.
"""
import importlib.metadata

from cadence.framework.jobs import command_line


def TensorFlowDistributions():
  """(name, version) of each installed distribution that writes the
  `tensorflow` package (its top_level.txt names it), sorted."""
  found = set()
  for dist in importlib.metadata.distributions():
    top_level = (dist.read_text('top_level.txt') or '').split()
    if 'tensorflow' in top_level:
      found.add((dist.metadata['Name'], dist.version))
  return sorted(found)


def CheckOneTensorFlow(installed=None):
  """Raises command_line.UserError if two distributions write TensorFlow.

  Args:
    installed: [(name, version)] of the distributions that write the
      `tensorflow` package; None: this environment's
      (`TensorFlowDistributions()`).
  """
  if installed is None:
    installed = TensorFlowDistributions()
  if len(installed) < 2:
    return
  names = ' '.join(name for name, _ in installed)
  found = ' and '.join(f'{name} {version}' for name, version in installed)
  raise command_line.UserError(
      f'TensorFlow is installed {len(installed)} times in this environment '
      f'({found}; setup.py\'s cpu, gpu and tf extras are alternatives): '
      'each writes the same tensorflow/ folder, so the last one installed '
      'wins and uninstalling either breaks the other; keep one: pip '
      f'uninstall -y {names}, then pip install -e ".[cpu]" (or ".[gpu]").')
