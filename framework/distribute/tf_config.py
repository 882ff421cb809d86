"""The multi-host configuration: $TF_CONFIG or --cluster_spec, checked.

A job on several hosts says who is who in one of two forms:

  TF_CONFIG='{"cluster": {"worker": ["h0:2222", "h1:2222"]},
              "task": {"type": "worker", "index": 0}}'
  --cluster_spec=worker=h0:2222,h1:2222 --task_type=worker --task_index=0

(the second is Lingvo's; jobs are separated by '@'). `Read` turns either
into the TF_CONFIG dict and checks it before TensorFlow sees it: malformed
JSON, a missing "cluster" or "task", a job Cadence does not run, an address
that is not host:port, one address given twice (also under two spellings
that resolve to the same IP and port, as 'localhost:2222' and
'127.0.0.1:2222'), a task type that is not a job of the cluster, an index
out of range. Each is a `ConfigError` whose
message names the source ($TF_CONFIG or the flag), the value and the rule;
the trainer prints it as its one `Error:` line and exits 2.

This module imports no TensorFlow, so the trainer checks the configuration
before loading it. Host names are resolved with a bound (`ResolveHosts`:
0.5 s for all of them together; a few ms for local names): a name that does
not resolve yet (on Kubernetes a peer's DNS name may appear only once the
peer starts) is not an error, and is compared by its text.

Example:
  config = tf_config.Read('worker=h0:2222,h1:2222', 'worker', 1)
  config['task']   # {'type': 'worker', 'index': 1}
"""
import difflib
import ipaddress
import json
import os
import re
import socket
import threading
import time

TF_CONFIG = 'TF_CONFIG'
# The jobs Cadence runs (framework/distribute/distribution.py); an
# 'evaluator' task may be named by "task" without being in the cluster.
JOBS = ('chief', 'worker', 'ps', 'evaluator')
_EXAMPLE = ('{"cluster": {"worker": ["h0:2222", "h1:2222"]}, "task": '
            '{"type": "worker", "index": 0}}')
_HOST_PORT = re.compile(r'^(\[[0-9A-Fa-f:.]+\]|[^\s:/\[\]@,]+):(\d+)$')
RESOLVE_WITHIN_S = 0.5   # For all of a cluster's host names together.


class ConfigError(ValueError):
  """A TF_CONFIG or --cluster_spec that cannot describe a cluster."""


def _Hint(value, choices):
  close = difflib.get_close_matches(str(value), list(choices), n=1,
                                    cutoff=0.6)
  return f' Did you mean {close[0]!r}?' if close else ''


def _CheckAddress(source, job, index, address):
  """Raises unless `address` is 'host:port' with a port in [1, 65535]."""
  m = _HOST_PORT.match(address) if isinstance(address, str) else None
  if not m or not 1 <= int(m.group(2)) <= 65535:
    raise ConfigError(
        f'{source}: {job} {index} address {address!r} must be '
        "'host:port' with a port in [1, 65535] (e.g. 'h0:2222', "
        "'[::1]:2222').")


def _IpOf(text):
  """The IP address `text` spells ('127.0.0.1', '::1'; IPv4-mapped IPv6 as
  IPv4), or None for a name."""
  try:
    ip = ipaddress.ip_address(text)
  except ValueError:
    return None
  return str(getattr(ip, 'ipv4_mapped', None) or ip)


