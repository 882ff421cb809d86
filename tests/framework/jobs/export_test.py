"""Tests for cadence.framework.jobs.export (in process).

On the Keras regression (the smallest task with an export): the export
serves the weights the evaler would use (EMA ones included), is written
whole or not at all, and bad input is an ExportError naming it. The LM and
image exports, loaded by a process without Cadence: tests/
trainer_export_test.py.
"""
import os
import tempfile

import numpy as np
import tensorflow as tf

from cadence.framework import base_model
from cadence.framework import inference
from cadence.framework import model_registry
from cadence.framework.jobs import export
from cadence.framework.nested_map import NestedMap
from cadence.framework.train import checkpointer
from cadence.framework.train import eval_programs
from cadence.tasks.synthetic import keras_regression
from cadence.tests import test_utils

_KEY = 'keras.regression.KerasMlpTiny'
_X = np.random.default_rng(0).normal(size=[5, 8]).astype(np.float32)


def _Params(ema=False):
  p = model_registry.GetParams(_KEY, 'Dev')
  if ema:
    p.task.train.ema_decay = 0.9
  return p


def _Save(params, logdir, step):
  """Checkpoint `step` in logdir/train of random weights (and EMA values
  when the params keep an EMA) drawn from the step."""
  task = params.Instantiate().task
  rng = np.random.default_rng(step)
  for v in task.vars.Flatten():
    v.assign(rng.normal(size=v.shape))
  objects = dict(model=checkpointer.KeyedVariables(
      checkpointer.TaskVariables(task)),
                 global_step=tf.Variable(tf.constant(step, tf.int64)))
  if params.task.train.ema_decay:
    ema = {k: tf.Variable(rng.normal(size=v.shape).astype(np.float32))
           for k, v in task.vars.FlattenItems()}
    objects['ema'] = checkpointer.KeyedVariables(
        checkpointer.TaskVariables(task, ema))
  checkpointer.Checkpointer(os.path.join(logdir, 'train'), objects).Save(step)


def _Predictions(params, logdir, step, ema):
  """What the evaler's task predicts for _X from checkpoint `step`."""
  params = params.Copy()
  params.task.is_inference = True
  task = params.Instantiate().task
  state = eval_programs.CheckpointState(task, os.path.join(logdir, 'train'))
  state.Restore(os.path.join(logdir, 'train', f'ckpt-{step}'))
  theta = state.Theta() if ema else task.theta
  return np.asarray(task.ComputePredictions(theta, NestedMap(x=_X)).y)


def _Served(path):
  model = tf.saved_model.load(path)   # Kept: its functions need it alive.
  return np.asarray(model.serve(_X))[:, 0]


def _Files(folder):
  """{path: (size, mtime)} of every file below `folder`."""
  out = {}
  for root, _, names in os.walk(folder):
    for name in names:
      stat = os.stat(os.path.join(root, name))
      out[os.path.relpath(os.path.join(root, name), folder)] = (
          stat.st_size, stat.st_mtime_ns)
  return out


class _NoExport(keras_regression.KerasRegressionModel):
  """A task of one's own without an export (BaseTask's Inference)."""

  Inference = base_model.BaseTask.Inference


class _BrokenExport(keras_regression.KerasRegressionModel):
  """Its signature fails while the SavedModel is being written."""

  def Inference(self, batch_size=None, max_len=None):

    def _Fail(theta, x):
      raise RuntimeError('broken on purpose')

    spec = tf.TensorSpec([None, 8], tf.float32)
    return inference.InferenceGraph(signatures={'predict': inference.Signature(
        _Fail, {'x': spec}, 'fails')})


class ExportTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    self.logdir = tempfile.mkdtemp(dir=self.get_temp_dir())

  def testServesTheEvalersWeightsEmaIncluded(self):
    params = _Params(ema=True)
    _Save(params, self.logdir, 3)
    path, step = export.Export(params, self.logdir)
    self.assertEqual((path, step), (os.path.join(self.logdir, 'export', '3'),
                                    3))
    want = _Predictions(params, self.logdir, 3, ema=True)
    self.assertAllClose(_Served(path), want, atol=1e-5)
    self.assertNotAllClose(want, _Predictions(params, self.logdir, 3,
                                              ema=False))
    with open(os.path.join(path, 'assets.extra', 'signatures.txt')) as f:
      self.assertIn('global step 3', f.read())

  def testReplacesAnExportWholeWithTheCheckpointAsked(self):
    params = _Params()
    for step in (1, 2):
      _Save(params, self.logdir, step)
    target = os.path.join(self.logdir, 'served')
    export.Export(params, self.logdir, export_dir=target)
    self.assertAllClose(_Served(target), _Predictions(params, self.logdir, 2,
                                                      False), atol=1e-5)
    path, step = export.Export(params, self.logdir, export_dir=target,
                               checkpoint='1')
    self.assertEqual((path, step), (target, 1))
    self.assertAllClose(_Served(target), _Predictions(params, self.logdir, 1,
                                                      False), atol=1e-5)
    self.assertEqual(sorted(os.listdir(self.logdir)), ['served', 'train'])
    # The default folder is named by the checkpoint's step; a path works.
    path, _ = export.Export(params, self.logdir, checkpoint=os.path.join(
        self.logdir, 'train', 'ckpt-1'))
    self.assertEqual(path, os.path.join(self.logdir, 'export', '1'))

  def testAFailedExportLeavesThePreviousOneAsItWas(self):
    params = _Params()
    _Save(params, self.logdir, 1)
    target = os.path.join(self.logdir, 'served')
    export.Export(params, self.logdir, export_dir=target)
    before = _Files(target)
    broken = params.Copy()
    broken.task.cls = _BrokenExport
    with self.assertRaisesRegex(Exception, 'broken on purpose'):
      export.Export(broken, self.logdir, export_dir=target)
    self.assertEqual(_Files(target), before)
    self.assertEqual(sorted(os.listdir(self.logdir)), ['served', 'train'])

  def testATargetThatIsNotASavedModelIsNeverTouched(self):
    params = _Params()
    _Save(params, self.logdir, 1)
    target = tempfile.mkdtemp(dir=tempfile.mkdtemp(dir=self.get_temp_dir()))
    with open(os.path.join(target, 'notes.txt'), 'w') as f:
      f.write('mine')
    with self.assertRaisesRegex(
        export.ExportError, rf'^--export_dir: {target} exists and is not a '
        'SavedModel; not replacing it'):
      export.Export(params, self.logdir, export_dir=target)
    self.assertEqual(os.listdir(target), ['notes.txt'])
    self.assertEqual(os.listdir(os.path.dirname(target)),
                     [os.path.basename(target)])

  def testUserErrors(self):
    params = _Params()
    train = os.path.join(self.logdir, 'train')
    with self.assertRaisesRegex(
        export.ExportError, rf'^no checkpoint in {train} to export; train '
        r'first \(--mode=sync\)'):
      export.Export(params, self.logdir)
    self.assertFalse(os.path.exists(self.logdir + '/export'))
    for step in (1, 2):
      _Save(params, self.logdir, step)
    with self.assertRaisesRegex(
        export.ExportError, rf"^--checkpoint='5': no checkpoint {train}/"
        rf'ckpt-5; {train} holds steps 1, 2\.$'):
      export.Export(params, self.logdir, checkpoint='5')
    for flag, kwargs in (('--export_batch_size=0', dict(batch_size=0)),
                         ('--export_max_len=1', dict(max_len=1))):
      with self.assertRaisesRegex(export.ExportError, f'^{flag} must be an '
                                  r'int >= \d'):
        export.Export(params, self.logdir, **kwargs)
    with self.assertRaisesRegex(
        export.ExportError, r"^--mode=export: KerasRegressionModel "
        r"'regression' \(params 'task'\) Inference: max_len=9 has no "
        'meaning for this task'):
      export.Export(params, self.logdir, max_len=9)
    plain = params.Copy()
    plain.task.cls = _NoExport
    with self.assertRaisesRegex(export.ExportError, r'^_NoExport has no '
                                r'export: it implements no Inference\(\)'):
      export.Export(plain, self.logdir)
    test_utils.DamageCheckpoint(os.path.join(train, 'ckpt-2'),
                                'truncated data')
    with self.assertRaisesRegex(
        export.ExportError, rf'^Checkpoint {train}/ckpt-2 is unreadable: .*'
        r'Export an older one with --checkpoint=<step>\.$'):
      export.Export(params, self.logdir)
    self.assertEqual(sorted(os.listdir(self.logdir)), ['train'])

  def testStaticBatch(self):
    params = _Params()
    _Save(params, self.logdir, 1)
    path, _ = export.Export(params, self.logdir, batch_size=5)
    model = tf.saved_model.load(path)
    specs = model.signatures['serving_default'].structured_input_signature[1]
    self.assertEqual([s.shape.as_list() for s in specs.values()], [[5, 8]])


if __name__ == '__main__':
  tf.test.main()
