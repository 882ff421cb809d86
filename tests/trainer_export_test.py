"""`trainer.py --mode=export`, end to end, in real subprocesses.

A Tiny LM (2 pipeline stages on 2 logical CPUs) and the Tiny ResNet (2
stages) train 2 steps each with the trainer (both start together), which
evaluates Dev and decodes it at the end; one process then exports both
(and tries the bad cases); one process that never imports Cadence loads
the exports and runs `score`, `sample` and `predict` on the same Dev rows.
The exports must give the trainer's own eval numbers (1e-5) and the
decoder job's lines, and the README's loading and sampling snippets run as
written.
"""
import json
import os
import re
import tempfile

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from cadence.framework.jobs import run_params
from cadence.framework.jobs import trainer_lib
from cadence.framework.train import summary_utils
from cadence.tasks.lm import tokenizers
from cadence.tests import readme_blocks
from cadence.tests import test_utils

_LM = 'lm.one_billion_wds.OneBWdsGPipeTransformerTiny'
_IMAGE = 'image.shapes_resnet.ShapesResNetTiny'
# Small and quick: 2 layers (one a stage), 8 rows of 32 tokens; eval reads
# 2 Dev batches, the decoder 1, seeded by decoder.seed.
_LM_OVERRIDE = ('task.stack_tpl.num_layers=2;input.batch_size=8;'
                'input.max_seq_len=32;task.eval.samples_per_summary=16;'
                'task.eval.decoder_samples=8;task.decoder.seed=7')
_IMAGE_OVERRIDE = ('input.num_examples=64;task.eval.samples_per_summary=32;'
                   'task.eval.decoder_samples=32')
_STEPS = 2
_SEED = 7

# Runs without Cadence: loads both exports, runs their signatures on the
# inputs the test wrote, and the README's snippet.
_LOADER = """
import json, sys
import numpy as np
import tensorflow as tf
args = json.loads(sys.argv[1])
data = np.load(args['inputs'])
lm = tf.saved_model.load(args['lm'])
image = tf.saved_model.load(args['image'])
# The serving signatures, as TF Serving calls them.
score = lm.signatures['score'](ids=tf.constant(data['score_ids']),
                               paddings=tf.constant(data['score_paddings']))
sample = lm.signatures['sample'](
    prompt_ids=tf.constant(data['prompt_ids']),
    prompt_lengths=tf.constant(data['prompt_lengths']),
    temperature=tf.constant(data['temperature']),
    seed=tf.constant(args['seed'], tf.int64))
predict = image.signatures['predict'](images=tf.constant(data['images']))
specs = {name: {k: v.shape.as_list() for k, v in
                model.signatures[name].structured_input_signature[1].items()}
         for model, name in ((lm, 'score'), (lm, 'sample'),
                             (image, 'predict'))}
exec(args['readme'].replace('/tmp/cadence_lm_export', args['lm']))
np.savez(args['out'], log_probs=score['log_probs'],
         sentence_log_prob=score['sentence_log_prob'],
         num_tokens=score['num_tokens'], ids=sample['ids'],
         lengths=sample['lengths'], finished=sample['finished'],
         probabilities=predict['probabilities'], classes=predict['classes'])
print(json.dumps({'cadence_imported': 'cadence' in sys.modules,
                  'specs': specs}))
"""


def _Flags(model, override, logdir, *more):
  return [f'--model={model}', f'--logdir={logdir}',
          f'--model_params_override={override}', *more]


def _DevBatches(model, override, n):
  """The first n Dev batches as the trainer's eval reads them (numpy)."""
  params = run_params.LoadParams(trainer_lib.TrainerOptions(
      model=model, model_params_override=override), 'Dev')
  generator = params.input.Instantiate()
  batches = [tf.nest.map_structure(np.asarray, b) for b in
             generator.Dataset().take(n)]
  return params, batches


