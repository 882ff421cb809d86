"""The Transformer language model task, pipelined with GPipe or not.

  ids [b, t] -> EmbeddingLayer (x sqrt(d)) + sinusoidal positions  [b, t, d]
             -> L causal pre-LN Transformer layers + final LayerNorm [b, t, d]
             -> SimpleFullSoftmax over the vocabulary               [b, t, V]
             -> cross-entropy against `labels`, weighted by `weights`

The stack is `stack_tpl`: a plain `transformer.TransformerStack`, or a
`gpipe_transformer.GPipeTransformerStack` (cells on the devices of the model
split, micro-batches through a pipeline; its `splits` and `pipeline_tpl`
hold every pipeline setting). Both keep their layers at
`<task>.stack.x_layers[i]` and `<task>.stack.final_ln`, so every partition
starts from the same weights (seeded by path), computes the same function,
and reads the same checkpoints. The task sets the stack's layer depth to
`model_dim` and makes self-attention causal. A pipelined stack puts the
embedding on its first cell's device and the softmax on its last cell's.

Metrics (each a (value, weight) pair, averaged by weight by the trainer):
  loss                   mean cross-entropy per label token (label
                         smoothing included), weight = tokens;
  log_pplx               mean negative log-likelihood per token, nats;
  tokens_per_batch       label tokens (weight > 0) in one replica's batch,
                         weight 1: averaged, the mean batch size in tokens;
  nats_per_sentence      negative log-likelihood per sentence, over the
                         sentences whole in their row only (BOS and EOS in
                         the row), weight = those sentences. The batch's
                         `sentence_weights` (see tasks/lm/input_generator.py)
                         mark them, and on packed rows weigh each by the
                         inverse of its chance to be whole, so the mean is
                         not biased towards short sentences; a batch
                         without that field counts every EOS label's
                         sentence (exact on one whole sentence a row);
  excess_nats_per_sentence  nats_per_sentence - entropy_per_sentence, when
                         the data's entropy is known, in eval and decode
                         (is_inference) only; 0 is the best any model can
                         do in expectation (a finite Dev set's own mean
                         -log p differs from the entropy by its sampling
                         error). Training does not report it: a summary
                         window's nats_per_sentence is an unbiased but
                         noisy estimate from ~8,000 sampled sentences; for
                         the exact model (the grammar itself) on the Tiny
                         experiment's 50-step windows its standard
                         deviation is 0.34 nats and about half the windows
                         fall below the entropy, while over 8,000 batches
                         it is within 0.01 of the corpus's mean
                         (bench/lm_train_metric_noise.py). That noise is
                         larger than the gap late in training, so a
                         train-side "gap" would often be negative.

`entropy_per_sentence` and `decoder.grammar_metrics` default to 'auto': they
follow the input the task is built with (`params.input`). Reading the
embedded grammar corpus (`corpus_input.ReadsTheGrammar`) they are the
grammar's exact entropy (`synthetic_corpus.EntropyPerSentence()`) and True;
on any other data (a real corpus, your own files) None and False, so no
excess_nats_per_sentence and no *_grammatical decoder metric is reported.

Decoding: for each row of a batch, the BOS and the first
`decoder.prompt_words` words of its ids are a prompt (it ends before the
first token of the next word: a token the tokenizer's `WordStartMask`
marks, a SentencePiece piece starting with U+2581 or the byte tokenizer's
space); the task continues it greedily and by temperature sampling
(`Sample`: stateless, seeded by `decoder.seed`, or by the checkpoint's step
when that is None: same checkpoint and seed, same samples) until EOS or the
batch's length, and `PostProcessDecodeOut` turns the ids into text lines.
Both use the tokenizer of `params.input`.

Serving (`Inference`, written by `trainer.py --mode=export`): `score`
(ids -> log-probabilities, `Score`) and `sample` (prompts -> continuations,
`Sample`, the decoder's own code: the same prompts, temperatures and seed
give the decoder's ids). Ids in, ids out: the SentencePiece model travels
in the SavedModel's assets and the caller tokenises with the
`sentencepiece` package (see `Inference` for why).
"""
from absl import logging
import numpy as np
import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import base_model
from cadence.framework import cluster as cluster_lib
from cadence.framework import cost
from cadence.framework import hyperparams
from cadence.framework import inference
from cadence.framework.nested_map import NestedMap
from cadence.framework import shapes
from cadence.framework import step_seed
from cadence.framework import validation
from cadence.layers import embedding
from cadence.layers import gpipe_transformer
from cadence.layers import gpipe_units
from cadence.layers import softmax as softmax_lib
from cadence.layers import transformer
from cadence.tasks.lm import corpus_input
from cadence.tasks.lm import synthetic_corpus
from cadence.tasks.lm import tokenizers

WeightInit = base_layer.WeightInit


