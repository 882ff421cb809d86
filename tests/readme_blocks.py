"""README.md's code blocks, for the tests that run them.

Each fenced code block of the README has, on the line before it, an HTML
comment saying how the tests hold it (tests/readme_test.py checks that
every block has one):

  <!-- readme_test: run -->               readme_test.py runs it as written
                                          (`/tmp/` paths in a temporary
                                          folder);
  <!-- readme_test: module NAME -->       the source of module NAME, which
                                          readme_test.py (and tests that
                                          use it) load and run as the text
                                          says;
  <!-- readme_test: by tests/X.py -->     tests/X.py reads the block from
                                          here and runs it;
  <!-- readme_test: not run: WHY -->      no test runs it, for that reason.

No TensorFlow here: a trainer process that loads a README module before
checking its flags (readme_test.py) imports this first.

Example:
  for block in Blocks():
    block.line, block.language, block.marker, block.section
  count_mode = Module('cadence.framework.jobs.count_mode')
  Run(block, {'/tmp/': '/tmp/test_xyz/'})   # a script's globals
"""
import os
import re
import sys
import types
import typing

PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), 'README.md')

# A block: the line of its opening fence (1-based), its language, what
# follows `readme_test:` in the comment before it ('' if none), its code
# (its indent removed) and the title of the `##` section it is in.
Block = typing.NamedTuple('Block', [
    ('line', int), ('language', str), ('marker', str), ('code', str),
    ('section', str)])
_FENCE = re.compile(r'^( *)```(\w*)\s*$')
_MARKER = re.compile(r'^ *<!-- readme_test: (.*?) -->\s*$')


def Blocks(marker=None):
  """The README's fenced code blocks in order (Block); with `marker`, those
  whose comment says that (e.g. 'by tests/trainer_export_test.py')."""
  with open(PATH) as f:
    lines = f.read().split('\n')
  blocks, section, i = [], '', 0
  while i < len(lines):
    if lines[i].startswith('## '):
      section = lines[i][3:].strip()
    fence = _FENCE.match(lines[i])
    if not fence:
      i += 1
      continue
    indent, start = fence.group(1), i
    i += 1
    while lines[i].rstrip() != indent + '```':
      i += 1
    before = _MARKER.match(lines[start - 1]) if start else None
    code = '\n'.join(line[len(indent):] for line in lines[start + 1:i])
    blocks.append(Block(start + 1, fence.group(2),
                        before.group(1) if before else '', code + '\n',
                        section))
    i += 1
  return [b for b in blocks if marker is None or b.marker == marker]


def _Compiled(block, replace):
  """The block's code, `replace`d ({old: new} texts), compiled so that its
  tracebacks give README.md's lines."""
  code = block.code
  for old, new in replace.items():
    code = code.replace(old, new)
  return compile('\n' * block.line + code, PATH, 'exec')


def Run(block, replace=None):
  """Runs `block` as a script (`__name__` '__main__'), its texts `replace`d
  ({old: new}, e.g. {'/tmp/': a temporary folder}); returns its globals."""
  namespace = {'__name__': '__main__', '__file__': PATH}
  exec(_Compiled(block, replace or {}), namespace)  # pylint: disable=exec-used
  return namespace


def Module(name):
  """Runs the block marked `module <name>` as a new module of that name (in
  sys.modules, in place of any before it; its tracebacks give README.md's
  lines) and returns it."""
  block, = Blocks(f'module {name}')
  module = types.ModuleType(name)
  module.__file__ = PATH
  sys.modules[name] = module
  exec(_Compiled(block, {}), module.__dict__)  # pylint: disable=exec-used
  return module
