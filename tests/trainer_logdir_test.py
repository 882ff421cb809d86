"""A logdir's work is never lost or endangered, through real trainers.

  * an unreadable `train/checkpoint` state file: the checkpoints are found
    from their files (the trainer resumes, an evaler evaluates them);
  * a hand-edited params.txt is kept, not overwritten;
  * one writer per logdir: a second trainer exits 2 naming the first;
  * another model's checkpoints, or a step that cannot fit in memory: exit
    2 with one line, the logdir byte-identical.

One trained logdir (RegressionTiny, checkpoints at steps 100, 200, 300) is
shared; each case works on a copy. Independent runs start together. A
SIGKILLed holder's restart: tests/trainer_test.py
(testKillAndResumeEqualsUninterrupted).
"""
import hashlib
import os
import shutil
import signal
import tempfile

import numpy as np
import tensorflow as tf

from cadence.framework.train import checkpointer
from cadence.framework.train import summary_utils
from cadence.tests import test_utils

_KEY = 'synthetic.linear_regression.RegressionTiny'
_LM = 'lm.one_billion_wds.OneBWdsGPipeTransformerTiny'
_SAVE_EVERY_100 = '--model_params_override=task.train.save_interval_steps=100'
_FLAGS = [f'--model={_KEY}', '--job=trainer', '--peak_tflops=1',
          _SAVE_EVERY_100]
_Run = test_utils.TrainerRun


def _Digests(folder):
  """{relative path: sha256} of every file under `folder`."""
  out = {}
  for root, _, files in os.walk(folder):
    for name in files:
      path = os.path.join(root, name)
      with open(path, 'rb') as f:
        out[os.path.relpath(path, folder)] = hashlib.sha256(
            f.read()).hexdigest()
  return out


def _Steps(train_dir):
  return [checkpointer.StepOf(p) for p in
          checkpointer.ListCheckpoints(train_dir)]


def _EvalSteps(eval_dir):
  """The steps of the eval summaries in `eval_dir`."""
  return [step for step, _ in summary_utils.ReadScalars(eval_dir)['loss']]


class LogdirTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tmp = tempfile.mkdtemp()
    cls.base = os.path.join(cls.tmp, 'base')
    code, _, err = _Run(*_FLAGS, f'--logdir={cls.base}',
                        '--max_steps=300').Finish()
    if code:
      raise AssertionError(err[-3000:])

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.tmp, ignore_errors=True)
    super().tearDownClass()

  def _Copy(self, name):
    path = os.path.join(self.tmp, name)
    shutil.copytree(self.base, path)
    return path

  def testUnreadableStateFileAndAnEditedParamsFile(self):
    # Garbage text (TensorFlow ignored it: the trainer trained from step 0
    # over the checkpoints) and random bytes (it exited 2). The other kinds
    # of damage: tests/framework/train/checkpointer_test.py.
    states = {'trainer': b'the latest is ckpt-300\n',
              'evaler': bytes(np.random.RandomState(1).randint(
                  128, 256, 64, dtype=np.uint8))}
    logdirs = {}
    for name, content in states.items():
      logdirs[name] = self._Copy(name)
      with open(os.path.join(logdirs[name], 'train', 'checkpoint'),
                'wb') as f:
        f.write(content)
    # A user's edit of params.txt.
    params = os.path.join(logdirs['trainer'], 'params.txt')
    with open(params) as f:
      edited = f.read().replace('input.batch_size : 32',
                                'input.batch_size : 64')
    with open(params, 'w') as f:
      f.write('# Tried a bigger batch.\n' + edited)
    before = {name: _Digests(os.path.join(logdir, 'train'))
              for name, logdir in logdirs.items()}
    # The trainer resumes to step 400; an evaler of Dev finds every
    # checkpoint.
    trainer = _Run(*_FLAGS, f'--logdir={logdirs["trainer"]}',
                   '--max_steps=400')
    evaler = _Run(f'--model={_KEY}', f'--logdir={logdirs["evaler"]}',
                  '--job=evaler_dev', '--max_steps=300')
    code, _, err = trainer.Finish()
    self.assertEqual(code, 0, err[-3000:])
    train = os.path.join(logdirs['trainer'], 'train')
    state = os.path.join(train, 'checkpoint')
    self.assertIn(f"] The checkpoint state file {state} is not a checkpoint "
                  "state (line 1: 'the latest is ckpt-300'): rewrote it from "
                  'the checkpoint files beside it (ckpt-100, ckpt-200, '
                  'ckpt-300).\n', err)
    self.assertIn(f'Restored {train}/ckpt-300: global step 300', err)
    self.assertNotIn('training from step 0', err)
    self.assertNotIn('Checkpoint ignored', err)
    self.assertEqual(_Steps(train), [100, 200, 300, 400])
    after = _Digests(train)
    for path, digest in before['trainer'].items():   # Nothing overwritten.
      if path.startswith('ckpt-'):
        self.assertEqual(after[path], digest, path)
    # The edited params.txt is kept beside the one this run wrote.
    kept = [f for f in os.listdir(logdirs['trainer'])
            if f.startswith('params.txt.')]
    self.assertLen(kept, 1)
    self.assertRegex(kept[0], r'^params\.txt\.\d{8}T\d{6}Z$')
    self.assertIn(
        f"] {params} differs from this run's params in input.batch_size (64 "
        'there, 32 here), task.train.max_steps (300 there, 400 here): kept '
        f'it as {params}{kept[0][len("params.txt"):]}.\n', err)
    with open(os.path.join(logdirs['trainer'], kept[0])) as f:
      self.assertEqual(f.read(), '# Tried a bigger batch.\n' + edited)
    with open(params) as f:
      self.assertIn('input.batch_size : 32\n', f.read())

    code, _, err = evaler.Finish()
    self.assertEqual(code, 0, err[-3000:])
    self.assertIn('Stopping: handled the checkpoint of step 300', err)
    eval_dir = os.path.join(logdirs['evaler'], 'eval_dev')
    self.assertEqual(_EvalSteps(eval_dir), [100, 200, 300])
    # The evaler reads past the state file; only the writer rewrites it.
    self.assertEqual(_Digests(os.path.join(logdirs['evaler'], 'train')),
                     before['evaler'])

  def testOneWriterPerLogdir(self):
    logdir = self._Copy('locked')
    holder = _Run(*_FLAGS, f'--logdir={logdir}', '--max_steps=500')
    holder.WaitForLog(r'First step done')
    # Frozen while holding the lock, so it is sure to hold it meanwhile.
    holder.Signal(signal.SIGSTOP)
    try:
      code, _, err = _Run(*_FLAGS, f'--logdir={logdir}',
                          '--max_steps=600').Finish()
    finally:
      holder.Signal(signal.SIGCONT)
    lock = os.path.join(logdir, '.writer.lock')
    test_utils.AssertUserErrorLine(
        self, code, err,
        rf'^Error: --logdir {logdir} is in use by another trainer \(host '
        rf'\S+, pid {holder.proc.pid}, started \d{{4}}-\d\d-\d\d '
        rf'\d\d:\d\d:\d\d UTC; lock file {lock}\): one logdir has one '
        r'writer\. Wait for it to end \(or stop it\), or use another '
        r'--logdir\.$')
    self.assertNotIn('Built the model', err)
    code, _, err = holder.Finish()
    self.assertEqual(code, 0, err[-3000:])
    self.assertIn('Training finished at step 500.', err)
    self.assertEqual(_Steps(os.path.join(logdir, 'train')),
                     [100, 200, 300, 400, 500])
    self.assertFalse(os.path.exists(lock))   # Released at its end.

  def testAnotherModelOrATooBigStepExitsTwoAndChangesNothing(self):
    # (logdir, flags, regex of the error line).
    cases = [
        ('wider', [f'--model={_KEY}', f'{_SAVE_EVERY_100};'
                   'task.hidden_dims=[32]'],
         rf"holds checkpoints of another model: \S+/train/ckpt-300 does not "
         rf"fit --model={_KEY}: variable 'regression\.net\.fc\[0\]\.b' is "
         r'float32\[16\] in the checkpoint but float32\[32\] in this model '
         r"\(and 2 more variables differ\)\. Its params\.txt differs from "
         r"this run's in task\.hidden_dims \(\[16\] there, \[32\] here\)\. "
         r'Use a new --logdir, or the model and overrides that wrote it; '
         r'nothing was changed\.$'),
        ('keras', ['--model=keras.regression.KerasMlpTiny'],
         r"does not fit --model=keras\.regression\.KerasMlpTiny: 4 of this "
         r"model's 4 variables are not in the checkpoint \(first "
         r"'regression\.net\.w0_kernel' float32\[8, 16\]\); the checkpoint "
         r"holds 4 variables this model lacks \(first 'regression\.net\.fc"
         r"\[0\]\.b' float32\[16\]\)\. Its params\.txt is of the model "
         r"'regression' \(RegressionModel\), this run's is 'regression' "
         r'\(KerasRegressionModel\)\.'),
    ]
    logdirs = [self._Copy(name) for name, _, _ in cases]
    before = [_Digests(logdir) for logdir in logdirs]
    argvs = [flags + [f'--logdir={logdir}', '--job=trainer',
                      '--max_steps=400']
             for (_, flags, _), logdir in zip(cases, logdirs)]
    # A batch of 2^20 sequences: refused before anything is built. (First:
    # its 2 logical CPUs are set up once for the whole process.)
    fresh = os.path.join(self.tmp, 'too_big')
    big = [f'--model={_LM}', f'--logdir={fresh}', '--job=trainer',
           '--model_params_override=input.batch_size=1048576']
    driver = test_utils.StartTrainerMains([big] + argvs)
    results = test_utils.FinishTrainerMains(driver)
    code, err = results.pop(0)
    test_utils.AssertUserErrorLine(
        self, code, err,
        rf'^Error: --model={_LM}: a training step does not fit in memory: '
        r"estimate [\d.]+ GiB for this host's 1 replica\(s\) x 2 stage\(s\) "
        r"at the step's worst moment \(weights, gradients and optimizer "
        r'slots [\d.]+ MiB, activations [\d.]+ GiB a replica\) against the '
        r"host's memory [\d.]+ GiB\. Lower input\.batch_size \(1048576\), "
        r'the model size or the micro-batch size \(more micro-batches, '
        r'remat\); --mode=inspect_model prints the estimate per stage\.$')
    self.assertNotIn('Built the model', err)
    self.assertFalse(os.path.exists(fresh))
    for (name, _, regex), (code, err), logdir, digests in zip(
        cases, results, logdirs, before):
      with self.subTest(name):
        test_utils.AssertUserErrorLine(self, code, err, regex)
        self.assertEqual(_Digests(logdir), digests)

if __name__ == '__main__':
  tf.test.main()
