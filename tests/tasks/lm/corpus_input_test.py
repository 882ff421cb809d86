"""Tests for cadence.tasks.lm.corpus_input: files from a corpus name."""
import glob
import os

import numpy as np
import tensorflow as tf

from cadence.framework import base_input_generator
from cadence.framework import base_layer
from cadence.framework import cluster as cluster_lib
from cadence.framework import model_registry
from cadence.framework.nested_map import NestedMap
from cadence.framework import step_seed
from cadence.tasks.lm import corpus_input
from cadence.tasks.lm import synthetic_corpus
from cadence.tasks.lm import tokenizers


_TINY = 'lm.one_billion_wds.OneBWdsGPipeTransformerTiny'


def _FakeOneBillionWords(root):
  """A few sentences in the one-billion-words layout under `root`."""
  train_dir = os.path.join(root, 'training-monolingual.tokenized.shuffled')
  held_dir = os.path.join(root, 'heldout-monolingual.tokenized.shuffled')
  os.makedirs(train_dir)
  os.makedirs(held_dir)
  for i in range(3):
    with open(os.path.join(train_dir, f'news.en-{i:05d}-of-00100'), 'w',
              encoding='utf-8') as f:
      f.write(f'train sentence {i} .\nthe market closed higher .\n')
  for i in range(2):
    with open(os.path.join(
        held_dir, f'news.en.heldout-{i:05d}-of-00050'), 'w',
              encoding='utf-8') as f:
      f.write(f'held out {i} .\nanother one .\n')
  return root


def _Params(**kwargs):
  p = corpus_input.LmCorpusInput.Params().Set(batch_size=4, max_seq_len=16,
                                              **kwargs)
  p.synthetic.Set(num_train_shards=2, sentences_per_shard=50,
                  num_heldout_sentences=20)
  return p


