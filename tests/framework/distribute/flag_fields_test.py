"""flag_fields: flags declared as dataclass fields, defined in absl and
read back (the modes' and the distribution options' flags)."""
import dataclasses
import subprocess
import sys
import types
import unittest

from absl import flags

from cadence.framework.distribute import flag_fields
from cadence.tests import test_utils

Flag = flag_fields.Flag


@dataclasses.dataclass
class _ToyFlags:
  steps: int = Flag(3, 'how many steps')
  rate: float = Flag(0.5, 'a rate')
  name: str = Flag('', 'a name')
  fast: bool = Flag(False, 'go fast')
  limit: int = Flag(None, 'a limit or none', 'integer')


class FlagFieldsTest(unittest.TestCase):

  def testKindComesFromTheDefault(self):
    kinds = {f.name: f.metadata['kind'] for f in dataclasses.fields(_ToyFlags)}
    self.assertEqual(dict(steps='integer', rate='float', name='string',
                          fast='bool', limit='integer'), kinds)
    with self.assertRaisesRegex(ValueError, r'^Flag\(default=None\): '
                                r'kind=None must be one of string, bool, '
                                r'integer, float'):
      Flag(None, 'no kind')

  def testDefineThenReadBack(self):
    values = flags.FlagValues()
    for f in dataclasses.fields(_ToyFlags):
      flag_fields.Define(flags, f, 'toy_' + f.name,
                         f'toy: {f.metadata["help"]}', values)
    values(['prog', '--toy_steps=7', '--toy_fast', '--toy_name=x'])
    self.assertEqual('toy: how many steps', values['toy_steps'].help)
    self.assertEqual(['--toy_steps', '--toy_name', '--toy_fast'],
                     flag_fields.Given(flag_fields.Read(_ToyFlags, values,
                                                        'toy_'), 'toy_'))
    self.assertEqual(_ToyFlags(7, 0.5, 'x', True, None),
                     flag_fields.Read(_ToyFlags, values, 'toy_'))
    self.assertEqual(dict(toy_steps=7, toy_rate=0.5, toy_name='x',
                          toy_fast=True, toy_limit=None),
                     flag_fields.Values(_ToyFlags, values, 'toy_'))

  def testReadGivesDefaultsForWhatIsMissing(self):
    self.assertEqual(_ToyFlags(steps=9), flag_fields.Read(_ToyFlags,
                                                          {'steps': 9}))
    self.assertEqual(_ToyFlags(rate=0.1), flag_fields.Read(
        _ToyFlags, types.SimpleNamespace(rate=0.1)))
    self.assertEqual(['steps', 'rate', 'name', 'fast', 'limit'],
                     flag_fields.Names(_ToyFlags))
    self.assertEqual([], flag_fields.Names(flag_fields.NoFlags))

  def testTheRegistriesAndTheirFlagsImportNoTensorFlow(self):
    script = ('import sys\n'
              'from cadence.framework.distribute import distribution\n'
              'from cadence.framework.jobs import modes\n'
              "assert 'tensorflow' not in sys.modules, 'tensorflow loaded'\n")
    subprocess.run([sys.executable, '-c', script], check=True,
                   cwd=test_utils.ROOT, timeout=120)


if __name__ == '__main__':
  unittest.main()
