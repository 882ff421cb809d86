"""The embedded default LM corpus: sentences from a stochastic grammar.

Nothing is downloaded. Sentences are sampled from an absorbing Markov chain
over grammatical roles (subject determiner, adjective, noun, verb, object,
prepositional phrase, adverb, conjunction, ...). Each role emits one word
from its category's Zipf distribution; the chain ends a sentence by moving to
the absorbing END state. The vocabulary has 248 English words in 9 disjoint
categories, sentences have about 5-20 words, e.g.

  the quiet farmer sees a cat near the bridge and alice gladly reads
  she often finds emma

Because the chain is deterministic in its words (from any state, the
successor states emit disjoint word sets), a sentence determines its state
path, and the entropy of a sentence is exactly the entropy of the chain's
path and emissions. `EntropyPerSentence()` computes it analytically, in nats
and including the end of the sentence, from the expected number of visits to
each state, a linear solve `(I - Q)^T v = e_start` over the transient part
`Q` of the chain. A language model's mean log-loss per sentence (summed over
all tokens of a sentence and its end-of-sentence token) can never be lower
than this number, whatever its tokeniser, as long as the tokeniser is
deterministic and invertible; the gap says how close training came to the
best possible model.

Files are written in the one-billion-words layout by `WriteShards`:

  <data_dir>/train-00000-of-00010 ... train-00009-of-00010
  <data_dir>/dev-00000-of-00001
  <data_dir>/test-00000-of-00001

one sentence per line, words separated by single spaces.

Using the real one-billion-words benchmark instead: download and unpack
`1-billion-word-language-modeling-benchmark-r13output.tar.gz` and point the
input generator's `file_pattern` at the training shards and the Dev/Test
generators at held-out shards, e.g.

  root = '/data/1-billion-word-language-modeling-benchmark-r13output'
  train_dir = root + '/training-monolingual.tokenized.shuffled'
  held_dir = root + '/heldout-monolingual.tokenized.shuffled'
  train.file_pattern = train_dir + '/news.en-*-of-00100'
  dev.file_pattern = held_dir + '/news.en.heldout-00000-of-00050'
  test.file_pattern = held_dir + '/news.en.heldout-00001-of-00050'

and set the SentencePiece tokenizer's `train_file_pattern` to the training
pattern with `vocab_size=32000`; the model is trained at first use and cached
under $XDG_CACHE_HOME/cadence/spm (default ~/.cache/cadence/spm; see
tokenizers.SentencePieceTokenizer). The
analytic entropy has no counterpart there.

Example:
  patterns = WriteShards('/tmp/lm_data', num_train_shards=10,
                         sentences_per_shard=10000, seed=0)
  patterns.train                  # '/tmp/lm_data/train-*-of-00010'
  EntropyPerSentence()            # nats per sentence, end included
  GenerateSentences(3, seed=1)    # three str sentences, same for seed 1
"""
import functools
import glob
import json
import os

from absl import logging
import numpy as np

from cadence.framework import atomic_file
from cadence.framework import nested_map
from cadence.tasks.lm import cache_files

# Bump when the grammar, the sampler or the file layout changes: data written
# by another version is regenerated.
_VERSION = 1
_MANIFEST = 'synthetic_corpus.json'
# The SHA-256 of each file, beside the manifest (which stays as versions
# without digests wrote it, so they and this one share a cache).
_DIGESTS = 'synthetic_corpus.sha256.json'

