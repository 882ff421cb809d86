"""The cluster a layout is planned for: devices, memory, links, sharing.

A `Hardware` says what the layout planner (framework/planning/planner.py)
needs to time a training step before anything runs: how many devices, how
fast each one multiplies (peak FLOP/s, and the share of it a model's layers
reach), how much memory it has and how fast it reads it, how fast the links
between devices of a host and between hosts are, and which devices share
compute. Logical CPU devices of one host share its cores: two actions that
run at once on two of them slow each other down, so the step of a K-stage
pipeline is not K times shorter (`share='host'`, with `concurrency`: the
throughput of the host's cores when n actions run at once, relative to one
action alone, for n = 1, 2, 4, ...).

A cluster is written as text (`Parse`, the trainer's --plan_cluster): a
preset's name, then `key=value` items that change it, all separated by
commas; or the items alone, with at least `devices` and `tflops`:

  cpu                         this host's logical CPUs, measured at plan time
  cpu,devices=8               the same, 8 of them
  h100x8                      8 x NVIDIA H100 SXM 80 GB on one host
  h100x8,hosts=2              two such hosts, linked by `network_gbps`
  a100x8                      8 x NVIDIA A100 SXM 80 GB on one host
  tpu_v4_8                    a Cloud TPU v4-8: 4 chips
  tpu_v5e_8                   a Cloud TPU v5e-8: 8 chips
  devices=4,tflops=100,memory_gib=16,link_gbps=50

Keys (`KEYS`): devices, hosts, tflops (peak dense TFLOP/s a device, for
the model's dtype), efficiency (the share of peak a layer's products reach,
in (0, 1]), memory_gib (a device's memory, or the host's when `share` is
'host'), memory_gbps (a device's memory bandwidth: gradient sums, the
optimizer update), link_gbps (between devices of a host, one direction),
network_gbps (between hosts), latency_us (a transfer's fixed cost), share
('none' or 'host'), concurrency (throughput with 1, 2, 4, ... actions at
once, '/'-separated, e.g. 1/1.6/1.8; with share=host); the op model's
tile, tile_k and cores (a product's output tiles of tile x tile, its depth
padded to tile_k, run in waves over `cores` units), launch_us (what
each op pays beyond its work), dispatch_us (what the host spends issuing
each op: a pass of a layer's ops takes at least that many of them,
`PassSeconds`) and fuse (what runs inside fused kernels:
'elementwise', element-wise ops inside the op before them, as XLA and
fused kernels run them; 'attention', attention's core as one kernel, as
FlashAttention runs it; both as 'elementwise+attention'): the
accelerator presets time each op of a layer's cost record by its kind and
shape (`OpSeconds`); without tile and cores every op takes its FLOPs at
peak x efficiency. GB are 1e9 bytes, GiB 2**30.

'measure' (the cpu preset's tflops, memory_gbps and concurrency) is filled
in at plan time by timing this host (plan_measure.Calibrate); `Parse` needs no
TensorFlow, so the trainer checks the text before TensorFlow loads.

Example:
  hw = Parse('h100x8,hosts=2')
  hw.num_devices, hw.devices_per_host     # 16, 8
  hw.LinkBandwidth(0, 9)                  # network_gbps * 1e9 (two hosts)
"""
import collections
import difflib
import math

from cadence.framework import op_cost

MEASURE = 'measure'
SHARE = ('none', 'host')
# What `fuse` may name, '+'-joined (or 'none'): the op kinds a cluster runs
# inside fused kernels.
FUSIBLE = (op_cost.ELEMENTWISE, op_cost.ATTENTION)
_CHOICES = {'share': SHARE}   # Keys that take one of a set.

