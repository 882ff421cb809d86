"""Tests for cadence.layers.gpipe_partition: partitioning and cells."""

import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import shapes
from cadence.layers import combinators
from cadence.layers import gpipe_partition as gpipe
from cadence.layers import linear

Shape = shapes.Shape


class PartitionSequentialLayersTest(tf.test.TestCase):

  def _Proj(self, name, i, o):
    return linear.ProjectionLayer.Params().Set(name=name, input_dim=i,
                                               output_dim=o)

  def testFlattensNestsAndBalancesFlops(self):
    inner = combinators.SequentialLayer.Params().Set(
        name='inner', repeat=2, sub=[self._Proj('a', 8, 8)])
    fe = combinators.FeatureExtractionLayer.Params().Set(
        name='fe', sub=[self._Proj('b', 8, 32), self._Proj('c', 32, 8)])
    outer = combinators.SequentialLayer.Params().Set(
        name='outer', sub=[inner, fe, self._Proj('d', 8, 8)])
    with self.assertLogs('absl', level='INFO') as logs:
      cells = gpipe.PartitionSequentialLayers(outer, 2, Shape([4, 8]))
    names = [[s.name for s in c.sub] for c in cells]
    self.assertEqual(['cell0', 'cell1'], [c.name for c in cells])
    flat = sum(names, [])
    self.assertEqual(['inner_a_0', 'inner_a_1', 'b', 'c', 'd'], flat)
    # FLOPs: a, a, d ~ 8*8; b, c ~ 8*32: the optimal cut is after b.
    flops = [s.cls.FPropMeta(s, Shape([4, s.input_dim])).flops
             for c in cells for s in c.sub]
    cut = len(names[0])
    self.assertEqual(gpipe.BalancedPartition(flops, 2)[1], cut)
    self.assertEqual(3, cut)
    self.assertLen(logs.output, 2)
    self.assertRegex(logs.output[0], r'cell 0: layers 0\.\.2 \(3\), '
                     r'\d+\.\d% of \d+ FLOPs')
    # The cells compute what the nest computes.
    seq = outer.Copy().Set(name='outer').Instantiate()
    x = tf.random.normal([4, 8])
    y = x
    built = [c.Instantiate() for c in cells]
    for c in built:
      for name, child in c.children.items():
        child_src = dict(zip(flat, [
            seq.sub[0].sub[0], seq.sub[0].sub[1], seq.sub[1].children.b,
            seq.sub[1].children.c, seq.sub[2]]))[name]
        for v, src in zip(child.vars.Flatten(), child_src.vars.Flatten()):
          v.assign(src)
      y = c(y)
    self.assertAllClose(seq(x), y, atol=1e-6)

  def testMeasuredBalancesWhatFlopsUnderstate(self):
    # Layer 0's FPropMeta counts its projection only, not its 200
    # elementwise ops: by FLOPs all four layers cost the same (cut 2 + 2);
    # by measured time layer 0 costs more than the other three together.
    class Heavy(linear.ProjectionLayer):

      def FProp(self, theta, inputs):
        y = super().FProp(theta, inputs)
        for _ in range(200):
          y = tf.sin(y) * 0.9
        return y

    layers = ([Heavy.Params().Set(name='heavy', input_dim=64, output_dim=64)]
              + [self._Proj(f'p{i}', 64, 64) for i in range(3)])
    cuts = {}
    for cost in gpipe.COSTS:
      with self.assertLogs('absl', level='INFO') as logs:
        cells = gpipe.PartitionSequentialLayers(layers, 2, Shape([256, 64]),
                                                cost=cost)
      cuts[cost] = [len(c.sub) for c in cells]
      if cost == 'measured':   # Time shares beside the FLOP shares.
        self.assertRegex(logs.output[0], r'cell 0: layers 0\.\.0 \(1\), '
                         r'25\.0% of \d+ FLOPs, \d+\.\d% of [\d.]+ ms '
                         'measured')
    self.assertEqual({'flops': [2, 2], 'measured': [1, 3]}, cuts)
    with self.assertRaisesRegex(
        ValueError, "PartitionSequentialLayers: cost='time' must be one of "
        "'flops', 'measured'"):
      gpipe.PartitionSequentialLayers(layers, 2, Shape([256, 64]),
                                      cost='time')

  def testDuplicateNamesAreMadeUnique(self):
    cells = gpipe.PartitionSequentialLayers(
        [self._Proj('p', 4, 4)] * 3, 3, Shape([2, 4]))
    self.assertEqual([['p_0'], ['p_1'], ['p_2']],
                     [[s.name for s in c.sub] for c in cells])

  def testMorePartitionsThanLayers(self):
    with self.assertRaisesRegex(
        ValueError, r'num_partitions=4 must be an int in \[1, 3\]: the model '
        r'has 3 layers'):
      gpipe.PartitionSequentialLayers([self._Proj(f'p{i}', 4, 4)
                                       for i in range(3)], 4, Shape([2, 4]))

  def testLayerWithoutFPropMeta(self):
    class NoMeta(base_layer.BaseLayer):
      pass

    with self.assertRaisesRegex(
        ValueError, r"layer 1 \(NoMeta 'bad'\) has no FPropMeta.*inputs "
        r'\[\[2, 4\]\]'):
      gpipe.PartitionSequentialLayers(
          [self._Proj('p', 4, 4), NoMeta.Params().Set(name='bad')], 2,
          Shape([2, 4]))


if __name__ == '__main__':
  tf.test.main()