_WORDS = {
    'det': 'the a every this that some one no',
    'adj': ('big small old young red green blue quiet loud happy sad bright '
            'dark tall short warm cold quick slow clever gentle brave tired '
            'hungry strange famous little heavy soft rich poor busy lazy '
            'proud wild calm kind angry empty golden'),
    'noun': ('cat dog house river tree city child teacher bird garden window '
             'road mountain friend book table horse king queen farmer ship '
             'village forest door letter song stone market doctor student '
             'painter baker soldier sailor island bridge lamp field cloud '
             'storm apple clock mirror wall boat train flower castle tower '
             'lake valley wolf fox owl bear rabbit mouse tiger whale pencil '
             'ocean kitchen school church station bottle basket candle '
             'hammer ladder blanket pocket ribbon shadow engine wagon pillow '
             'meadow harbor cottage'),
    'verb': ('sees finds likes follows watches helps visits paints builds '
             'carries remembers loves hates calls meets brings opens closes '
             'pushes pulls chases feeds leaves holds reads writes sells buys '
             'hears knows catches draws fixes guards hides washes teaches '
             'counts greets answers admires forgets protects trusts misses '
             'wakes ignores praises thanks warns'),
    'adv': ('slowly quickly quietly often never always sometimes today again '
            'soon early late gladly rarely happily badly well loudly gently '
            'twice'),
    'prep': ('near under behind with beside above inside across beyond '
             'without toward around'),
    'pron': 'she he it someone everyone nobody somebody anyone',
    'name': ('alice bob carol david emma frank grace henry irene jack kate leo '
             'maria nina oscar paul rosa sam tina victor wendy yusuf zoe hugo '
             'lena'),
    'conj': 'and but while because so',
}
_ZIPF_EXPONENT = 1.0

# state: (category, {successor: probability}); 'END' absorbs. 'START' emits
# nothing. From every state the successors' categories are distinct, so a
# sentence determines its state path.
_STATES = {
    'START': (None, {'DET_S': .5, 'PRON_S': .2, 'NAME_S': .3}),
    'DET_S': ('det', {'ADJ_S': .4, 'N_S': .6}),
    'ADJ_S': ('adj', {'ADJ_S': .2, 'N_S': .8}),
    'N_S': ('noun', {'V': .75, 'PREP_S': .25}),
    'PREP_S': ('prep', {'DET_PS': 1.}),
    'DET_PS': ('det', {'ADJ_PS': .3, 'N_PS': .7}),
    'ADJ_PS': ('adj', {'ADJ_PS': .15, 'N_PS': .85}),
    'N_PS': ('noun', {'V': .85, 'ADV_S': .15}),
    'PRON_S': ('pron', {'V': .8, 'ADV_S': .2}),
    'NAME_S': ('name', {'V': .8, 'ADV_S': .2}),
    'ADV_S': ('adv', {'V': 1.}),
    'V': ('verb', {'DET_O': .6, 'NAME_O': .2, 'ADV_E': .15, 'END': .05}),
    'DET_O': ('det', {'ADJ_O': .4, 'N_O': .6}),
    'ADJ_O': ('adj', {'ADJ_O': .2, 'N_O': .8}),
    'N_O': ('noun', {'END': .35, 'PREP_O': .3, 'CONJ': .2, 'ADV_E': .15}),
    'NAME_O': ('name', {'END': .45, 'PREP_O': .2, 'CONJ': .2, 'ADV_E': .15}),
    'PREP_O': ('prep', {'DET_PO': 1.}),
    'DET_PO': ('det', {'ADJ_PO': .3, 'N_PO': .7}),
    'ADJ_PO': ('adj', {'ADJ_PO': .15, 'N_PO': .85}),
    'N_PO': ('noun', {'END': .55, 'CONJ': .2, 'PREP_O': .1, 'ADV_E': .15}),
    'ADV_E': ('adv', {'END': .75, 'CONJ': .25}),
    'CONJ': ('conj', {'DET_S': .5, 'PRON_S': .25, 'NAME_S': .25}),
}


def _Entropy(p):
  p = np.asarray(p, np.float64)
  p = p[p > 0]
  return float(-(p * np.log(p)).sum())


