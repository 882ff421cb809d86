"""Tests for cadence.tasks.lm.model: the LanguageModel task."""
import functools
import os
import re

import numpy as np
import tensorflow as tf

from cadence.framework import cluster as cluster_lib
from cadence.framework import model_registry
from cadence.framework.nested_map import NestedMap
from cadence.framework.pipeline import schedules
from cadence.framework import shapes
from cadence.framework.train import eval_programs
from cadence.framework.train import programs
from cadence.framework.train import summary_utils
from cadence.layers import gpipe_transformer
from cadence.tasks.lm import corpus_input
from cadence.tasks.lm import input_generator
from cadence.tasks.lm import model
from cadence.tasks.lm import synthetic_corpus
from cadence.tasks.lm import tokenizers
from cadence.tests import test_utils

VOCAB, DIM, T, B = 40, 16, 6, 8


def _Params(splits=None, num_micro_batches=1, schedule='gpipe',
            stages_per_device=1, **kwargs):
  """LM params; with `splits`, a GPipe stack of that partition."""
  p = model.LanguageModel.Params().Set(
      name='lm', vocab_size=VOCAB, model_dim=DIM, random_seed=3)
  if splits is not None:
    p.stack_tpl = gpipe_transformer.GPipeTransformerStack.Params().Set(
        splits=splits)
    p.stack_tpl.pipeline_tpl.Set(num_micro_batches=num_micro_batches,
                                 schedule=schedule,
                                 stages_per_device=stages_per_device)
  p.stack_tpl.num_layers = 3
  p.stack_tpl.transformer_tpl.Set(num_heads=2, hidden_dim=32)
  return p.Set(**kwargs)


def _Cluster(num_devices):
  return cluster_lib.Cluster.Params().Set(
      num_devices=num_devices, worker_split_size=num_devices).Instantiate()


def _Build(p, num_devices=1):
  with _Cluster(num_devices):
    return p.Instantiate()


def _Batch(seed=0, b=B, t=T):
  """Sentences of random length: BOS w.. / w.. EOS, padded."""
  rng = np.random.default_rng(seed)
  ids = np.zeros([b, t], np.int32)
  labels = np.zeros([b, t], np.int32)
  weights = np.zeros([b, t], np.float32)
  for i in range(b):
    n = int(rng.integers(1, t))                  # words; n + 1 <= t labels
    words = rng.integers(4, VOCAB, size=n)
    ids[i, :n + 1] = [tokenizers.BOS_ID] + list(words)
    labels[i, :n + 1] = list(words) + [tokenizers.EOS_ID]
    weights[i, :n + 1] = 1.0
  return NestedMap(ids=tf.constant(ids), labels=tf.constant(labels),
                   paddings=tf.constant(1.0 - weights),
                   weights=tf.constant(weights))


def _Nll(task, batch):
  """[b, t] float64 negative log-likelihood of the labels, in numpy."""
  encoded = task.ComputePredictions(task.theta, batch).encoded
  logits = np.asarray(task.children.softmax.Logits(task.theta.softmax,
                                                   encoded), np.float64)
  log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  labels = np.asarray(batch.labels)
  return -np.take_along_axis(log_probs, labels[..., None], -1)[..., 0]


def _LossAndGrads(task, batch):
  """(metrics, {variable key: gradient of the loss})."""

  def _Loss():
    metrics, _ = task.FPropTower(test_utils.Seeded(task), batch)
    return metrics.loss[0], metrics

  (_, metrics), grads = test_utils.LossAndGrads(_Loss, task.vars.Flatten())
  return metrics, dict(zip([k for k, _ in task.vars.FlattenItems()], grads))