class LmCorpusInputTest(tf.test.TestCase):

  def testSyntheticSplitsAndSharedTokenizer(self):
    data_dir = os.path.join(self.get_temp_dir(), 'synthetic')
    cache = os.path.join(self.get_temp_dir(), 'spm_cache')
    spm = tokenizers.SentencePieceTokenizer.Params().Set(vocab_size=300,
                                                         cache_dir=cache)
    gens = {split: _Params(corpus='synthetic', data_dir=data_dir, split=split,
                           tokenizer=spm).Instantiate()
            for split in ('train', 'dev', 'test')}
    self.assertEqual(gens['train'].params.file_pattern,
                     os.path.join(data_dir, 'train-*-of-00002'))
    self.assertEqual(gens['dev'].files,
                     [os.path.join(data_dir, 'dev-00000-of-00001')])
    self.assertEqual(gens['test'].stats.num_sentences, 20)
    self.assertEqual(gens['train'].stats.num_sentences, 100)
    # One SentencePiece model, trained on the training split, for all.
    models = {g.tokenizer.model_file for g in gens.values()}
    self.assertLen(models, 1)
    self.assertEqual(os.path.dirname(models.pop()), cache)
    self.assertEmpty(glob.glob(os.path.join(data_dir, 'spm_*')))
    self.assertEqual(gens['dev'].params.tokenizer.train_file_pattern,
                     gens['train'].params.file_pattern)
    # The Dev file is the corpus's, word for word.
    with open(gens['dev'].files[0], encoding='utf-8') as f:
      lines = f.read().splitlines()
    self.assertEqual(lines, synthetic_corpus.GenerateSentences(20, [0, 1]))
    batch = gens['train'].InputBatchAt(0)
    self.assertEqual(batch.ids.shape, (4, 16))

  def testOneBillionWordsLayout(self):
    root = _FakeOneBillionWords(os.path.join(self.get_temp_dir(), '1bw'))
    train = _Params(corpus='one_billion_words', data_dir=root).Instantiate()
    self.assertLen(train.files, 3)
    self.assertEqual(train.stats.num_sentences, 6)
    dev = _Params(corpus='one_billion_words', data_dir=root,
                  split='dev').Instantiate()
    test = _Params(corpus='one_billion_words', data_dir=root,
                   split='test').Instantiate()
    self.assertEqual([os.path.basename(f) for f in dev.files + test.files],
                     ['news.en.heldout-00000-of-00050',
                      'news.en.heldout-00001-of-00050'])

  def testTinyExperimentOnOneBillionWordsHasNoGrammarMetrics(self):
    # What a user gets from the README's override on real text: the
    # metrics that need the embedded grammar are gone, the others stay.
    root = _FakeOneBillionWords(os.path.join(self.get_temp_dir(), '1bw_lm'))
    cache = os.path.join(self.get_temp_dir(), 'spm_1bw')
    results = {}
    for corpus, data_dir in (('one_billion_words', root), (
        'synthetic', os.path.join(self.get_temp_dir(), 'synthetic_lm'))):
      p = model_registry.GetParams(_TINY, 'Dev')
      p.input.Set(corpus=corpus, data_dir=data_dir, batch_size=4,
                  max_seq_len=12)
      p.input.synthetic.Set(num_train_shards=1, sentences_per_shard=200,
                            num_heldout_sentences=8)
      p.input.tokenizer.cache_dir = cache
      p.task.Set(model_dim=16, is_inference=True)
      p.task.stack_tpl.num_layers = 2
      p.task.stack_tpl.transformer_tpl.Set(num_heads=2, hidden_dim=32)
      with cluster_lib.Cluster.Params().Set(
          num_devices=2, worker_split_size=2).Instantiate():
        task = p.Instantiate().task
        batch = NestedMap({k: tf.constant(v) for k, v in
                           p.input.Instantiate().InputBatchAt(0).items()})
        metrics, _ = task.FPropTower(task.theta, batch)
        decoder_metrics = task.CreateDecoderMetrics()
        if corpus == 'one_billion_words':   # Decodes real text.
          theta = base_layer.WithStepSeed(task.theta,
                                          step_seed.MakeStepSeed(0))
          out = tf.nest.map_structure(np.asarray, tf.function(
              task.Decode, autograph=False)(theta, batch))
          lines = task.PostProcessDecodeOut(out, decoder_metrics)
          # Two sentences (2 all-padding rows skipped); 'u' is not in the
          # tiny SentencePiece model.
          self.assertLen(lines, 2)
          self.assertTrue(lines[1].startswith("prompt: 'another one'  "))
      results[corpus] = set(metrics) | set(decoder_metrics)
    grammar_only = {'excess_nats_per_sentence', 'greedy_grammatical',
                    'sampled_grammatical'}
    self.assertEmpty(results['one_billion_words'] & grammar_only)
    self.assertEqual(results['synthetic'] - results['one_billion_words'],
                     grammar_only)
    self.assertIn('nats_per_sentence', results['one_billion_words'])

  def testExplicitFilePatternWins(self):
    data_dir = os.path.join(self.get_temp_dir(), 'explicit')
    other = os.path.join(self.get_temp_dir(), 'mine.txt')
    with open(other, 'w', encoding='utf-8') as f:
      f.write('hello world\n')
    gen = _Params(corpus='synthetic', data_dir=data_dir,
                  file_pattern=other).Instantiate()
    self.assertEqual(gen.files, [other])
    plain = _Params(file_pattern=other).Instantiate()  # corpus=''
    self.assertEqual(plain.stats.num_sentences, 1)

  def testErrors(self):
    with self.assertRaisesRegex(base_input_generator.InputError,
                                r"LmCorpusInput 'lm_input': corpus='1bw' "
                                r'must be one of'):
      _Params(corpus='1bw', data_dir='/tmp').Instantiate()
    with self.assertRaisesRegex(base_input_generator.InputError,
                                r"split='valid' must be one of"):
      _Params(corpus='synthetic', data_dir='/tmp', split='valid').Instantiate()
    with self.assertRaisesRegex(base_input_generator.InputError,
                                r"data_dir='' must be set for "
                                r"corpus='synthetic'"):
      _Params(corpus='synthetic').Instantiate()
    with self.assertRaisesRegex(base_input_generator.InputError,
                                r'is not a directory; unpack'):
      _Params(corpus='one_billion_words',
              data_dir='/nonexistent/1bw').Instantiate()


if __name__ == '__main__':
  tf.test.main()
