"""The house's imports run one way (framework/__init__.py).

Each package of Cadence may import only the packages below it:

  framework (core) <- framework.pipeline <- framework.train
      <- framework.distribute <- framework.planning <- framework.jobs
      <- trainer.py
  framework (core), framework.pipeline <- layers <- tasks <- params
  (framework.planning and framework.jobs also import layers, tasks and
  params: they lay out and run the experiments)
  framework (core), framework.pipeline, layers <- framework.testing (the
  test kit users import; nothing of Cadence imports it)

The test reads every module's import statements (nothing is imported), so a
new upward import fails here with the file, the line and the rule.
"""
import ast
import os
import unittest

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_ROOMS = ('pipeline', 'train', 'distribute', 'planning', 'jobs',
          'testing')

# What each package may import from cadence (besides itself).
_ALLOWED = {
    'framework': set(),
    'framework.pipeline': {'framework'},
    'framework.train': {'framework', 'framework.pipeline'},
    'framework.distribute': {'framework', 'framework.pipeline',
                             'framework.train'},
    'framework.planning': {'framework', 'framework.pipeline',
                           'framework.train', 'framework.distribute',
                           'layers', 'tasks', 'params'},
    'framework.jobs': {'framework', 'framework.pipeline', 'framework.train',
                       'framework.distribute', 'framework.planning',
                       'layers', 'tasks', 'params'},
    'framework.testing': {'framework', 'framework.pipeline', 'layers'},
    'layers': {'framework', 'framework.pipeline'},
    'tasks': {'framework', 'framework.pipeline', 'layers'},
    'params': {'framework', 'framework.pipeline', 'layers', 'tasks'},
}


def _PackageOf(module):
  """'framework.pipeline.schedules' -> 'framework.pipeline'; the package
  (a key of _ALLOWED) a dotted module path below `cadence` belongs to."""
  parts = module.split('.')
  if parts[0] == 'framework' and len(parts) > 1 and parts[1] in _ROOMS:
    return f'framework.{parts[1]}'
  return parts[0]


def _Imports(path):
  """(line, dotted module below `cadence`) of each `cadence` import."""
  tree = ast.parse(open(path).read(), path)
  found = []
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module and (
        node.module == 'cadence' or node.module.startswith('cadence.')):
      base = node.module[len('cadence.'):] if '.' in node.module else ''
      for alias in node.names:
        full = f'{base}.{alias.name}' if base else alias.name
        found.append((node.lineno, full))
    elif isinstance(node, ast.Import):
      for alias in node.names:
        if alias.name.startswith('cadence.'):
          found.append((node.lineno, alias.name[len('cadence.'):]))
  return found


def _Modules():
  for top in ('framework', 'layers', 'tasks', 'params'):
    for folder, _, files in os.walk(os.path.join(_ROOT, top)):
      for name in sorted(files):
        if name.endswith('.py'):
          path = os.path.join(folder, name)
          rel = os.path.relpath(path, _ROOT)[:-len('.py')]
          yield path, rel.replace(os.sep, '.').replace('.__init__', '')


class LayeringTest(unittest.TestCase):

  def testImportsRunOneWay(self):
    broken = []
    for path, module in _Modules():
      own = _PackageOf(module)
      for line, imported in _Imports(path):
        # 'framework.pipeline' imported as a name from 'cadence.framework'.
        target = _PackageOf(imported)
        if target != own and target not in _ALLOWED[own]:
          broken.append(f'{os.path.relpath(path, _ROOT)}:{line} imports '
                        f'cadence.{imported}: {own} may import only '
                        f'{sorted(_ALLOWED[own]) or "itself"}')
    self.assertEqual(broken, [], '\n'.join(broken))

  def testCoreIsSmall(self):
    core = [n for n in os.listdir(os.path.join(_ROOT, 'framework'))
            if n.endswith('.py') and n != '__init__.py']
    self.assertLessEqual(len(core), 20, sorted(core))


if __name__ == '__main__':
  unittest.main()
