"""LmInput over a named corpus layout: the embedded grammar or real 1BW files.

`LmCorpusInput` is an `input_generator.LmInput` that finds its files from
(`corpus`, `data_dir`, `split`) instead of an explicit `file_pattern`:

  corpus='synthetic'          the embedded default (tasks/lm/synthetic_corpus):
                              generated into `data_dir` at first use by
                              `synthetic_corpus.WriteShards` (idempotent;
                              a few seconds), then read like any other files.
  corpus='one_billion_words'  the unpacked one-billion-words benchmark
                              (`1-billion-word-language-modeling-benchmark-
                              r13output`) in `data_dir`: train = the 100
                              training shards, dev = held-out shard 0,
                              test = held-out shard 1.
  corpus=''                   `file_pattern` as given (any one-sentence-per-
                              line files).

An explicit `file_pattern` always wins. A SentencePiece tokenizer left
without `model_file` and `train_file_pattern` is trained on the corpus's
training split (and cached under $XDG_CACHE_HOME/cadence/spm, default
~/.cache/cadence/spm, keyed by the files; nothing is written into a real
corpus's directory), so the Train, Dev and Test generators of one experiment share one vocabulary. Switching an
experiment to the real corpus is a command-line override:

  --model_params_override="input.corpus=one_billion_words;\
input.data_dir=/data/1-billion-word-language-modeling-benchmark-r13output"

`ReadsTheGrammar(input_params)` tells a task whether its data are the
embedded grammar's sentences (whose exact entropy is known and whose
sentences can be checked), which the LM task uses to decide its
grammar-only metrics from the input actually used.

Example:
  p = LmCorpusInput.Params().Set(corpus='synthetic', data_dir='/tmp/lm_data',
                                 split='train', batch_size=16, max_seq_len=32)
  p.tokenizer = tokenizers.SentencePieceTokenizer.Params().Set(vocab_size=512)
  gen = p.Instantiate()           # writes /tmp/lm_data/train-*-of-00010 ...
  batch = gen.InputBatchAt(0)     # ids [16, 32], labels, paddings, weights
"""
import os

from cadence.framework import base_input_generator
from cadence.framework import hyperparams
from cadence.framework import validation
from cadence.framework.nested_map import NestedMap
from cadence.tasks.lm import input_generator
from cadence.tasks.lm import synthetic_corpus
from cadence.tasks.lm import tokenizers

CORPORA = ('', 'synthetic', 'one_billion_words')
SPLITS = ('train', 'dev', 'test')

_ONE_BW_TRAIN = ('training-monolingual.tokenized.shuffled/'
                 'news.en-*-of-00100')
_ONE_BW_HELDOUT = ('heldout-monolingual.tokenized.shuffled/'
                   'news.en.heldout-{:05d}-of-00050')


def _SyntheticParams():
  p = hyperparams.Params()
  p.Define('num_train_shards', 10, 'Training files, an int >= 1.')
  p.Define('sentences_per_shard', 10000, 'Sentences per training file.')
  p.Define('num_heldout_sentences', 2000, 'Sentences in each of the Dev and '
           'Test files.')
  p.Define('seed', 0, 'Seed of the grammar samples (an int).')
  return p


def CorpusPatterns(corpus, data_dir, synthetic=None):
  """File patterns of a corpus's splits: NestedMap(train=, dev=, test=).

  Writes the synthetic corpus when it is missing or stale (see
  `synthetic_corpus.WriteShards`); nothing is written for real corpora.

  Args:
    corpus: 'synthetic' or 'one_billion_words'.
    data_dir: the corpus directory.
    synthetic: `LmCorpusInput.Params().synthetic` (sizes and seed); None:
      the defaults.
  """
  if corpus == 'synthetic':
    s = synthetic or _SyntheticParams()
    return synthetic_corpus.WriteShards(
        data_dir, num_train_shards=s.num_train_shards,
        sentences_per_shard=s.sentences_per_shard, seed=s.seed,
        num_heldout_sentences=s.num_heldout_sentences)
  if corpus == 'one_billion_words':
    return NestedMap(
        train=os.path.join(data_dir, _ONE_BW_TRAIN),
        dev=os.path.join(data_dir, _ONE_BW_HELDOUT.format(0)),
        test=os.path.join(data_dir, _ONE_BW_HELDOUT.format(1)))
  raise ValueError(f'CorpusPatterns: corpus={corpus!r} must be one of '
                   f'{[c for c in CORPORA if c]}')