# Public specifications (datasheets), not measured here.
#  * NVIDIA H100 SXM5 80 GB (NVIDIA H100 Tensor Core GPU datasheet and
#    architecture whitepaper): 989 TFLOP/s dense BF16 (1979 with sparsity),
#    132 SMs, 80 GB HBM3 at 3.35 TB/s, fourth-generation NVLink 900 GB/s
#    per GPU in both directions together (450 GB/s each way). Hosts linked
#    by 8 x 400 Gb/s InfiniBand, 50 GB/s a GPU (a common DGX H100 set-up).
#  * NVIDIA A100 SXM4 80 GB (A100 datasheet and whitepaper): 312 TFLOP/s
#    dense BF16, 108 SMs, 80 GB HBM2e at 2039 GB/s, third-generation NVLink
#    600 GB/s both ways (300 each way); hosts by 8 x 200 Gb/s InfiniBand
#    (DGX A100), 25 GB/s a GPU.
#  * Google Cloud TPU v4 (cloud.google.com/tpu/docs/v4): 275 TFLOP/s BF16 a
#    chip, 32 GiB HBM2 at 1200 GB/s; a v4-8 has 4 chips (each of 2
#    TensorCores with 4 MXUs of 128 x 128, one device with megacore). ICI:
#    the documented all-reduce bandwidth of a 4096-chip pod, 1.1 PB/s, is
#    ~270 GB/s a chip.
#  * Google Cloud TPU v5e (cloud.google.com/tpu/docs/v5e): 197 TFLOP/s BF16
#    a chip, 16 GiB HBM2 at 819 GB/s, 4 MXUs of 128 x 128, ICI 1600 Gb/s
#    (200 GB/s) a chip; a v5litepod-8 has 8 chips on one host.
#  Collectives: a ring all-reduce on every preset (step_model.AllReduceTime:
#  2 (n - 1) / n of the bytes over the slowest link, 2 (n - 1) latencies).
#  The op model's figures (`OpSeconds`), assumptions rather than specs:
#  * efficiency: the share of peak a large product reaches (cuBLAS BF16
#    GEMMs on large squares reach ~70-80% of dense peak on A100 and H100 in
#    NVIDIA's and public benchmarks; XLA's on TPU MXUs ~80-90%);
#  * tile x tile (x tile_k) output tiles of a product, run in waves over
#    `cores` units (SMs; MXUs on a TPU): a product that does not fill its
#    tiles or its last wave wastes what it leaves empty (CUTLASS's common
#    128 x 128 x 64 BF16 tile on GPUs; a TPU pads to its 128 x 128 MXU);
#  * launch_us: what each op pays beyond its work on the device (a GPU
#    kernel's launch and the gap to the next, a few microseconds; an XLA
#    program on a TPU runs its fused ops back to back: about 1);
#  * dispatch_us: the host's time to issue an op, which the device waits
#    for when its ops are shorter (small micro-batches in an eager
#    framework). 0 on every preset: Cadence's steps are TensorFlow graphs
#    whose executor issues ops ahead of the device, and an XLA program is
#    one launch. PyTorch run eagerly takes about 30 us an op (a dispatch-
#    bound EfficientNet-B5 on an A100: 583 top-level ops in 17.8 ms,
#    github.com/pytorch/pytorch/issues/82793);
#  * fuse: 'elementwise' on TPUs (XLA compiles every step and fuses
#    element-wise ops into their neighbours); 'none' on GPUs (Cadence's
#    pipelined steps run TensorFlow's ops one by one: --xla needs
#    --worker_split_size=1 off a TPU). A GPU run with fused kernels
#    (Megatron-LM's, XLA) is `h100x8,fuse=elementwise`; with
#    FlashAttention too (PyTorch's scaled_dot_product_attention, Megatron-
#    LM's --use-flash-attn) `h100x8,fuse=elementwise+attention`. No preset
#    fuses attention: Cadence's MultiHeadedAttention runs its parts as
#    TensorFlow ops, and XLA writes the scores to memory.
#    Checked against a real H100 layer of the published-scale LM (d 2048,
#    ffn 8192, 16 heads, seq 1024, dropout 0.1, bf16; PyTorch with fused
#    attention), forward and backward 2.00/2.52/4.80 ms at micro-batches
#    2/4/8: `h100x8,fuse=elementwise+attention` predicts 1.32/2.52/4.91
#    ms (0.66/1.00/1.02x), with PyTorch's dispatch_us=30 1.74/2.52/4.91
#    (0.87/1.00/1.02x: at micro-batch 2 the real layer waits on its
#    host); unfused attention 1.78/3.40/6.66 ms, 1.35x and 1.39x at 4
#    and 8 (tests/framework/planning/hardware_test.py holds them).
# bench/published_check.py's last run: the op model against 49 figures
# that 3 sources measured of pipelined Transformer training (A100, V100,
# TPU v3 and P100 clusters): |error| median 2.6%, worst 41.3% (GPipe's
# TPU rows of 4 micro-batches), every ratio between two rows of a source
# (schedule over schedule, M over M, layout over layout) on the right side
# of 1. The plan quotes it (plan_report.Sureness).
PUBLISHED_CHECK = dict(rows=49, sources=3, median=0.026, worst=0.413)
_GPU = dict(tile=128, tile_k=64, launch_us=5.0, share='none',
            concurrency=None, hosts=1, fuse='none', dispatch_us=0.0)
