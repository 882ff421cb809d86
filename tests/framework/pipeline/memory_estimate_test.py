"""Tests for cadence.framework.pipeline.memory_estimate and the layers'
activation bytes (their cost records' act, act_weights, residuals)."""
import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework.nested_map import NestedMap
from cadence.framework.pipeline import memory_estimate
from cadence.framework.pipeline import schedules
from cadence.framework import shapes
from cadence.framework.testing import measure
from cadence.layers import combinators
from cadence.layers import conv
from cadence.layers import linear
from cadence.layers import normalization
from cadence.layers import resnet
from cadence.layers import softmax
from cadence.layers import transformer


def _Saved(params, input_specs, policy='all'):
  """The test kit's measurement (framework/testing/measure.py) of a layer's
  FProp on input_specs: SavedBytes by remat policy `policy`, or its
  ResidualBytes ('residuals'); of a softmax's output, its total_xent."""
  layer = params.Instantiate()

  def _Loss(out):
    return out.total_xent if isinstance(out, NestedMap) else out

  if policy == 'residuals':
    return measure.ResidualBytes(layer, input_specs, _Loss)
  return measure.SavedBytes(layer, input_specs, policy, _Loss)


def _Check(test, params, input_specs, meta, rtol=0.02):
  """act and act_weights of the cost record `meta` against SavedBytes,
  residuals against ResidualBytes."""
  for policy, got in (('all', meta.act),
                      ('weights', meta.act_weights),
                      ('residuals', meta.residuals)):
    with test.subTest(policy=policy):
      test.assertAllClose(_Saved(params, input_specs, policy), got,
                          rtol=rtol)


def _TwoCells1F1B():
  """Two cells' memory (bytes) under 1F1B, M=4, no remat."""
  cells = [NestedMap(act=100, act_weights=40, out=10, transient=30,
                     outside=0),
           NestedMap(act=200, act_weights=80, out=20, transient=50,
                     outside=0)]
  return NestedMap(schedule='1f1b', remat='never', num_micro_batches=4,
                   backward_window=1, cells=cells)


