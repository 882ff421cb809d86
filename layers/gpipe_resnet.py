"""ResNet image classifier, pipelined over a model split (GPipe).

He et al., 2016, "Deep Residual Learning for Image Recognition",
arXiv:1512.03385; Huang et al., 2019 (GPipe), arXiv:1811.06965.

The network is a sequence of *units* (layers/gpipe_units.py): the stem
(layers/resnet.py ResNetStem), the residual blocks (stage s has
stage_blocks[s] blocks of stage_dims[s] channels; the first block of every
stage but the first has stride 2) and the head (global average pooling and
a projection to the logits). `UnitsPipeline` cuts them into `splits`
stages of near-equal FLOPs on one image and runs them as the pipeline of
`pipeline_tpl` (layers/gpipe.py) over micro-batches, or, with pipeline_tpl
None, one after the other on the whole batch; FPropMeta gives the plan
(framework/pipeline/plan.py) the memory estimate, inspect and the planner
read.

Batch normalisation under micro-batches (layers/batch_norm.py): the stem
and the blocks are BatchStatsLayers; the statistics of every micro-batch
ride in the pipeline's state, keyed by unit ('stem', 'block3', ...), leave
it as [M, 2, dim] in micro-batch order (through the per-micro-batch loss
too, with a schedule that runs it inside the pipeline), and
`UpdateMovingStats` applies the M updates in order after the pipeline.
Every micro-batch is normalised with its own statistics. In inference
there are no stats: BN reads its moving statistics from theta.

Weight layout: the units are children `stem`, `blocks[i]` and `logits` of
this layer whatever the partition (variable paths do not depend on
`splits`); only their devices do.

Example:
  p = ResNet.Params().Set(name='net', image_size=[32, 32], input_dim=3,
                          stage_dims=[16, 32], stage_blocks=[1, 1],
                          num_classes=10, splits=2)
  p.stem_tpl.Set(dim=16, kernel=3, stride=1, max_pool=False)
  p.pipeline_tpl.num_micro_batches = 4
  with cluster:                                  # 2 devices per split
    net = p.Instantiate()
  logits, stats = net.FPropStats(net.theta, images)   # [b, 10]
  net.UpdateMovingStats(stats)                        # once per step
"""
from cadence.framework import base_layer
from cadence.framework import hyperparams
from cadence.framework import shapes
from cadence.framework import validation
from cadence.layers import batch_norm
from cadence.layers import conv
from cadence.layers import gpipe
from cadence.layers import gpipe_units
from cadence.layers import linear
from cadence.layers import resnet

NestedMap = base_layer.NestedMap
Shape = shapes.Shape