_TPU = dict(tile=128, tile_k=128, launch_us=1.0, share='none',
            concurrency=None, hosts=1, fuse='elementwise', dispatch_us=0.0)
_PRESETS = {
    'cpu': dict(devices=4, hosts=1, tflops=MEASURE, efficiency=1.0,
                memory_gib=None, memory_gbps=MEASURE, link_gbps=None,
                network_gbps=10.0, latency_us=0.0, share='host',
                concurrency=MEASURE, tile=None, tile_k=None, cores=None,
                launch_us=0.0, fuse='none', dispatch_us=0.0),
    'h100x8': dict(_GPU, devices=8, tflops=989.0, efficiency=0.75,
                   memory_gib=80e9 / 2**30, memory_gbps=3350.0,
                   link_gbps=450.0, network_gbps=50.0, latency_us=5.0,
                   cores=132),
    'a100x8': dict(_GPU, devices=8, tflops=312.0, efficiency=0.8,
                   memory_gib=80e9 / 2**30, memory_gbps=2039.0,
                   link_gbps=300.0, network_gbps=25.0, latency_us=5.0,
                   cores=108),
    'tpu_v4_8': dict(_TPU, devices=4, tflops=275.0, efficiency=0.85,
                     memory_gib=32.0, memory_gbps=1200.0, link_gbps=270.0,
                     network_gbps=25.0, latency_us=5.0, cores=8),
    'tpu_v5e_8': dict(_TPU, devices=8, tflops=197.0, efficiency=0.85,
                      memory_gib=16.0, memory_gbps=819.0, link_gbps=200.0,
                      network_gbps=25.0, latency_us=5.0, cores=4),
}
PRESETS = tuple(_PRESETS)
_DESCRIPTIONS = {
    'cpu': "this host's logical CPU devices sharing its cores (FLOP/s, "
           'memory bandwidth and concurrency measured at plan time)',
    'h100x8': '8 x NVIDIA H100 SXM 80 GB, NVLink (public specs)',
    'a100x8': '8 x NVIDIA A100 SXM 80 GB, NVLink (public specs)',
    'tpu_v4_8': 'Cloud TPU v4-8, 4 chips (public specs)',
    'tpu_v5e_8': 'Cloud TPU v5e-8, 8 chips (public specs)',
}
# key: (kind, rule); kinds: int, number, share, concurrency.
_KEYS = collections.OrderedDict([
    ('devices', ('int', 'an int >= 1 (devices in all)')),
    ('hosts', ('int', 'an int >= 1 that divides devices')),
    ('tflops', ('number', "a number > 0 (peak TFLOP/s of a device) or "
                "'measure' (this host's CPU)")),
    ('efficiency', ('number', 'a number in (0, 1] (the share of peak a '
                    "layer's products reach)")),
    ('memory_gib', ('number', "a number > 0 (GiB of a device; of the host "
                    "with share=host)")),
    ('memory_gbps', ('number', "a number > 0 (GB/s of a device's memory) "
                     "or 'measure'")),
    ('link_gbps', ('number', 'a number > 0 (GB/s between two devices of a '
                   'host, one way)')),
    ('network_gbps', ('number', 'a number > 0 (GB/s between hosts, a '
                      'device)')),
    ('latency_us', ('number', 'a number >= 0 (microseconds a transfer '
                    'costs besides its bytes)')),
    ('share', ('share', "'none' (each device computes alone) or 'host' "
               "(a host's devices share its cores)")),
    ('concurrency', ('concurrency', "'measure' or '/'-separated numbers "
                     '>= 1, non-decreasing, starting at 1: the throughput '
                     'of a shared host with 1, 2, 4, ... actions at once')),
    ('tile', ('int', 'an int >= 1 (rows and columns of a product\'s output '
              'tile; with cores, turns on the op model)')),
    ('tile_k', ('int', 'an int >= 1 (the depth a product pads to)')),
    ('cores', ('int', 'an int >= 1 (units a product\'s tiles run on at '
               'once: SMs, MXUs)')),
    ('launch_us', ('number', 'a number >= 0 (microseconds each op pays '
                   'beyond its work)')),
    ('dispatch_us', ('number', 'a number >= 0 (microseconds the host takes '
                     'to issue an op; the device waits for it when its '
                     'ops are shorter)')),
    ('fuse', ('fuse', "'none', or what runs in fused kernels, '+'-joined: "
              "'elementwise' (element-wise ops inside the op before them: "
              "XLA, fused kernels), 'attention' (attention's core as one "
              "kernel: FlashAttention)")),
])
KEYS = tuple(_KEYS)


