"""GPipe Transformer language models on one-billion-words-style data.

The main job (2 pipeline stages on 2 logical CPUs, 4 micro-batches; the
experiment declares its devices, WORKER_SPLIT_SIZE = 2, so no device flag
is needed):

  python trainer.py --model=lm.one_billion_wds.OneBWdsGPipeTransformerTiny \
      --logdir=/tmp/cadence_lm

What to expect (the README gives the time measured on a 2-core machine):
the embedded corpus (sentences of a stochastic grammar,
tasks/lm/synthetic_corpus.py) is written to DATA_DIR and a 512-piece
SentencePiece model is trained on it (once, cached in
$XDG_CACHE_HOME/cadence/spm, default ~/.cache/cadence/spm).
A progress line every 50 steps (and at least every 30 s): the loss (nats
per token) falls from 6.5 (about uniform over 512 pieces) to ~2.9 by step
500. A checkpoint every 100 steps is followed by an eval on the whole Dev
set (2000 sentences): log_pplx per token, nats_per_sentence, and
excess_nats_per_sentence, its distance to the grammar's exact entropy (31.6
nats a sentence; 0 is the best possible model in expectation; this Dev
set's own mean -log p is 31.9, so about 0.3 of the excess is its sampling
error). The training lines' nats_per_sentence counts only the sentences
whole in their 64-token windows, weighted for their length (see
tasks/lm/input_generator.py), so it estimates the same quantity as Dev's,
from ~8,000 sentences a 50-step window: about +-0.34 nats of noise even for
the exact model (bench/lm_train_metric_noise.py), which is why the gap to
the entropy is reported for Dev only. tokens_per_batch is the mean number
of label tokens in a batch. The run ends by decoding Dev with the final
weights (the default job, trainer_and_evaler): greedy and sampled
continuations of Dev prompts (the first 2 words of a sentence), logged and
written to /tmp/cadence_lm/decoder_dev/decoder_out-<step>.txt, with the
share of sampled sentences the grammar can produce (~0.9 at step 500).
`--job=decoder_dev` runs the same decode on its own, for every checkpoint
of a logdir. TensorBoard: `tensorboard --logdir=/tmp/cadence_lm`.

`OneBWdsGPipeTransformer` is the published-scale configuration (d 2048, 32
layers, 16 heads, feed-forward 8192, 32k SentencePiece vocabulary, sequences
of 1024, batch 32, 4 pipeline stages x 32 micro-batches) on the real corpus;
it does not fit this machine, but its params and FLOPs can be inspected:

  python trainer.py --model=lm.one_billion_wds.OneBWdsGPipeTransformer \
      --mode=inspect_params

Real one-billion-words files: unpack
1-billion-word-language-modeling-benchmark-r13output.tar.gz and point the
input at it (any experiment here; Train, Dev and Test follow, and the
SentencePiece model is trained on the training shards at first use and
cached in $XDG_CACHE_HOME/cadence/spm (default ~/.cache/cadence/spm), so
the data directory may be read-only; set input.tokenizer.cache_dir to put it
elsewhere):

  --model_params_override="input.corpus=one_billion_words;\
input.data_dir=/data/1-billion-word-language-modeling-benchmark-r13output"

The grammar-only metrics follow the input: on real text there is no
excess_nats_per_sentence (the entropy is unknown) and no *_grammatical
decoder metric.

Other one-sentence-per-line text: subclass an experiment and return
`LmCorpusInput` params with corpus='' and your own `file_pattern` per
dataset (and the SentencePiece `train_file_pattern` of the training files).
"""
from cadence.framework import base_model_params
from cadence.framework import lr_schedule
from cadence.framework import model_registry
from cadence.framework import optimizer
from cadence.framework.pipeline import schedules
from cadence.layers import gpipe_transformer
from cadence.tasks.lm import cache_files
from cadence.tasks.lm import corpus_input
from cadence.tasks.lm import model
from cadence.tasks.lm import tokenizers