class ActBytesTest(tf.test.TestCase):
  """FPropMeta's act equals what TF's gradient really reads."""

  def testTransformerLayer(self):
    small, other = (4, 8, 16, 2, 32), (2, 12, 24, 4, 40)
    for (b, t, d, h, f), drops in [
        (small, (0, 0, 0)), (small, (0.1, 0, 0)), (small, (0, 0.1, 0)),
        (small, (0, 0, 0.1)), (other, (0.1, 0.1, 0.1))]:
      p = transformer.TransformerLayer.Params().Set(
          name='x', input_dim=d, hidden_dim=f, num_heads=h,
          mask_self_atten=True, residual_dropout_prob=drops[0],
          atten_dropout_prob=drops[1], relu_dropout_prob=drops[2])
      with self.subTest(shape=(b, t, d, h, f), drops=drops):
        # Small tensors ([b, t, 1] inverse deviations, a [t, t] mask) are
        # left out.
        _Check(self, p, [tf.TensorSpec([b, t, d])],
               p.cls.FPropMeta(p, shapes.Shape([b, t, d])))
    p.is_inference = True
    self.assertEqual(4 * (8 * b * t * d + b * h * t * t + b * t * f),
                     p.cls.FPropMeta(p, shapes.Shape([b, t, d])).act)

  def testResNetUnits(self):
    # Each kept tensor once (relu1's output is conv2's input; x is conv1's
    # and the projection's); act_outputs is the output the last relu's (or
    # max pool's) gradient reads. The stem's formula leaves out 7% without
    # its pool (a copy of its small input, [b, h, w, 3]).
    block, stem = resnet.ResidualBlock.Params, resnet.ResNetStem.Params
    for p, shape, rtol in [
        (block().Set(name='b', input_dim=16, output_dim=16), [8, 16, 16, 16],
         0.02),
        (block().Set(name='b', input_dim=16, output_dim=32), [8, 16, 16, 16],
         0.02),
        (block().Set(name='b', input_dim=16, output_dim=32, stride=2),
         [8, 16, 16, 16], 0.02),
        (stem().Set(name='s', input_dim=3, dim=16, kernel=3, stride=1,
                    max_pool=False), [8, 16, 16, 3], 0.1),
        (stem().Set(name='s', input_dim=3, dim=8, kernel=7, stride=2,
                    max_pool=True), [4, 32, 32, 3], 0.02)]:
      with self.subTest(layer=p.cls.__name__, shape=shape):
        meta = p.cls.FPropMeta(p, shapes.Shape(shape))
        _Check(self, p, [tf.TensorSpec(shape)], meta, rtol=rtol)
        self.assertEqual(meta.act_outputs,
                         4 * meta.out_shapes[0].num_elements())

  def testResNetChainCountsWhatBlocksPassOnOnce(self):
    # A block's output (its act_outputs, the final relu's) is the next
    # block's conv1 input (its act_inputs): one buffer, which the chained
    # record counts once, as the real gradient of the chain keeps it.
    block = resnet.ResidualBlock.Params
    subs = [resnet.ResNetStem.Params().Set(name='s', input_dim=3, dim=16,
                                           kernel=3, stride=1,
                                           max_pool=False),
            block().Set(name='b0', input_dim=16, output_dim=16),
            block().Set(name='b1', input_dim=16, output_dim=32, stride=2),
            block().Set(name='b2', input_dim=32, output_dim=32),
            conv.GlobalPoolingLayer.Params().Set(name='pool'),
            linear.ProjectionLayer.Params().Set(name='logits', input_dim=32,
                                                output_dim=10)]
    p = combinators.SequentialLayer.Params().Set(name='net', sub=subs)
    shape = [8, 16, 16, 3]
    meta = p.cls.FPropMeta(p, shapes.Shape(shape))
    _Check(self, p, [tf.TensorSpec(shape)], meta, rtol=0.03)
    parts, in_shape = [], shapes.Shape(shape)
    for sub in subs:
      parts.append(base_layer.FPropCost(sub, in_shape))
      in_shape = parts[-1].out_shapes[0]
    # Between the units: the stem's and the blocks' outputs, [8, 16, 16,
    # 16] twice, [8, 8, 8, 32] twice (the last into the pool).
    passed_on = 4 * 8 * (2 * 16 * 16 * 16 + 2 * 8 * 8 * 32)
    self.assertEqual(sum(c.act for c in parts) - passed_on, meta.act)
    self.assertEqual(sum(c.act_weights for c in parts) - passed_on,
                     meta.act_weights)
    self.assertEqual(meta.act_inputs, 4 * 8 * 16 * 16 * 3)   # The stem's x.

  def testNormAndSoftmax(self):
    for norm in (normalization.LayerNorm, normalization.RMSNorm):
      ln = norm.Params().Set(name='ln', input_dim=64)
      _Check(self, ln, [tf.TensorSpec([4, 8, 64])],
             ln.cls.FPropMeta(ln, shapes.Shape([4, 8, 64])))
    for smoothing, max_alloc in ((0.0, 0), (0.1, 0), (0.0, 256)):
      sm = softmax.SimpleFullSoftmax.Params().Set(
          name='sm', input_dim=128, num_classes=64, label_smoothing=smoothing,
          softmax_max_alloc=max_alloc)
      with self.subTest(smoothing=smoothing, max_alloc=max_alloc):
        # Left out: per row the labels, the log-normaliser (chunked).
        _Check(self, sm, [tf.TensorSpec([4, 8, 128]),
                          tf.TensorSpec([4, 8], tf.int32)],
               sm.cls.FPropMeta(sm, shapes.Shape([4, 8, 128])), rtol=0.04)

  def testBfloat16(self):
    # Activations of 2 bytes; a norm's normalised input and the
    # cross-entropy in float32; the weights cast to bfloat16 for the
    # products (their gradients read the cast copies).
    bf16 = dict(fprop_dtype=tf.bfloat16)
    for (b, t, d, h, f), drops in [((4, 8, 16, 2, 32), (0, 0, 0)),
                                   ((2, 12, 24, 4, 40), (0.1, 0.1, 0.1))]:
      p = transformer.TransformerLayer.Params().Set(
          name='x', input_dim=d, hidden_dim=f, num_heads=h,
          mask_self_atten=True, residual_dropout_prob=drops[0],
          atten_dropout_prob=drops[1], relu_dropout_prob=drops[2], **bf16)
      with self.subTest(shape=(b, t, d, h, f), drops=drops):
        _Check(self, p, [tf.TensorSpec([b, t, d], tf.bfloat16)],
               p.cls.FPropMeta(p, shapes.Shape([b, t, d])))
    p.is_inference = True
    self.assertEqual(
        2 * (6 * b * t * d + b * h * t * t + b * t * f + 4 * d * d +
             2 * d * f) + 2 * 4 * b * t * d,
        p.cls.FPropMeta(p, shapes.Shape([b, t, d])).act)
    ln = normalization.LayerNorm.Params().Set(name='ln', input_dim=64, **bf16)
    _Check(self, ln, [tf.TensorSpec([4, 8, 64], tf.bfloat16)],
           ln.cls.FPropMeta(ln, shapes.Shape([4, 8, 64])))
    for max_alloc in (0, 256):
      sm = softmax.SimpleFullSoftmax.Params().Set(
          name='sm', input_dim=128, num_classes=64,
          softmax_max_alloc=max_alloc, **bf16)
      with self.subTest(max_alloc=max_alloc):
        _Check(self, sm, [tf.TensorSpec([4, 8, 128], tf.bfloat16),
                          tf.TensorSpec([4, 8], tf.int32)],
               sm.cls.FPropMeta(sm, shapes.Shape([4, 8, 128])), rtol=0.04)

  def testUnknownBatch(self):
    p = transformer.TransformerLayer.Params().Set(
        name='x', input_dim=8, hidden_dim=16, num_heads=2)
    self.assertIsNone(p.cls.FPropMeta(p, shapes.Shape([None, 4, 8])).act)


