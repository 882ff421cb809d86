"""Bad experiment params through the trainer's command line: exit 2, one line.

A table of inconsistent configurations of the Tiny GPipe LM, each given as a
`--model_params_override`, each of which a layer can detect from params and
static shapes alone. Every one must stop the trainer before any step with
exit code 2 and one `Error: ...` line that names the params path, the value
and the rule: no traceback.

The command lines run through `trainer.py`'s own flag parsing and `main` in
ONE subprocess (TensorFlow's import is paid once); one case also runs as a
real `python trainer.py` process to show both paths give the same answer.
"""
import os

import tensorflow as tf

from cadence.tests import test_utils

_KEY = 'lm.one_billion_wds.OneBWdsGPipeTransformerTiny'
_ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')
_STACK = 'task.stack_tpl'
_PIPE = 'task.stack_tpl.pipeline_tpl'
_LAYER = 'task.stack_tpl.transformer_tpl'

# (override, regex of the one error line).
_CASES = [
    (f'{_PIPE}.num_micro_batches=3',
     rf"PipeliningLayer \(params '{_PIPE}'\): num_micro_batches=3 does not "
     r'divide batch 32 \(inputs dim batch_dim=0\)\.'),
    (f'{_PIPE}.micro_batch_size=5',
     rf"\(params '{_PIPE}'\): micro_batch_size=5 \* num_micro_batches=4 = 20 "
     r'!= batch 32'),
    (f'{_PIPE}.remat=sometimes',
     rf"\(params '{_PIPE}'\): remat='sometimes' must be one of "
     r"'except_last', 'always', 'never', 'selective'\."),
    (f'{_PIPE}.schedule=1F1B',
     rf"\(params '{_PIPE}'\): schedule='1F1B' must be one of 'gpipe', "
     r"'1f1b'\. Did you mean '1f1b'\?"),
    (f'{_PIPE}.backward_window=0',
     rf"\(params '{_PIPE}'\): backward_window=0 must be None or an int >= 1"),
    (f'{_STACK}.splits=5',
     rf"GPipeTransformerStack 'stack' \(params '{_STACK}'\): splits=5 must be "
     r'in \[1, num_layers=4\]; each cell needs a layer\.'),
    (f'{_STACK}.splits=[2,2]',
     rf"\(params '{_STACK}'\): splits=\[2, 2\] must be an int K in \[1, 4\] "
     r'or a list of increasing layer indices in \(0, 4\)'),
    (f'{_STACK}.num_layers=0',
     rf"\(params '{_STACK}'\): num_layers=0 must be an int >= 1\."),
    (f'{_LAYER}.num_heads=3',
     rf"\(params '{_LAYER}'\): num_heads=3 must divide input_dim=128; "
     r'128 % 3 = 2\.'),
    (f'{_LAYER}.hidden_dim=0',
     rf"\(params '{_LAYER}'\): hidden_dim=0 must be an int >= 1\."),
    (f'{_LAYER}.atten_dropout_prob=1.5',
     rf"\(params '{_LAYER}'\): atten_dropout_prob=1.5 must be a probability "
     r'in \[0, 1\)\.'),
    (f'{_LAYER}.activation=RELUU',
     rf"\(params '{_LAYER}'\): activation='RELUU' is invalid: .*Did you mean "
     r"'RELU'\?"),
    ('task.model_dim=0',
     r"LanguageModel 'lm' \(params 'task'\): model_dim=0 must be an int >= "
     r'1\.'),
    ('task.label_smoothing=0.1;task.softmax_max_alloc=100',
     r"\(params 'task'\): label_smoothing=0.1 needs softmax_max_alloc=0"),
    ('task.decoder.temperature=0',
     r"\(params 'task'\): decoder.temperature=0 must be a number > 0\."),
    ('task.train.learner.learning_rate=-1',
     r"Learner 'learner' \(params 'task.train.learner'\): learning_rate=-1 "
     r'must be a number >= 0\.'),
    ('task.num_micro_batches=3',
     r"^Error: --model_params_override: Params 'task' has no param "
     rf"'num_micro_batches'; did you mean '{_PIPE}.num_micro_batches'\?$"),
]



class BadParamsTest(tf.test.TestCase):

  def testEachBadConfigurationExitsTwoWithOneLine(self):
    self.assertGreaterEqual(len(_CASES), 10)
    logdir = os.path.join(self.get_temp_dir(), 'run')
    argvs = [[f'--model={_KEY}', f'--logdir={logdir}', '--worker_split_size=2',
              f'--model_params_override={override}']
             for override, _ in _CASES]
    driver = test_utils.StartTrainerMains(argvs, env=_ENV)
    real = test_utils.StartTrainer(argvs[0], env=_ENV)
    results = test_utils.FinishTrainerMains(driver)
    for (override, regex), (code, stderr) in zip(_CASES, results):
      with self.subTest(override=override):
        test_utils.AssertUserErrorLine(self, code, stderr, regex)
        # Stopped before training: no checkpoint, no train summaries.
        self.assertFalse(os.path.exists(os.path.join(logdir, 'train')))
    test_utils.AssertRealRunAgrees(self, real, results[0][1])


if __name__ == '__main__':
  tf.test.main()
