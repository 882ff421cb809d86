"""The README's "Test your own layers and pipelines", as written: its test
functions pass when run, and the error it shows is the kit's."""
import os
import re

import tensorflow as tf

from cadence.framework import model_registry
from cadence.framework import testing
from cadence.tests import bad_units
from cadence.tests import test_utils


def _Section():
  with open(os.path.join(test_utils.ROOT, 'README.md')) as f:
    text = f.read()
  section = text[text.index('## Test your own layers and pipelines'):]
  return section[:section.index('\n## ', 3)]


class ReadmeKitTest(tf.test.TestCase):

  def testTheReadmeTestsPass(self):
    code = re.search(r'```python\n(.*?)```', _Section(), re.S).group(1)
    namespace = {}
    exec(compile(code, 'README.md', 'exec'), namespace)  # pylint: disable=exec-used
    tests = sorted(k for k in namespace if k.startswith('test') and
                   callable(namespace[k]))
    self.assertEqual(['testPipelinedMlp', 'testResidualMlp'], tests)
    for name in tests:
      namespace[name]()

  def testTheReadmeErrorIsTheKits(self):
    shown = re.search(r'\n```\n(WrongShape.*?)```', _Section(),
                      re.S).group(1).strip()
    params = model_registry.GetParams('examples.pipelined_mlp.PipelinedMlp',
                                      'Train')
    params.task.net_tpl.units[2].cls = bad_units.WrongShape
    with self.assertRaises(AssertionError) as ctx:
      testing.CheckLayer(params.task.net_tpl.units[2], [4, 8])
    self.assertEqual(shown, str(ctx.exception))


if __name__ == '__main__':
  tf.test.main()
