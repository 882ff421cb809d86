"""Preemption: finish the step in progress, checkpoint it, exit 0.

Cloud VMs, Kubernetes and TPU maintenance preempt a job with SIGTERM; a user
at a terminal sends SIGINT. The train program runs its steps inside one
TensorFlow call (a compiled loop of up to `save_interval_steps` steps), and
Python runs signal handlers only in the main thread, between bytecodes: a
plain handler would wait for the whole loop. So:

  * A `Watcher` owns a boolean tf.Variable, the *stop flag*; its signal
    handler sets it.
  * The compiled loop reads the flag after every step (`StopTensor`) and
    ends when it is set: the step in progress finishes, no other starts.
  * `Call(fn, ...)` runs the compiled loop in a worker thread while the
    main thread waits for its result (a signal interrupts the wait; if the
    kernel gave the signal to another thread, the handler runs at the
    wait's next 0.1 s poll).
  * The first signal also puts SIGTERM and SIGINT back to their default
    action: a second one ends the process at once, killed by that signal
    (exit status 143 for SIGTERM, 130 for SIGINT in a shell), without a new
    checkpoint; the latest one stays loadable (saves are atomic).

Several hosts must stop at the same step, or those still stepping wait
forever in their all-reduce. The stop flag therefore goes through an
*agreement*, a function run inside the compiled loop (cross-replica
context) that maps this process's flag to a value every worker gets alike:
in one process (the default strategy, or MirroredStrategy on one host,
whose replicas all read the same variable) the flag itself; across hosts
(MultiWorkerMirroredStrategy) `AllReduceAgreement(strategy)`, the sum of
the flags of all replicas > 0. The train program stops on the agreed value
only, never on a local signal alone.

The handlers are the only process state a watcher touches: installed on
`__enter__` (main thread only), the previous ones restored on `__exit__`.

Example:
  with preemption.Watcher() as watcher:
    program = programs.TrainProgram(task, '/tmp/run', watcher=watcher)
    try:
      program.Run()
    except programs.Preempted as e:
      logging.info('%s', e)   # Stopped by SIGTERM at step 137: ...
"""
import queue
import signal
import threading

from absl import logging
import tensorflow as tf

DEFAULT_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_POLL_SECS = 0.1


def LocalAgreement(local_stop):
  """The agreement of one process: its own stop flag."""
  return local_stop


def AllReduceAgreement(strategy):
  """The agreement of several workers: stop if any replica's flag is set.

  Run inside the compiled loop in cross-replica context, once per step, on
  every worker: an all-reduce (sum) of one int32 per replica, so all
  workers see the same value at the same step.

  Args:
    strategy: the tf.distribute strategy the loop runs under.

  Returns:
    agreement(local_stop: bool scalar tensor) -> bool scalar tensor.
  """

  def _Agree(local_stop):
    votes = strategy.run(lambda: tf.cast(local_stop, tf.int32))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, votes, axis=None) > 0

  return _Agree


class Watcher:
  """Turns SIGTERM/SIGINT into a stop flag the compiled train loop reads.

  Args:
    signals: the signals to handle while entered; () for a flag that only
      `Request` sets (what TrainProgram uses when given no watcher).
    agreement: the function from this process's flag to the flag all
      workers agree on (see the module docstring); default: LocalAgreement.

  Build it outside any tf.distribute strategy scope (its flag is one plain
  variable of this process).

  Example:
    with Watcher() as watcher:        # Handlers installed.
      watcher.Call(train_loop, iterator, n)   # Reads watcher.StopTensor().
      watcher.requested               # 'SIGTERM' once one arrived, or None.
  """

  def __init__(self, signals=DEFAULT_SIGNALS, agreement=None):
    if tf.distribute.has_strategy():
      raise ValueError('preemption.Watcher: build it outside the '
                       'tf.distribute strategy scope; its stop flag is a '
                       'plain variable of this process.')
    self._signals = tuple(signals)
    self._agreement = agreement or LocalAgreement
    self._flag = tf.Variable(False, trainable=False, name='stop_requested')
    self._requested = None
    self._previous = {}
    self._calls = None  # The worker thread's queue, once it runs.
    self._thread = None

  # --- signals ---------------------------------------------------------------

  def __enter__(self):
    if self._signals and (threading.current_thread() is not
                          threading.main_thread()):
      raise ValueError('preemption.Watcher: enter it in the main thread '
                       '(Python delivers signals there only).')
    for signum in self._signals:
      self._previous[signum] = signal.signal(signum, self._Handle)
    return self

  def __exit__(self, *unused_exc):
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)
    self._previous = {}
    if self._calls is not None:
      self._calls.put(None)  # Ends the worker thread: it must not be alive
      # inside TF when the interpreter shuts down (that aborts the process).
      self._thread.join()
      self._calls = self._thread = None

  def _Handle(self, signum, unused_frame):
    # A second signal gets the default action: the process ends at once.
    for other in self._previous:
      signal.signal(other, signal.SIG_DFL)
    name = signal.Signals(signum).name
    logging.warning('%s received: finishing the step in progress, then '
                    'saving a checkpoint and exiting (a second signal exits '
                    'at once, without a checkpoint).', name)
    self.Request(name)

  # --- the flag --------------------------------------------------------------

  @property
  def requested(self):
    """What asked this process to stop ('SIGTERM', ...), or None."""
    return self._requested

  def Request(self, reason='a request'):
    """Sets the stop flag (what a signal does); `reason` names the cause."""
    self._requested = self._requested or reason
    self._flag.assign(True)

  def StopTensor(self):
    """In the compiled loop: the agreed stop flag, a bool scalar tensor."""
    return self._agreement(self._flag.read_value())

  def Call(self, fn, *args):
    """`fn(*args)`, in a worker thread while signals are handled.

    The main thread waits on the result, where the handlers run; without
    handlers installed `fn` runs in this thread. One worker thread serves
    every call while the watcher is entered (bench/trainer_bench.py
    --watcher compares the loop's steps/s with and without it).
    """
    if not self._previous:
      return fn(*args)
    if self._calls is None:
      self._calls = queue.Queue()
      self._thread = threading.Thread(target=_Serve, args=(self._calls,),
                                      name='train_loop', daemon=True)
      self._thread.start()
    results = queue.Queue()
    self._calls.put((fn, args, results))
    while True:
      try:
        # Timed: a signal the kernel gave another thread (e.g. one of
        # TensorFlow's) does not interrupt this wait, but its Python
        # handler runs here within _POLL_SECS.
        ok, value = results.get(timeout=_POLL_SECS)
        break
      except queue.Empty:
        continue
    if not ok:
      raise value
    return value


def _Outcome(fn, args):
  try:
    return True, fn(*args)
  except BaseException as e:  # pylint: disable=broad-except
    return False, e


def _Serve(calls):
  """The worker thread: runs (fn, args, results) calls until a None.

  It lets go of a call's function and arguments before it answers, so it
  never holds the last reference to the caller's objects: the train loop's
  input iterator, freed by this thread as it ended, made `__exit__`'s join
  wait for tf.data to stop its threads (0.4-11.6 s on a loaded machine).
  """
  while True:
    call = calls.get()
    if call is None:
      return
    fn, args, results = call
    del call
    outcome = _Outcome(fn, args)
    del fn, args
    results.put(outcome)
