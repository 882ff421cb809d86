"""Progress lines of the benchmarks: what a phase does, as it starts.

A benchmark prints its table on stdout; its progress lines go to stderr,
each with the script's name and the seconds since it started, so a run
that works for minutes says what it is doing (and a table redirected to a
file stays clean). A script run as `python bench/<name>.py` finds this
module beside it.

Example:
  import bench_log
  bench_log.Say('building the model...')
  # stderr: [export_bench   2.1 s] building the model...
"""
import os
import sys
import time

_START = time.perf_counter()   # When the benchmark imported this module.
_NAME = os.path.splitext(os.path.basename(sys.argv[0] or 'bench'))[0]


def Say(text):
  """Writes '[<script> <seconds> s] <text>' to stderr at once."""
  print(f'[{_NAME} {time.perf_counter() - _START:6.1f} s] {text}',
        file=sys.stderr, flush=True)
