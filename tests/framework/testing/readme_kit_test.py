"""The README's "Test your own layers and pipelines", as written: its test
functions pass when run, and the error it shows is the kit's."""
import tensorflow as tf

from cadence.framework import model_registry
from cadence.framework import testing
from cadence.tests import bad_units
from cadence.tests import readme_blocks

_MARKER = 'by tests/framework/testing/readme_kit_test.py'


class ReadmeKitTest(tf.test.TestCase):

  def testTheReadmeTestsPass(self):
    code, _ = readme_blocks.Blocks(_MARKER)
    self.assertEqual('python', code.language)
    namespace = readme_blocks.Run(code)
    tests = sorted(k for k in namespace if k.startswith('test') and
                   callable(namespace[k]))
    self.assertEqual(['testPipelinedMlp', 'testResidualMlp'], tests)
    for name in tests:
      namespace[name]()

  def testTheReadmeErrorIsTheKits(self):
    _, shown = readme_blocks.Blocks(_MARKER)
    params = model_registry.GetParams('examples.pipelined_mlp.PipelinedMlp',
                                      'Train')
    params.task.net_tpl.units[2].cls = bad_units.WrongShape
    with self.assertRaises(AssertionError) as ctx:
      testing.CheckLayer(params.task.net_tpl.units[2], [4, 8])
    self.assertEqual(shown.code.strip(), str(ctx.exception))


if __name__ == '__main__':
  tf.test.main()
