"""ResNet image classifier, pipelined over a model split (GPipe).

He et al., 2016, "Deep Residual Learning for Image Recognition",
arXiv:1512.03385; Huang et al., 2019 (GPipe), arXiv:1811.06965.

The network is a sequence of *units*: the stem (layers/resnet.py
ResNetStem), the residual blocks (stage s has stage_blocks[s] blocks of
stage_dims[s] channels; the first block of every stage but the first has
stride 2) and the head (global average pooling and a projection to the
logits). The units are cut into `splits` cells of near-equal FLOPs
(`BalancedPartition`); the cells run as the pipeline of `pipeline_tpl`
(layers/gpipe.py) over micro-batches, or, with pipeline_tpl None, one
after the other on the whole batch.

Batch normalisation under micro-batches (layers/batch_norm.py): the state
passed between cells is a NestedMap(x=activations, stats=...). Each cell
adds the batch statistics of its units' BatchNormLayers to `stats`, keyed
by unit ('stem', 'block3', ...) and BN child, each [1, 2, dim] (a batch
dim of 1), and passes the earlier cells' stats on. The pipeline
concatenates the last cell's outputs over micro-batches, so every stats
leaf comes out [M, 2, dim] in micro-batch order: `FPropStats` returns it,
and `UpdateMovingStats` applies the M updates in order after the
pipeline. Every micro-batch is normalised with its own statistics. In
inference there are no stats: BN reads its moving statistics from theta.

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
import functools

import tensorflow as tf

from cadence.framework import base_layer
from cadence.framework import hyperparams
from cadence.framework.pipeline import schedules
from cadence.framework import shapes
from cadence.framework import validation
from cadence.layers import batch_norm
from cadence.layers import conv
from cadence.layers import gpipe
from cadence.layers import linear
from cadence.layers import resnet

NestedMap = base_layer.NestedMap
Shape = shapes.Shape


def _StatsShapes(unit_p):
  """NestedMap of the [1, 2, dim] stats shapes of one unit (None: none)."""
  if issubclass(unit_p.cls, resnet.ResNetStem):
    return NestedMap(bn=Shape([1, 2, unit_p.dim]))
  if issubclass(unit_p.cls, resnet.ResidualBlock):
    names = ['bn1', 'bn2'] + (
        ['proj_bn'] if unit_p.cls.HasProjection(unit_p) else [])
    return NestedMap({n: Shape([1, 2, unit_p.output_dim]) for n in names})
  return None


class ResNet(gpipe.SplitCells, batch_norm.BatchStatsLayer):
  """Pipelined ResNet classifier; see the module docstring.

  FPropStats(theta, images [b, h, w, input_dim]) -> (logits [b,
  num_classes], stats); FProp returns the logits alone.
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

  # --- structure from params ---------------------------------------------------

  @classmethod
  def UnitParams(cls, p):
    """[(name, params)] of the units: stem, block0.., head (params None)."""
    units = [('stem', p.stem_tpl.Copy().Set(
        name='stem', input_dim=p.input_dim, bn_tpl=p.bn_tpl.Copy()))]
    dim_in = p.stem_tpl.dim
    for s, (dim, n) in enumerate(zip(p.stage_dims, p.stage_blocks)):
      for b in range(n):
        units.append((f'block{len(units) - 1}',
                      resnet.ResidualBlock.Params().Set(
                          name='blocks', input_dim=dim_in, output_dim=dim,
                          stride=2 if s and not b else 1,
                          bn_tpl=p.bn_tpl.Copy())))
        dim_in = dim
    units.append(('head', None))
    return units

  @classmethod
  def _HeadParams(cls, p):
    last = p.stage_dims[-1] if p.stage_dims else p.stem_tpl.dim
    return (conv.GlobalPoolingLayer.Params().Set(name='pool'),
            linear.ProjectionLayer.Params().Set(
                name='logits', input_dim=last, output_dim=p.num_classes))

  @classmethod
  def CheckParams(cls, p, owner):
    validation.CheckInt(owner, 'input_dim', p.input_dim)
    validation.CheckIntList(owner, 'image_size', p.image_size, 2)
    validation.CheckInt(owner, 'num_classes', p.num_classes)
    validation.CheckIntList(owner, 'stage_dims', p.stage_dims)
    validation.CheckIntList(owner, 'stage_blocks', p.stage_blocks,
                            len(p.stage_dims))
    pipe = p.pipeline_tpl
    if pipe is not None:
      if not (isinstance(pipe, hyperparams.InstantiableParams) and
              issubclass(pipe.cls, gpipe.PipeliningLayer)):
        raise validation.Error(owner, 'pipeline_tpl', getattr(pipe, 'cls',
                                                              pipe),
                               'must be a PipeliningLayer.Params() or None.')
      for field in ('cell_tpl', 'before_tpl'):
        if pipe.Get(field):
          raise validation.Error(owner, f'pipeline_tpl.{field}',
                                 pipe.Get(field), 'must stay empty: the '
                                 'ResNet gives the pipeline its cells.')
      if pipe.batch_dim != 0:
        raise validation.Error(owner, 'pipeline_tpl.batch_dim',
                               pipe.batch_dim, 'must be 0: images are NHWC.')
      gpipe.PipeliningLayer.CheckParams(pipe, validation.Owner(pipe))
      if schedules.LossInside(pipe.schedule):
        raise validation.Error(
            owner, 'pipeline_tpl.schedule', pipe.schedule,
            f'must be {schedules.DEFAULT!r} (or another schedule that runs '
            'every forward first): the ResNet does not run its loss inside '
            'the pipeline (FPropLoss), which this schedule needs.')
    cls.Boundaries(p)

  @classmethod
  def UnitMetas(cls, p, images):
    """Per unit NestedMap(flops, out_shapes, act_bytes) on `images`."""
    shape, out = shapes.AsShape(images), []
    for _, unit_p in cls.UnitParams(p):
      if unit_p is None:
        pool_p, logits_p = [base_layer.InheritParams(p, s)
                            for s in cls._HeadParams(p)]
        pool = pool_p.cls.FPropMeta(pool_p, shape)
        logits = logits_p.cls.FPropMeta(logits_p, pool.out_shapes[0])
        meta = NestedMap(
            flops=shapes.Add(pool.flops, logits.flops),
            out_shapes=logits.out_shapes,
            act_bytes=shapes.Mul(4, shapes.Add(
                shape.num_elements(), pool.out_shapes[0].num_elements())))
      else:
        unit_p = base_layer.InheritParams(p, unit_p)
        meta = unit_p.cls.FPropMeta(unit_p, shape)
      out.append(meta)
      shape = meta.out_shapes[0]
    return out

  @classmethod
  def Boundaries(cls, p):
    """The K + 1 unit boundaries [0, b_1, ..., U] that `splits` defines
    (an int K: K cells of near-equal FLOPs on one image)."""
    n = len(cls.UnitParams(p))
    splits = gpipe.StageSplits(p.splits, p.pipeline_tpl)
    costs = [1] * n
    if validation.IsInt(splits) and 1 <= splits <= n:
      one = Shape([1] + list(p.image_size) + [p.input_dim])
      costs = [m.flops for m in cls.UnitMetas(p, one)]
    return gpipe.SplitBoundaries(
        validation.Owner(p), splits, costs, 'unit',
        f'must be in [1, {n}] (the stem, the blocks and the head).')

  # --- construction ------------------------------------------------------------

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CheckParams(p, validation.Owner(self))
    self._bounds = self.Boundaries(p)
    k = len(self._bounds) - 1
    if p.pipeline_tpl is not None:
      pipe = self.CreateChild('pipeline', p.pipeline_tpl.Copy().Set(
          nested_map_fprop=True))
      pipe.CheckNumCells(k)
      cell_devices = pipe.StageDevices(k)
    else:
      cell_devices = [None] * k
    units = self.UnitParams(p)
    device = [cell_devices[c] for c in range(k)
              for _ in range(self._bounds[c], self._bounds[c + 1])]
    self.CreateChild('stem', units[0][1], device=device[0])
    self.CreateChildren('blocks', [u for _, u in units[1:-1]],
                        devices=device[1:-1])
    pool_p, logits_p = self._HeadParams(p)
    self.CreateChild('pool', pool_p)
    self.CreateChild('logits', logits_p, device=device[-1])
    self._unit_names = [name for name, _ in units]

  # --- computation -------------------------------------------------------------

  def _UnitTheta(self, theta, u):
    if u == 0:
      return theta.stem
    if u == len(self._unit_names) - 1:
      return theta.logits
    return theta.blocks[u - 1]

  def _RunUnit(self, u, theta, x):
    """(x, stats or None) of unit u on x."""
    if u == 0:
      return self.stem.FPropStats(theta, x)
    if u == len(self._unit_names) - 1:
      x = self.pool.FProp(NestedMap(), x)
      return self.logits.FProp(theta, x), None
    return self.blocks[u - 1].FPropStats(theta, x)

  def _CellFProp(self, c, theta, state):
    """Cell c on NestedMap(x[, stats]): its units, their stats added."""
    x = state.x
    stats = NestedMap(state.get('stats') or {})
    for u in range(self._bounds[c], self._bounds[c + 1]):
      x, unit_stats = self._RunUnit(u, theta[f'u{u}'], x)
      if unit_stats is not None:   # [2, dim] -> [1, 2, dim], no gradient.
        stats[self._unit_names[u]] = unit_stats.Transform(
            lambda s: tf.stop_gradient(s)[tf.newaxis])
    out = NestedMap(x=x)
    if stats:
      out.stats = stats
    return out

  def _CellMeta(self, c, state):
    """FPropMeta of cell c on NestedMap(x[, stats]) shapes."""
    p = self.params
    metas = self.UnitMetas(p, Shape([state.x[0]] + list(p.image_size) +
                                    [p.input_dim]))
    stats = NestedMap(state.get('stats') or {})
    flops = 0
    units = self.UnitParams(p)
    for u in range(self._bounds[c], self._bounds[c + 1]):
      flops = shapes.Add(flops, metas[u].flops)
      unit_stats = _StatsShapes(units[u][1]) if units[u][1] else None
      if unit_stats is not None and not p.is_inference:
        stats[units[u][0]] = unit_stats
    out = NestedMap(x=metas[self._bounds[c + 1] - 1].out_shapes[0])
    if stats:
      out.stats = stats
    return NestedMap(flops=flops, out_shapes=(out,))

  def _Cells(self, theta):
    cells = []
    for c in range(self.num_cells):
      th = NestedMap({f'u{u}': self._UnitTheta(theta, u)
                      for u in range(self._bounds[c], self._bounds[c + 1])})
      cells.append(gpipe.PipelineCell(
          fprop=functools.partial(self._CellFProp, c), theta=th,
          meta=functools.partial(self._CellMeta, c)))
    return cells

  @tf.autograph.experimental.do_not_convert
  def FPropStats(self, theta, images):
    """The logits and the micro-batches' BN statistics.

    Args:
      theta: this layer's theta (its step seed, if any, seeds the
        micro-batches).
      images: [batch, height, width, input_dim], float.

    Returns:
      (logits [batch, num_classes], stats: NestedMap unit -> BN child ->
      [M, 2, dim] per micro-batch (mean, variance) in order (M = 1
      unpipelined); None with is_inference). Pass stats to
      UpdateMovingStats.
    """
    cells = self._Cells(theta)
    state = NestedMap(x=self.CastToFPropDtype(images))
    if self.params.pipeline_tpl is None:
      for cell in cells:
        state = cell.fprop(cell.theta, state)
    else:
      state = self.pipeline.FPropCells(
          cells, state, step_seed=theta.get(base_layer.STEP_SEED_KEY))
    return state.x, state.get('stats')

  def UpdateMovingStats(self, stats):
    """Applies FPropStats' stats: each BN's moving averages, one update per
    micro-batch in order, on its own device. Once per training step."""
    for u, name in enumerate(self._unit_names):
      if stats and name in stats:
        layer = self.stem if u == 0 else self.blocks[u - 1]
        layer.UpdateMovingStats(stats[name])

  # --- static costs ------------------------------------------------------------

  @classmethod
  def CellFlops(cls, p, images):
    """Forward FLOPs of each cell on `images`, a list."""
    bounds = cls.Boundaries(p)
    metas = cls.UnitMetas(p, images)
    return [sum(m.flops for m in metas[a:b]) if all(
        m.flops is not None for m in metas[a:b]) else None
            for a, b in zip(bounds, bounds[1:])]

  @classmethod
  def CellMemory(cls, p, images):
    """Per cell NestedMap(act, act_weights, residuals, out, transient,
    outside=0) in bytes on `images` (one micro-batch): the units' act_bytes
    (estimates, see resnet.py; also taken for what remat 'selective' keeps
    and for what W reads after a split B: a convolution's W reads its input
    and its output's gradient, about what its backward reads), its output,
    and its largest unit's act_bytes."""
    bounds = cls.Boundaries(p)
    metas = cls.UnitMetas(p, images)
    out = []
    for a, b in zip(bounds, bounds[1:]):
      act = sum(m.act_bytes for m in metas[a:b])
      out.append(NestedMap(
          act=act, act_weights=act, residuals=act,
          out=4 * metas[b - 1].out_shapes[0].num_elements(),
          transient=max(m.act_bytes for m in metas[a:b]), outside=0))
    return out

  @classmethod
  def FPropMeta(cls, p, images):
    """Shapes and FLOPs: the units' (layers/resnet.py, the head's pool and
    projection); checks the micro-batching of the batch."""
    shape = shapes.AsShape(images)
    owner = validation.Owner(p)
    want = [None] + list(p.image_size) + [p.input_dim]
    if shape.rank != 4 or any(d is not None and w is not None and d != w
                              for d, w in zip(shape, want)):
      raise ValueError(f'{owner}: images shape {list(shape)} must be '
                       f'{want} (None: any batch).')
    if p.pipeline_tpl is not None:
      gpipe.PipeliningLayer.CheckBatch(
          p.pipeline_tpl, (shape,), owner=validation.Owner(p.pipeline_tpl))
    metas = cls.UnitMetas(p, shape)
    flops = 0
    for m in metas:
      flops = shapes.Add(flops, m.flops)
    return NestedMap(flops=flops, out_shapes=metas[-1].out_shapes)
