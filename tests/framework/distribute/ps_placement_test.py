"""PsPlacement: least-loaded vs round-robin placement on 2 parameter servers.

One subprocess (ParameterServerStrategy connects the process to its
cluster, which a test process must not be) starts 2 parameter servers and a
worker in process and builds, under each policy, a 64 -> 64 -> 64 -> 1
FeedForwardNet (variables created w, b, w, b, ...: round robin puts every
big matrix on server 0) and its Adam slots. It reports each variable's
server and the placement's logged bytes.
"""
import json
import textwrap

import tensorflow as tf

from cadence.framework.distribute import ps_placement
from cadence.tests import test_utils

_SCRIPT = textwrap.dedent("""
    import json, sys
    import tensorflow as tf
    from cadence.framework.distribute import ps_placement
    from cadence.framework import optimizer
    from cadence.layers import linear

    cluster = json.loads(sys.argv[1])
    spec = tf.train.ClusterSpec(cluster)
    servers = [tf.distribute.Server(spec, job_name=job, task_index=i,
                                    protocol='grpc')
               for job in ('ps', 'worker') for i in range(len(cluster[job]))]
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        tf.distribute.cluster_resolver.SimpleClusterResolver(
            spec, task_type='chief', task_id=0, rpc_layer='grpc'))
    out = {}
    for policy in ('round_robin', 'least_loaded'):
      with strategy.scope():
        placement = ps_placement.PsPlacement(strategy, policy, num_ps=2)
        with placement.Scope():
          net = linear.FeedForwardNet.Params().Set(
              name=policy, input_dim=64, hidden_layer_dims=[64, 64, 1],
              activation=['RELU', 'RELU', 'NONE']).Instantiate()
          opt = optimizer.Adam.Params().Instantiate()
          opt.Build(net.vars.FlattenItems())
      model = {k: [ps_placement.PsIndex(v), ps_placement.VariableBytes(v)]
               for k, v in net.vars.FlattenItems()}
      slots = {k: [[ps_placement.PsIndex(s), ps_placement.VariableBytes(s)]
                   for s in opt.Slots(v).values()]
               for k, v in net.vars.FlattenItems()}
      counter = [ps_placement.PsIndex(opt.num_updates),
                 ps_placement.VariableBytes(opt.num_updates)]
      out[policy] = dict(model=model, slots=slots, counter=counter,
                         logged=placement.bytes, report=placement.Report())
    print(json.dumps(out))
""")


def _BytesPerServer(placed):
  """[bytes on ps 0, bytes on ps 1] of {name: [ps index, bytes]}."""
  per_ps = [0, 0]
  for ps, size in placed:
    per_ps[ps] += size
  return per_ps


class PsPlacementTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cluster = test_utils.LocalCluster(chief=1, ps=2, worker=1)
    proc = test_utils.RunPython(_SCRIPT, json.dumps(cluster), timeout=300)
    cls.result = json.loads(proc.stdout.strip().splitlines()[-1])

  def testLeastLoadedBalancesWhereRoundRobinDoesNot(self):
    largest = 64 * 64 * 4
    rr = self.result['round_robin']['model']
    ll = self.result['least_loaded']['model']
    self.assertEqual(largest, max(size for _, size in ll.values()))
    rr_bytes = _BytesPerServer(rr.values())
    ll_bytes = _BytesPerServer(ll.values())
    # Round robin: all three matrices on one server, the biases on the other.
    self.assertGreater(abs(rr_bytes[0] - rr_bytes[1]), largest)
    self.assertEqual(sum(rr_bytes), sum(ll_bytes))
    self.assertLessEqual(abs(ll_bytes[0] - ll_bytes[1]), largest)
    self.assertLess(abs(ll_bytes[0] - ll_bytes[1]),
                    abs(rr_bytes[0] - rr_bytes[1]))

  def testSlotsLiveBesideTheirVariable(self):
    for policy, result in self.result.items():
      for name, (ps, size) in result['model'].items():
        with self.subTest(policy=policy, variable=name):
          self.assertEqual([[ps, size], [ps, size]], result['slots'][name])

  def testLoggedBytesAreTheVariablesOnEachServer(self):
    for policy, result in self.result.items():
      with self.subTest(policy=policy):
        placed = list(result['model'].values()) + [result['counter']] + [
            slot for slots in result['slots'].values() for slot in slots]
        self.assertEqual(_BytesPerServer(placed), result['logged'])
        b0, b1 = result['logged']
        self.assertIn(f'{policy} placement on 2 parameter server(s): ps 0 '
                      f'{b0:,} bytes', result['report'])
        self.assertIn(f'ps 1 {b1:,} bytes', result['report'])

  def testUnknownPolicy(self):
    with self.assertRaisesRegex(ValueError, r"policy='greedy' must be one of "
                                r'least_loaded, round_robin'):
      ps_placement.PsPlacement(None, 'greedy', num_ps=2)


if __name__ == '__main__':
  tf.test.main()