class _Grammar:
  """The chain in array form (built once by `_GetGrammar`)."""

  def __init__(self):
    self.categories = list(_WORDS)
    cat_index = {c: i for i, c in enumerate(self.categories)}
    self.cat_words = [_WORDS[c].split() for c in self.categories]
    self.vocab = [w for ws in self.cat_words for w in ws]
    if len(set(self.vocab)) != len(self.vocab):
      dup = sorted({w for w in self.vocab if self.vocab.count(w) > 1})
      raise ValueError(f'synthetic_corpus: words in two categories: {dup}')
    self.word_index = {w: i for i, w in enumerate(self.vocab)}
    self.cat_offset = np.cumsum([0] + [len(ws) for ws in self.cat_words])
    self.cat_probs = []
    for ws in self.cat_words:
      p = 1.0 / np.arange(1, len(ws) + 1)**_ZIPF_EXPONENT
      self.cat_probs.append(p / p.sum())
    self.word_cat = np.repeat(np.arange(len(self.categories)),
                              [len(ws) for ws in self.cat_words])
    self.word_logp = np.concatenate([np.log(p) for p in self.cat_probs])

    self.states = list(_STATES)  # START is state 0.
    index = {s: i for i, s in enumerate(self.states)}
    n = len(self.states)
    self.end = n  # Column n of `trans` is the absorbing END.
    self.trans = np.zeros([n, n + 1])
    self.state_cat = np.full([n], -1)
    for s, (cat, succ) in _STATES.items():
      if cat is not None:
        self.state_cat[index[s]] = cat_index[cat]
      if abs(sum(succ.values()) - 1) > 1e-12:
        raise ValueError(f'synthetic_corpus: state {s!r} probabilities sum '
                         f'to {sum(succ.values())}, not 1')
      cats = [_STATES[t][0] for t in succ if t != 'END']
      if len(set(cats)) != len(cats):
        raise ValueError(f'synthetic_corpus: successors of {s!r} share a '
                         f'category ({cats}); sentences would be ambiguous')
      for t, prob in succ.items():
        self.trans[index[s], self.end if t == 'END' else index[t]] = prob
    # (state, category of the next word) -> next state, for parsing.
    self.next_state = np.full([n, len(self.categories)], -1)
    for s, (_, succ) in _STATES.items():
      for t in succ:
        if t != 'END':
          self.next_state[index[s], cat_index[_STATES[t][0]]] = index[t]

  def ExpectedVisits(self):
    """[states] expected visits per sentence, START visited once."""
    q = self.trans[:, :-1]
    e_start = np.zeros([q.shape[0]])
    e_start[0] = 1.0
    return np.linalg.solve((np.eye(q.shape[0]) - q).T, e_start)


@functools.lru_cache(maxsize=1)
def _GetGrammar():
  return _Grammar()


def Vocabulary():
  """The 248 words of the grammar, category by category."""
  return list(_GetGrammar().vocab)


def EntropyPerSentence():
  """Exact expected entropy of one sentence in nats, its end included.

  Sum over states of (expected visits) x (entropy of the next-state choice,
  END included, + entropy of the emitted word).
  """
  g = _GetGrammar()
  visits = g.ExpectedVisits()
  total = 0.0
  for s, v in enumerate(visits):
    emit = _Entropy(g.cat_probs[g.state_cat[s]]) if g.state_cat[s] >= 0 else 0.
    total += v * (_Entropy(g.trans[s]) + emit)
  return total


def ExpectedWordsPerSentence():
  """Exact expected number of words in a sentence (END not counted)."""
  return float(_GetGrammar().ExpectedVisits()[1:].sum())


def SentenceLogProb(sentence):
  """Natural log-probability of one sentence (a str) under the grammar.

  Raises:
    ValueError: if the sentence has a word outside the vocabulary or cannot
      be produced by the grammar.
  """
  g = _GetGrammar()
  state, logp = 0, 0.0
  for word in sentence.split(' '):
    w = g.word_index.get(word)
    nxt = -1 if w is None else g.next_state[state, g.word_cat[w]]
    if nxt < 0:
      raise ValueError(f'SentenceLogProb: {sentence!r} is not in the grammar '
                       f'(at word {word!r})')
    logp += np.log(g.trans[state, nxt]) + g.word_logp[w]
    state = nxt
  if g.trans[state, g.end] == 0:
    raise ValueError(f'SentenceLogProb: {sentence!r} cannot end where it does')
  return float(logp + np.log(g.trans[state, g.end]))


