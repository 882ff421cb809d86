"""The hosts of a multi-host job leave together; no log line reads as a crash.

MultiWorkerMirroredStrategy runs TensorFlow's coordination service in its
leader (the chief, else worker 0); every host's agent sends it a heartbeat
every 5 s. TensorFlow gives Python no call that shuts an agent down (its
destructor would, but the eager context owning it lives until the process
dies), so a host that exits simply stops its heartbeats. Measured with two
workers on 127.0.0.1, each ending the moment its script did:

  * a host that outlives the leader by a heartbeat (and 1 s) logs
    `E0000 ... StartAbort UNAVAILABLE: Failed to send RPC to coordination
    service`;
  * a leader that outlives a host by 10 s (its heartbeat timeout) logs
    `E0000 ... StartAbort UNAVAILABLE: ... The tasks have crashed` about
    that host, which finished normally (what the trainer did when its
    interpreter's teardown took 20-50 s on a loaded machine).

So once a multi-host job ended normally, `FinishTogether` has every host
wait at a barrier of the coordination service until all got there (the
chief may still be evaluating and decoding Dev); then the other hosts leave
at once (framework/jobs/process_exit.py ends a process in milliseconds),
and the leader, which serves the barrier, leaves last: once no peer's
server accepts a connection any more, within `leave_timeout_s`.

Example (every host, after its job returned):
  coordinated_exit.FinishTogether(setup)   # Then end the process.
"""
import time

from tensorflow.python.eager import context  # The barrier: no public API.

from cadence.framework.distribute import peer_wait

BARRIER = 'cadence_job_finished'
# The chief may evaluate and decode for a long time; a host that dies fails
# the barrier at once (the coordination service's heartbeats).
BARRIER_TIMEOUT_S = 24 * 3600
LEAVE_TIMEOUT_S = 5.0  # Below the service's 10 s heartbeat timeout.
_POLL_S = 0.02


def PeerAddresses(strategy):
  """The addresses of the other tasks of `strategy`'s cluster
  (MultiWorkerMirroredStrategy), e.g. ['127.0.0.1:41234']."""
  resolver = strategy.cluster_resolver
  spec = resolver.cluster_spec().as_dict()
  return [address for job, addresses in sorted(spec.items())
          for i, address in enumerate(addresses)
          if (job, i) != (resolver.task_type, resolver.task_id)]


def AwaitGone(addresses, timeout_s=LEAVE_TIMEOUT_S):
  """Waits until no server listens at `addresses` any more, at most
  `timeout_s` seconds; returns those still serving ([] when all left)."""
  deadline = time.monotonic() + timeout_s
  serving = list(addresses)
  while True:
    serving = [a for a in serving if peer_wait.Accepts(a, 0.5)]
    if not serving or time.monotonic() >= deadline:
      return serving
    time.sleep(_POLL_S)


def FinishTogether(setup, barrier_timeout_s=BARRIER_TIMEOUT_S,
                   leave_timeout_s=LEAVE_TIMEOUT_S):
  """Waits until every host of `setup`'s job finished (see the module
  docstring); on the leader (host 0), also until the others left.

  Args:
    setup: the distribution.Setup of a MultiWorkerMirroredStrategy job.
    barrier_timeout_s: the longest wait for the other hosts to finish.
    leave_timeout_s: the leader's longest wait for them to exit after.

  Raises:
    tf.errors.OpError: a host failed or left before it finished, or the
      barrier timed out.
  """
  context.context().wait_at_barrier(BARRIER, int(barrier_timeout_s * 1000))
  if setup.worker_index == 0:
    AwaitGone(PeerAddresses(setup.strategy), leave_timeout_s)