def _DecoderParams():
  p = hyperparams.Params()
  p.Define('prompt_words', 2, 'Words of each row given as the prompt (with '
           'the BOS), an int >= 1; the prompt ends on a word boundary. '
           'Shorter sentences are prompted whole.')
  p.Define('temperature', 1.0, 'Temperature of the sampled continuation, a '
           'float > 0 (1.0: the model distribution).')
  p.Define('seed', None, 'Seed of the sampled continuations, an int >= 0, '
           "or None: the checkpoint's global step (each checkpoint draws "
           'anew). An export\'s `sample` given this seed draws the same.')
  p.Define('log_samples', 3, 'Decoded lines logged per decoded batch (all '
           'are written to the decoder output file).')
  p.Define('grammar_metrics', 'auto', 'Whether the decoder reports the '
           'share of continuations the embedded grammar can produce '
           '(*_grammatical): True, False, or \'auto\': True iff the input '
           'reads the embedded grammar corpus.')
  return p


def _DefaultStackParams():
  layer = transformer.TransformerLayer.Params().Set(num_heads=2,
                                                    hidden_dim=256)
  return transformer.TransformerStack.Params().Set(num_layers=2,
                                                   transformer_tpl=layer)


class LanguageModel(base_model.BaseTask):
  """Causal Transformer LM; see the module docstring.

  Example:
    p = LanguageModel.Params().Set(name='lm', vocab_size=64, model_dim=16)
    p.stack_tpl.Set(num_layers=2)
    p.stack_tpl.transformer_tpl.Set(num_heads=2, hidden_dim=32)
    task = p.Instantiate()
    batch = NestedMap(ids=tf.ones([2, 8], tf.int32),
                      labels=tf.ones([2, 8], tf.int32),
                      paddings=tf.zeros([2, 8]), weights=tf.ones([2, 8]))
    metrics, _ = task.FPropTower(task.theta, batch)
    metrics.log_pplx   # (scalar, 16.0)

  With `stack_tpl` a GPipeTransformerStack with splits=2 (build it inside
  `with cluster:` of 2 devices a split) the layers run as a 2-stage GPipe
  pipeline over `stack_tpl.pipeline_tpl.num_micro_batches`.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('vocab_size', 512, 'Rows of the embedding and classes of the '
             'softmax, an int >= the tokenizer\'s vocabulary size.')
    p.Define('model_dim', 64, 'Model depth d, an int > 0 (the embedding, '
             'every layer of the stack and the softmax input).')
    p.Define('stack_tpl', _DefaultStackParams(), 'Params of the Transformer '
             'stack: transformer.TransformerStack, or '
             'gpipe_transformer.GPipeTransformerStack to pipeline it (splits, '
             'pipeline_tpl.num_micro_batches, ...). Its '
             'transformer_tpl.input_dim is set to model_dim and its '
             'self-attention made causal.')
    p.Define('softmax_max_alloc', 0, 'If > 0, the most logits (rows x '
             'vocab) the softmax computes at once; 0: all.')
    p.Define('label_smoothing', 0.0, 'Label smoothing of the training loss, '
             'in [0, 1); needs softmax_max_alloc=0.')
    p.Define('eos_id', tokenizers.EOS_ID, 'Id of the end-of-sentence token '
             '(counts sentences).')
    p.Define('entropy_per_sentence', 'auto', 'Known entropy of the data in '
             'nats per sentence (EOS included), None, or \'auto\': the '
             'embedded grammar\'s if the input reads its corpus, else None. '
             'When known, eval metrics include excess_nats_per_sentence.')
    p.Define('decoder', _DecoderParams(), 'Decoding params.')
    return p

  @classmethod
  def StackParams(cls, p):
    """`p.stack_tpl` with the task's depth and causal self-attention."""
    stack = p.stack_tpl.Copy().Set(name='stack')
    stack.transformer_tpl.Set(input_dim=p.model_dim, mask_self_atten=True)
    return stack

  @classmethod
  def _SubParams(cls, p):
    """Params of the children, named; shared by __init__ and FPropMeta."""
    return NestedMap(
        stack=cls.StackParams(p),
        # The ids' vectors and their positions' signal: the stack's input.
        emb=embedding.EmbeddingLayer.Params().Set(
            name='emb', vocab_size=p.vocab_size, embedding_dim=p.model_dim,
            scale_sqrt_depth=True,
            params_init=WeightInit.Gaussian(p.model_dim**-0.5),
            position_tpl=embedding.PositionalEmbedding.Params()),
        softmax=softmax_lib.SimpleFullSoftmax.Params().Set(
            name='softmax', input_dim=p.model_dim, num_classes=p.vocab_size,
            label_smoothing=p.label_smoothing,
            softmax_max_alloc=p.softmax_max_alloc))

  @classmethod
  def CheckParams(cls, p, owner):
    """Raises ValueError for bad task params; __init__ and FPropMeta call it,
    so the static check of the task (BaseTask.CheckStaticShapes) runs on
    valid params."""
    for field in ('vocab_size', 'model_dim'):
      validation.CheckInt(owner, field, p.Get(field))
    if not (isinstance(p.stack_tpl, hyperparams.InstantiableParams) and
            issubclass(p.stack_tpl.cls, transformer.TransformerStack)):
      raise validation.Error(owner, 'stack_tpl', p.stack_tpl, 'must be a '
                             "TransformerStack.Params() or a subclass's.")
    validation.CheckInt(owner, 'softmax_max_alloc', p.softmax_max_alloc, 0)
    validation.CheckNumber(owner, 'label_smoothing', p.label_smoothing, 0, 1,
                           high_open=True)
    if p.label_smoothing and p.softmax_max_alloc:
      raise validation.Error(owner, 'label_smoothing', p.label_smoothing,
                             'needs softmax_max_alloc=0: log_pplx is computed '
                             'from the full log-probabilities.')
    if p.entropy_per_sentence not in (None, 'auto') and not (
        validation.IsNumber(p.entropy_per_sentence) and
        p.entropy_per_sentence >= 0):
      raise validation.Error(owner, 'entropy_per_sentence',
                             p.entropy_per_sentence,
                             "must be 'auto', None or a number >= 0.")
    d = p.decoder
    validation.CheckOneOf(owner, 'decoder.grammar_metrics', d.grammar_metrics,
                          ('auto', True, False))
    validation.CheckInt(owner, 'decoder.prompt_words', d.prompt_words)
    validation.CheckNumber(owner, 'decoder.temperature', d.temperature, low=0,
                           low_open=True)
    validation.CheckOptionalInt(owner, 'decoder.seed', d.seed, low=0)

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CheckParams(p, validation.Owner(self))
    h, d = p.entropy_per_sentence, p.decoder
    # 'auto': from the input this task is built with.
    grammar = corpus_input.ReadsTheGrammar(p.input)
    self._entropy_per_sentence = (
        (synthetic_corpus.EntropyPerSentence() if grammar else None)
        if h == 'auto' else h)
    self._grammar_metrics = (grammar if d.grammar_metrics == 'auto' else
                             d.grammar_metrics)
    self._vocab_tables = None   # Filled from the tokenizer by Decode.
    children = self._SubParams(p)
    stack = self.CreateChild('stack', children.stack)
    # A pipelined stack says where what feeds it and reads it goes.
    self._first_device = stack.input_device
    self._last_device = stack.output_device
    self.CreateChild('emb', children.emb, device=self._first_device)
    self.CreateChild('softmax', children.softmax, device=self._last_device)
    self._tokenizer = None

  @property
  def entropy_per_sentence(self):
    """The data's entropy in nats a sentence in use (None: unknown)."""
    return self._entropy_per_sentence

  @property
  def grammar_metrics(self):
    """Whether the decoder reports *_grammatical (resolved from 'auto')."""
    return self._grammar_metrics

  # --- forward -------------------------------------------------------------

  def _Embed(self, theta, ids, paddings):
    """ids [b, t] int, paddings [b, t] -> the stack's inputs [b, t, d] and
    paddings [b, t] in their dtype."""
    with cluster_lib.DeviceScope(self._first_device):
      x = self.children.emb.FProp(theta.emb, ids)             # [b, t, d]
      return x, tf.cast(paddings, x.dtype)

  def _Encode(self, theta, ids, paddings):
    """ids [b, t] int, paddings [b, t] -> final-norm outputs [b, t, d]."""
    return self.children.stack.FProp(theta.stack,
                                     *self._Embed(theta, ids, paddings))

  def ComputePredictions(self, theta, input_batch):
    """NestedMap(encoded=[b, t, d]) of a batch of ids and paddings."""
    return NestedMap(encoded=self._Encode(theta, input_batch.ids,
                                          input_batch.paddings))

  def _TokenNll(self, softmax_theta, encoded, labels, weights):
    """(the softmax's output NestedMap, nll [b, t]): the negative
    log-likelihood of each label (unsmoothed) given encoded [b, t, d]."""
    out = self.children.softmax.FProp(softmax_theta, encoded, labels, weights)
    if self.params.label_smoothing:
      return out, -tf.gather(out.log_probs, labels, batch_dims=2)
    return out, out.per_example_xent

  def _LossSums(self, softmax_theta, encoded, batch):
    """The sums behind the metrics, of a batch or a micro-batch.

    Args:
      softmax_theta: the softmax's theta.
      encoded: [b, t, d], the stack's outputs.
      batch: NestedMap with labels and weights [b, t] (and optionally
        sentence_weights [b, t]).

    Returns:
      NestedMap of scalars: loss (the summed training xent, label smoothing
      included), nll, tokens, sentence_nll, sentences; and [b] tensors xent
      and num_tokens (per example).
    """
    p = self.params
    labels = batch.labels
    out, nll = self._TokenNll(softmax_theta, encoded, labels,
                              batch.weights)                   # [b, t]
    weights = out.per_example_weight                           # [b, t]
    # Per sentence: only sentences whole in their row (see the docstring).
    sentence_weights = batch.get('sentence_weights')
    sentence_weights = weights if sentence_weights is None else tf.cast(
        sentence_weights, weights.dtype)
    return NestedMap(
        loss=out.total_xent, nll=tf.reduce_sum(nll * weights),
        tokens=out.total_weight,
        sentence_nll=tf.reduce_sum(nll * sentence_weights),
        sentences=tf.reduce_sum(sentence_weights * tf.cast(
            tf.equal(labels, p.eos_id), weights.dtype)),
        xent=tf.reduce_sum(nll * weights, axis=1),
        num_tokens=tf.reduce_sum(weights, axis=1))

  def _Metrics(self, sums):
    """(metrics, per_example) of the module docstring from `_LossSums`."""
    tokens, sentences = sums.tokens, sums.sentences
    nats_per_sentence = tf.math.divide_no_nan(sums.sentence_nll, sentences)
    metrics = NestedMap(
        loss=(tf.math.divide_no_nan(sums.loss, tokens), tokens),
        log_pplx=(tf.math.divide_no_nan(sums.nll, tokens), tokens),
        tokens_per_batch=(tokens, tf.constant(1.0, tokens.dtype)),
        nats_per_sentence=(nats_per_sentence, sentences))
    if self._entropy_per_sentence is not None and self.params.is_inference:
      metrics.excess_nats_per_sentence = (
          nats_per_sentence - self._entropy_per_sentence, sentences)
    return metrics, NestedMap(xent=sums.xent, num_tokens=sums.num_tokens)

  def FPropTower(self, theta, input_batch):
    """BaseTask's: the stack, then the softmax and cross-entropy; the stack
    runs them where its pipeline's schedule needs them (FPropLoss: per
    micro-batch inside the pipeline for 1F1B, after it for GPipe, once on
    the whole batch for an unpipelined stack), on the stack's last device;
    metrics summed over micro-batches are the same metrics and gradients."""
    x, paddings = self._Embed(theta, input_batch.ids, input_batch.paddings)
    side = NestedMap(labels=input_batch.labels, weights=input_batch.weights)
    if 'sentence_weights' in input_batch:
      side.sentence_weights = input_batch.sentence_weights
    loss = gpipe_transformer.gpipe.PipelineCell(
        fprop=self._LossSums, theta=theta.softmax, meta=None)
    sums = self.children.stack.FPropLoss(theta.stack, x, paddings, loss, side)
    with cluster_lib.DeviceScope(self._last_device):
      metrics, per_example = self._Metrics(sums)
    return base_model.CheckMetrics(metrics, validation.Owner(self)), \
        per_example

  # --- decoding --------------------------------------------------------------

  def _LastLogits(self, theta, ids, position):
    """Logits [b, V] of the token after `position` (a scalar) of ids [b, t]."""
    encoded = self._Encode(theta, ids, tf.zeros(tf.shape(ids), tf.float32))
    with cluster_lib.DeviceScope(self._last_device):
      return self.children.softmax.Logits(theta.softmax,
                                          encoded[:, position])

  def _VocabTables(self):
    """NestedMap(word_starts, in_tokenizer) of [vocab_size] bools.

    From the tokenizer of params.input: which ids begin a word, and which
    ids it has at all (a SentencePiece model may have fewer pieces than
    vocab_size; decoding never emits the others).
    """
    if self._vocab_tables is None:
      tok = self._Tokenizer()
      size = max(self.params.vocab_size, tok.vocab_size)
      tables = NestedMap(word_starts=np.zeros([size], bool),
                         in_tokenizer=np.arange(size) < tok.vocab_size)
      tables.word_starts[:tok.vocab_size] = tok.WordStartMask()
      self._vocab_tables = tables
    return self._vocab_tables

  def PromptLengths(self, ids, paddings):
    """[b] int32 tokens of each row's prompt: the BOS and prompt_words words.

    A token begins a word if the tokenizer's WordStartMask marks it or it
    follows a BOS; the prompt ends before the token that begins word
    prompt_words + 1 (or with the row).

    Args:
      ids: [b, t] int32, rows starting with a BOS.
      paddings: [b, t] float, 1.0 past each row's end.
    """
    word_starts = tf.constant(self._VocabTables().word_starts)
    real = paddings < 0.5                                     # [b, t]
    after_bos = tf.pad(tf.equal(ids[:, :-1], self._Tokenizer().bos_id),
                       [[0, 0], [1, 0]])
    starts = tf.logical_and(real, tf.logical_or(
        tf.gather(word_starts, ids), after_bos))
    words = tf.cumsum(tf.cast(starts, tf.int32), axis=1)     # [b, t]
    in_prompt = tf.logical_and(real, words <= self.params.decoder.prompt_words)
    return tf.maximum(tf.reduce_sum(tf.cast(in_prompt, tf.int32), 1), 1)

  def SampleSeed(self, seed):
    """The step seed, int64 [2], that sampling with `seed` (an int or a
    scalar integer tensor: decoder.seed, or a checkpoint's step) uses; the
    decoder job's for the same seed (eval_programs.DecodeProgram)."""
    return step_seed.MakeStepSeed(seed, self.params.random_seed or 0)

  def Sample(self, theta, prompt_ids, prompt_lengths, temperature, max_len):
    """Continues each prompt, greedily or by sampling, to EOS or max_len.

    The decoder's code (Decode) and the exported `sample`'s. One token per
    step for the whole batch: step s re-encodes the rows (no cache) and
    writes position s of each row whose prompt ended before s and that has
    not yet emitted EOS. Only ids the tokenizer has are emitted. Sampling
    is stateless: Gumbel noise on the [b, vocab] logits from
    `tf.random.stateless_uniform` seeded by (theta's step seed, this layer,
    s); the same weights, batch, temperatures and seed give the same ids,
    and a row's draws depend on its index in the batch, not on the other
    rows. Static shapes compile with XLA (jit_compile), whose stateless
    generator draws other numbers for the same seed (greedy rows agree).

    Args:
      theta: the task's theta with a step seed (`SampleSeed`).
      prompt_ids: [b, p] int32, p <= max_len: row i's prompt (BOS first) in
        its first prompt_lengths[i] places; the rest is ignored.
      prompt_lengths: [b] int32 in [1, max_len].
      temperature: [b] float32: 0 decodes the row greedily (argmax), > 0
        samples it at that temperature.
      max_len: int or scalar int32 tensor, the length of the output rows.

    Returns:
      NestedMap of
        ids [b, max_len] int32: prompt, continuation, EOS, then pads (0);
        lengths [b] int32: tokens up to and including the EOS, or max_len;
        finished [b] bool: whether the row emitted EOS.
    """
    p = self.params
    prompt_ids = tf.convert_to_tensor(prompt_ids)[:, :max_len]
    lens = tf.convert_to_tensor(prompt_lengths, tf.int32)
    b = tf.shape(prompt_ids)[0]
    pos = tf.range(max_len)[None, :]                          # [1, T]
    pad = tf.constant(tokenizers.PAD_ID, prompt_ids.dtype)
    buf = tf.pad(prompt_ids, [[0, 0], [0, max_len - tf.shape(prompt_ids)[1]]])
    buf = tf.where(pos < lens[:, None], buf, pad)             # [b, T]
    temperature = tf.convert_to_tensor(temperature, tf.float32)
    greedy = temperature <= 0                                 # [b]
    divisor = tf.where(greedy, 1.0, temperature)[:, None]     # [b, 1]
    in_tokenizer = tf.constant(
        self._VocabTables().in_tokenizer[:p.vocab_size])[None]  # [1, V]

    def _Cond(step, unused_buf, done, unused_ends):
      return tf.logical_and(step < max_len,
                            tf.logical_not(tf.reduce_all(done)))

    def _Body(step, buf, done, ends):
      logits = tf.cast(self._LastLogits(theta, buf, step - 1), tf.float32)
      logits = tf.where(in_tokenizer, logits, -1e9)
      best = tf.argmax(logits, -1, output_type=buf.dtype)
      # Gumbel-max: argmax(logits / T + Gumbel noise) is a draw of
      # softmax(logits / T); unlike stateless_categorical, it compiles
      # with XLA (a static export on an XLA server).
      u = tf.random.stateless_uniform(
          tf.shape(logits), seed=self.OpSeed(theta, step),
          minval=np.finfo(np.float32).tiny, maxval=1.0)
      drawn = tf.argmax(logits / divisor - tf.math.log(-tf.math.log(u)), -1,
                        output_type=buf.dtype)
      new = tf.where(greedy, best, drawn)                     # [b]
      write = tf.logical_and(step >= lens, tf.logical_not(done))
      at_step = tf.logical_and(tf.equal(pos, step), write[:, None])
      buf = tf.where(at_step, new[:, None], buf)
      eos = tf.logical_and(write, tf.equal(new, p.eos_id))
      return step + 1, buf, tf.logical_or(done, eos), tf.where(
          eos, step + 1, ends)

    _, buf, done, ends = tf.while_loop(
        _Cond, _Body, (tf.reduce_min(lens), buf, tf.zeros([b], tf.bool),
                       tf.fill([b], tf.convert_to_tensor(max_len, tf.int32))))
    return NestedMap(ids=buf, lengths=ends, finished=done)

  def Decode(self, theta, input_batch):
    """Greedy and sampled continuations of each row's prompt.

    Rows [0, b) of one `Sample` batch decode greedily, rows [b, 2b) sample
    at decoder.temperature, seeded by `SampleSeed(decoder.seed)`, or by
    theta's step seed (the checkpoint's step) when decoder.seed is None.

    Args:
      theta: the task's theta with a step seed.
      input_batch: NestedMap with ids, labels, paddings, weights [b, t].

    Returns:
      NestedMap of
        prompt_lengths [b] int32: prompt tokens of each row (BOS included,
          ending on a word boundary);
        greedy_ids [b, t] int32: prompt, greedy continuation, EOS, pads
          (only ids the tokenizer has are emitted);
        sampled_ids [b, t] int32: the same with temperature sampling;
        reference_ids [b, t] int32: the row's true labels (pads elsewhere).
    """
    d = self.params.decoder
    ids = tf.convert_to_tensor(input_batch.ids)
    b, t = tf.shape(ids)[0], tf.shape(ids)[1]
    prompt_len = self.PromptLengths(ids, input_batch.paddings)  # [b]
    if d.seed is not None:
      theta = base_layer.WithStepSeed(theta,
                                                 self.SampleSeed(d.seed))
    temperature = tf.concat([tf.zeros([b]), tf.fill([b], float(
        d.temperature))], 0)
    out = self.Sample(theta, tf.concat([ids, ids], 0),
                      tf.concat([prompt_len, prompt_len], 0), temperature, t)
    pad = tf.constant(tokenizers.PAD_ID, ids.dtype)
    reference = tf.where(input_batch.weights > 0,
                         tf.convert_to_tensor(input_batch.labels), pad)
    return NestedMap(prompt_lengths=prompt_len, greedy_ids=out.ids[:b],
                     sampled_ids=out.ids[b:], reference_ids=reference)

  # --- serving ---------------------------------------------------------------

  def Score(self, theta, ids, paddings):
    """Log-probabilities of each row's tokens given the tokens before them.

    Args:
      theta: the task's theta.
      ids: [b, t] int32: BOS, the sentence's tokens, EOS, then pads. (An
        input batch row is ids[:, :-1], its labels ids[:, 1:].)
      paddings: [b, t] float32, 1.0 past the row's end.

    Returns:
      NestedMap of
        log_probs [b, t] float32: log p(ids[:, i] | ids[:, :i]) for i >= 1;
          0 at i = 0 (the BOS is given) and on padding;
        sentence_log_prob [b] float32: their sum, the row's log-likelihood
          (the negative of the evaler's per-row xent);
        num_tokens [b] float32: tokens scored (the EOS included).
    """
    ids = tf.convert_to_tensor(ids)
    paddings = tf.convert_to_tensor(paddings, tf.float32)
    encoded = self._Encode(theta, ids[:, :-1], paddings[:, :-1])
    weights = 1.0 - paddings[:, 1:]
    with cluster_lib.DeviceScope(self._last_device):
      _, nll = self._TokenNll(theta.softmax, encoded, ids[:, 1:], weights)
      log_probs = -tf.cast(nll, tf.float32) * weights          # [b, t - 1]
      log_probs = tf.pad(log_probs, [[0, 0], [1, 0]])
      return NestedMap(log_probs=log_probs,
                       sentence_log_prob=tf.reduce_sum(log_probs, 1),
                       num_tokens=tf.reduce_sum(weights, 1))

  def Inference(self, batch_size=None, max_len=None):
    """`score` and `sample` for serving; see BaseTask.Inference.

    Token ids in and out. Text cannot go in or out of the graph on plain
    TensorFlow: SentencePiece's ops are TF Text's (tensorflow-text), which
    is not a dependency of Cadence and which every process that loads the
    SavedModel would have to import (TF Serving needs a custom build). So
    the SavedModel carries the tokenizer's model file as the asset
    `tokenizer_model` (SentencePiece input only) and the caller tokenises
    with the `sentencepiece` package, which needs no TensorFlow (README:
    "Export for serving"). Special ids: pad 0, BOS 1, EOS 2, unk 3.

    A pipelined stack exports its inference computation: the task is built
    with is_inference on one device (framework/jobs/export.py), where a
    PipeliningLayer runs its cells one after the other on the whole batch;
    the weights are the same (their paths do not depend on the partition).

    Args:
      batch_size: None (dynamic) or the static batch of both signatures.
      max_len: the static row length of both signatures (BOS and EOS
        included): score's ids and sample's prompts and outputs; None:
        score's length is dynamic and sample's rows are params.input's
        max_seq_len long (the decoder's).

    Returns:
      An inference.InferenceGraph.
    """
    owner = f'{validation.Owner(self)} Inference'
    inference.CheckDims(owner, batch_size, max_len)
    sample_len = max_len
    if sample_len is None:
      sample_len = (self.params.input.Get('max_seq_len') if
                    'max_seq_len' in (self.params.input or {}) else None)
      if sample_len is None:
        raise validation.Error(owner, 'max_len', None, "needs a value: "
                               "params.input has no max_seq_len (sample's "
                               'rows are that long by default).')
    b, t = batch_size, max_len

    def _Score(theta, ids, paddings):
      return dict(self.Score(theta, ids, paddings))

    def _Sample(theta, prompt_ids, prompt_lengths, temperature, seed):
      theta = base_layer.WithStepSeed(theta,
                                                 self.SampleSeed(seed))
      return dict(self.Sample(theta, prompt_ids, prompt_lengths, temperature,
                              sample_len))

    int_ids = lambda shape: tf.TensorSpec(shape, tf.int32)
    graph = inference.InferenceGraph(signatures=dict(
        score=inference.Signature(_Score, dict(
            ids=int_ids([b, t]), paddings=tf.TensorSpec([b, t], tf.float32)),
            _SCORE_DOC),
        sample=inference.Signature(_Sample, dict(
            prompt_ids=int_ids([b, t]), prompt_lengths=int_ids([b]),
            temperature=tf.TensorSpec([b], tf.float32),
            seed=tf.TensorSpec([], tf.int64)),
            _SAMPLE_DOC.format(max_len=sample_len))))
    tok = self._Tokenizer()
    if isinstance(tok, tokenizers.SentencePieceTokenizer):
      graph.assets['tokenizer_model'] = tok.model_file
      how = ('SentencePiece: the asset tokenizer_model (tokenise with the '
             'sentencepiece package; README "Export for serving")')
    else:
      how = (f'{type(tok).__name__}: UTF-8 byte b is id b + '
             f'{tokenizers.NUM_RESERVED_IDS}')
    graph.doc = (f'{type(self).__name__} {self.path!r}: vocabulary '
                 f'{self.params.vocab_size} ids; special ids pad '
                 f'{tokenizers.PAD_ID}, BOS {tokenizers.BOS_ID}, EOS '
                 f'{self.params.eos_id}, unk {tokenizers.UNK_ID}; tokenizer '
                 f'{how}.')
    return graph

  def _Tokenizer(self):
    if self._tokenizer is None:
      if self.params.input is None:
        raise ValueError(f"{type(self).__name__} '{self.path}': decoding "
                         'needs params.input (its tokenizer says where words '
                         'start and turns ids into text).')
      input_p = self.params.input
      # An input class that derives its files (and so the tokenizer's
      # training text) from other params exposes ResolveParams.
      resolve = getattr(input_p.cls, 'ResolveParams', None)
      if resolve is not None:
        input_p = resolve(input_p)
      self._tokenizer = input_p.tokenizer.Instantiate()
    return self._tokenizer

  def CreateDecoderMetrics(self):
    metrics = {'greedy_finished': base_model.AverageMetric(),
               'sampled_finished': base_model.AverageMetric(),
               'sampled_tokens': base_model.AverageMetric()}
    if self._grammar_metrics:
      metrics['greedy_grammatical'] = base_model.AverageMetric()
      metrics['sampled_grammatical'] = base_model.AverageMetric()
    return metrics

  def _Continuation(self, ids, prompt_len):
    """(continuation ids up to EOS, whether EOS was produced) of one row."""
    cont = np.asarray(ids[prompt_len:])
    eos = np.flatnonzero(cont == self.params.eos_id)
    if eos.size:
      return cont[:eos[0]], True
    return cont[cont != tokenizers.PAD_ID], False

  def PostProcessDecodeOut(self, decode_out, decoder_metrics):
    """One text line per row; updates finished/grammatical shares.

    All-padding rows (filling the last batch of a pass) are skipped.
    """
    tok = self._Tokenizer()
    temperature = self.params.decoder.temperature
    grammar = self._grammar_metrics
    lines = []
    for i, n in enumerate(np.asarray(decode_out.prompt_lengths)):
      if not np.any(decode_out.reference_ids[i] != tokenizers.PAD_ID):
        continue
      prompt = tok.Decode(decode_out.greedy_ids[i][:n])
      texts = {}
      for kind in ('greedy', 'sampled'):
        row = decode_out[f'{kind}_ids'][i]
        cont, finished = self._Continuation(row, n)
        texts[kind] = tok.Decode(cont)
        decoder_metrics[f'{kind}_finished'].Update(float(finished))
        if kind == 'sampled':
          decoder_metrics['sampled_tokens'].Update(cont.size)
        if grammar:  # The whole sentence: a piece may continue a word.
          sentence = tok.Decode(row[:n + cont.size])
          decoder_metrics[f'{kind}_grammatical'].Update(
              float(finished and _InGrammar(sentence)))
      reference = tok.Decode(decode_out.reference_ids[i])
      lines.append(f'prompt: {prompt!r}  greedy: {texts["greedy"]!r}  '
                   f'sampled(T={temperature:g}): {texts["sampled"]!r}  '
                   f'reference: {reference!r}')
    for line in lines[:self.params.decoder.log_samples]:
      logging.info('%s', line)
    return lines

  # --- cost -------------------------------------------------------------------

  @classmethod
  def FPropMeta(cls, params, input_shapes):
    """The cost of FPropTower on a batch of `input_shapes.ids` [b, t].

    Returns:
      A cost.Cost: flops, out_shapes=(), breakdown=[(part, flops)] and the
      `plan` (framework/pipeline/plan.py): the stack's units (its layers),
      cut and scheduled as its pipeline runs them (one stage on the whole
      batch for an unpipelined stack), the embedding before it and the
      softmax and cross-entropy as the per-micro-batch loss; None if the
      batch is unknown. Built from params alone.
    """
    p = params
    cls.CheckParams(p, validation.Owner(p))
    ids = shapes.AsShape(input_shapes.ids)
    if ids.rank != 2:
      raise ValueError(f"{cls.__name__} '{p.name}': ids shape {list(ids)} "
                       'must be [batch, time].')
    c = cls._SubParams(p)
    for name in c:
      c[name] = base_layer.InheritParams(p, c[name])
    b, t = ids
    x = ids + (p.model_dim,)
    # The lookup, and the positions' signal and its add.
    emb = base_layer.FPropCost(c.emb.Copy().Set(position_tpl=None),
                               ids).flops
    pos = shapes.Add(base_layer.FPropCost(c.emb, ids).flops,
                     shapes.Mul(-1, emb) if emb is not None else None)
    stack = c.stack.cls.FPropMeta(c.stack, x, shapes.Shape([b, t])).flops
    sm = c.softmax.cls.FPropMeta(c.softmax, x).flops
    breakdown = [('emb', emb), ('pos_emb', pos),
                 (f'stack ({c.stack.num_layers} layers)', stack),
                 ('softmax', sm)]
    total = 0
    for _, f in breakdown:
      total = shapes.Add(total, f)
    plan = gpipe_units.Plan(gpipe_transformer.GPipeTransformerStack, c.stack,
                            x, shapes.Shape([b, t]), ends=cls._Ends(c, t))
    return cost.Cost(flops=total, out_shapes=(), breakdown=breakdown,
                     plan=plan)

  @classmethod
  def _Ends(cls, c, t):
    """What runs before the stack (the embedding, on ids) and after it (the
    softmax and cross-entropy, on each micro-batch's labels), as layers
    (children params `c`, inherited; rows of `t` tokens)."""
    ids = lambda rows: [(tf.TensorSpec([rows, t], tf.int32),
                         c.emb.vocab_size)]
    return gpipe_units.Ends(
        before=[gpipe_units.Layer('emb', c.emb)], before_inputs=ids,
        loss=gpipe_units.Layer('softmax', c.softmax), loss_inputs=ids,
        loss_key='total_xent')