@model_registry.RegisterSingleTaskModel
class OneBWdsGPipeTransformer(base_model_params.SingleTaskModelParams):
  """A 32-layer GPipe Transformer LM at the published scale (~1.7B params)."""

  CORPUS = 'one_billion_words'
  DATA_DIR = '/data/1-billion-word-language-modeling-benchmark-r13output'
  VOCAB_SIZE = 32000
  MAX_SEQ_LEN = 1024
  DEV_MAX_SEQ_LEN = 128       # Dev/Test: one sentence a row, padded.
  BATCH_SIZE = 32
  MODEL_DIM = 2048
  NUM_LAYERS = 32
  NUM_HEADS = 16
  HIDDEN_DIM = 8192
  DROPOUT_PROB = 0.1
  SPLITS = 4
  WORKER_SPLIT_SIZE = SPLITS   # One device per pipeline stage.
  NUM_MICRO_BATCHES = 32
  # A registered pipeline schedule (framework/pipeline/schedules.py): GPipe
  # by default; 1f1b holds the activations of S micro-batches, not M.
  SCHEDULE = schedules.DEFAULT
  REMAT = 'except_last'       # 'never' with '1f1b': no re-run forwards.
  SOFTMAX_MAX_ALLOC = 128 * 1024 * 1024   # logits computed at once
  LEARNING_RATE = 1.0                     # x the rsqrt schedule
  WARMUP_STEPS = 4000
  CLIP_GRADIENT_NORM = 1.0
  MAX_STEPS = 500000
  SAVE_INTERVAL_STEPS = 2000
  LOG_INTERVAL_STEPS = 100
  EVAL_SAMPLES = 4096         # Dev sentences per eval (0: all)
  DECODER_SAMPLES = 32
  # 'auto': the embedded grammar's exact entropy when the input reads its
  # corpus, else None (no excess_nats_per_sentence).
  ENTROPY_PER_SENTENCE = 'auto'

  def _Input(self, split):
    packed = split == 'train'
    return corpus_input.LmCorpusInput.Params().Set(
        name=f'lm_{split}', corpus=self.CORPUS,
        data_dir=self.DATA_DIR or cache_files.CacheDir('synthetic_lm'),
        split=split, batch_size=self.BATCH_SIZE, packed=packed,
        max_seq_len=self.MAX_SEQ_LEN if packed else self.DEV_MAX_SEQ_LEN,
        fixed_input_shape=True, repeat=packed, shuffle=packed,
        tokenizer=tokenizers.SentencePieceTokenizer.Params().Set(
            vocab_size=self.VOCAB_SIZE))

  def Train(self):
    return self._Input('train')

  def Dev(self):
    return self._Input('dev')

  def Test(self):
    return self._Input('test')

  def Task(self):
    p = model.LanguageModel.Params().Set(
        name='lm', vocab_size=self.VOCAB_SIZE, model_dim=self.MODEL_DIM,
        softmax_max_alloc=self.SOFTMAX_MAX_ALLOC,
        entropy_per_sentence=self.ENTROPY_PER_SENTENCE, random_seed=1)
    p.stack_tpl = gpipe_transformer.GPipeTransformerStack.Params().Set(
        num_layers=self.NUM_LAYERS, splits=self.SPLITS)
    p.stack_tpl.pipeline_tpl.Set(num_micro_batches=self.NUM_MICRO_BATCHES,
                                 schedule=self.SCHEDULE, remat=self.REMAT)
    p.stack_tpl.transformer_tpl.Set(
        num_heads=self.NUM_HEADS, hidden_dim=self.HIDDEN_DIM,
        atten_dropout_prob=self.DROPOUT_PROB,
        residual_dropout_prob=self.DROPOUT_PROB,
        relu_dropout_prob=self.DROPOUT_PROB)
    p.train.learner.Set(
        optimizer=optimizer.Adam.Params().Set(beta2=0.98, epsilon=1e-9),
        learning_rate=self.LEARNING_RATE,
        lr_schedule=lr_schedule.TransformerSchedule.Params().Set(
            model_dim=self.MODEL_DIM, warmup_steps=self.WARMUP_STEPS),
        clip_gradient_norm_to_value=self.CLIP_GRADIENT_NORM)
    p.train.Set(max_steps=self.MAX_STEPS,
                save_interval_steps=self.SAVE_INTERVAL_STEPS,
                summary_interval_steps=self.LOG_INTERVAL_STEPS,
                log_interval_steps=self.LOG_INTERVAL_STEPS)
    p.eval.Set(samples_per_summary=self.EVAL_SAMPLES,
               decoder_samples=self.DECODER_SAMPLES)
    return p


@model_registry.RegisterSingleTaskModel
class OneBWdsGPipeTransformerTiny(OneBWdsGPipeTransformer):
  """The same structure shrunk to train in minutes on 2 CPU cores.

  2 pipeline stages x 4 micro-batches, 4 layers of d 128 on the embedded
  grammar corpus; see the module docstring for the command.
  """

  CORPUS = 'synthetic'
  # None: $XDG_CACHE_HOME/cadence/synthetic_lm (default ~/.cache/cadence/
  # synthetic_lm), read when the params are made (tasks/lm/cache_files.py).
  DATA_DIR = None
  VOCAB_SIZE = 512
  MAX_SEQ_LEN = 64
  DEV_MAX_SEQ_LEN = 64        # Holds every Dev sentence (the longest: 55).
  BATCH_SIZE = 32
  MODEL_DIM = 128
  NUM_LAYERS = 4
  NUM_HEADS = 4
  HIDDEN_DIM = 512
  DROPOUT_PROB = 0.0          # The corpus is effectively unlimited.
  SPLITS = 2
  WORKER_SPLIT_SIZE = SPLITS
  NUM_MICRO_BATCHES = 4
  SOFTMAX_MAX_ALLOC = 0
  LEARNING_RATE = 0.4
  WARMUP_STEPS = 100
  CLIP_GRADIENT_NORM = 1.0
  MAX_STEPS = 500
  SAVE_INTERVAL_STEPS = 100
  LOG_INTERVAL_STEPS = 50
  EVAL_SAMPLES = 0            # The whole Dev set: 2000 sentences, ~2.5 s.
  DECODER_SAMPLES = 16