def ReadsTheGrammar(input_params):
  """Whether `input_params` read the embedded grammar corpus's sentences.

  True for LmCorpusInput params with corpus='synthetic' and no explicit
  file_pattern (which would win over the corpus); False for anything else,
  None included.
  """
  return (input_params is not None and
          issubclass(input_params.cls, LmCorpusInput) and
          input_params.corpus == 'synthetic' and not input_params.file_pattern)


class LmCorpusInput(input_generator.LmInput):
  """LmInput whose files come from a corpus name; see the module docstring.

  Example:
    p = LmCorpusInput.Params().Set(corpus='synthetic', data_dir='/tmp/d',
                                   split='dev', packed=False)
    gen = p.Instantiate()
    gen.params.file_pattern       # '/tmp/d/dev-00000-of-00001'
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('corpus', '', "Where the files come from: 'synthetic' (the "
             "embedded grammar, written to data_dir at first use), "
             "'one_billion_words' (the unpacked benchmark in data_dir) or '' "
             '(file_pattern as given).')
    p.Define('data_dir', '', 'Directory of the corpus (created for '
             "'synthetic').")
    p.Define('split', 'train', "Which split to read: 'train', 'dev' or "
             "'test'.")
    p.Define('synthetic', _SyntheticParams(), "Size and seed of the "
             "'synthetic' corpus.")
    return p

  def __init__(self, params):
    super().__init__(self.ResolveParams(params))

  @classmethod
  def _Fail(cls, params, field, value, rule):
    return validation.Error(validation.Owner(params), field, value, rule,
                            base_input_generator.InputError)

  @classmethod
  def _CheckParams(cls, p, owner):
    super()._CheckParams(p, owner)
    validation.CheckOneOf(owner, 'corpus', p.corpus, CORPORA)
    validation.CheckOneOf(owner, 'split', p.split, SPLITS)
    s = p.synthetic
    for field in ('num_train_shards', 'sentences_per_shard',
                  'num_heldout_sentences'):
      validation.CheckInt(owner, f'synthetic.{field}', s.Get(field))
    validation.CheckInt(owner, 'synthetic.seed', s.seed, 0)

  @classmethod
  def ResolveParams(cls, params):
    """A copy of `params` with file_pattern and the tokenizer's filled.

    Writes the synthetic corpus if needed. A task that needs the tokenizer
    without building the generator (to turn decoded ids into text) calls
    this, then `Instantiate()`s the returned `tokenizer` params.
    """
    cls.CheckParams(params)
    p = params.Copy()
    if not p.corpus:
      return p
    if not p.data_dir:
      raise cls._Fail(p, 'data_dir', p.data_dir, f'must be set for corpus='
                      f'{p.corpus!r}.')
    if p.corpus == 'one_billion_words' and not os.path.isdir(p.data_dir):
      raise cls._Fail(p, 'data_dir', p.data_dir, 'is not a directory; unpack '
                      '1-billion-word-language-modeling-benchmark-r13output'
                      '.tar.gz and point data_dir at it.')
    patterns = CorpusPatterns(p.corpus, p.data_dir, p.synthetic)
    if not p.file_pattern:
      p.file_pattern = patterns[p.split]
    tok = p.tokenizer
    if (issubclass(tok.cls, tokenizers.SentencePieceTokenizer) and
        tok.model_file is None and tok.train_file_pattern is None):
      tok.train_file_pattern = patterns.train
    return p
