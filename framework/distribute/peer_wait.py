"""Before TensorFlow's server starts: wait, in Python, for the job's peers.

A MultiWorkerMirroredStrategy host, or a parameter-server chief, blocks in
TensorFlow's C++ start-up until every peer answers: a peer that never comes
(a mistyped address, a host that did not start) kept the trainer silent
for minutes, deaf to SIGTERM, until TensorFlow gave up or SIGKILL came. So
the distribution option waits here first, where Python runs:

  * one daemon thread per peer tries a TCP connection to its address
    ('host:port' from TF_CONFIG) every 0.5-2 s until one is accepted: the
    peer has been *seen*;
  * this host listens on its own port meanwhile (a plain socket on every
    interface, SO_REUSEADDR), accepting and closing each probe, since its
    peers wait for it too; the socket is closed when the wait ends, right
    before TensorFlow's server binds the port. A peer's probe that lands
    between the two is refused and retried (milliseconds, in a two-worker
    start, between the close and MultiWorkerMirroredStrategy's bind;
    TensorFlow's server binds a port that still holds the TIME_WAIT socket
    of an accepted probe);
  * a log line names the peers not seen yet (job, index, address) after
    1 s and then every 10 s;
  * after `timeout_s` (--peer_timeout_s; 0: no limit) a `WaitError` names
    the peers never seen, the timeout and the flag: the trainer's one
    `Error:` line, exit 2;
  * SIGTERM or SIGINT ends the wait within 0.2 s with `Stopped`, whose
    message is the trainer's one line (exit 0: nothing was built).

The wait only says that a peer's process is up and listening; TensorFlow
still runs its own start-up after it. No TensorFlow here.

Example:
  peers = peer_wait.Peers(cluster, ('chief', 'worker'), own=('worker', 0))
  peer_wait.Wait(peers, timeout_s=600, listen_port=2222)   # Or raises.
"""
import collections
import contextlib
import errno
import os
import select
import signal
import socket
import threading
import time

from absl import logging

DEFAULT_TIMEOUT_S = 600.0
FLAG = '--peer_timeout_s'
FIRST_LOG_S = 1.0     # A peer starting with this host is not worth a line.
LOG_EVERY_S = 10.0
_TICK_S = 0.2         # The longest a signal waits for the loop.
_PROBE_FIRST_S, _PROBE_MAX_S = 0.5, 2.0   # Between two tries at a peer.
_CONNECT_TIMEOUT_S = 1.0
_NAMED = 8            # Peers named in one line; the rest are counted.

Peer = collections.namedtuple('Peer', 'job index address')


class WaitError(Exception):
  """A peer never seen within the timeout, or this host's port in use; the
  trainer exits 2 with the message."""


class Stopped(Exception):
  """SIGTERM or SIGINT while waiting; the message is the line to log."""


def SplitAddress(address):
  """'h0:2222' -> ('h0', 2222); '[::1]:2222' -> ('::1', 2222)."""
  host, _, port = address.rpartition(':')
  return host.strip('[]'), int(port)


def Peers(cluster, jobs, own=None):
  """The tasks of `jobs` in `cluster` (a TF_CONFIG "cluster" dict), except
  `own` = (job, index): a list of Peer."""
  return [Peer(job, i, address) for job in jobs
          for i, address in enumerate(cluster.get(job, []))
          if (job, i) != own]


def Describe(peers):
  """'worker 1 at h1:2222, chief 0 at h0:2222' (the first few, then how
  many more)."""
  named = [f'{p.job} {p.index} at {p.address}' for p in peers[:_NAMED]]
  more = len(peers) - len(named)
  return ', '.join(named) + (f' and {more} more' if more else '')


def _Limit(timeout_s):
  """'giving up at --peer_timeout_s=600 s', or that there is no limit."""
  if not timeout_s:
    return f'no time limit: {FLAG}=0'
  return f'giving up at {FLAG}={timeout_s:g} s'


def WaitLoop(peers, seen, timeout_s, clock, pause, stop_reason,
             log=logging.info):
  """Returns once every peer is seen; the pure loop of `Wait`.

  Args:
    peers: the Peers to wait for.
    seen: () -> the set of those seen so far.
    timeout_s: seconds before giving up; 0: no limit.
    clock: () -> seconds (a monotonic clock).
    pause: fn(seconds) that waits (and meanwhile serves this host's probes).
    stop_reason: () -> the signal's name once one asked to stop, or None.
    log: fn(format, *args) for the waiting lines.

  Returns:
    The seconds waited.

  Raises:
    WaitError: `timeout_s` passed with peers not seen.
    Stopped: stop_reason() named a signal.
  """
  start = clock()
  next_log = start + FIRST_LOG_S
  logged = False
  while True:
    now = clock()
    seen_now = seen()
    missing = [p for p in peers if p not in seen_now]
    if not missing:
      if logged:
        log('Every peer accepted a connection after %.1f s: starting '
            "TensorFlow's server.", now - start)
      return now - start
    reason = stop_reason()
    if reason:
      raise Stopped(f'{reason} received while waiting for {len(missing)} '
                    f'peer(s) not seen yet ({Describe(missing)}): this host '
                    'stops before building anything; nothing to save.')
    if timeout_s and now - start >= timeout_s:
      raise WaitError(
          f'{len(missing)} of {len(peers)} peer(s) never accepted a '
          f'connection within {FLAG}={timeout_s:g} s: {Describe(missing)}. '
          'Check those addresses in TF_CONFIG (or --cluster_spec) and start '
          f'the same command there; raise {FLAG} if hosts start slowly.')
    if now >= next_log:
      log('Waiting for %d of %d peer(s) to accept a connection: %s (%.0f s '
          'so far; %s).', len(missing), len(peers), Describe(missing),
          now - start, _Limit(timeout_s))
      logged = True
      next_log = now + LOG_EVERY_S
    pause(_TICK_S)