class SpecError(ValueError):
  """A cluster text that cannot be read; its message is one line."""


def Interpolate(points, x):
  """y at `x` of the piecewise-linear curve through `points` ((x, y), x
  ascending), held at its end values beyond them."""
  if x <= points[0][0]:
    return points[0][1]
  for (x0, y0), (x1, y1) in zip(points, points[1:]):
    if x <= x1:
      return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
  return points[-1][1]


class Hardware(collections.namedtuple('Hardware', [
    'name', 'num_devices', 'num_hosts', 'flops', 'efficiency', 'memory',
    'memory_bandwidth', 'link_bandwidth', 'network_bandwidth', 'latency',
    'share', 'concurrency', 'tile', 'tile_k', 'cores', 'launch', 'fuse',
    'dispatch'], defaults=[None, None, None, 0.0, 'none', 0.0])):
  """A cluster; see the module docstring. Units: FLOP/s, bytes, bytes/s,
  seconds. `flops`, `memory_bandwidth` or `concurrency` is MEASURE until
  calibrated (`Calibrated`); `memory` None: unknown (no fit check); `tile`
  None: no op model (`OpSeconds` times every op at the flat rate)."""
  __slots__ = ()

  @property
  def op_model(self):
    """Whether ops are timed by kind and shape (tile and cores known)."""
    return bool(self.tile and self.cores)

  def ProductEfficiency(self, dims):
    """The share of `efficiency` x peak a product of op_cost dims
    (batch, m, k, n, weight, size) reaches: the share of its padded tiles
    it fills (m and n to `tile`, k to `tile_k`) times the share of its last
    wave of `cores` it fills."""
    batch, m, k, n = dims[:4]
    t, tk = self.tile, self.tile_k or self.tile
    rows, cols, depth = (math.ceil(x / q) for x, q in ((m, t), (n, t),
                                                       (k, tk)))
    filled = m * n * k / (rows * t * cols * t * depth * tk)
    tiles = batch * rows * cols
    waves = math.ceil(tiles / self.cores)
    return filled * tiles / (waves * self.cores)

  def OpSeconds(self, op):
    """Seconds of one op (framework/op_cost.py) on a device.

    With the op model: a product takes the longer of its FLOPs at peak x
    efficiency x ProductEfficiency and its bytes at the memory bandwidth;
    the memory-bound kinds the longer of their bytes at the bandwidth and
    their FLOPs at peak x efficiency; each op pays `launch` besides. With
    fuse='elementwise' an element-wise op runs inside the op before it:
    no launch, and only its own streams' bytes (op_cost.FusedBytes). An
    attention op is its parts one by one, unless the cluster fuses
    attention or the op says it is fused: then one kernel, a product of
    op_cost.FusedAttention's FLOPs and bytes (the scores' tiles).
    Without the op model, or for an `other` op: FLOPs at peak x
    efficiency.
    """
    rate = self.flops * self.efficiency
    if op.kind == op_cost.OTHER or not self.op_model:
      return op.flops / rate
    if op.kind == op_cost.ATTENTION:
      if not self.RunsFused(op):
        return sum(self.OpSeconds(part) for part in op.dims.parts)
      flops, num_bytes, dims = op_cost.FusedAttention(op)
      return max(flops / (rate * self.ProductEfficiency(dims)),
                 num_bytes / self.memory_bandwidth) + self.launch
    if op.kind == op_cost.MATMUL:
      rate *= self.ProductEfficiency(op.dims)
    if op.kind == op_cost.ELEMENTWISE and self.Fuses(op_cost.ELEMENTWISE):
      # Fused into the op before it: no launch, only its own streams.
      return max(op.flops / rate,
                 op_cost.FusedBytes(op) / self.memory_bandwidth)
    return max(op.flops / rate, op.bytes / self.memory_bandwidth) + (
        self.launch)

  def Issued(self, op):
    """How many ops the host issues for `op`: an attention's parts when
    it runs unfused, else 1."""
    if op.kind == op_cost.ATTENTION and not self.RunsFused(op):
      return sum(self.Issued(part) for part in op.dims.parts)
    return 1

  def PassSeconds(self, ops):
    """Seconds of a pass of `ops` (a unit's forward, or its gradient's
    ops) on a device: the sum of their OpSeconds, or the host's time to
    issue them (`dispatch` each, `Issued`) when that is longer: the
    device runs ahead of the host, or waits for it."""
    device = sum(self.OpSeconds(op) for op in ops)
    if not self.dispatch or not self.op_model:
      return device
    return max(device, self.dispatch * sum(self.Issued(op) for op in ops))

  def RunsFused(self, op):
    """Whether ATTENTION op `op` runs as one kernel here: its record
    says so, or the cluster fuses attention."""
    return op.dims.fused or self.Fuses(op_cost.ATTENTION)

  def Fuses(self, kind):
    """Whether the cluster runs ops of `kind` (one of FUSIBLE) inside
    fused kernels (`fuse`)."""
    return kind in self.fuse.split('+')

  @property
  def devices_per_host(self):
    return self.num_devices // self.num_hosts

  @property
  def shared(self):
    """Whether a host's devices share its cores (and its memory)."""
    return self.share == 'host'

  @property
  def needs_calibration(self):
    return MEASURE in (self.flops, self.memory_bandwidth, self.concurrency)

  def Calibrated(self, flops=None, memory_bandwidth=None, concurrency=None,
                 memory=None):
    """A copy with the measured values in place of MEASURE (and `memory`
    where it was unknown)."""
    pick = lambda old, new: new if old == MEASURE else old  # pylint: disable=unnecessary-lambda-assignment
    return self._replace(
        flops=pick(self.flops, flops),
        memory_bandwidth=pick(self.memory_bandwidth, memory_bandwidth),
        concurrency=pick(self.concurrency, concurrency),
        memory=self.memory if self.memory is not None else memory)

  def Host(self, device):
    """The host of global device index `device`."""
    return device // self.devices_per_host

  def LinkBandwidth(self, a, b):
    """Bytes/s from device a to device b (within a host or between)."""
    if self.Host(a) != self.Host(b):
      return self.network_bandwidth
    return self.link_bandwidth or self.memory_bandwidth

  def Transfer(self, num_bytes, a, b):
    """Seconds to send `num_bytes` from device a to device b (0 on the same
    device)."""
    if a == b or not num_bytes:
      return 0.0
    return self.latency + num_bytes / self.LinkBandwidth(a, b)

  def Throughput(self, running):
    """The work per second of a shared host running `running` actions at
    once, relative to one action alone (`concurrency`, held at its last
    value; linear in between)."""
    if not self.shared or running <= 1:
      return 1.0
    return Interpolate([(2 ** i, c) for i, c in enumerate(self.concurrency)],
                       running)

  def Describe(self):
    """One line: the cluster in words and numbers."""
    def _Num(x, scale, unit):
      if x is None:
        return 'unknown'
      return x if x == MEASURE else f'{Figure(x / scale)} {unit}'
    text = (f'{self.name}: {self.num_devices} device(s) on '
            f'{self.num_hosts} host(s), '
            f'{_Num(self.flops, 1e12, "TFLOP/s")} peak x efficiency '
            f'{self.efficiency:g}, memory '
            f'{_Num(self.memory, 2**30, "GiB")}'
            f'{" per host" if self.shared else " per device"} at '
            f'{_Num(self.memory_bandwidth, 1e9, "GB/s")}, links '
            f'{_Num(self.link_bandwidth, 1e9, "GB/s")} in a host, '
            f'{_Num(self.network_bandwidth, 1e9, "GB/s")} between hosts')
    if self.op_model:
      text += (f'; ops timed by kind and shape: products in '
               f'{self.tile}x{self.tile}x{self.tile_k or self.tile} tiles '
               f'over {self.cores} cores, {self.launch * 1e6:g} us an op'
               + (', element-wise ops fused'
                  if self.Fuses(op_cost.ELEMENTWISE) else '')
               + (', attention fused (one kernel, FlashAttention)'
                  if self.Fuses(op_cost.ATTENTION) else '')
               + (f', {self.dispatch * 1e6:g} us to issue an op'
                  if self.dispatch else ''))
    if self.shared:
      conc = self.concurrency
      conc = conc if conc == MEASURE else '/'.join(f'{c:.2f}' for c in conc)
      text += (f"; a host's devices share its cores (throughput with 1, 2, "
               f'4, ... actions at once: {conc})')
    return text