def ResolveHosts(hosts, within_s=RESOLVE_WITHIN_S,
                 lookup=socket.getaddrinfo):
  """The IP addresses of each of `hosts`, resolved together within a bound.

  IP literals need no lookup; names are looked up at once, one daemon
  thread each (a lookup cannot be interrupted), and those not answered
  within `within_s` seconds are left to their text.

  Args:
    hosts: host names or IP literals (without brackets).
    within_s: the longest wait for all the lookups together.
    lookup: socket.getaddrinfo, or a stand-in with its signature.

  Returns:
    {host: frozenset of IP strings, or None when it did not resolve (an
    unknown name, or no answer within `within_s`)}.
  """
  found = {}
  names = []
  for host in dict.fromkeys(hosts):
    ip = _IpOf(host)
    if ip is None:
      names.append(host)
    else:
      found[host] = frozenset([ip])

  def _Lookup(name):
    try:
      infos = lookup(name, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
      return
    ips = frozenset(_IpOf(info[4][0]) or info[4][0] for info in infos)
    found[name] = ips or None

  threads = [threading.Thread(target=_Lookup, args=(name,), daemon=True,
                              name='resolve_host') for name in names]
  for thread in threads:
    thread.start()
  deadline = time.monotonic() + within_s
  for thread in threads:
    thread.join(max(0.0, deadline - time.monotonic()))
  found = dict(found)   # A late lookup writes to the old dict only.
  return {host: found.get(host) for host in dict.fromkeys(hosts)}


def _Endpoints(address, resolved):
  """The set of (IP or lowercase name, port) `address` reaches."""
  m = _HOST_PORT.match(address)
  host, port = m.group(1).strip('[]'), int(m.group(2))
  ips = resolved.get(host)
  return {(ip, port) for ip in ips} if ips else {(host.lower(), port)}


def _CheckCluster(cluster, source):
  """Checks the jobs and addresses of a cluster dict."""
  if not isinstance(cluster, dict) or not cluster:
    raise ConfigError(f'{source}: "cluster" must map job names to lists of '
                      f'host:port addresses; got {cluster!r}. E.g. '
                      f'{_EXAMPLE}.')
  for job, addresses in cluster.items():
    if job not in JOBS:
      raise ConfigError(f'{source}: job {job!r} is not one of '
                        f'{", ".join(map(repr, JOBS))}.{_Hint(job, JOBS)}')
    if not isinstance(addresses, list) or not addresses:
      raise ConfigError(f'{source}: job {job!r} must list at least one '
                        f'host:port address; got {addresses!r}.')
    for index, address in enumerate(addresses):
      _CheckAddress(source, job, index, address)
  _CheckDistinct(cluster, source)
  if len(cluster.get('chief', [])) > 1:
    raise ConfigError(f'{source}: job \'chief\' has '
                      f'{len(cluster["chief"])} tasks; a cluster has at most '
                      'one chief.')


def _CheckDistinct(cluster, source):
  """Raises unless every task has its own IP and port (names resolved by
  `ResolveHosts`; one that does not resolve is compared by its text)."""
  tasks = [(f'{job} {i}', a) for job, addresses in cluster.items()
           for i, a in enumerate(addresses)]
  resolved = ResolveHosts(
      [_HOST_PORT.match(a).group(1).strip('[]') for _, a in tasks])
  seen = {}   # (IP or name, port) -> (task, address)
  for task, address in tasks:
    endpoints = _Endpoints(address, resolved)
    for endpoint in sorted(endpoints):
      if endpoint in seen:
        first, spelt = seen[endpoint]
        host = f'[{endpoint[0]}]' if ':' in endpoint[0] else endpoint[0]
        alias = ('' if spelt == address else f' (as {spelt!r}, both '
                 f'{host}:{endpoint[1]})')
        raise ConfigError(f'{source}: address {address!r} is given twice, '
                          f'for {first}{alias} and {task}; each task needs '
                          'its own host:port.')
    for endpoint in endpoints:
      seen[endpoint] = (task, address)


def _CheckTask(cluster, task_type, index, type_name, index_name):
  """Checks this host's task against the cluster; names the fields as
  `type_name` and `index_name` (the flags, or TF_CONFIG's entries)."""
  if task_type in cluster:
    count = len(cluster[task_type])
  elif task_type == 'evaluator':
    count = 1   # Named by its task alone, as TensorFlow has it.
  else:
    raise ConfigError(f'{type_name}={task_type!r} is not a job of the '
                      f'cluster ({", ".join(map(repr, cluster))}).'
                      f'{_Hint(task_type, cluster)}')
  if isinstance(index, bool) or not isinstance(index, int):
    raise ConfigError(f'{index_name}={index!r} must be an int.')
  if not 0 <= index < count:
    raise ConfigError(f'{index_name}={index} is out of range: job '
                      f'{task_type!r} has {count} task(s), so the index is '
                      f'in [0, {count - 1}].')


def ParseClusterSpec(spec, task_type, task_index):
  """Lingvo's `--cluster_spec` ('worker=h:p,h:p@ps=h:p') as a TF_CONFIG dict.

  Raises:
    ConfigError: a malformed spec, or a task not in it.
  """
  cluster = {}
  for part in [p for p in spec.split('@') if p.strip()]:
    job, sep, hosts = part.partition('=')
    addresses = [h.strip() for h in hosts.split(',') if h.strip()]
    if not sep or not job.strip() or not addresses:
      raise ConfigError(f"--cluster_spec={spec!r}: {part!r} is not "
                        "'job=host:port[,host:port...]' (jobs separated by "
                        "'@').")
    if job.strip() in cluster:
      raise ConfigError(f'--cluster_spec={spec!r}: job {job.strip()!r} is '
                        'given twice; list its tasks once, separated by '
                        "','.")
    cluster[job.strip()] = addresses
  _CheckCluster(cluster, f'--cluster_spec={spec!r}')
  _CheckTask(cluster, task_type, task_index, '--task_type', '--task_index')
  return {'cluster': cluster, 'task': {'type': task_type,
                                       'index': task_index}}


def _ParseTfConfig(text):
  """The checked dict of $TF_CONFIG's text."""
  source = f'${TF_CONFIG}'
  try:
    config = json.loads(text)
  except json.JSONDecodeError as e:
    raise ConfigError(f'{source} is not JSON ({e}): {text[:200]!r}. E.g. '
                      f'{_EXAMPLE}.') from None
  if not isinstance(config, dict):
    raise ConfigError(f'{source} must be a JSON object; got {text[:200]!r}. '
                      f'E.g. {_EXAMPLE}.')
  for entry in ('cluster', 'task'):
    if entry not in config:
      raise ConfigError(f'{source} has no "{entry}" entry; it needs '
                        f'"cluster" and "task", e.g. {_EXAMPLE}.')
  _CheckCluster(config['cluster'], source)
  task = config['task']
  if not isinstance(task, dict) or 'type' not in task:
    raise ConfigError(f'{source}: "task" must be {{"type": <job>, "index": '
                      f'<int>}}; got {task!r}.')
  _CheckTask(config['cluster'], task['type'], task.get('index', 0),
             f'{source} task type', f'{source} task index')
  return config


def Read(cluster_spec='', task_type='', task_index=0, environ=None):
  """The multi-host configuration: --cluster_spec, else $TF_CONFIG, else None.

  Args:
    cluster_spec: the --cluster_spec flag ('' to read $TF_CONFIG).
    task_type: --task_type, with cluster_spec.
    task_index: --task_index, with cluster_spec.
    environ: the environment to read TF_CONFIG from (default os.environ).

  Returns:
    The TF_CONFIG dict, or None for a local run.

  Raises:
    ConfigError: the configuration cannot describe a cluster.
  """
  if cluster_spec:
    return ParseClusterSpec(cluster_spec, task_type, task_index)
  text = (os.environ if environ is None else environ).get(TF_CONFIG, '')
  if not text.strip():
    return None
  return _ParseTfConfig(text)


def IsChief(config):
  """Whether the task of `config` (Read's: a TF_CONFIG dict, or None for
  a local run) writes the logdir: the only host, the 'chief', or worker 0
  of a cluster without one."""
  if config is None:
    return True
  task = config['task']
  return task['type'] == 'chief' or (
      task['type'] == 'worker' and task.get('index', 0) == 0 and
      'chief' not in config['cluster'])
