"""How the trainer's process ends: at once, once its work is written.

When `main` returns, CPython tears the interpreter down: it joins the
non-daemon threads, runs the atexit handlers, then frees every module's
objects with full garbage collections over TensorFlow's objects, graphs
and functions: seconds of CPU, and on a loaded machine tens of seconds of
wall time between the trainer's last line and its exit; in a multi-host
job the hosts' teardowns raced the coordination service's heartbeats
(framework/distribute/coordinated_exit.py) (figures: the README, "Measured on the development machine"). The teardown writes nothing the
trainer needs: checkpoints are whole when saved, summaries are flushed at
each write, params.txt and the decoder's output are closed files by then.

So `Exit` does what a normal exit does that matters, then ends the process
with `os._exit`: it waits for non-daemon Python threads, runs the atexit
handlers (logging and absl flush and close their handlers; TensorFlow's
async checkpoint joins its saver thread) and flushes stdout and stderr.
Only trainer.py calls it; `trainer_lib.Main` returns its code, so tests run
it in process.

Example (trainer.py: `main` returns the code, so tests call it in process;
the script's entry point ends the process):
  def _MainThenExit(argv):
    process_exit.Exit(main(argv))   # Never returns.
"""
import atexit
import os
import sys
import threading


def Exit(code):
  """Ends this process with exit status `code`, without the interpreter's
  teardown (see the module docstring). Never returns.

  Args:
    code: the exit status, an int in [0, 255].
  """
  for thread in threading.enumerate():
    if thread is not threading.current_thread() and not thread.daemon:
      thread.join()
  atexit._run_exitfuncs()  # pylint: disable=protected-access
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError):  # Closed, or its reader is gone.
      pass
  os._exit(code)  # pylint: disable=protected-access
