"""Tokens/sec of the LM input pipeline alone (no model).

Builds `LmInput` on the embedded synthetic corpus (10 train shards x 10000
sentences, written once to --data_dir) for the Tiny LM's shapes and times
  * numpy: `InputBatchAt(i)` for consecutive i (the pure batch function);
  * tf.data: iterating `Dataset()` (numpy_function map + prefetch), which is
    what the trainer consumes;
for packed and padded rows, with the SentencePiece (BPE, 512 pieces) and the
byte tokenizers. `tok/s` counts every position of a batch (b x t), `real/s`
only positions with label weight 1. Also reported: the one-time start-up
(read + tokenise every file, the token cache off) and the cost of resuming
at step 10^9. Then the start-up of the SentencePiece input with the token
cache (tasks/lm/token_cache.py): off, cold (tokenise and write the
entries) and warm (read them back), interleaved over --repeats rounds, as
medians and ratios to off.
bench/lm_bench.py compares these rates with the model's consumption.

Run:
  .venv/bin/python bench/lm_input_bench.py [--batches 300]
"""
import argparse
import os
import shutil
import statistics
import tempfile
import time

from absl import logging
import bench_log
import tensorflow as tf

from cadence.tasks.lm import input_generator
from cadence.tasks.lm import synthetic_corpus
from cadence.tasks.lm import tokenizers


def _Rate(fn, batches, repeats):
  """Median seconds of `fn(batches)` over `repeats` runs."""
  fn(5)  # Warm-up (tf.data start, caches).
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn(batches)
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def _Row(gen, batches, repeats):
  p = gen.params
  b, t = p.batch_size, p.max_seq_len
  real = float(sum(gen.InputBatchAt(i).weights.sum() for i in range(50))) / (
      50 * b * t)

  def _Numpy(n):
    for i in range(n):
      gen.InputBatchAt(i)

  def _TfData(n):
    for _ in gen.Dataset().take(n):
      pass

  out = []
  for name, fn in (('numpy', _Numpy), ('tf.data', _TfData)):
    secs = _Rate(fn, batches, repeats)
    rate = batches * b * t / secs
    out.append((name, rate, rate * real))
  start = time.perf_counter()
  gen.InputBatchAt(10**9)
  resume_ms = (time.perf_counter() - start) * 1e3
  return out, resume_ms


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--data_dir', default=os.path.join(
      tempfile.gettempdir(), 'cadence_lm_input_bench'))
  parser.add_argument('--batches', type=int, default=300)
  parser.add_argument('--repeats', type=int, default=3)
  args = parser.parse_args()
  logging.set_verbosity(logging.WARNING)

  bench_log.Say('writing the corpus, training (or loading) SentencePiece...')
  patterns = synthetic_corpus.WriteShards(args.data_dir, 10, 10000, seed=0)
  spm = tokenizers.SentencePieceTokenizer.Params().Set(
      train_file_pattern=patterns.train, vocab_size=512)
  spm.Instantiate()  # Train (or load) the model before timing.
  toks = (('spm512', spm), ('bytes', tokenizers.ByteTokenizer.Params()))
  shapes = ((32, 128), (16, 64))

  print(f'tf {tf.__version__}, {os.cpu_count()} CPUs, train set '
        f'{patterns.train}, {args.batches} batches x {args.repeats} repeats')
  header = (f'{"tokenizer":>9} {"mode":>6} {"b x t":>8} {"path":>7} '
            f'{"tok/s":>11} {"real/s":>11} {"start s":>8} {"resume ms":>9}')
  print(header)
  print('-' * len(header))
  for tok_name, tok in toks:
    for packed in (True, False):
      for b, t in shapes:
        p = input_generator.LmInput.Params().Set(
            file_pattern=patterns.train, tokenizer=tok, batch_size=b,
            max_seq_len=t, packed=packed, fixed_input_shape=True,
            token_cache_dir='')
        bench_log.Say(f'{tok_name} {"packed" if packed else "padded"} '
                      f'{b}x{t}: building the input, timing its batches...')
        start = time.perf_counter()
        gen = p.Instantiate()
        start_s = time.perf_counter() - start
        rows, resume_ms = _Row(gen, args.batches, args.repeats)
        for path, rate, real in rows:
          print(f'{tok_name:>9} {"packed" if packed else "padded":>6} '
                f'{f"{b}x{t}":>8} {path:>7} {rate:11,.0f} {real:11,.0f} '
                f'{start_s:8.2f} {resume_ms:9.2f}')
  CacheStartup(patterns.train, spm, args.repeats)


def CacheStartup(pattern, spm, repeats):
  """Prints the SentencePiece input's start-up with the token cache off,
  cold and warm (see the module docstring)."""
  times = {'off': [], 'cold': [], 'warm': []}
  for r in range(repeats):
    bench_log.Say(f'token cache start-up, round {r + 1} of {repeats}: '
                  'building the input without, then with a cold and a warm '
                  'cache...')
    cache = tempfile.mkdtemp(prefix='lm_input_bench_tokens_')
    order = ['off', 'cold', 'warm'] if r % 2 == 0 else ['cold', 'warm', 'off']
    for name in order:
      p = input_generator.LmInput.Params().Set(
          file_pattern=pattern, tokenizer=spm, batch_size=32,
          max_seq_len=128, token_cache_dir='' if name == 'off' else cache)
      start = time.perf_counter()
      p.Instantiate()
      times[name].append(time.perf_counter() - start)
    shutil.rmtree(cache, ignore_errors=True)
  med = {k: statistics.median(v) for k, v in times.items()}
  print(f'\nspm512 train input start-up, token cache (median of {repeats})')
  print(f'{"cache":>6} {"s":>7} {"/ off":>7}')
  for name, value in med.items():
    print(f'{name:>6} {value:7.3f} {value / med["off"]:7.2f}')


if __name__ == '__main__':
  main()