def _PlacedOps(path):
  """Ops of the SavedModel's own functions that name a device (TF's
  save/restore functions excepted, which pin to the CPU)."""
  model = saved_model_pb2.SavedModel()
  with open(os.path.join(path, 'saved_model.pb'), 'rb') as f:
    model.ParseFromString(f.read())
  return [(fn.signature.name, node.name, node.device)
          for graph in model.meta_graphs
          for fn in graph.graph_def.library.function
          if not re.search('traced_(save|restore)', fn.signature.name)
          for node in fn.node_def if node.device]


def _ReadmeSnippet():
  """The python blocks of the README's export section, one after the other
  (the second uses the first's `lm` and `sp`)."""
  blocks = readme_blocks.Blocks('by tests/trainer_export_test.py')
  assert [b.section for b in blocks] == ['Export for serving'] * 2, blocks
  return ''.join(b.code for b in blocks)


class TrainerExportTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    tmp = cls.tmp = tempfile.mkdtemp(dir=tf.compat.v1.test.get_temp_dir())
    cls.lm_dir, cls.image_dir = f'{tmp}/lm', f'{tmp}/image'
    runs = [test_utils.TrainerRun(*_Flags(
        model, override, logdir, f'--max_steps={_STEPS}',
        '--job=trainer_and_evaler'))
            for model, override, logdir in (
                (_LM, _LM_OVERRIDE, cls.lm_dir),
                (_IMAGE, _IMAGE_OVERRIDE, cls.image_dir))]
    # Meanwhile: the inputs, as the evaler and the decoder read them.
    lm_params, cls.lm_batches = _DevBatches(_LM, _LM_OVERRIDE, 2)
    _, (cls.image_batch,) = _DevBatches(_IMAGE, _IMAGE_OVERRIDE, 1)
    lm_params.task.is_inference = True
    cls.lm_task = lm_params.Instantiate().task   # For its tokenizer.
    inputs = cls._LoaderInputs()
    for run in runs:
      code, _, stderr = run.Finish()
      assert code == 0, stderr[-3000:]
    with open(f'{tmp}/a_file', 'w') as f:
      f.write('not a folder')
    cls.image_export = f'{tmp}/image_export'
    # A real export, stopped by SIGTERM while it writes its folder.
    stopped = test_utils.StartTrainer(_Flags(
        _LM, _LM_OVERRIDE, cls.lm_dir, '--mode=export',
        f'--export_dir={tmp}/stopped'))
    driver = test_utils.StartTrainerMains([
        _Flags(_LM, _LM_OVERRIDE, cls.lm_dir, '--mode=export'),
        _Flags(_IMAGE, _IMAGE_OVERRIDE, cls.image_dir, '--mode=export',
               '--export_batch_size=32', f'--export_dir={cls.image_export}'),
        _Flags(_LM, _LM_OVERRIDE, f'{tmp}/never_trained', '--mode=export'),
        _Flags(_IMAGE, _IMAGE_OVERRIDE, cls.image_dir, '--mode=export',
               f'--export_dir={tmp}/a_file/export'),
        _Flags('synthetic.linear_regression.RegressionTiny', '',
               cls.image_dir, '--mode=export'),
        _Flags(_IMAGE, _IMAGE_OVERRIDE, cls.image_dir, '--mode=export',
               '--export_max_len=16', f'--export_dir={tmp}/image_16'),
        # Weights of another shape than the overrides build.
        _Flags(_LM, f'{_LM_OVERRIDE};task.stack_tpl.transformer_tpl.'
               'hidden_dim=64', cls.lm_dir, '--mode=export',
               f'--export_dir={tmp}/other_shape'),
    ])
    cls.stopped = test_utils.StopOnceExists(
        stopped, lambda: [n for n in os.listdir(tmp)
                          if n.startswith('.stopped.tmp-')])
    cls.exports = test_utils.FinishTrainerMains(driver)
    cls.lm_export = os.path.join(cls.lm_dir, 'export', str(_STEPS))
    if cls.exports[0][0] == 0 and cls.exports[1][0] == 0:
      out = test_utils.RunPython(_LOADER, json.dumps(dict(
          inputs=inputs, lm=cls.lm_export, image=cls.image_export,
          seed=_SEED, readme=_ReadmeSnippet(), out=f'{tmp}/outputs.npz')))
      cls.loader = json.loads(out.stdout.strip().splitlines()[-1])
      cls.outputs = dict(np.load(f'{tmp}/outputs.npz'))

  @classmethod
  def _LoaderInputs(cls):
    """Writes the signatures' inputs; returns the file's path."""
    # score: each row BOS, tokens, EOS = the batch's ids then its labels.
    ids = np.concatenate([np.concatenate([b['ids'][:, :1], b['labels']], 1)
                          for b in cls.lm_batches])
    weights = np.concatenate([b['weights'] for b in cls.lm_batches])
    paddings = np.pad(1.0 - weights, [[0, 0], [1, 0]]).astype(np.float32)
    # sample: the decoder's batch, its prompts twice (greedy, then sampled).
    first = cls.lm_batches[0]
    lengths = np.asarray(cls.lm_task.PromptLengths(first['ids'],
                                                   first['paddings']))
    b = len(lengths)
    temperature = cls.lm_task.params.decoder.temperature
    path = f'{cls.tmp}/inputs.npz'
    np.savez(path, score_ids=ids, score_paddings=paddings,
             prompt_ids=np.concatenate([first['ids']] * 2),
             prompt_lengths=np.concatenate([lengths] * 2),
             temperature=np.array([0.0] * b + [temperature] * b, np.float32),
             images=cls.image_batch['image'])
    cls.prompt_lengths = lengths
    return path

  def _Eval(self, logdir):
    scalars = summary_utils.ReadScalars(os.path.join(logdir, 'eval_dev'))
    return {k: dict(v)[_STEPS] for k, v in scalars.items()}

  def testExportsLoadWithoutCadence(self):
    for code, stderr in self.exports[:2]:
      self.assertEqual(0, code, stderr[-3000:])
    self.assertFalse(self.loader['cadence_imported'])
    self.assertEqual(
        sorted(os.listdir(os.path.join(self.lm_dir, 'export'))), ['2'])
    with open(os.path.join(self.lm_export, 'assets.extra',
                           'signatures.txt')) as f:
      doc = f.read()
    self.assertIn('score(ids, paddings) -> log_probs', doc)
    self.assertIn('sample(prompt_ids, prompt_lengths, temperature, seed)', doc)
    # Trained on 2 stages, exported without devices: the loader places it.
    for path in (self.lm_export, self.image_export):
      self.assertEqual(_PlacedOps(path), [])

  def testScoreEqualsTheTrainersEval(self):
    out = self.outputs
    weights = np.concatenate([b['weights'] for b in self.lm_batches])
    self.assertAllEqual(out['num_tokens'], weights.sum(1))
    self.assertAllClose(out['sentence_log_prob'], out['log_probs'].sum(1),
                        rtol=1e-6)
    self.assertAllEqual(out['log_probs'][:, 0], np.zeros(len(weights)))
    log_pplx = -out['log_probs'].astype(np.float64).sum() / weights.sum()
    self.assertAllClose(log_pplx, self._Eval(self.lm_dir)['log_pplx'],
                        rtol=1e-5, atol=0)

  def testSampleEqualsTheDecoderJob(self):
    out = self.outputs
    b = len(self.prompt_lengths)
    first = self.lm_batches[0]
    decoded = test_utils.NestedMap(
        prompt_lengths=self.prompt_lengths, greedy_ids=out['ids'][:b],
        sampled_ids=out['ids'][b:],
        reference_ids=np.where(first['weights'] > 0, first['labels'],
                               tokenizers.PAD_ID))
    lines = self.lm_task.PostProcessDecodeOut(
        decoded, self.lm_task.CreateDecoderMetrics())
    path = os.path.join(self.lm_dir, 'decoder_dev',
                        f'decoder_out-{_STEPS:08d}.txt')
    with open(path) as f:
      self.assertEqual(f.read().splitlines(), lines)
    # lengths and finished agree with the ids.
    for row, n, done in zip(out['ids'], out['lengths'], out['finished']):
      self.assertEqual(done, n <= row.size and row[n - 1] == tokenizers.EOS_ID)

  def testPredictEqualsTheTrainersEval(self):
    out = self.outputs
    labels = self.image_batch['label']
    probs = out['probabilities'].astype(np.float64)
    self.assertAllClose(probs.sum(1), np.ones(len(labels)), atol=1e-6)
    self.assertAllEqual(out['classes'], probs.argmax(1))
    evaled = self._Eval(self.image_dir)
    xent = -np.log(probs[np.arange(len(labels)), labels]).mean()
    self.assertAllClose(xent, evaled['loss'], rtol=1e-5, atol=0)
    self.assertAllClose((out['classes'] == labels).mean(),
                        evaled['accuracy'], atol=1e-7)

  def testStaticShapesWhereAsked(self):
    specs = self.loader['specs']
    self.assertEqual(specs['predict'], {'images': [32, 32, 32, 3]})
    self.assertEqual(specs['score'], {'ids': [None, None],
                                      'paddings': [None, None]})
    self.assertEqual(specs['sample']['prompt_ids'], [None, None])
    self.assertEqual(self.outputs['ids'].shape[1], 32)   # input.max_seq_len

  def testUserErrorsExitTwoWithOneLine(self):
    tmp = self.tmp
    cases = [
        rf'Error: no checkpoint in {tmp}/never_trained/train to export; '
        r'train first',
        rf'Error: --export_dir: cannot write in {tmp}/a_file: ',
        # A model of another task on the image run's logdir.
        rf'Error: --logdir {tmp}/image holds checkpoints of another model: '
        rf'{tmp}/image/train/ckpt-\d+ does not fit --model=synthetic\.'
        r'linear_regression\.RegressionTiny: .* Its params\.txt is of the '
        r"model 'image' \(ImageClassifier\), this run's is 'regression' "
        r'\(RegressionModel\)\. Export with the model and overrides that '
        r'trained it; nothing was written\.$',
        r"Error: --mode=export: ImageClassifier 'image' \(params 'task'\) "
        r'Inference: max_len=16 has no meaning for this task: it has no '
        r'sequence length\.$',
        # As the sync mode says it: the checkpoint, the variable, its
        # shapes, and the params path whose value differs.
        rf'Error: --logdir {tmp}/lm holds checkpoints of another model: '
        rf'{tmp}/lm/train/ckpt-{_STEPS} does not fit --model={_LM}: variable '
        r"'lm\.stack\.x_layers\[0\]\.ffn\.fc\[0\]\.b' is float32\[512\] in "
        r'the checkpoint but float32\[64\] in this model \(and \d+ more '
        r"variables differ\)\. Its params\.txt differs from this run's in "
        r'task\.stack_tpl\.transformer_tpl\.hidden_dim \(512 there, 64 '
        r'here\)\. Export with the model and overrides that trained it; '
        r'nothing was written\.$',
    ]
    for regex, (code, stderr) in zip(cases, self.exports[2:]):
      with self.subTest(regex=regex):
        test_utils.AssertUserErrorLine(self, code, stderr, regex)
    # SIGTERM while an export is written: exit 4, one line, and its
    # partial folder removed.
    code, stderr = self.stopped
    self.assertEqual(4, code, stderr[-3000:])
    self.assertNotIn('Traceback', stderr)
    self.assertRegex(stderr.strip().splitlines()[-1], r'^Error: --mode=export '
                     'stopped by SIGTERM: the partial export was removed and '
                     r'nothing was written; rerun the command to export\.$')
    # Nothing half-written beside the targets.
    self.assertEqual(sorted(os.listdir(tmp)), sorted([
        'a_file', 'image', 'image_export', 'inputs.npz', 'lm',
        'outputs.npz']))


if __name__ == '__main__':
  tf.test.main()