class LanguageModelTest(tf.test.TestCase):

  def testMetricsAgainstNumpy(self):
    task = _Build(_Params(entropy_per_sentence=2.5))
    batch = _Batch()
    metrics, per_example = task.FPropTower(task.theta, batch)
    encoded = task.ComputePredictions(task.theta, batch).encoded
    self.assertEqual(encoded.shape, [B, T, DIM])
    nll = _Nll(task, batch)
    labels, w = np.asarray(batch.labels), np.asarray(batch.weights)
    tokens, sentences = w.sum(), (w * (labels == tokenizers.EOS_ID)).sum()
    self.assertEqual(sentences, B)
    self.assertAllClose(metrics.loss[0], (nll * w).sum() / tokens, atol=1e-5)
    self.assertAllClose(metrics.loss[1], tokens, atol=0)
    self.assertAllClose(metrics.log_pplx[0], metrics.loss[0], atol=1e-6)
    self.assertAllClose(metrics.tokens_per_batch, (tokens, 1.0), atol=0)
    self.assertAllClose(metrics.nats_per_sentence,
                        ((nll * w).sum() / B, B), atol=1e-4)
    self.assertAllClose(per_example.xent, (nll * w).sum(1), atol=1e-4)
    # The gap to the entropy is an eval metric (is_inference) only.
    self.assertNotIn('excess_nats_per_sentence', metrics)
    evaler = _Build(_Params(entropy_per_sentence=2.5, is_inference=True))
    eval_metrics, _ = evaler.FPropTower(evaler.theta, batch)
    self.assertAllClose(eval_metrics.excess_nats_per_sentence,
                        ((nll * w).sum() / B - 2.5, B), atol=1e-4)
    # Untrained on VOCAB classes: about log(VOCAB) nats a token.
    self.assertAllClose(metrics.log_pplx[0], np.log(VOCAB), atol=0.5)

  def testPerSentenceMetricsCountOnlyWholeSentences(self):
    # Packed windows of 6 over the byte stream of 'ab', 'c', 'de', 'fgh':
    #   row 0  ids  BOS a b EOS BOS c      labels a b EOS BOS c EOS
    #   row 1  ids  EOS BOS d e EOS BOS    labels BOS d e EOS BOS f
    #   row 2  ids  f g h                  labels g h EOS
    # Whole: 'ab' (row 0, labels 0-2), 'c' (row 0, 4-5), 'de' (row 1,
    # 1-3); 'fgh' is cut at the end of row 1 and the start of row 2. Each
    # whole sentence of n tokens weighs 6 / (6 - n).
    path = os.path.join(self.get_temp_dir(), 'packed.txt')
    with open(path, 'w', encoding='utf-8') as f:
      f.write('ab\nc\nde\nfgh\n')
    gen = input_generator.LmInput.Params().Set(
        file_pattern=path, batch_size=3, max_seq_len=6, packed=True,
        shuffle=False, repeat=False, fixed_input_shape=True).Instantiate()
    batch = NestedMap({k: tf.constant(v)
                       for k, v in gen.InputBatchAt(0).items()})
    task = _Build(_Params(vocab_size=260, entropy_per_sentence=2.5,
                          is_inference=True))
    metrics, _ = task.FPropTower(task.theta, batch)
    nll = _Nll(task, batch)
    whole = [(0, [0, 1, 2], 6 / 4), (0, [4, 5], 6 / 5), (1, [1, 2, 3], 6 / 4)]
    want = (sum(w * nll[r, cols].sum() for r, cols, w in whole) /
            sum(w for _, _, w in whole))
    self.assertAllClose(metrics.nats_per_sentence,
                        (want, 6 / 4 + 6 / 5 + 6 / 4), atol=1e-4)
    self.assertAllClose(metrics.excess_nats_per_sentence[0], want - 2.5,
                        atol=1e-4)
    # Without sentence_weights every EOS label's sentence counts: here 'fgh'
    # too, and the cut 'fgh' tokens of row 1.
    del batch['sentence_weights']
    old, _ = task.FPropTower(task.theta, batch)
    w = np.asarray(batch.weights)
    self.assertAllClose(old.nats_per_sentence, ((nll * w).sum() / 4, 4),
                        atol=1e-4)

  def testEntropyAndGrammarMetricsFollowTheInput(self):
    synthetic = corpus_input.LmCorpusInput.Params().Set(
        corpus='synthetic', data_dir='/unused')
    for input_p, entropy, grammar in (
        (None, None, False),
        (synthetic, synthetic_corpus.EntropyPerSentence(), True),
        (synthetic.Copy().Set(file_pattern='/my/text'), None, False),
        (corpus_input.LmCorpusInput.Params().Set(
            corpus='one_billion_words'), None, False)):
      p = _Params(is_inference=True)
      p.input = input_p
      task = _Build(p)
      self.assertEqual(task.entropy_per_sentence, entropy)
      self.assertEqual(task.grammar_metrics, grammar)
      metrics, _ = task.FPropTower(task.theta, _Batch())
      self.assertEqual('excess_nats_per_sentence' in metrics,
                       entropy is not None)
      self.assertEqual('sampled_grammatical' in task.CreateDecoderMetrics(),
                       grammar)
    # Explicit values win over the input.
    p = _Params(entropy_per_sentence=None)
    p.input = synthetic
    p.decoder.grammar_metrics = False
    task = _Build(p)
    self.assertEqual((task.entropy_per_sentence, task.grammar_metrics),
                     (None, False))

  def testLabelSmoothingKeepsLogPplxUnsmoothed(self):
    plain = _Build(_Params())
    smooth = _Build(_Params(label_smoothing=0.2))
    batch = _Batch()
    m0, _ = plain.FPropTower(plain.theta, batch)
    m1, _ = smooth.FPropTower(smooth.theta, batch)
    self.assertAllClose(m1.log_pplx[0], m0.log_pplx[0], atol=1e-6)
    self.assertNotAllClose(m1.loss[0], m0.loss[0], atol=1e-3)

  def testSoftmaxMaxAllocGivesTheSameLoss(self):
    batch = _Batch()
    full = _Build(_Params())
    chunked = _Build(_Params(softmax_max_alloc=3 * VOCAB))
    m0, g0 = _LossAndGrads(full, batch)
    m1, g1 = _LossAndGrads(chunked, batch)
    self.assertAllClose(m0.loss[0], m1.loss[0], atol=1e-6)
    for key in g0:
      self.assertAllClose(g0[key], g1[key], atol=1e-6, msg=key)

  def testSplitsGiveTheSameLossAndGradients(self):
    # Every schedule (1F1B and the zero-bubble and interleaved ones run the
    # softmax and cross-entropy of each micro-batch inside the pipeline)
    # against the plain stack.
    batch = _Batch(b=8)
    plain = _Build(_Params(label_smoothing=0.1))
    self.assertIsInstance(plain.children.stack,
                          model.transformer.TransformerStack)
    results = {}
    for splits, m, schedule, v in (
        (1, 1, 'gpipe', 1), (2, 4, 'gpipe', 1), ([1], 2, 'gpipe', 1),
        (2, 4, '1f1b', 1), (1, 8, '1f1b', 1), (2, 4, 'zb_h1', 1),
        (1, 4, 'zb_v', 2), (1, 2, 'interleaved_1f1b', 3)):
      k = 1 if splits == 1 else 2   # One device per pipeline cell.
      task = _Build(_Params(splits=splits, num_micro_batches=m,
                            schedule=schedule, stages_per_device=v,
                            label_smoothing=0.1), k)
      self.assertEqual(schedule != 'gpipe', schedules.LossInside(
          task.stack.pipeline.params.schedule))
      self.assertEqual(task.stack.num_cells,
                       (1 if splits == 1 else 2) * v)
      if splits != 1:
        self.assertIn('CPU:1', task.children.softmax.vars.w.device)
      # Same paths, same initial weights.
      self.assertEqual([k for k, _ in task.vars.FlattenItems()],
                       [k for k, _ in plain.vars.FlattenItems()])
      for a, b in zip(task.vars.Flatten(), plain.vars.Flatten()):
        self.assertAllEqual(a, b)
      results[str(splits), m, schedule] = _LossAndGrads(task, batch)
    m_ref, g_ref = _LossAndGrads(plain, batch)
    for key, (m, g) in results.items():
      self.assertAllClose(m, m_ref, atol=1e-5, msg=key)
      self.assertEqual(sorted(g), sorted(g_ref))
      for name in g_ref:
        self.assertAllClose(g[name], g_ref[name], atol=1e-5,
                            msg=f'{key} {name}')

  def testBfloat16WithOneKnob(self):
    # task.fprop_dtype: every layer computes in bfloat16 from float32
    # variables (gradients float32), the cross-entropy and the metrics in
    # float32. GELU: see layers/transformer_test (a ReLU's kink).
    batch = _Batch(b=8)

    def _Task(splits=None, m=1, schedule='gpipe', dtype=tf.bfloat16):
      p = _Params(splits=splits, num_micro_batches=m, schedule=schedule,
                  fprop_dtype=dtype)
      p.stack_tpl.transformer_tpl.activation = 'GELU'
      return _Build(p, 1 if splits in (None, 1) else 2)

    m32, _ = _LossAndGrads(_Task(dtype=tf.float32), batch)
    plain = _Task()
    for child in plain.children.values():
      self.assertEqual(child.fprop_dtype, tf.bfloat16)
    self.assertEqual({v.dtype for v in plain.vars.Flatten()}, {tf.float32})
    self.assertEqual(plain.ComputePredictions(
        plain.theta, batch).encoded.dtype, tf.bfloat16)
    m16, want = _LossAndGrads(plain, batch)
    for metric in m16.values():
      self.assertEqual(metric[0].dtype, tf.float32)
    # Untrained, log(VOCAB) = 3.7 nats a token; bfloat16 logits (2^-9
    # relative rounding) move it by about 1e-3 (measured 8.6e-4).
    self.assertAllClose(m32.loss[0], m16.loss[0], atol=0.01)
    scale = max(np.abs(g).max() for g in want.values())
    for splits, m, schedule in ((2, 4, 'gpipe'), (2, 4, '1f1b')):
      got_m, got = _LossAndGrads(_Task(splits, m, schedule), batch)
      self.assertAllClose(m16.loss[0], got_m.loss[0], atol=1e-5)  # 2e-7
      for name, w in want.items():
        self.assertEqual(got[name].dtype, tf.float32)
        # As gpipe_transformer_test: micro-batches' bfloat16 weight
        # gradients summed in float32, against the whole batch's
        # (measured: up to 0.34% of the largest).
        self.assertAllClose(w, got[name], atol=2**-6 * scale, rtol=0,
                            msg=f'{splits} {m} {schedule} {name}')
    # The memory estimate: the pipeline's outputs (activations, paddings)
    # in 2 bytes (the layers' act: memory_estimate_test).
    shape = NestedMap(ids=shapes.Shape([B, T]), labels=shapes.Shape([B, T]))
    mem = {dtype: model.LanguageModel.FPropMeta(_Params(
        splits=2, num_micro_batches=4, fprop_dtype=dtype), shape).plan
           for dtype in (tf.float32, tf.bfloat16)}
    for c32, c16 in zip(mem[tf.float32].cells, mem[tf.bfloat16].cells):
      self.assertEqual(c16.out * 2, c32.out)

  def testFPropMetaIsTheSumOfItsParts(self):
    p = _Params(splits=[1], num_micro_batches=2)
    meta = model.LanguageModel.FPropMeta(
        p, NestedMap(ids=shapes.Shape([B, T]), labels=shapes.Shape([B, T])))
    self.assertEqual(meta.flops, sum(f for _, f in meta.breakdown))
    partitions = meta.plan.StageFlops()
    self.assertEqual(sum(partitions), meta.flops)
    self.assertLen(partitions, 2)
    parts = dict(meta.breakdown)
    layer_p = model.transformer.TransformerLayer.Params().Set(
        name='x', input_dim=DIM, hidden_dim=32, num_heads=2)
    layer = layer_p.cls.FPropMeta(layer_p, shapes.Shape([B, T, DIM])).flops
    ln_p = layer_p.ln_tpl.Copy().Set(input_dim=DIM)
    ln = ln_p.cls.FPropMeta(ln_p, shapes.Shape([B, T, DIM])).flops
    self.assertEqual(parts['stack (3 layers)'], 3 * layer + ln)
    # Cell 0 has layer 0 (+ embeddings), cell 1 layers 1-2 (+ norm, softmax).
    self.assertEqual(partitions[0],
                     layer + parts['emb'] + parts['pos_emb'])
    self.assertEqual(parts['softmax'], B * T * (
        2 * DIM * VOCAB + VOCAB + 6 * VOCAB + 3))
    # Unknown batch: uncountable.
    unknown = model.LanguageModel.FPropMeta(
        p, NestedMap(ids=shapes.Shape([None, T])))
    self.assertIsNone(unknown.flops)

  def testBadParams(self):
    with self.assertRaisesRegex(ValueError, r"LanguageModel 'lm': "
                                r'model_dim=0 must be an int >= 1'):
      _Build(_Params(model_dim=0))
    with self.assertRaisesRegex(ValueError, r'label_smoothing=0.1 needs '
                                r'softmax_max_alloc=0'):
      _Build(_Params(label_smoothing=0.1, softmax_max_alloc=100))
    with self.assertRaisesRegex(ValueError, r'decoder.temperature=0 must be '
                                r'a number > 0'):
      p = _Params()
      p.decoder.temperature = 0
      _Build(p)
    with self.assertRaisesRegex(ValueError, r'splits=5 must be in \[1, '
                                r'num_layers=3\]'):
      _Build(_Params(splits=5), 2)
    with self.assertRaisesRegex(ValueError, r"entropy_per_sentence='yes' "
                                r"must be 'auto', None or a number >= 0"):
      _Build(_Params(entropy_per_sentence='yes'))
    for field, value, rule in (
        ('grammar_metrics', 'on', "must be one of 'auto', True, False"),
        ('prompt_words', 0, 'must be an int >= 1')):
      p = _Params()
      p.decoder.Set(**{field: value})
      with self.assertRaisesRegex(ValueError, re.escape(
          f"LanguageModel 'lm': decoder.{field}={value!r} {rule}")):
        _Build(p)