def _SampleWordIds(n, rng):
  """All rows advance one word per loop; returns (word ids, [n] lengths).

  The word ids of sentence 0, then of sentence 1, ... in one flat array.
  """
  g = _GetGrammar()
  cdf = np.cumsum(g.trans, axis=1)
  cdf[:, -1] = 1.0
  cat_cdf = [np.cumsum(p) for p in g.cat_probs]
  state = np.zeros([n], np.int64)
  alive = np.arange(n)
  columns = []  # per step: (row ids, word ids)
  while alive.size:
    u = rng.random(alive.size)
    nxt = (u[:, None] >= cdf[state]).sum(axis=1)
    keep = nxt != g.end
    alive, state = alive[keep], nxt[keep]
    words = np.empty([alive.size], np.int64)
    cats = g.state_cat[state]
    u = rng.random(alive.size)
    for c, c_cdf in enumerate(cat_cdf):
      sel = cats == c
      idx = np.minimum(np.searchsorted(c_cdf, u[sel], side='right'),
                       len(c_cdf) - 1)
      words[sel] = g.cat_offset[c] + idx
    columns.append((alive, words))
  rows = np.concatenate([r for r, _ in columns] or [np.zeros([0], np.int64)])
  words = np.concatenate([w for _, w in columns] or [np.zeros([0], np.int64)])
  order = np.argsort(rows, kind='stable')  # Steps stay in order in a row.
  return words[order], np.bincount(rows, minlength=n)


def GenerateSentences(n, seed):
  """Samples `n` sentences (str, words joined by single spaces).

  Args:
    n: number of sentences.
    seed: an int or a sequence of ints for `np.random.default_rng`; the same
      seed gives the same sentences.
  """
  if n < 0:
    raise ValueError(f'GenerateSentences: n={n} must be >= 0')
  vocab = np.array(_GetGrammar().vocab, dtype=object)
  ids, lengths = _SampleWordIds(n, np.random.default_rng(seed))
  words = vocab[ids].tolist()
  ends = np.cumsum(lengths).tolist()
  return [' '.join(words[e - k:e]) for e, k in zip(ends, lengths.tolist())]


def _FileBytes(path):
  """The file's bytes; None if it does not exist."""
  if not os.path.exists(path):
    return None
  with open(path, 'rb') as f:
    return f.read()


def _ReadJson(path):
  """The dict in a JSON file; None if there is none (or, with a warning,
  if it is not a readable one)."""
  if not os.path.exists(path):
    return None
  try:
    with open(path, encoding='utf-8') as f:
      value = json.load(f)
  except (OSError, ValueError):
    value = None
  if not isinstance(value, dict):
    logging.warning('synthetic_corpus: %s is not readable; ignoring it', path)
    return None
  return value