_SCORE_DOC = """score(ids, paddings) -> log_probs, sentence_log_prob, num_tokens
  ids [batch, time] int32: BOS, a sentence's tokens, EOS, then pad ids.
  paddings [batch, time] float32: 1.0 past each row's end, else 0.
  log_probs [batch, time] float32: log p(ids[:, i] | ids[:, :i]) in nats;
    0 at i = 0 (the BOS) and on padding.
  sentence_log_prob [batch] float32: the sum of a row's log_probs.
  num_tokens [batch] float32: tokens scored per row (EOS included)."""

_SAMPLE_DOC = """sample(prompt_ids, prompt_lengths, temperature, seed) -> ids,
    lengths, finished
  prompt_ids [batch, p] int32 (p <= {max_len}): a row's prompt (BOS first)
    in its first prompt_lengths places; the rest is ignored.
  prompt_lengths [batch] int32 in [1, {max_len}].
  temperature [batch] float32: 0 continues the row greedily, > 0 samples at
    that temperature.
  seed [] int64: the sampling seed. Stateless: the same batch, temperatures
    and seed give the same ids; the draws of a row depend on its index in
    the batch (not on the other rows); compiled with XLA the draws are
    other ones (XLA's generator). The decoder job with decoder.seed=s
    (or, with decoder.seed None, at checkpoint step s) decodes a batch of b
    prompts as one batch of 2b rows: the prompts twice, temperatures b x 0
    then b x decoder.temperature; this signature given that batch and seed s
    returns its greedy_ids (rows :b) and sampled_ids (rows b:).
  ids [batch, {max_len}] int32: prompt, continuation, EOS, then pad ids.
  lengths [batch] int32: tokens up to and including the EOS (or {max_len}).
  finished [batch] bool: whether the row emitted EOS."""


def _InGrammar(sentence):
  """Whether the embedded grammar can produce `sentence` (a str)."""
  try:
    synthetic_corpus.SentenceLogProb(sentence)
  except ValueError:
    return False
  return True
