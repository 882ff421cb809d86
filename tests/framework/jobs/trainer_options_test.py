"""trainer_options: each common flag declared once, and from that one field
the absl flag, its check and the TrainerOptions field (the checks' messages:
command_line_test; through the trainer: trainer_bad_inputs_test)."""
import dataclasses
import types
import unittest

from absl import flags

from cadence.framework.distribute import distribution
from cadence.framework.jobs import mode_registry
from cadence.framework.jobs import modes
from cadence.framework.jobs import trainer_options
from cadence.framework.jobs import user_error

# What TrainerOptions holds besides the common flags.
_NOT_FLAGS = ('start_time', 'mode_flags', 'option_flags')


def _DefinedFlags():
  """A FlagValues with every flag trainer.py defines from declarations."""
  values = flags.FlagValues()
  trainer_options.DefineFlags(flags, values)
  mode_registry.DefineFlags(flags, values)
  distribution.DefineFlags(flags, values)
  return values


class TrainerOptionsTest(unittest.TestCase):

  def testEachFlagIsAFieldWithItsDefault(self):
    values = _DefinedFlags()
    values(['trainer.py'])
    fields = [f.name for f in dataclasses.fields(trainer_options.TrainerOptions)
              if f.name not in _NOT_FLAGS]
    self.assertEqual(fields, trainer_options.FlagNames())
    defaults = trainer_options.TrainerOptions()
    for name in fields:
      self.assertEqual(getattr(defaults, name), values[name].default, name)
    self.assertEqual(list(modes.NAMES), values['mode'].parser.enum_values)
    self.assertIn('inspect_model: print variables and FLOPs',
                  values['mode'].help)
    self.assertEqual(['cpu', 'gpu'], values['run_locally'].parser.enum_values)
    self.assertEqual('int', values['max_steps'].parser.flag_type())

  def testFromFlagsTakesEveryFlag(self):
    values = _DefinedFlags()
    values(['trainer.py', '--model=m.M', '--mode=plan', '--max_steps=5',
            '--run_locally=gpu', '--noxla', '--plan_top=3', '--tpu=t'])
    options = trainer_options.FromFlags(values, start_time=1.5)
    expected = trainer_options.TrainerOptions(
        model='m.M', mode='plan', max_steps=5, run_locally='gpu',
        start_time=1.5, mode_flags=mode_registry.FlagValues(values),
        option_flags=distribution.FlagValues(values))
    self.assertEqual(expected, options)
    self.assertEqual(3, options.mode_flags['plan_top'])
    self.assertEqual('t', options.option_flags['tpu'])

  def testEachValueIsCheckedByItsDeclaration(self):
    options = trainer_options.TrainerOptions(
        model='synthetic.linear_regression.RegressionTiny')
    trainer_options.CheckValues(options)
    for name, value, regex in (
        ('mode', 'count', r"^--mode='count' is not one of sync, "),
        ('xla', 1, r'^--xla=1 must be True or False\.$'),
        ('worker_split_size', 0, r'^--worker_split_size=0 must be None or '
         r'an int >= 1 \(devices per replica\)\.$'),
        ('model', '', r'^--model is required: ')):
      with self.subTest(flag=name):
        with self.assertRaisesRegex(user_error.UserError, regex):
          trainer_options.CheckValues(types.SimpleNamespace(
              **dict(dataclasses.asdict(options), **{name: value})))


if __name__ == '__main__':
  unittest.main()