class ResNet(gpipe_units.UnitsPipeline, batch_norm.BatchStatsLayer):
  """Pipelined ResNet classifier; see the module docstring.

  FPropStats(theta, images [b, h, w, input_dim]) -> (logits [b,
  num_classes], stats); FProp returns the logits alone; FPropLossStats runs
  a per-micro-batch loss as the schedule needs (UnitsPipeline).
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('input_dim', 3, 'Channels of the images, an int > 0.')
    p.Define('image_size', [224, 224], 'Image [height, width]; the '
             'partition costs the units on it.')
    p.Define('stem_tpl', resnet.ResNetStem.Params(), 'The stem (dim, '
             'kernel, stride, max_pool); input_dim and bn_tpl are set here.')
    p.Define('stage_dims', [64, 128, 256, 512], 'Channels of each stage.')
    p.Define('stage_blocks', [3, 4, 6, 3], 'Residual blocks of each stage '
             '(ResNet-34: [3, 4, 6, 3]; ResNet-18: [2, 2, 2, 2]).')
    p.Define('num_classes', 1000, 'Classes, an int > 0.')
    p.Define('bn_tpl', batch_norm.BatchNormLayer.Params(), 'Every '
             'BatchNormLayer\'s settings (decay, epsilon).')
    p.Define('splits', 1, 'The partition into cells: an int K (K cells of '
             'near-equal FLOPs), or K-1 increasing unit indices where cells '
             '1.. start (unit 0: the stem; 1..N: the blocks; N+1: the head).')
    p.Define('pipeline_tpl', gpipe.PipeliningLayer.Params(), 'The '
             "pipeline's settings (num_micro_batches, remat, ...), or None: "
             'the cells run one after another on the whole batch.')
    return p

  # --- the units ---------------------------------------------------------------

  @classmethod
  def Units(cls, p):
    """The stem, block0.., and the head (pooling, then the logits)."""
    units = [gpipe_units.Unit('stem', [gpipe_units.Layer(
        'stem', p.stem_tpl.Copy().Set(input_dim=p.input_dim,
                                      bn_tpl=p.bn_tpl.Copy()))])]
    dim_in = p.stem_tpl.dim
    for s, (dim, n) in enumerate(zip(p.stage_dims, p.stage_blocks)):
      for b in range(n):
        i = len(units) - 1
        units.append(gpipe_units.Unit(f'block{i}', [gpipe_units.Layer(
            f'blocks[{i}]', resnet.ResidualBlock.Params().Set(
                input_dim=dim_in, output_dim=dim, stride=2 if s and not b
                else 1, bn_tpl=p.bn_tpl.Copy()))]))
        dim_in = dim
    units.append(gpipe_units.Unit('head', [
        gpipe_units.Layer('pool', conv.GlobalPoolingLayer.Params()),
        gpipe_units.Layer('logits', linear.ProjectionLayer.Params().Set(
            input_dim=dim_in, output_dim=p.num_classes))]))
    return units

  @classmethod
  def ExampleShapes(cls, p):
    return (Shape([1] + list(p.image_size) + [p.input_dim]),)

  @classmethod
  def SplitsRule(cls, p, num_units):
    return f'must be in [1, {num_units}] (the stem, the blocks and the head).'

  @classmethod
  def CheckParams(cls, p, owner):
    # The ResNet's own and bn_tpl's first: the units inherit them (and the
    # stem's bn_tpl is replaced by bn_tpl), so a bad value is named where
    # it was set.
    super().CheckParams(p, owner)
    if isinstance(p.bn_tpl, hyperparams.Params):
      base_layer.CheckBaseParams(validation.Owner(p.bn_tpl), p.bn_tpl)
    validation.CheckInt(owner, 'input_dim', p.input_dim)
    validation.CheckIntList(owner, 'image_size', p.image_size, 2)
    validation.CheckInt(owner, 'num_classes', p.num_classes)
    validation.CheckIntList(owner, 'stage_dims', p.stage_dims)
    validation.CheckIntList(owner, 'stage_blocks', p.stage_blocks,
                            len(p.stage_dims))
    pipe = p.pipeline_tpl
    gpipe_units.CheckPipelineTpl(owner, pipe, 'the ResNet')
    if pipe is not None:
      if pipe.batch_dim != 0:
        raise validation.Error(owner, 'pipeline_tpl.batch_dim',
                               pipe.batch_dim, 'must be 0: images are NHWC.')
      gpipe.PipeliningLayer.CheckParams(pipe, validation.Owner(pipe))
      cls.Bounds(p)

  # --- construction ------------------------------------------------------------

  def __init__(self, params):
    super().__init__(params)
    self.CheckParams(self.params, validation.Owner(self))
    self.BuildUnits()
    self.CreateUnitChildren()

  @classmethod
  def FPropMeta(cls, p, images):
    """The units' cost and plan (UnitsPipeline); checks the images'
    shape first."""
    shape = shapes.AsShape(images)
    owner = validation.Owner(p)
    cls.CheckParams(p, owner)   # Before the units and the pipeline read them.
    want = [None] + list(p.image_size) + [p.input_dim]
    if shape.rank != 4 or any(d is not None and w is not None and d != w
                              for d, w in zip(shape, want)):
      raise ValueError(f'{owner}: images shape {list(shape)} must be '
                       f'{want} (None: any batch).')
    return super().FPropMeta(p, shape)
