"""TensorFlow's own C++ log lines: hidden by default, one flag away.

TensorFlow and gRPC write to stderr from C++, around Cadence's log: at
import, twice (two of TensorFlow's libraries each log once), absl's
"All log messages before absl::InitializeLog() is called are written to
STDERR" and oneDNN's "oneDNN custom operations are on ..." (neither obeys
TF_CPP_MIN_LOG_LEVEL); later cpu_feature_guard's notice, tf.data's
"GeneratorDatasetOp ... will not be optimized" and gRPC's `E0000` lines.

`trainer.py` calls `Configure(show)` before it imports TensorFlow (the C++
levels are read when it loads) and imports it under `QuietImport(show)`:

  show=False (default)  TF_CPP_MIN_LOG_LEVEL=3 and GRPC_VERBOSITY=NONE
                        unless the environment sets them; the import's
                        stderr is captured and written back without the
                        two notices above.
  show=True (--tf_log)  TF_CPP_MIN_LOG_LEVEL=0: every line, as TensorFlow
                        writes it.

TensorFlow's Python records are filtered by trainer_lib.ConfigureLogging
(absl's --verbosity=1 keeps them). This module imports no TensorFlow.
"""
import contextlib
import os
import re
import sys
import tempfile

# Lines TensorFlow writes while it loads that say nothing about the run.
_IMPORT_NOISE = re.compile(
    r'^(WARNING: All log messages before absl::InitializeLog\(\) is called '
    r'are written to STDERR|\S+ [\d:.]+ +\d+ port\.cc:\d+\] oneDNN custom '
    r'operations are on\. .*)$')


def Configure(show, environ=None):
  """Sets the C++ log levels of TensorFlow and gRPC; before TF loads.

  Args:
    show: True to show every line (--tf_log).
    environ: the environment to change (default os.environ).
  """
  environ = os.environ if environ is None else environ
  if show:
    environ['TF_CPP_MIN_LOG_LEVEL'] = '0'
    return
  environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
  environ.setdefault('GRPC_VERBOSITY', 'NONE')


def DropImportNoise(text):
  """`text` without the lines TensorFlow writes at import (see above)."""
  return ''.join(line for line in text.splitlines(keepends=True)
                 if not _IMPORT_NOISE.match(line.rstrip('\n')))


@contextlib.contextmanager
def QuietImport(show):
  """Captures file descriptor 2 (where C++ writes) while the block runs,
  then writes what was captured back to stderr without the import's
  notices. With `show`, or when stderr cannot be captured, does nothing."""
  if show:
    yield
    return
  try:
    sys.stderr.flush()
    saved = os.dup(2)
  except (OSError, ValueError):
    yield
    return
  with tempfile.TemporaryFile() as capture:
    os.dup2(capture.fileno(), 2)
    try:
      yield
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      capture.seek(0)
      text = DropImportNoise(capture.read().decode('utf-8', 'replace'))
      if text:
        sys.stderr.write(text)
        sys.stderr.flush()
