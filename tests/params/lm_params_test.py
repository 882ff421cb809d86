"""The LM experiments of params/lm/one_billion_wds.py, beyond instantiation.

(tests/params/all_params_test.py instantiates every experiment's params and
builds the Tiny models.) Here: the published-scale experiment is costed from
its params alone, without building a variable; the Tiny one keeps its
structure and is consistent with its data.
"""
import tensorflow as tf

from cadence.framework import model_registry
from cadence.framework.nested_map import NestedMap
from cadence.framework import shapes
from cadence.layers import gpipe_transformer
from cadence.tasks.lm import corpus_input
from cadence.tasks.lm import model

_BIG = 'lm.one_billion_wds.OneBWdsGPipeTransformer'
_TINY = 'lm.one_billion_wds.OneBWdsGPipeTransformerTiny'


def _WeightsPerLayer(p):
  """Matmul weights of one layer: Q, K, V, O (d x d) and the FFN (2 d h)."""
  hidden = p.stack_tpl.transformer_tpl.hidden_dim
  return 4 * p.model_dim**2 + 2 * p.model_dim * hidden


def _Meta(params):
  b, t = params.input.batch_size, params.input.max_seq_len
  return model.LanguageModel.FPropMeta(
      params.task, NestedMap(ids=shapes.Shape([b, t]),
                             labels=shapes.Shape([b, t])))


class OneBWdsTest(tf.test.TestCase):

  def testPublishedScaleIsCostedWithoutBuilding(self):
    params = model_registry.GetParams(_BIG, 'Train')
    p = params.task
    stack = p.stack_tpl
    self.assertEqual(
        (p.model_dim, stack.num_layers, stack.transformer_tpl.num_heads,
         stack.transformer_tpl.hidden_dim, p.vocab_size, stack.splits,
         stack.pipeline_tpl.num_micro_batches),
        (2048, 32, 16, 8192, 32000, 4, 32))
    self.assertEqual((params.input.max_seq_len, params.input.batch_size),
                     (1024, 32))
    meta = _Meta(params)
    tokens = 32 * 1024
    # Forward: 2 FLOPs per weight per token, plus attention's QK^T and AV
    # (2 * 2 * t * d a token a layer) and the elementwise work (< 10%).
    matmul = 2 * tokens * (stack.num_layers * _WeightsPerLayer(p) +
                           p.model_dim * p.vocab_size)
    atten = 4 * tokens * 1024 * p.model_dim * stack.num_layers
    self.assertBetween(meta.flops, matmul + atten,
                       1.1 * (matmul + atten))
    # 4 cells of 8 layers; the last also has the norm and the softmax.
    self.assertLen(meta.plan.StageFlops(), 4)
    self.assertEqual(sum(meta.plan.StageFlops()), meta.flops)
    self.assertEqual(meta.plan.StageFlops()[1], meta.plan.StageFlops()[2])
    self.assertIs(stack.cls, gpipe_transformer.GPipeTransformerStack)

  def testTinyEvaluatesTheWholeDevSetUncut(self):
    params = model_registry.GetParams(_TINY, 'Dev')
    self.assertEqual(params.task.eval.samples_per_summary, 0)
    stats = params.input.Instantiate().stats
    self.assertEqual(stats.num_sentences, 2000)
    self.assertEqual(stats.num_truncated, 0)  # Every sentence is whole.

  def testDevAndTestAreOneSentenceARow(self):
    for key in (_BIG, _TINY):
      for dataset in ('Dev', 'Test'):
        params = model_registry.GetParams(key, dataset)
        self.assertFalse(params.input.packed, (key, dataset))
        self.assertFalse(params.input.repeat, (key, dataset))
        self.assertEqual(params.input.split, dataset.lower())

  def testTinyKeepsTheStructureAndFitsItsData(self):
    big = model_registry.GetParams(_BIG, 'Train')
    for dataset in ('Train', 'Dev', 'Test'):
      params = model_registry.GetParams(_TINY, dataset)
      p = params.task
      self.assertIs(params.task.cls, big.task.cls)
      self.assertIs(params.input.cls, big.input.cls)
      stack = p.stack_tpl
      self.assertEqual((stack.splits, stack.pipeline_tpl.num_micro_batches),
                       (2, 4))
      self.assertEqual(
          params.input.batch_size % stack.pipeline_tpl.num_micro_batches, 0)
      self.assertEqual(params.input.corpus, 'synthetic')
      self.assertGreaterEqual(p.vocab_size,
                              params.input.tokenizer.vocab_size)
      # Grammar metrics follow the input: on for Tiny's corpus only.
      self.assertEqual(p.entropy_per_sentence, 'auto')
      self.assertEqual(p.decoder.grammar_metrics, 'auto')
      self.assertTrue(corpus_input.ReadsTheGrammar(params.input))
      self.assertFalse(corpus_input.ReadsTheGrammar(
          model_registry.GetParams(_BIG, dataset).input))
    meta = _Meta(model_registry.GetParams(_TINY, 'Train'))
    self.assertLen(meta.plan.StageFlops(), 2)
    # The model is small: a train step is well under 100 GFLOPs.
    self.assertLess(3 * meta.flops, 1e11)


if __name__ == '__main__':
  tf.test.main()