_SPACE = ord(' ') + tokenizers.NUM_RESERVED_IDS   # ByteTokenizer's space


def _PromptLengthsReference(ids, paddings, num_words):
  """Tokens up to the start of word num_words + 1 (bytes), in plain Python."""
  lengths = []
  for row, pads in zip(ids.tolist(), paddings.tolist()):
    words = n = 0
    for j, (x, pad) in enumerate(zip(row, pads)):
      if pad > 0.5:
        break
      words += x == _SPACE or (j > 0 and row[j - 1] == tokenizers.BOS_ID)
      if words > num_words:
        break
      n += 1
    lengths.append(max(n, 1))
  return lengths


class DecodeTest(tf.test.TestCase):

  def _Task(self, **kwargs):
    p = _Params(is_inference=True, **kwargs)
    p.input = corpus_input.LmCorpusInput.Params()   # ByteTokenizer
    return _Build(p, 2)

  def testShapesPromptsAndDeterminism(self):
    task = self._Task(splits=2, num_micro_batches=2)
    batch = _Batch(seed=1)
    # Spaces (byte tokenizer word starts) at every other word position.
    ids = np.asarray(batch.ids).copy()
    ids[:, 2::2] = np.where(ids[:, 2::2] > 0, _SPACE, 0)
    batch.ids = tf.constant(ids)
    decode = tf.function(task.Decode, autograph=False)
    out = decode(test_utils.Seeded(task, 7), batch)
    again = decode(test_utils.Seeded(task, 7), batch)
    other = decode(test_utils.Seeded(task, 8), batch)
    for key in ('greedy_ids', 'sampled_ids', 'reference_ids'):
      self.assertEqual(out[key].shape, [B, T])
    self.assertAllEqual(out.sampled_ids, again.sampled_ids)
    self.assertAllEqual(out.greedy_ids, other.greedy_ids)
    self.assertNotAllEqual(out.sampled_ids, other.sampled_ids)
    want = _PromptLengthsReference(ids, np.asarray(batch.paddings), 2)
    self.assertAllEqual(out.prompt_lengths, want)
    self.assertBetween(len(set(want)), 3, T)  # Cut at various places.
    for i, n in enumerate(np.asarray(out.prompt_lengths)):
      self.assertAllEqual(out.greedy_ids[i, :n], ids[i, :n])
      self.assertAllEqual(out.sampled_ids[i, :n], ids[i, :n])
    self.assertAllEqual(out.reference_ids,
                        np.where(np.asarray(batch.weights) > 0,
                                 np.asarray(batch.labels), 0))
    # Greedy: each token is the argmax given the tokens before it (until
    # EOS); checked on row 0 with the plain, unpipelined forward.
    plain = _Build(_Params(is_inference=True))   # Same weights (by path).
    row = np.asarray(out.greedy_ids[0])
    n = int(out.prompt_lengths[0])
    for t in range(n, T):
      logits = plain._LastLogits(plain.theta, row[None], t - 1)  # pylint: disable=protected-access
      self.assertEqual(row[t], int(np.argmax(logits[0])))
      if row[t] == tokenizers.EOS_ID:
        self.assertTrue((row[t + 1:] == 0).all())
        break

  def testPostProcessDecodeOut(self):
    p = _Params(vocab_size=260)
    p.input = corpus_input.LmCorpusInput.Params()  # ByteTokenizer
    p.decoder.grammar_metrics = True
    task = _Build(p)
    tok = tokenizers.ByteTokenizer.Params().Instantiate()

    def _Row(text, eos=True):
      ids = [1] + tok.Encode(text) + ([2] if eos else [])
      return ids + [0] * (12 - len(ids))

    # Row 2 is all padding (a pass's last batch): no line, no metric.
    out = NestedMap(
        prompt_lengths=np.array([3, 2, 1]),
        greedy_ids=np.array([_Row('alice sees'),
                             _Row('she sees', eos=False), _Row('she')]),
        sampled_ids=np.array([_Row('alice s'), _Row('she '), _Row('she')]),
        reference_ids=np.array([_Row('a dog')[1:] + [0],
                                _Row('he')[1:] + [0], [0] * 12]))
    metrics = task.CreateDecoderMetrics()
    lines = task.PostProcessDecodeOut(out, metrics)
    self.assertEqual(lines, [
        "prompt: 'al'  greedy: 'ice sees'  sampled(T=1): 'ice s'  "
        "reference: 'a dog'",
        "prompt: 's'  greedy: 'he sees'  sampled(T=1): 'he '  "
        "reference: 'he'"])
    self.assertEqual(metrics['greedy_finished'].value, 0.5)
    self.assertEqual(metrics['sampled_finished'].value, 1.0)
    self.assertEqual(metrics['sampled_tokens'].value, (5 + 3) / 2)
    # Only 'alice sees' is a finished sentence of the grammar.
    self.assertEqual(metrics['greedy_grammatical'].value, 0.5)
    self.assertEqual(metrics['sampled_grammatical'].value, 0.0)

  def testPromptsAreWholeWords(self):
    data_dir = os.path.join(self.get_temp_dir(), 'prompts')
    patterns = synthetic_corpus.WriteShards(
        data_dir, num_train_shards=1, sentences_per_shard=500, seed=4,
        num_heldout_sentences=12)
    with open(patterns.dev, encoding='utf-8') as f:
      sentences = f.read().splitlines()
    spm = tokenizers.SentencePieceTokenizer.Params().Set(
        train_file_pattern=patterns.train, vocab_size=300,
        cache_dir=os.path.join(self.get_temp_dir(), 'spm'))
    for tok_p, words in ((tokenizers.ByteTokenizer.Params(), 1), (spm, 3),
                         (spm, 1)):
      with self.subTest(tokenizer=tok_p.cls.__name__, words=words):
        p = _Params(vocab_size=320, is_inference=True)
        p.stack_tpl.num_layers = 1
        p.decoder.prompt_words = words
        p.input = input_generator.LmInput.Params().Set(
            file_pattern=patterns.dev, tokenizer=tok_p, batch_size=12,
            max_seq_len=200, packed=False, shuffle=False, repeat=False)
        task = _Build(p)
        gen = p.input.Instantiate()
        batch = NestedMap({k: tf.constant(v)
                           for k, v in gen.InputBatchAt(0).items()})
        out = tf.function(task.Decode, autograph=False)(test_utils.Seeded(task), batch)
        out = tf.nest.map_structure(np.asarray, out)
        # vocab_size 320 > the tokenizer's ids: never emitted.
        self.assertLess(out.sampled_ids.max(), gen.tokenizer.vocab_size)
        lines = task.PostProcessDecodeOut(out, task.CreateDecoderMetrics())
        for i, s in enumerate(sentences):
          prompt = ' '.join(s.split(' ')[:words])
          n = out.prompt_lengths[i]
          self.assertEqual(gen.tokenizer.Decode(out.greedy_ids[i, :n]),
                           prompt, (tok_p.cls.__name__, words, s))
          self.assertTrue(lines[i].startswith(f'prompt: {prompt!r}  '))