# --- the real parts: probes, this host's listener, the signals ----------------


def Accepts(address, timeout_s=_CONNECT_TIMEOUT_S):
  """Whether something accepts a TCP connection at 'host:port' now."""
  try:
    with socket.create_connection(SplitAddress(address), timeout_s):
      return True
  except (OSError, UnicodeError):   # Refused, unreachable, not resolved.
    return False


class _Probes:
  """A daemon thread per peer, trying it until it accepts a connection.

  A thread may sit in a name lookup (which no timeout bounds): daemon
  threads, so neither the wait nor the process's exit waits for them.
  """

  def __init__(self, peers):
    self._seen = set()
    self._done = threading.Event()
    for peer in peers:
      threading.Thread(target=self._Try, args=(peer,), daemon=True,
                       name=f'peer_probe_{peer.job}_{peer.index}').start()

  def _Try(self, peer):
    interval = _PROBE_FIRST_S
    while not self._done.is_set():
      if Accepts(peer.address):
        self._seen.add(peer)
        return
      self._done.wait(interval)
      interval = min(interval * 1.5, _PROBE_MAX_S)

  def Seen(self):
    return set(self._seen)

  def Stop(self):
    self._done.set()


def _Listen(port, own):
  """A socket listening on `port` of every interface (SO_REUSEADDR, as
  socket.create_server sets it), IPv6 and IPv4 where the host has both."""
  try:
    if socket.has_dualstack_ipv6():
      listener = socket.create_server(('', port), family=socket.AF_INET6,
                                      dualstack_ipv6=True, backlog=128)
    else:
      listener = socket.create_server(('', port), backlog=128)
  except OSError as e:
    why = ('another process holds it (each task needs a free port of its '
           'own)' if e.errno == errno.EADDRINUSE else
           'give this task a port it may listen on')
    raise WaitError(
        f'This task ({own}) cannot listen on its port {port}: '
        f'{os.strerror(e.errno) if e.errno else e}; {why}.') from None
  listener.setblocking(False)
  return listener


def _Serve(listener, seconds):
  """Waits `seconds`, accepting and closing the probes of this host's
  peers on `listener` (None: only waits)."""
  if listener is None:
    time.sleep(seconds)
    return
  select.select([listener], [], [], seconds)
  while True:   # The listener does not block: accept what is there.
    try:
      conn, _ = listener.accept()
    except (BlockingIOError, InterruptedError, ConnectionError):
      return
    conn.close()


@contextlib.contextmanager
def _SignalsNamed(names):
  """While entered, SIGTERM and SIGINT append their name to `names` (in
  the main thread only: Python delivers signals there); the previous
  handlers are restored on exit."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  previous = {}
  for signum in (signal.SIGTERM, signal.SIGINT):
    previous[signum] = signal.signal(
        signum, lambda s, _: names.append(signal.Signals(s).name))
  try:
    yield
  finally:
    for signum, handler in previous.items():
      signal.signal(signum, handler)


def WaitForTasks(config, jobs, timeout_s=DEFAULT_TIMEOUT_S, listen=True):
  """`Wait` for the tasks of `jobs` in a TF_CONFIG dict but its own task.

  Args:
    config: the checked TF_CONFIG dict (tf_config.Read).
    jobs: the jobs whose tasks this task's strategy needs, e.g. ('chief',
      'worker').
    timeout_s: seconds before giving up; 0: no limit.
    listen: listen on this task's own port meanwhile (its peers wait for
      it too).

  Returns:
    The seconds waited.

  Raises:
    WaitError, Stopped: as `Wait`.
  """
  cluster, task = config['cluster'], config['task']
  own = (task.get('type', ''), int(task.get('index', 0)))
  address = cluster[own[0]][own[1]] if own[0] in cluster else ''
  return Wait(Peers(cluster, jobs, own), timeout_s,
              SplitAddress(address)[1] if listen and address else None,
              f'{own[0]} {own[1]} at {address}')


def Wait(peers, timeout_s=DEFAULT_TIMEOUT_S, listen_port=None, own=''):
  """Waits until every peer accepts a TCP connection (module docstring).

  Args:
    peers: the Peers to wait for (`Peers`); none: returns at once.
    timeout_s: seconds before giving up; 0: no limit.
    listen_port: this host's own port, listened on while waiting (its
      peers wait for it too); None: this host is not waited for.
    own: this task, e.g. 'worker 0 at h0:2222', for the error if its
      port is taken.

  Returns:
    The seconds waited.

  Raises:
    WaitError: a peer never seen in time, or `listen_port` is taken.
    Stopped: SIGTERM or SIGINT arrived while waiting.
  """
  if not peers:
    return 0.0
  listener = (None if listen_port is None else
              _Listen(listen_port, own or f'port {listen_port}'))
  probes = _Probes(peers)
  names = []
  try:
    with _SignalsNamed(names):
      return WaitLoop(peers, probes.Seen, timeout_s, time.monotonic,
                      lambda s: _Serve(listener, s),
                      lambda: names[0] if names else None)
  finally:
    probes.Stop()
    if listener is not None:
      listener.close()   # Right before TensorFlow's server binds the port.