def WriteShards(data_dir, num_train_shards=10, sentences_per_shard=10000,
                seed=0, num_heldout_sentences=None):
  """Writes the corpus in the one-billion-words layout; idempotent.

  Files already written with the same configuration (the manifest) are
  kept as they are if their bytes still match the SHA-256 digests recorded
  beside it (`synthetic_corpus.sha256.json`; written without one, by an
  older version, they are compared with the samples once and the record is
  written); a file that does not match (damaged, truncated, edited) or is
  missing is rewritten (the samples are deterministic, so it comes back as
  it was), with one warning line naming it. Otherwise the files of an
  earlier configuration (listed in its manifest) are deleted with any
  SentencePiece models that older versions cached beside them
  (`spm_*.model`, trained on the old text; models are now cached
  elsewhere, keyed by the files' sizes and times), and everything is
  rewritten. Every file is written to a temporary name and renamed: the
  corpus, then the digests, the manifest last.

  Args:
    data_dir: directory, created if missing.
    num_train_shards: number of training files.
    sentences_per_shard: sentences in each training file.
    seed: int; shard i uses seed (seed, 0, i), Dev (seed, 1), Test (seed, 2).
    num_heldout_sentences: sentences in each of Dev and Test; defaults to
      `sentences_per_shard`.

  Returns:
    NestedMap(train=, dev=, test=) of file patterns (globs).
  """
  for name, value in (('num_train_shards', num_train_shards),
                      ('sentences_per_shard', sentences_per_shard)):
    if value < 1:
      raise ValueError(f'WriteShards: {name}={value} must be >= 1')
  if num_heldout_sentences is None:
    num_heldout_sentences = sentences_per_shard
  os.makedirs(data_dir, exist_ok=True)
  n = num_train_shards
  files = {f'train-{i:05d}-of-{n:05d}': (sentences_per_shard, [seed, 0, i])
           for i in range(n)}
  files['dev-00000-of-00001'] = (num_heldout_sentences, [seed, 1])
  files['test-00000-of-00001'] = (num_heldout_sentences, [seed, 2])
  config = {'version': _VERSION, 'num_train_shards': n,
            'sentences_per_shard': sentences_per_shard, 'seed': seed,
            'num_heldout_sentences': num_heldout_sentences,
            'files': sorted(files)}
  patterns = nested_map.NestedMap(
      train=os.path.join(data_dir, f'train-*-of-{n:05d}'),
      dev=os.path.join(data_dir, 'dev-00000-of-00001'),
      test=os.path.join(data_dir, 'test-00000-of-00001'))

  def _Path(name):
    return os.path.join(data_dir, name)

  def _Text(name):
    count, file_seed = files[name]
    return '\n'.join(GenerateSentences(count, file_seed)) + '\n'

  manifest, record = _Path(_MANIFEST), _Path(_DIGESTS)
  old = _ReadJson(manifest)
  texts = {}
  if old == config:
    digests = _ReadJson(record)
    if digests is not None:
      rewrite = [f for f in sorted(files) if not os.path.exists(_Path(f)) or
                 cache_files.Sha256(_Path(f)) != digests.get(f)]
    else:  # Written without a digest record: compare with the samples.
      texts = {f: _Text(f) for f in files}
      rewrite = [f for f in sorted(files)
                 if _FileBytes(_Path(f)) != texts[f].encode('utf-8')]
    if not rewrite and digests is not None:
      logging.info('synthetic_corpus: %s already holds this corpus (digests '
                   'checked)', data_dir)
      return patterns
    if rewrite:
      logging.warning('synthetic_corpus: %s: %s missing or not as written; '
                      'rewriting it', data_dir, ', '.join(rewrite))
  else:
    if old is not None:
      stale = [_Path(f) for f in old.get('files', []) if isinstance(f, str)]
      stale += glob.glob(_Path('spm_*.model')) + [record, manifest]
      for path in stale:
        if os.path.exists(path):
          os.remove(path)
    rewrite = sorted(files)
  for name in rewrite:
    atomic_file.Write(_Path(name), texts.get(name) or _Text(name))
  atomic_file.Write(record, json.dumps(
      {f: cache_files.Sha256(_Path(f)) for f in sorted(files)}, indent=1))
  if old != config:
    atomic_file.Write(manifest, json.dumps(config, indent=1,
                                                 sort_keys=True))
  logging.info('synthetic_corpus: wrote %d file(s) of the corpus (%d train '
               'shards x %d sentences, %d Dev/Test sentences) and their '
               'digests to %s; entropy %.4f nats/sentence', len(rewrite), n,
               sentences_per_shard, num_heldout_sentences, data_dir,
               EntropyPerSentence())
  return patterns