def Figure(x):
  """`x` to three significant digits, without an exponent: what a
  measurement of this host holds (two runs differ in the second); presets
  are round already."""
  return f'{float(f"{x:.3g}"):g}'


def _Hint(word, choices):
  """' Did you mean ...?' with the closest of `choices` (the second too
  when it is about as close), or ''."""
  word = str(word).lower()
  close = difflib.get_close_matches(word, list(choices), n=2, cutoff=0.5)
  score = lambda c: difflib.SequenceMatcher(None, word, c).ratio()  # pylint: disable=unnecessary-lambda-assignment
  close = [c for c in close if score(c) >= score(close[0]) - 0.1]
  return f' Did you mean {" or ".join(map(repr, close))}?' if close else ''


def _Fuse(text):
  """`fuse`'s value in FUSIBLE's order ('none' alone), from '+'-joined
  names in any order."""
  names = [n.strip() for n in text.split('+')]
  if names == ['none']:
    return 'none'
  for name in names:
    if name not in FUSIBLE:
      raise SpecError(f"--plan_cluster: fuse={text!r} must be 'none' or "
                      "'+'-joined names among "
                      f'{", ".join(map(repr, FUSIBLE))}; {name!r} is not '
                      f'one.{_Hint(name, FUSIBLE)}')
  if len(set(names)) < len(names):
    raise SpecError(f'--plan_cluster: fuse={text!r} names an op twice.')
  return '+'.join(k for k in FUSIBLE if k in names)


