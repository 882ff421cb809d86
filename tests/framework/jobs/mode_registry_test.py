"""Trainer modes as a registry: a toy mode added from a test is one class
and one Register line, and the trainer defines, checks and runs it; a mode
has the hooks the sync mode runs by (checks before the devices, its own
exit code)."""
import dataclasses
import io
import sys
from unittest import mock

from absl import flags
import tensorflow as tf

from cadence.framework.jobs import command_line
from cadence.framework.jobs import mode_registry
from cadence.framework.jobs import modes
from cadence.framework.jobs import trainer_lib
from cadence.framework.jobs import user_error

_KEY = 'synthetic.linear_regression.RegressionTiny'


@dataclasses.dataclass
class _CountFlags:
  count_to: int = mode_registry.Flag(3, 'how far to count')
  count_word: str = mode_registry.Flag('', 'printed before the numbers')


class _CountMode(mode_registry.Mode):
  """Prints 1..count_to; refuses count_to < 1 before TensorFlow would."""
  NAME = 'count'
  HELP = 'prints 1..--count_to'
  FLAGS = _CountFlags

  def Check(self, options, flags):
    user_error.CheckInt('count_to', flags.count_to, 1, False, 'how far')

  def Run(self, context):
    words = [context.flags.count_word] if context.flags.count_word else []
    sys.stdout.write(' '.join(
        words + [str(i) for i in range(1, context.flags.count_to + 1)]) +
                     f' on {len(context.setup.cluster.devices)} device(s)\n')


class _GateMode(mode_registry.Mode):
  """What the sync mode uses too: checks before the devices, whose result
  Run gets (context.params), and an exit code of its own."""
  NAME = 'gate'
  HELP = 'exits with --max_steps'

  def CheckBeforeDevices(self, options, flags, setup_cls):
    if not options.max_steps:
      raise user_error.UserError('--mode=gate needs --max_steps.')
    return dict(code=options.max_steps, option=setup_cls.name)

  def Run(self, context):
    if context.params['code'] == 7:
      raise ValueError('Params gate.code: 7 is unlucky.')
    sys.stdout.write(f'{context.params["option"]}\n')
    return context.params['code']


class ModeRegistryTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    mode_registry.Register(_CountMode)
    self.addCleanup(mode_registry.Unregister, 'count')

  def testBuiltInModesKeepTheirOrder(self):
    self.assertEqual(('sync', 'inspect_params', 'inspect_model',
                      'inspect_pipeline', 'export', 'plan'), modes.NAMES)
    self.assertEqual(modes.NAMES + ('count',), mode_registry.Names())

  def testFlagsAreDefinedFromTheDataclass(self):
    values = flags.FlagValues()
    mode_registry.DefineFlags(flags, values)
    values(['prog', '--count_to=5', '--count_word=go', '--plan_top=3'])
    self.assertEqual(5, values.count_to)
    self.assertEqual('--mode=count: how far to count',
                     values['count_to'].help)
    self.assertEqual('int', values['count_to'].parser.flag_type())
    # The plan mode's fields come with its prefix; export's without one.
    self.assertEqual(3, values.plan_top)
    self.assertIsNone(values.export_batch_size)
    got = mode_registry.FlagsOf(_CountMode, values)
    self.assertEqual(_CountFlags(5, 'go'), got)
    self.assertEqual({'count_to': 5, 'count_word': 'go'},
                     {k: v for k, v in mode_registry.FlagValues(values).items()
                      if k.startswith('count_')})

  def testTheTrainerRunsIt(self):
    options = trainer_lib.TrainerOptions(
        model=_KEY, mode='count',
        mode_flags={'count_to': 4, 'count_word': 'go'})
    with mock.patch.object(sys, 'stdout', io.StringIO()) as out:
      self.assertEqual(trainer_lib.EXIT_OK, trainer_lib.Main(options))
    self.assertEqual('go 1 2 3 4 on 1 device(s)\n', out.getvalue())

  def testAModeHasTheSyncModesHooks(self):
    mode_registry.Register(_GateMode)
    self.addCleanup(mode_registry.Unregister, 'gate')
    with mock.patch.object(sys, 'stdout', io.StringIO()) as out:
      self.assertEqual(3, trainer_lib.Main(trainer_lib.TrainerOptions(
          model=_KEY, mode='gate', max_steps=3)))
    self.assertEqual('local\n', out.getvalue())
    # Its refusal before the devices, and a ValueError out of its Run:
    # exit 2 with one line.
    for max_steps, line in ((None, 'Error: --mode=gate needs --max_steps.'),
                            (7, 'Error: Bad params: Params gate.code: 7 is '
                             'unlucky.')):
      with mock.patch.object(sys, 'stderr', io.StringIO()) as err:
        self.assertEqual(trainer_lib.EXIT_USER_ERROR, trainer_lib.Main(
            trainer_lib.TrainerOptions(model=_KEY, mode='gate',
                                       max_steps=max_steps)))
      self.assertEqual(line + '\n', err.getvalue())

  def testItsChecksRunWithTheOthers(self):
    options = trainer_lib.TrainerOptions(model=_KEY, mode='count',
                                         mode_flags={'count_to': 0})
    with self.assertRaisesRegex(
        command_line.UserError, r'^--count_to=0 must be an int >= 1 '
        r'\(how far\)\.$'):
      command_line.Check(options)

  def testItsFlagsNeedIt(self):
    options = trainer_lib.TrainerOptions(model=_KEY, mode='inspect_params',
                                         mode_flags={'count_word': 'go'})
    with self.assertRaisesRegex(
        command_line.UserError, r'^--count_word need\(s\) --mode=count '
        r'\(now --mode=inspect_params\)\.$'):
      command_line.Check(options)

  def testRegisteringRefusesClashes(self):
    class _Again(_CountMode):
      pass
    with self.assertRaisesRegex(ValueError, r'--mode=count is registered '
                                r'already \(by _CountMode\)'):
      mode_registry.Register(_Again)

    class _Clash(mode_registry.Mode):
      NAME = 'clash'
      FLAGS = _CountFlags
    with self.assertRaisesRegex(ValueError, r'the flag --count_to is '
                                r'--mode=count\'s already'):
      mode_registry.Register(_Clash)
    with self.assertRaisesRegex(ValueError, r"kind=None must be one of "):
      mode_registry.Flag(None, 'no kind')


if __name__ == '__main__':
  tf.test.main()