class StageMemoryTest(tf.test.TestCase):

  def testKeptMicroBatches(self):
    k, m = 4, 8
    for schedule, remat, window, act, out in [
        ('gpipe', 'never', 1, [8] * 4, [8] * 4),
        ('gpipe', 'always', 1, [1] * 4, [8] * 4),
        ('gpipe', 'always', 2, [2] * 4, [8] * 4),
        ('gpipe', 'always', None, [8] * 4, [8] * 4),
        ('gpipe', 'except_last', 1, [1] * 4, [8] * 4),
        ('1f1b', 'never', 1, [4, 3, 2, 1], [4, 3, 2, 1]),
        ('1f1b', 'always', 1, [1] * 4, [4, 3, 2, 1]),
        ('1f1b', 'except_last', 1, [2, 2, 2, 1], [4, 3, 2, 1]),
        ('1f1b', 'selective', 1, [4, 3, 2, 1], [4, 3, 2, 1]),
        # ZB-H1 holds 1F1B's activations from F to B.
        ('zb_h1', 'never', 1, [4, 3, 2, 1], [4, 3, 2, 1]),
        ('zb_h1', 'always', 1, [1] * 4, [4, 3, 2, 1])]:
      with self.subTest(schedule=schedule, remat=remat, window=window):
        self.assertEqual((act, out), memory_estimate.KeptMicroBatches(
            schedule, remat, k, m, window))
    with self.assertRaisesRegex(ValueError, "schedule='2f2b'; expected one "
                                r"of \['gpipe', '1f1b', 'interleaved_1f1b', "
                                r"'zb_h1', 'zb_v', 'table'\]"):
      memory_estimate.KeptMicroBatches('2f2b', 'never', 2, 2)
    with self.assertRaisesRegex(ValueError, "remat='some'; expected"):
      memory_estimate.KeptMicroBatches('gpipe', 'some', 2, 2)

  def testStages(self):
    memory = _TwoCells1F1B()
    cells = memory.cells
    stages = memory_estimate.StageMemory(memory, [1000, 2000], [2000, 4000])
    # 1F1B: cell 0 keeps 2 micro-batches, cell 1 one; the gradients' sum.
    self.assertEqual(memory_estimate.Stage(1000, 2000, 1000, 2 * 110, 30),
                     stages[0])
    self.assertEqual(2000 + 4000 + 2000 + 220 + 50, stages[1].total)
    # Selective: act_weights of each micro-batch; a backward recomputes
    # the rest of one micro-batch's act (100 - 40) besides its transient.
    memory.remat = 'selective'
    stages = memory_estimate.StageMemory(memory, [1000, 2000], [2000, 4000])
    self.assertEqual(memory_estimate.Stage(1000, 2000, 1000, 2 * 50, 60 + 30),
                     stages[0])
    # GPipe with the loss outside: its moment wins when it is larger.
    cells[1].outside = 5000
    memory.schedule, memory.remat = 'gpipe', 'except_last'
    stages = memory_estimate.StageMemory(memory, [1000, 2000], [0, 0])
    # Cell 0's worst moment: its first backward, all 4 outputs waiting.
    self.assertEqual(memory_estimate.Stage(1000, 0, 1000, 100 + 4 * 10, 30),
                     stages[0])
    self.assertEqual(memory_estimate.Stage(2000, 0, 0, 200 + 4 * 20 + 5000,
                                           5000), stages[1])
    # Unpipelined: the peak is where the backward starts, before gradients.
    plain = NestedMap(schedule=None, remat=None, num_micro_batches=1,
                      backward_window=None, cells=cells[:1])
    self.assertEqual([memory_estimate.Stage(1000, 500, 0, 100, 30)],
                     memory_estimate.StageMemory(plain, [1000], [500]))

  def testFirstStageHoldsTheWholeBatchInput(self):
    # 1F1B, K=2, M=4, no remat: cell 0 runs F0 F1 B0 F2 B1 F3 B2 B3. Its
    # micro-batches are slices of one input buffer (7 bytes each): all 4
    # stay while any does, and each B's input gradient waits to be joined.
    memory = _TwoCells1F1B()
    plain = memory_estimate.Moments(memory, [0, 0], [0, 0])
    memory.input = 7
    moments = memory_estimate.Moments(memory, [0, 0], [0, 0])
    # F0: one micro-batch kept, the other 3 held by the buffer.
    self.assertEqual(110 + 3 * 7, moments[0][0].activations)
    # B3: one kept, 3 more in the buffer, 3 input gradients waiting.
    self.assertEqual(110 + 6 * 7, moments[-1][0].activations)
    # The other stage's inputs are transfers of their own.
    self.assertEqual([m[1] for m in plain], [m[1] for m in moments])

  def testOutputInActCountedOnceForKeptMicroBatches(self):
    # Cell 0 ends in a relu: its act (100) holds its output (10). 1F1B
    # keeps 2 micro-batches in flight on cell 0 and counts each output once;
    # GPipe (except_last) keeps one micro-batch's act with all 4 outputs.
    memory = _TwoCells1F1B()
    memory.cells[0].act_outputs = 10
    stages = memory_estimate.StageMemory(memory, [0, 0], [0, 0])
    self.assertEqual(2 * 100, stages[0].activations)
    memory.schedule, memory.remat = 'gpipe', 'except_last'
    stages = memory_estimate.StageMemory(memory, [0, 0], [0, 0])
    self.assertEqual(100 + 3 * 10, stages[0].activations)
    # 'selective' keeps act_weights, not the output: counted beside it.
    memory.schedule, memory.remat = '1f1b', 'selective'
    stages = memory_estimate.StageMemory(memory, [0, 0], [0, 0])
    self.assertEqual(2 * (40 + 10), stages[0].activations)

  def testSplitBackwardHoldsWhatWReadsUntilW(self):
    # ZB-H1, K=2, M=2, no remat; ticks [F00] [F01 F10] [B10] [B00 F11]
    # [W00 B11] [B01 W10] [W01 W11]. After a B its residuals (what W
    # reads) stay until the W; gradients exist from the first B or W on;
    # cell 1 holds B10's input gradient while B00 takes it, B11's while
    # B01 does (cell 0's out, 10).
    cells = [NestedMap(act=100, act_weights=40, residuals=50, out=10,
                       transient=30, outside=0),
             NestedMap(act=200, act_weights=80, residuals=90, out=20,
                       transient=50, outside=0)]
    memory = NestedMap(schedule='zb_h1', remat='never', num_micro_batches=2,
                       backward_window=1, cells=cells)
    moments = memory_estimate.Moments(memory, [1000, 2000], [0, 0])
    self.assertEqual(
        [[110, 0], [220, 220], [220, 220 + 2050], [220 + 1030, 310 + 10],
         [160 + 1030, 310 + 2050], [110 + 1030, 180 + 2050 + 10],
         [50 + 1030, 90 + 2050]],
        [[s.activations + s.grads + s.transient for s in m]
         for m in moments])
    self.assertEqual(
        memory_estimate.Stage(2000, 0, 2000, 310, 50),
        memory_estimate.StageMemory(memory, [1000, 2000], [0, 0])[1])

  def testDeviceMemoryOfStagesSharingDevices(self):
    cell = NestedMap(act=100, act_weights=40, residuals=50, out=10,
                     transient=30, outside=0)
    for schedule, k, d in (('zb_v', 4, 2), ('interleaved_1f1b', 4, 2),
                           ('zb_v', 2, 1), ('1f1b', 2, 2)):
      memory = NestedMap(schedule=schedule, remat='never',
                         num_micro_batches=4, backward_window=1,
                         num_devices=d, cells=[cell] * k)
      params, slots = [1000] * k, [500] * k
      with self.subTest(schedule=schedule, d=d):
        devices = memory_estimate.DeviceMemory(memory, params, slots)
        stages = memory_estimate.StageMemory(memory, params, slots)
        self.assertLen(devices, d)
        placed = schedules.StageDevices(schedule, k, d)
        for i, device in enumerate(devices):
          # A device's worst moment: at most its stages' own worst ones.
          mine = [s.total for s, sd in zip(stages, placed) if sd == i]
          self.assertLessEqual(device.total, sum(mine))
          self.assertGreaterEqual(device.total, max(mine))
        if d == 1:   # One device holds every stage: the shared memory.
          self.assertEqual(devices, [memory_estimate.SharedMemory(
              memory, params, slots)])
        if d == k:
          self.assertEqual(devices, stages)

  def testMomentsAndSharedMemory(self):
    # GPipe, K=2, M=2, no remat: ticks [F00] [F01 F10] [F11] (between the
    # phases) [B11] [B01 B10] [B00]; each cell's act 100, out 10. Cell 1
    # holds the input gradient of B11 while B01 takes it, and B10's while
    # B00 does (10 bytes each).
    cell = NestedMap(act=100, act_weights=100, out=10, transient=30,
                     outside=0)
    memory = NestedMap(schedule='gpipe', remat='never', num_micro_batches=2,
                       backward_window=1, cells=[cell, cell])
    moments = memory_estimate.Moments(memory, [1000, 1000], [0, 0])
    self.assertEqual([[1110, 1000], [1220, 1110], [1220, 1220],
                      [1220, 1220], [1220, 2250], [2250, 2150],
                      [2140, 2010]],
                     [[s.total for s in m] for m in moments])
    # Each cell's worst moment is a different tick; together, B01 and B10.
    self.assertEqual([memory_estimate.Stage(1000, 0, 1000, 220, 30)] * 2,
                     memory_estimate.StageMemory(memory, [1000] * 2, [0, 0]))
    self.assertEqual(memory_estimate.Stage(2000, 0, 2000, 340, 60),
                     memory_estimate.SharedMemory(memory, [1000] * 2, [0, 0]))
    # One cell: the shared memory is the stage's.
    for schedule in ('gpipe', '1f1b'):
      for remat in ('never', 'always', 'except_last', 'selective'):
        one = NestedMap(memory, schedule=schedule, remat=remat,
                        num_micro_batches=4, cells=[cell])
        self.assertEqual(
            memory_estimate.StageMemory(one, [1000], [500]),
            [memory_estimate.SharedMemory(one, [1000], [500])])


if __name__ == '__main__':
  tf.test.main()