def _Value(key, text):
  kind, rule = _KEYS[key]
  bad = SpecError(f'--plan_cluster: {key}={text!r} must be {rule}.')
  if kind == 'fuse':
    return _Fuse(text)
  if kind in _CHOICES:
    if text not in _CHOICES[kind]:
      raise SpecError(f'--plan_cluster: {key}={text!r} must be {rule}.'
                      f'{_Hint(text, _CHOICES[kind])}')
    return text
  if text == MEASURE and key in ('tflops', 'memory_gbps', 'concurrency'):
    return MEASURE
  if kind == 'concurrency':
    try:
      values = tuple(float(x) for x in text.split('/'))
    except ValueError:
      raise bad from None
    if (values[0] != 1 or any(b < a for a, b in zip(values, values[1:])) or
        any(v != v or v == float('inf') for v in values)):
      raise bad
    return values
  try:
    value = int(text) if kind == 'int' else float(text)
  except ValueError:
    raise bad from None
  if value != value or value in (float('inf'), float('-inf')):
    raise bad
  low_ok = value >= 0 if key in ('latency_us', 'launch_us',
                                 'dispatch_us') else (
      value >= 1 if kind == 'int' else value > 0)
  if not low_ok or (key == 'efficiency' and value > 1):
    raise bad
  return value


