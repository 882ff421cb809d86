"""tf_config: $TF_CONFIG and --cluster_spec, parsed and checked.

Pure parsing (no TensorFlow in the module); every bad form is a
ConfigError naming the source, the value and the rule. The trainer's
real-process cases are rows of tests/trainer_bad_inputs_test.py. Host
names are resolved (within a bound) before addresses are compared.
"""
import json
import re
import socket
import time
import unittest

from cadence.framework.distribute import tf_config

_TWO = ['h0:2222', 'h1:2222']


def _Env(cluster=None, task=None):
  return {'TF_CONFIG': json.dumps({
      'cluster': {'worker': _TWO} if cluster is None else cluster,
      'task': {'type': 'worker', 'index': 1} if task is None else task})}


class TfConfigTest(unittest.TestCase):

  def testGoodConfigurations(self):
    self.assertIsNone(tf_config.Read(environ={}))
    self.assertIsNone(tf_config.Read(environ={'TF_CONFIG': '  '}))
    config = tf_config.Read(environ=_Env())
    self.assertEqual({'cluster': {'worker': _TWO},
                      'task': {'type': 'worker', 'index': 1}}, config)
    ps = tf_config.Read(environ=_Env(
        {'chief': ['c:1'], 'worker': ['[::1]:2'], 'ps': ['p:3']},
        {'type': 'ps', 'index': 0}))
    self.assertEqual('ps', ps['task']['type'])
    # An evaluator is named by its task, not listed in the cluster.
    self.assertIsNotNone(tf_config.Read(environ=_Env(
        task={'type': 'evaluator', 'index': 0})))
    spec = tf_config.Read('worker=h0:2222,h1:2222@ps=p:1', 'ps', 0)
    self.assertEqual({'worker': _TWO, 'ps': ['p:1']}, spec['cluster'])

  def testEachBadFormNamesItsSourceValueAndRule(self):
    cases = [
        (dict(environ={'TF_CONFIG': '{"cluster": '}),
         r'^\$TF_CONFIG is not JSON \(Expecting value'),
        (dict(environ={'TF_CONFIG': '[1]'}),
         r'^\$TF_CONFIG must be a JSON object; got'),
        (dict(environ={'TF_CONFIG': '{"task": {"type": "worker"}}'}),
         r'^\$TF_CONFIG has no "cluster" entry'),
        (dict(environ={'TF_CONFIG': '{"cluster": {"worker": ["h:1"]}}'}),
         r'^\$TF_CONFIG has no "task" entry'),
        (dict(environ=_Env(cluster={})),
         r'^\$TF_CONFIG: "cluster" must map job names to lists'),
        (dict(environ=_Env(cluster={'worker': 'h0:2222'})),
         r"^\$TF_CONFIG: job 'worker' must list at least one host:port "
         r"address; got 'h0:2222'\.$"),
        (dict(environ=_Env(cluster={'wroker': _TWO})),
         r"^\$TF_CONFIG: job 'wroker' is not one of .* Did you mean "
         r"'worker'\?$"),
        (dict(environ=_Env(cluster={'worker': ['h0:2222', 'h0:2222']})),
         r"^\$TF_CONFIG: address 'h0:2222' is given twice, for worker 0 and "
         r'worker 1; each task needs its own host:port\.$'),
        (dict(environ=_Env(cluster={'worker': ['h0:0', 'h1:2']})),
         r"^\$TF_CONFIG: worker 0 address 'h0:0' must be 'host:port' with a "
         r'port in \[1, 65535\]'),
        (dict(environ=_Env(cluster={'worker': ['h0 :1', 'h1:2']})),
         r"worker 0 address 'h0 :1' must be 'host:port'"),
        (dict(environ=_Env(cluster={'chief': ['c:1', 'c:2'],
                                    'worker': ['w:1']})),
         r"^\$TF_CONFIG: job 'chief' has 2 tasks; a cluster has at most one "
         r'chief\.$'),
        (dict(environ=_Env(task='worker')),
         r'^\$TF_CONFIG: "task" must be \{"type": <job>, "index": <int>\}'),
        (dict(environ=_Env(task={'type': 'ps', 'index': 0})),
         r"^\$TF_CONFIG task type='ps' is not a job of the cluster "
         r"\('worker'\)\.$"),
        (dict(environ=_Env(task={'type': 'worker', 'index': '1'})),
         r"^\$TF_CONFIG task index='1' must be an int\.$"),
        (dict(environ=_Env(task={'type': 'worker', 'index': -1})),
         r"^\$TF_CONFIG task index=-1 is out of range: job 'worker' has 2 "
         r'task\(s\), so the index is in \[0, 1\]\.$'),
        (dict(cluster_spec='worker=h0:1@worker=h1:1', task_type='worker'),
         r"^--cluster_spec='worker=h0:1@worker=h1:1': job 'worker' is given "
         r'twice'),
        (dict(cluster_spec='worker=', task_type='worker'),
         r"^--cluster_spec='worker=': 'worker=' is not 'job=host:port"),
        (dict(cluster_spec='worker=h0:1', task_type='worker', task_index=1),
         r"^--task_index=1 is out of range: job 'worker' has 1 task\(s\), so "
         r'the index is in \[0, 0\]\.$'),
        (dict(cluster_spec='worker=h0:1', task_type='workr'),
         r"^--task_type='workr' is not a job of the cluster \('worker'\)\. "
         r"Did you mean 'worker'\?$"),
    ]
    for kwargs, regex in cases:
      with self.subTest(**{k: str(v) for k, v in kwargs.items()}):
        with self.assertRaisesRegex(tf_config.ConfigError, regex):
          tf_config.Read(**kwargs)


