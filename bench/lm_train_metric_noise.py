"""How far a training window's nats_per_sentence strays for the exact model.

The LM task's per-sentence metric on training batches (packed rows, only
the sentences whole in their row, each weighted by the inverse of its
chance to be whole; tasks/lm/input_generator.py) is an estimate over the
few thousand sentences of a summary window. This script scores the Tiny
experiment's training batches with the grammar's own probabilities (the
best possible model: its expected nats per sentence is the entropy), so
whatever the windows show beyond the entropy is the estimate's noise and
bias, not a model's:

  window  steps summed in one reported value (the trainer's summary and
          log interval is 50), the ratio of summed weighted -log p to
          summed weights, as the trainer sums a metric's (value x weight,
          weight) pairs;
  mean / std / min / <0  of (window value - entropy) over the windows.

and, over all batches, the weighted mean against the plain mean of the
corpus's sentences (of fewer tokens than a row: the only ones that can be
whole), which it estimates. No model is trained; nothing is timed.

Run (about 4 minutes on 2 cores; measured there, shared with other jobs):
  .venv/bin/python bench/lm_train_metric_noise.py [--batches 8000]

  window  windows     mean      std      min     <0
       1     8000    0.073    2.359   -5.859    53%
      10      800    0.029    0.753   -2.048    50%
      50      160    0.024    0.340   -0.906    48%
     200       40    0.024    0.155   -0.318    45%
  all 8000 batches: 31.625; the corpus's sentences of < 64 tokens: 31.619

so the length weighting is unbiased, and a 50-step window strays from the
entropy by 0.34 nats (std) for the exact model, below it about half the
time: the LM task reports the gap to the entropy for eval only.
"""
import argparse
import os
import tempfile

from absl import logging
import bench_log
import numpy as np

from cadence.framework import model_registry
from cadence.tasks.lm import synthetic_corpus

_KEY = 'lm.one_billion_wds.OneBWdsGPipeTransformerTiny'


def _WholeSentences(batch, tok):
  """(texts, weights) of the sentences whole in the batch's rows."""
  texts, weights = [], []
  ids, labels, sw = batch.ids, batch.labels, batch.sentence_weights
  for r, j in zip(*np.nonzero((labels == tok.eos_id) & (sw > 0))):
    bos = np.flatnonzero(ids[r, :j + 1] == tok.bos_id)[-1]
    texts.append(tok.Decode(ids[r, bos + 1:j + 1]))
    weights.append(float(sw[r, j]))
  return texts, np.array(weights)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--batches', type=int, default=8000)
  parser.add_argument('--data_dir', default=os.path.join(
      tempfile.gettempdir(), 'cadence_metric_noise'))
  args = parser.parse_args()
  logging.set_verbosity(logging.WARNING)
  p = model_registry.GetParams(_KEY, 'Train').input
  p.data_dir = os.path.join(args.data_dir, 'data')
  p.tokenizer.cache_dir = os.path.join(args.data_dir, 'spm')
  bench_log.Say('building the input (the corpus and its tokenizer)...')
  gen = p.Instantiate()
  tok = gen.tokenizer
  entropy = synthetic_corpus.EntropyPerSentence()

  sums, weights = np.zeros([args.batches]), np.zeros([args.batches])
  for i in range(args.batches):
    if i % 500 == 0:
      bench_log.Say(f'scoring the training batches\' sentences: {i} of '
                    f'{args.batches} done...')
    texts, w = _WholeSentences(gen.InputBatchAt(i), tok)
    nll = np.array([-synthetic_corpus.SentenceLogProb(t) for t in texts])
    sums[i], weights[i] = (w * nll).sum(), w.sum()

  bench_log.Say('scoring every sentence of the corpus...')
  corpus = []
  for path in gen.files:
    with open(path, encoding='utf-8') as f:
      corpus += [line for line in f.read().split('\n') if line]
  lengths = np.array([len(x) for x in tok.EncodeBatch(corpus)])
  nll = np.array([-synthetic_corpus.SentenceLogProb(s) for s in corpus])
  short = nll[lengths < p.max_seq_len]

  print(f'{_KEY} training batches ({p.batch_size} x {p.max_seq_len}, '
        f'packed), scored by the grammar; entropy {entropy:.3f} nats a '
        f'sentence; {weights.mean():.0f} weighted whole sentences a batch')
  print(f'{"window":>8} {"windows":>8} {"mean":>8} {"std":>8} {"min":>8} '
        f'{"<0":>6}')
  for window in (1, 10, 50, 200):
    k = args.batches // window
    if not k:
      continue
    est = (sums[:k * window].reshape(k, window).sum(1) /
           weights[:k * window].reshape(k, window).sum(1)) - entropy
    print(f'{window:>8} {k:>8} {est.mean():>8.3f} {est.std():>8.3f} '
          f'{est.min():>8.3f} {(est < 0).mean():>6.0%}')
  print(f'all {args.batches} batches: {sums.sum() / weights.sum():.3f}; '
        f'the corpus\'s sentences of < {p.max_seq_len} tokens: '
        f'{short.mean():.3f} (all: {nll.mean():.3f}, std of one sentence '
        f'{nll.std():.1f})')


if __name__ == '__main__':
  main()
