"""Tests for cadence.framework.train.checkpoint_match."""
import tensorflow as tf

from cadence.framework.train import checkpoint_match
from cadence.framework.train import checkpointer


def _Variables(shapes):
  """{path: variable of zeros} of {path: shape}."""
  return {k: tf.Variable(tf.zeros(s)) for k, s in shapes.items()}


class CheckpointMatchTest(tf.test.TestCase):

  def _Save(self, variables):
    directory = self.get_temp_dir()
    ckpt = checkpointer.Checkpointer(directory, dict(
        model=checkpointer.KeyedVariables(variables),
        global_step=tf.Variable(0, dtype=tf.int64)))
    return ckpt.Save(7)

  def testSavedVariablesAreTheModelVariablesByPath(self):
    variables = _Variables({'reg.net.fc[0].w': [8, 16], 'reg.b': [16]})
    # A path with the characters the checkpoint escapes ('.' and '/').
    variables['lm.stack..x/y.S'] = tf.Variable(tf.zeros([2], tf.int32))
    path = self._Save(variables)
    saved = checkpoint_match.SavedVariables(path)
    self.assertEqual(saved, {
        'reg.net.fc[0].w': ([8, 16], tf.float32), 'reg.b': ([16], tf.float32),
        'lm.stack..x/y.S': ([2], tf.int32)})
    self.assertEqual(saved, checkpoint_match.ModelVariables(variables))
    self.assertIsNone(checkpoint_match.Mismatch(
        saved, checkpoint_match.ModelVariables(variables)))

  def testUnreadableIndexRaises(self):
    path = self._Save(_Variables({'w': [2]}))
    with open(path + '.index', 'wb') as f:
      f.write(b'not an index')
    with self.assertRaises(tf.errors.OpError):
      checkpoint_match.SavedVariables(path)

  def testShapeOrDtypeDifference(self):
    saved = {'m.a': ([4], tf.float32), 'm.b': ([8, 16], tf.float32),
             'm.c': ([3], tf.float32)}
    model = {'m.a': ([4], tf.float32), 'm.b': ([8, 32], tf.float32),
             'm.c': ([3], tf.bfloat16)}
    self.assertEqual(
        checkpoint_match.Mismatch(saved, model),
        "variable 'm.b' is float32[8, 16] in the checkpoint but "
        'float32[8, 32] in this model (and 1 more variables differ)')
    del model['m.b'], saved['m.b']
    self.assertEqual(
        checkpoint_match.Mismatch(saved, model),
        "variable 'm.c' is float32[3] in the checkpoint but bfloat16[3] in "
        'this model')

  def testMissingAndExtraVariables(self):
    saved = {'reg.w': ([8, 1], tf.float32), 'reg.b': ([1], tf.float32)}
    model = {'lm.emb': ([512, 128], tf.float32), 'reg.b': ([1], tf.float32),
             'lm.softmax': ([128, 512], tf.float32)}
    self.assertEqual(
        checkpoint_match.Mismatch(saved, model),
        "2 of this model's 3 variables are not in the checkpoint (first "
        "'lm.emb' float32[512, 128]); the checkpoint holds 1 variables this "
        "model lacks (first 'reg.w' float32[8, 1])")
    self.assertEqual(
        checkpoint_match.Mismatch(saved, {'reg.b': ([1], tf.float32)}),
        "the checkpoint holds 1 variables this model lacks (first 'reg.w' "
        'float32[8, 1])')
    # Names are compared before shapes.
    self.assertRegex(checkpoint_match.Mismatch(
        {'reg.b': ([2], tf.float32)}, model), r"^2 of this model's 3 ")


if __name__ == '__main__':
  tf.test.main()