class ResolvedAddressesTest(unittest.TestCase):
  """Two spellings of one IP and port are one address; a name that does
  not resolve (yet) is compared by its text, within a bound."""

  def testSpellingsOfOneAddressAreRefusedNamingBoth(self):
    cases = [
        (['localhost:2222', '127.0.0.1:2222'], 'worker 0', 'localhost:2222',
         '127.0.0.1:2222', '127.0.0.1:2222'),
        (['[::1]:7', '[0:0::1]:7'], 'worker 0', '[::1]:7', '[0:0::1]:7',
         r'\[::1\]:7'),
        (['[::ffff:127.0.0.1]:7', 'h1:7', '127.0.0.1:7'], 'worker 0',
         '[::ffff:127.0.0.1]:7', '127.0.0.1:7', '127.0.0.1:7'),
    ]
    for addresses, first, spelt, again, endpoint in cases:
      with self.subTest(addresses=addresses):
        with self.assertRaisesRegex(
            tf_config.ConfigError,
            rf"^\$TF_CONFIG: address '{re.escape(again)}' is given twice, "
            rf"for {first} \(as '{re.escape(spelt)}', both {endpoint}\) and "
            r'worker \d; each task needs its own host:port\.$'):
          tf_config.Read(environ=_Env(cluster={'worker': addresses}))

  def testDifferentPortsOrUnresolvedNamesPass(self):
    for addresses in (['localhost:2222', '127.0.0.1:2223'],
                      ['h0:2222', 'h1:2222'],   # Not resolvable here.
                      ['no-such-host.invalid:1', 'localhost:1']):
      with self.subTest(addresses=addresses):
        config = tf_config.Read(environ=_Env(cluster={'worker': addresses}))
        self.assertEqual(addresses, config['cluster']['worker'])
    # An unresolved name is compared by its text (host names ignore case).
    with self.assertRaisesRegex(
        tf_config.ConfigError, r"^\$TF_CONFIG: address 'H0:1' is given "
        r"twice, for worker 0 \(as 'h0:1', both h0:1\) and worker 1;"):
      tf_config.Read(environ=_Env(cluster={'worker': ['h0:1', 'H0:1']}))

  def testResolutionIsBounded(self):
    calls = []

    def _Lookup(name, port, type):   # pylint: disable=redefined-builtin
      calls.append((name, port, type))
      if name == 'slow':
        time.sleep(5)   # A DNS server that does not answer.
      if name == 'gone':
        raise socket.gaierror(-2, 'Name or service not known')
      return [(socket.AF_INET, type, 6, '', ('10.0.0.7', 0)),
              (socket.AF_INET6, type, 6, '', ('::ffff:10.0.0.8', 0, 0, 0))]

    start = time.monotonic()
    resolved = tf_config.ResolveHosts(
        ['slow', 'gone', 'h0', '10.0.0.9', '::1', 'h0'], within_s=0.3,
        lookup=_Lookup)
    elapsed = time.monotonic() - start
    self.assertEqual({'slow': None, 'gone': None,
                      'h0': frozenset(['10.0.0.7', '10.0.0.8']),
                      '10.0.0.9': frozenset(['10.0.0.9']),
                      '::1': frozenset(['::1'])}, resolved)
    self.assertGreaterEqual(elapsed, 0.3)
    self.assertLess(elapsed, 2.0)
    # IP literals are not looked up; each name once, the lookups at once.
    self.assertCountEqual(['slow', 'gone', 'h0'], [c[0] for c in calls])

  def testLocalNamesResolveFast(self):
    start = time.monotonic()
    resolved = tf_config.ResolveHosts(['localhost', '127.0.0.1'])
    self.assertLess(time.monotonic() - start, 0.45)   # The bound is 0.5 s.
    self.assertIn('127.0.0.1', resolved['localhost'])
    self.assertEqual(frozenset(['127.0.0.1']), resolved['127.0.0.1'])


if __name__ == '__main__':
  unittest.main()