def Parse(text):
  """The `Hardware` of a cluster text; see the module docstring.

  Raises:
    SpecError: one line naming the item, the value and the rule (an
      unknown preset or key with the closest names).
  """
  items = [s.strip() for s in str(text).split(',') if s.strip()]
  if not items:
    raise SpecError('--plan_cluster is empty: give a preset '
                    f'({", ".join(PRESETS)}) or key=value items '
                    f'({", ".join(KEYS)}).')
  name = 'custom'
  values = dict(_PRESETS['cpu'], tflops=None, devices=None, memory_gib=None,
                memory_gbps=None, share='none', concurrency=None,
                efficiency=1.0, network_gbps=None, latency_us=0.0)
  if '=' not in items[0]:
    name = items.pop(0)
    if name not in _PRESETS:
      raise SpecError(f'--plan_cluster: {name!r} is not a preset (one of '
                      f'{", ".join(PRESETS)}) nor a key=value item.'
                      f'{_Hint(name, PRESETS)}')
    values = dict(_PRESETS[name])
  given = set()
  for item in items:
    key, sep, value = item.partition('=')
    key, value = key.strip(), value.strip()
    if not sep:
      raise SpecError(f'--plan_cluster: {item!r} is not key=value (only '
                      'the first item may name a preset).')
    if key not in _KEYS:
      raise SpecError(f'--plan_cluster: unknown key {key!r}; the keys are '
                      f'{", ".join(KEYS)}.{_Hint(key, KEYS)}')
    if key in given:
      raise SpecError(f'--plan_cluster: {key} is given twice.')
    given.add(key)
    values[key] = _Value(key, value)
  for key in ('devices', 'tflops'):
    if values[key] is None:
      raise SpecError(f'--plan_cluster: {key}=... is needed without a '
                      f'preset ({", ".join(PRESETS)}).')
  if values['devices'] % values['hosts']:
    raise SpecError(f'--plan_cluster: hosts={values["hosts"]} must divide '
                    f'devices={values["devices"]}.')
  if values['share'] == 'host' and values['concurrency'] is None:
    values['concurrency'] = (1.0,)
  if values['share'] == 'none':
    values['concurrency'] = None
  if values['memory_gbps'] is None:
    raise SpecError('--plan_cluster: memory_gbps=... is needed without a '
                    'preset (the gradient sums and the optimizer update '
                    'read memory).')
  if values['hosts'] > 1 and values['network_gbps'] is None:
    raise SpecError(f'--plan_cluster: hosts={values["hosts"]} needs '
                    'network_gbps=... (GB/s between hosts).')
  gb = lambda x: x if x in (None, MEASURE) else x * 1e9  # pylint: disable=unnecessary-lambda-assignment
  return Hardware(
      name=name if not given else f'{name} ({", ".join(items)})',
      num_devices=values['devices'], num_hosts=values['hosts'],
      flops=values['tflops'] if values['tflops'] == MEASURE else
      values['tflops'] * 1e12,
      efficiency=values['efficiency'],
      memory=None if values['memory_gib'] is None else
      values['memory_gib'] * 2**30,
      memory_bandwidth=gb(values['memory_gbps']),
      link_bandwidth=gb(values['link_gbps']),
      network_bandwidth=gb(values['network_gbps']),
      latency=values['latency_us'] * 1e-6, share=values['share'],
      concurrency=values['concurrency'], tile=values['tile'],
      tile_k=values['tile_k'], cores=values['cores'],
      launch=values['launch_us'] * 1e-6, fuse=values['fuse'],
      dispatch=values['dispatch_us'] * 1e-6)


def Presets():
  """'name: what it is' lines of the presets."""
  return [f'{n}: {_DESCRIPTIONS[n]}' for n in PRESETS]
