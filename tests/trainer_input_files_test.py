"""Bad data files and damaged caches through the trainer's command line.

Files that cannot be data (a directory, random bytes, only blank lines, for
the input or for the SentencePiece training text; words where the
regression expects CSV numbers) stop the trainer before any step with exit
code 2 and one `Error: Input: ...` line naming the file and the rule. The
command lines run through `trainer.py`'s own flag parsing and `main` in ONE
subprocess; the first also runs as a real `python trainer.py` process.
A cache damaged on disk (a corpus file and a trained SentencePiece model
overwritten with random bytes) is rebuilt by a real trainer run, which
says so in one warning line per file and trains.
"""
import os

import numpy as np
import tensorflow as tf

from cadence.framework.jobs import run_params
from cadence.framework.jobs import trainer_lib
from cadence.framework.train import checkpointer
from cadence.tests import test_utils

_REGRESSION = 'synthetic.linear_regression.RegressionTiny'


def _Write(path, data):
  with open(path, 'wb') as f:
    f.write(data)
  return path


class InputFilesTest(tf.test.TestCase):

  def testBadFilesExitTwoWithOneLine(self):
    tmp = self.get_temp_dir()
    # No cache of the user's: ~/.cache, XDG_CACHE_HOME ignored when empty.
    env = dict(test_utils.QUIET_ENV, HOME=tmp, XDG_CACHE_HOME='')
    noise = _Write(f'{tmp}/noise.txt', np.random.RandomState(0).bytes(4096))
    blank = _Write(f'{tmp}/blank.txt', b'\n  \n\n')
    text = _Write(f'{tmp}/text.txt', b'the cat sees alice\n')
    os.makedirs(f'{tmp}/a_dir')
    lm = [f'--model={test_utils.TINY_LM}']
    spm = f"input.corpus='';input.tokenizer.cache_dir={tmp}/spm"
    not_text = r"is not text: it holds NUL bytes \(byte \d+\); a binary, "
    cases = [   # (flags, regex of the one error line)
        ([f'--model={_REGRESSION}',
          f'--model_params_override=input.file_pattern={noise}'],
         rf"^Error: Input: RegressionInput 'input': '{noise}' \(of "
         rf'file_pattern \'{noise}\'\) {not_text}'),
        ([f'--model={_REGRESSION}',
          f'--model_params_override=input.file_pattern={tmp}/a_*'],
         rf"^Error: Input: RegressionInput 'input': '{tmp}/a_dir' \(of "
         rf"file_pattern '{tmp}/a_\*'\) is a directory, not a file; name the "
         rf"files in it \(e\.g\. '{tmp}/a_dir/\*'\)\.$"),
        ([f'--model={_REGRESSION}',
          f'--model_params_override=input.file_pattern={text}'],
         rf"^Error: Input: RegressionInput 'input': line 1 of '{text}' "
         r"\('the cat sees alice'\) holds something else; each line must be "
         r'input_dim \+ 1 = 9 comma-separated numbers \(x_0,...,x_\{d-1\},y\)'
         r'\.$'),
        (lm + [f'--model_params_override={spm};input.file_pattern={text};'
               f'input.tokenizer.train_file_pattern={noise}'],
         rf"^Error: Input: SentencePieceTokenizer 'tokenizer' \(params "
         rf"'input\.tokenizer'\): '{noise}' \(of train_file_pattern "
         rf"'{noise}'\) {not_text}"),
        (lm + [f'--model_params_override={spm};input.file_pattern={blank};'
               f'input.tokenizer.train_file_pattern={blank}'],
         rf"^Error: Input: SentencePieceTokenizer 'tokenizer' \(params "
         rf"'input\.tokenizer'\): train_file_pattern='{blank}' has no "
         r'sentences to train on: its 1 file\(s\) hold 3 lines, all blank; '
         r'point it at text with one sentence a line\.$'),
        (lm + [f'--model_params_override={spm};input.file_pattern={blank};'
               f'input.tokenizer.train_file_pattern={text}'],
         rf"^Error: Input: LmCorpusInput 'lm_train' \(params 'input'\): "
         rf"file_pattern='{blank}' has no sentences: its 1 file\(s\) hold 3 "
         r'lines, all blank; point it at text with one sentence a line\.$'),
    ]
    # One process, one device set-up: the LM's 2 stages' for every case.
    argvs = [flags + [f'--logdir={tmp}/run{i}', '--worker_split_size=2',
                      '--job=trainer']
             for i, (flags, _) in enumerate(cases)]
    driver = test_utils.StartTrainerMains(argvs, env=env)
    # The same first case as a real process, in a logdir of its own (one
    # logdir has one writer: the driver holds run0's lock).
    real = test_utils.StartTrainer(
        cases[0][0] + [f'--logdir={tmp}/run_real', '--worker_split_size=2',
                       '--job=trainer'], env=env)
    results = test_utils.FinishTrainerMains(driver)
    for i, ((_, regex), (code, stderr)) in enumerate(zip(cases, results)):
      with self.subTest(case=i):
        test_utils.AssertUserErrorLine(self, code, stderr, regex)
        self.assertFalse(os.path.exists(f'{tmp}/run{i}/train'))  # No step.
    test_utils.AssertRealRunAgrees(self, real, results[0][1])
    self.assertFalse(os.path.exists(f'{tmp}/.cache'))

  def testDamagedCachesAreRebuiltByTheTrainer(self):
    tmp = self.get_temp_dir()
    overrides = test_utils.SmallLmOverrides(tmp)
    # The corpus and the SentencePiece model, as a first run leaves them;
    # then a Dev file and the model are overwritten with random bytes.
    params = run_params.LoadParams(trainer_lib.TrainerOptions(
        model=test_utils.TINY_LM, model_params_override=overrides), 'Train')
    model_file = params.input.Instantiate().tokenizer.model_file
    dev = f'{tmp}/data/dev-00000-of-00001'
    good = {}
    for path in (dev, model_file):
      with open(path, 'rb') as f:
        good[path] = f.read()
      _Write(path, np.random.RandomState(0).bytes(len(good[path])))
    code, _, err = test_utils.TrainerRun(
        f'--model={test_utils.TINY_LM}', f'--logdir={tmp}/run',
        '--job=trainer', '--max_steps=1',
        f'--model_params_override={overrides}', script=True).Finish()
    self.assertEqual(0, code, err[-3000:])
    warnings = [l for l in test_utils.LogLines(err) if l.startswith('W') and
                ('synthetic_corpus' in l or 'SentencePiece' in l)]
    self.assertLen(warnings, 2, err[-3000:])
    self.assertIn(f'synthetic_corpus: {tmp}/data: dev-00000-of-00001 missing '
                  'or not as written; rewriting it', warnings[0])
    self.assertIn(f"SentencePieceTokenizer 'tokenizer': the cached "
                  f'{model_file} does not match its recorded digest',
                  warnings[1])
    for path, data in good.items():   # Rebuilt as they were.
      with open(path, 'rb') as f:
        self.assertEqual(data, f.read(), path)
    self.assertEqual(checkpointer.StepOf(
        checkpointer.ListCheckpoints(f'{tmp}/run/train')[-1]), 1)

if __name__ == '__main__':
  tf.test.main()