class ServingTest(tf.test.TestCase):
  """Score and Sample, the code of the exported `score` and `sample`
  (export and load: tests/trainer_export_test.py)."""

  def _Task(self, splits=None, seed=None, num_layers=3):
    p = _Params(is_inference=True, splits=splits, num_micro_batches=2,
                vocab_size=260)
    p.stack_tpl.num_layers = num_layers
    p.decoder.seed = seed
    p.input = corpus_input.LmCorpusInput.Params().Set(max_seq_len=T)
    return _Build(p, 2 if splits else 1)

  def testScoreIsTheEvalersNll(self):
    """Rows BOS w.. EOS: ids[:, 1:] scored given the ones before, as the
    loss scores the batch's labels given its ids."""
    for splits in (None, 2):
      with self.subTest(splits=splits):
        task = self._Task(splits)
        batch = _Batch(seed=2)
        ids = tf.concat([batch.ids[:, :1], batch.labels], 1)     # [b, t+1]
        paddings = tf.pad(1.0 - batch.weights, [[0, 0], [1, 0]])
        out = task.Score(task.theta, ids, paddings)
        nll = _Nll(task, batch) * np.asarray(batch.weights)
        self.assertAllClose(out.log_probs[:, 1:], -nll, atol=1e-5)
        self.assertAllEqual(out.log_probs[:, 0], np.zeros(B))
        self.assertAllClose(out.sentence_log_prob, -nll.sum(1), atol=1e-5)
        self.assertAllEqual(out.num_tokens, np.sum(batch.weights, 1))
        _, per_example = task.FPropTower(task.theta, batch)
        self.assertAllClose(out.sentence_log_prob, -per_example.xent,
                            atol=1e-5)

  def testSampleIsTheDecodersCodeWithItsSeed(self):
    """decoder.seed=5 decodes as a checkpoint of step 5 does, and Sample
    given the decoder's batch (prompts twice, b greedy then b sampled rows)
    and SampleSeed(5) returns its ids."""
    task = self._Task()
    seeded = self._Task(seed=5)
    batch = _Batch(seed=1)
    ids = np.asarray(batch.ids).copy()
    ids[:, 2::2] = np.where(ids[:, 2::2] > 0, _SPACE, 0)
    batch.ids = tf.constant(ids)
    at_step_5 = task.Decode(test_utils.Seeded(task, seed=task.SampleSeed(5)),
                            batch)
    with_seed = seeded.Decode(test_utils.Seeded(seeded, 99), batch)
    for key in ('greedy_ids', 'sampled_ids', 'prompt_lengths'):
      self.assertAllEqual(at_step_5[key], with_seed[key])
    lengths = at_step_5.prompt_lengths
    out = task.Sample(
        test_utils.Seeded(task, seed=task.SampleSeed(5)),
        tf.concat([batch.ids] * 2, 0), tf.concat([lengths] * 2, 0),
        [0.0] * B + [1.0] * B, T)
    self.assertAllEqual(out.ids, tf.concat([at_step_5.greedy_ids,
                                            at_step_5.sampled_ids], 0))
    for row, n, done, start in zip(np.asarray(out.ids), out.lengths,
                                   out.finished, np.tile(lengths, 2)):
      eos = np.flatnonzero(row[start:] == tokenizers.EOS_ID)
      self.assertEqual(bool(done), eos.size > 0)
      self.assertEqual(n, start + eos[0] + 1 if eos.size else T)
      self.assertTrue((row[n:] == 0).all())

  def testStaticSampleCompilesWithXla(self):
    """What a static export (--export_batch_size, --export_max_len) gives
    an XLA server: sample compiles (stateless_categorical has no XLA
    kernel; score compiles too: 1e-6 from the uncompiled, measured) and
    its greedy rows are the uncompiled ones. (XLA's stateless generator
    draws other numbers than TensorFlow's kernels: sampled rows differ.)"""
    task = self._Task(num_layers=1)   # XLA compiles the stack per step.
    sample = task.Inference(batch_size=B, max_len=T + 1).signatures['sample']
    self.assertEqual(sample.inputs['prompt_ids'].shape.as_list(), [B, T + 1])
    batch = _Batch(seed=3)
    args = (tf.pad(batch.ids, [[0, 0], [0, 1]]), tf.fill([B], 2),
            tf.constant([0.0, 1.0] * (B // 2)), tf.constant(4, tf.int64))
    fn = functools.partial(sample.fn, task.theta)
    compiled = tf.function(fn, jit_compile=True)(*args)['ids']
    self.assertAllEqual(compiled[::2], fn(*args)['ids'][::2])
    self.assertEqual(compiled.shape, [B, T + 1])

  def testInferenceSignatures(self):
    task = self._Task()
    graph = task.Inference()
    self.assertEqual(list(graph.signatures), ['score', 'sample'])
    self.assertEqual(graph.assets, {})   # ByteTokenizer: no model file.
    sample = graph.signatures['sample']
    self.assertEqual({k: v.shape.as_list() for k, v in sample.inputs.items()},
                     dict(prompt_ids=[None, None], prompt_lengths=[None],
                          temperature=[None], seed=[]))
    out = sample.fn(task.theta, tf.ones([2, 1], tf.int32), [1, 1],
                    [0.0, 0.0], tf.constant(3, tf.int64))
    self.assertEqual(out['ids'].shape, [2, T])       # input.max_seq_len
    static = task.Inference(batch_size=4, max_len=10).signatures
    self.assertEqual(static['score'].inputs['ids'].shape.as_list(), [4, 10])
    self.assertEqual(static['sample'].inputs['temperature'].shape.as_list(),
                     [4])
    with self.assertRaisesRegex(
        ValueError, r"LanguageModel 'lm' Inference: max_len=1 must be None "
        r'or an int >= 2\.'):
      task.Inference(max_len=1)


class TinyExperimentTest(tf.test.TestCase):

  def testTrainsWithAPipelineAndLogPplxFalls(self):
    key = 'lm.one_billion_wds.OneBWdsGPipeTransformerTiny'
    data_dir = os.path.join(self.get_temp_dir(), 'data')
    logdir = os.path.join(self.get_temp_dir(), 'run')

    def _Shrunk(dataset):
      p = model_registry.GetParams(key, dataset)
      p.input.Set(data_dir=data_dir, batch_size=8)
      p.input.synthetic.Set(num_train_shards=2, sentences_per_shard=1000,
                            num_heldout_sentences=60)
      p.input.tokenizer.Set(vocab_size=300, cache_dir=os.path.join(
          self.get_temp_dir(), 'spm'))
      p.task.Set(vocab_size=300, model_dim=32)
      p.task.stack_tpl.num_layers = 2
      p.task.stack_tpl.transformer_tpl.Set(num_heads=2, hidden_dim=64)
      p.task.train.Set(max_steps=120, save_interval_steps=120,
                       summary_interval_steps=40, log_interval_steps=40)
      p.task.eval.samples_per_summary = 0  # The whole (60-sentence) Dev set.
      p.task.train.learner.lr_schedule.Set(model_dim=32, warmup_steps=20)
      if dataset == 'Train':
        p.input.max_seq_len = 32
      return p

    with _Cluster(2):
      train_p = _Shrunk('Train')
      stack_p = train_p.task.stack_tpl
      self.assertEqual((stack_p.splits, stack_p.pipeline_tpl.num_micro_batches),
                       (2, 4))
      task = train_p.Instantiate().task
      dev_p = _Shrunk('Dev')
      dev_p.task.is_inference = True
      evaler = eval_programs.EvalProgram(
          dev_p.Instantiate().task, 'Dev', logdir)
      program = programs.TrainProgram(task, logdir, peak_flops=1e12,
                                      on_checkpoint=[
                                          lambda s: evaler.Run(s, task.theta)])
      before = evaler.Run(0, task.theta)
      program.Run()
    scalars = summary_utils.ReadScalars(os.path.join(logdir, 'eval_dev'))
    after = dict(scalars['log_pplx'])[120]
    self.assertAllClose(before['log_pplx'], np.log(300), atol=0.5)
    self.assertLess(after, before['log_pplx'] - 1.5)
    self.assertAllClose(before['excess_nats_per_sentence'],
                        before['nats_per_sentence'] -
                        task.entropy_per_sentence, atol=1e-3)
    # 8 batches of 8 rows: the last 4 rows only fill up the last batch.
    self.assertEqual(before['num_samples'], 60)
    train = summary_utils.ReadScalars(os.path.join(logdir, 'train'))
    self.assertIn('mfu', train)
    self.assertIn('nats_per_sentence', train)
    self.assertNotIn('excess_nats_per_sentence', train)   # Eval only.
    self.assertLess(train['loss'][-1][1], train['loss'][0][1])


if __name__ == '__main__':
  tf.test.main()
