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

Within the packages too, no module imports itself back, however long the
way round: the modules' imports form no circle. Every import counts, at a
module's top or inside a function. An import inside a function is allowed
only where it defers TensorFlow: the module importing it loads none at its
top, and the module imported does (what keeps a mistyped flag answered
before TensorFlow loads: e.g. a mode's Run imports what it runs); any
other goes to the top.

The test reads every module's import statements (nothing is imported), so a
new upward import, a circle or an import hidden in a function fails here
with the file, the line and the rule.
"""
import ast
import collections
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


# What loads TensorFlow when imported (third-party top-level names).
_TENSORFLOW = ('tensorflow', 'keras', 'tf_keras')
# An import: its line, the dotted module below `cadence` (or
# '<tensorflow>'), and whether it is inside a function.
_Import = collections.namedtuple('_Import', 'line module in_function')


def _Walk(node, in_function, found):
  """Appends an _Import of each import under `node` to `found`."""
  for child in ast.iter_child_nodes(node):
    names = []
    if isinstance(child, ast.ImportFrom) and child.module and not child.level:
      if child.module == 'cadence' or child.module.startswith('cadence.'):
        base = child.module[len('cadence.'):] if '.' in child.module else ''
        names = [f'{base}.{a.name}' if base else a.name for a in child.names]
      elif child.module.split('.')[0] in _TENSORFLOW:
        names = ['<tensorflow>']
    elif isinstance(child, ast.Import):
      for alias in child.names:
        if alias.name.startswith('cadence.'):
          names.append(alias.name[len('cadence.'):])
        elif alias.name.split('.')[0] in _TENSORFLOW:
          names.append('<tensorflow>')
    found.extend(_Import(child.lineno, n, in_function) for n in names)
    _Walk(child, in_function or isinstance(
        child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)), found)


def _AllImports(path):
  """Every import of the file `path`, at its top or inside a function."""
  found = []
  with open(path) as f:
    _Walk(ast.parse(f.read(), path), False, found)
  return found


def _Imports(path):
  """(line, dotted module below `cadence`) of each `cadence` import."""
  return [(i.line, i.module) for i in _AllImports(path)
          if i.module != '<tensorflow>']


def _Modules():
  for top in ('framework', 'layers', 'tasks', 'params'):
    for folder, _, files in os.walk(os.path.join(_ROOT, top)):
      for name in sorted(files):
        if name.endswith('.py'):
          path = os.path.join(folder, name)
          rel = os.path.relpath(path, _ROOT)[:-len('.py')]
          yield path, rel.replace(os.sep, '.').replace('.__init__', '')


class _Graph:
  """Every module's imports (the packages', trainer.py's and the
  `__init__`s'), each resolved to a module: `from cadence.x import Name`
  imports the module x when x.Name is not a module."""

  def __init__(self):
    self.paths = {m: p for p, m in _Modules()}
    self.paths['trainer'] = os.path.join(_ROOT, 'trainer.py')
    self.paths[''] = os.path.join(_ROOT, '__init__.py')
    self.imports = {m: [i._replace(module=self._Resolve(i.module))
                        for i in _AllImports(p)]
                    for m, p in self.paths.items()}

  def _Resolve(self, name):
    while name not in self.paths and name != '<tensorflow>':
      name = name.rpartition('.')[0]
    return name

  def Where(self, module, line):
    return f'{os.path.relpath(self.paths[module], _ROOT)}:{line}'

  def LoadsTensorFlow(self, module, seen=None):
    """Whether importing `module` loads TensorFlow: through its top-level
    imports or its packages' `__init__`s, and theirs."""
    seen = set() if seen is None else seen
    if module == '<tensorflow>':
      return True
    if module in seen:
      return False
    seen.add(module)
    parts = module.split('.')
    packages = ['.'.join(parts[:n]) for n in range(len(parts))]
    return any(self.LoadsTensorFlow(m, seen) for m in packages + [
        i.module for i in self.imports[module] if not i.in_function])

  def Circles(self):
    """The circles of imports, at the top and inside functions: each the
    sorted modules that reach one another (a strongly connected component
    of more than one module; Tarjan's algorithm)."""
    edges = {m: sorted({i.module for i in imports
                        if i.module in self.paths and i.module != m})
             for m, imports in self.imports.items()}
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def Visit(v):
      index[v] = low[v] = len(index)
      stack.append(v)
      on_stack.add(v)
      for w in edges[v]:
        if w not in index:
          Visit(w)
          low[v] = min(low[v], low[w])
        elif w in on_stack:
          low[v] = min(low[v], index[w])
      if low[v] == index[v]:
        component = [stack.pop()]
        while component[-1] != v:
          component.append(stack.pop())
        on_stack.difference_update(component)
        if len(component) > 1:
          circles.append(sorted(component))

    for module in sorted(edges):
      if module not in index:
        Visit(module)
    return circles


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

  def testNoCircleCountingImportsInsideFunctions(self):
    graph = _Graph()
    lines = []
    for circle in graph.Circles():
      lines.append(f'A circle of {len(circle)} modules:')
      lines += [f'  {graph.Where(m, i.line)} imports cadence.{i.module}'
                f'{" inside a function" if i.in_function else ""}'
                for m in circle for i in graph.imports[m]
                if i.module in circle and i.module != m]
    self.assertEqual(lines, [], '\n'.join(lines))

  def testImportsInsideFunctionsOnlyDeferTensorFlow(self):
    graph = _Graph()
    hidden, deferred = [], 0
    for module, imports in sorted(graph.imports.items()):
      for i in imports:
        if not i.in_function or i.module in ('<tensorflow>', module):
          continue
        where = (f'{graph.Where(module, i.line)} imports cadence.{i.module} '
                 'inside a function, but ')
        if graph.LoadsTensorFlow(module):
          hidden.append(f'{where}{module or "cadence"} loads TensorFlow at '
                        'its top already: import it at the top.')
        elif not graph.LoadsTensorFlow(i.module):
          hidden.append(f'{where}it loads no TensorFlow: import it at the '
                        'top.')
        else:
          deferred += 1
    self.assertEqual(hidden, [], '\n'.join(hidden))
    self.assertGreater(deferred, 0)   # The modes' Runs defer TensorFlow.

  def testCoreIsSmall(self):
    core = [n for n in os.listdir(os.path.join(_ROOT, 'framework'))
            if n.endswith('.py') and n != '__init__.py']
    self.assertLessEqual(len(core), 20, sorted(core))


if __name__ == '__main__':
  unittest.main()
