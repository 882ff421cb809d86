"""Published measurements of pipelined Transformer training, as data.

Each row is a figure a paper measured, with the model, cluster and layout
it states; bench/published_check.py gives the planner the same and puts
its prediction beside the figure. Numbers are quoted as the papers print
them; what a paper leaves unsaid is an assumption named in ASSUMED.

Sources:
  ZB:    Qi, Wan, Huang, Lin. "Zero Bubble Pipeline Parallelism", ICLR 2024
         (arXiv 2401.10241). Table 3 (models), Table 4 (samples per GPU per
         second, m = 24/32/64, 24/32/64, 48/64/128, 96/128/256), Table 9
         (1F1B with m <= p). Up to 32 x A100 SXM 80 GB, 8 a node, nodes on
         RoCE RDMA; pipeline only (pipeline size = GPUs, no data or tensor
         parallelism); sequence length 1024; the first and last stages
         hold one layer fewer than the others.
  GPIPE: Huang et al. "GPipe: Efficient Training of Giant Neural Networks
         using Pipeline Parallelism", NeurIPS 2019 (arXiv 1811.06965).
         Table 2 (Transformer-48 on Cloud TPU v3 cores; throughput
         normalised to K=2, M=1) and Table 3 (a 24-layer Transformer on
         P100s over PCIe; normalised to K=2), model dim 2048, feed-forward
         8192, 32 heads, vocabulary 32k, sequence length 1024, batch 32,
         GPipe's schedule with re-materialisation.
  DLPERF: OneFlow's DLPerf GPT benchmark report (github.com/Oneflow-Inc/
         DLPerf, reports/GPT/dlperf_gpt_test_report_210512.md, 2021): its
         Megatron-LM rows (commit 8aa4619, --fp16 --checkpoint-activations)
         of a GPT of 16 layers, hidden 1536, 16 heads, sequence 2048,
         vocabulary 51200, micro-batch 2, on up to 4 nodes of 8 x V100
         SXM2 16 GB (NVLink in a node, one 100 Gb/s EDR InfiniBand NIC a
         node): iteration times of data x pipeline 8 x 4 (32 micro-batches),
         32 x 1, 8 x 1 and 1 x 1. Its OneFlow rows are left out (OneFlow's
         own runtime, no schedule Cadence has).

Left out, and why (the planner cannot express them, and the model is not
bent to fit):
  * ZB's ZB-2p rows: a schedule of twice 1F1B's memory that Cadence does
    not have (its zero-bubble schedules are ZB-H1 and ZB-V).
  * ZB's 1F1B-I rows: "each transformer layer serves as a chunk", 22, 30,
    46 and 62 layers on 8, 8, 16 and 32 devices: not an equal number of
    stages per device, which interleaved_1f1b needs.
  * ZB's ZB-V rows (arXiv Table 6): 30-62 layers on twice as many stages
    as devices (32-64 stages): more stages than layers.
  * NVIDIA NeMo's DGX-H100 rows (Llama-2 13B, pipeline 4): FP8, which
    Cadence does not run.
  * Megatron-LM's (Narayanan et al. 2021) rows with tensor parallelism,
    and its one pipeline-only figure (Figure 14), printed only as a chart.
"""
import collections

Row = collections.namedtuple('Row', [
    'source', 'table', 'model', 'cluster', 'replicas', 'devices',
    'micro_batch', 'micro_batches', 'schedule', 'published', 'unit'])
Row.__doc__ = """One published figure.

Attributes:
  source, table: where it is printed (SOURCES' key, the table).
  model: a key of MODELS.
  cluster: the planner's cluster text (--plan_cluster).
  replicas, devices: R and K (pipeline size).
  micro_batch, micro_batches: examples a micro-batch, M.
  schedule: the paper's schedule name; SCHEDULES maps it to Cadence's.
  published: the figure as printed.
  unit: 'samples/GPU/s', 'ms/iteration', or 'x K=2 M=1' / 'x K=2'
    (throughput normalised to another row of the same table: `BaseOf`).
"""

# Model dims: layers, hidden, heads, feed-forward, vocabulary, sequence.
MODELS = {
    # ZB Table 3 (feed-forward 4 x hidden and GPT-2's vocabulary padded to
    # 50304 as in Megatron-LM, which ZB's code forks: ASSUMED).
    'zb-1.5b': dict(layers=22, hidden=2304, heads=24, ffn=4 * 2304,
                    vocab=50304, seq=1024),
    'zb-6.2b': dict(layers=30, hidden=4096, heads=32, ffn=4 * 4096,
                    vocab=50304, seq=1024),
    'zb-14.6b': dict(layers=46, hidden=5120, heads=40, ffn=4 * 5120,
                     vocab=50304, seq=1024),
    'zb-28.3b': dict(layers=62, hidden=6144, heads=48, ffn=4 * 6144,
                     vocab=50304, seq=1024),
    # GPipe section 3.
    'gpipe-t48': dict(layers=48, hidden=2048, heads=32, ffn=8192,
                      vocab=32000, seq=1024),
    'gpipe-t24': dict(layers=24, hidden=2048, heads=32, ffn=8192,
                      vocab=32000, seq=1024),
    # DLPerf (feed-forward 4 x hidden, Megatron-LM's default: ASSUMED).
    'dlperf-0.5b': dict(layers=16, hidden=1536, heads=16, ffn=4 * 1536,
                        vocab=51200, seq=2048),
}

# The clusters, as --plan_cluster text.
# ZB's code is a fork of Megatron-LM, whose fused kernels (bias-GeLU,
# bias-dropout-add, scale-mask-softmax, layer norm) run element-wise ops
# inside their neighbours: fuse=elementwise. So do DLPerf's Megatron-LM
# runs, and GPipe's on TPU (XLA); GPipe's P100 runs did not (TensorFlow
# ops one by one on a GPU). No row fuses attention (fuse=attention): ZB's
# script of the paper's time (examples/pretrain_zero_bubble.sh, November
# 2023) runs without --use-flash-attn; DLPerf's Megatron-LM of 2021 and
# GPipe predate FlashAttention.
_A100 = {8: 'a100x8,fuse=elementwise',
         16: 'a100x8,devices=16,hosts=2,fuse=elementwise',
         32: 'a100x8,devices=32,hosts=4,fuse=elementwise'}
# A Cloud TPU v3 core (cloud.google.com/tpu/docs/system-architecture-tpu-vm:
# a v3 chip, 2 cores, does 123 TFLOP/s BF16 with 32 GiB of HBM at 900 GB/s;
# 2 MXUs of 128 x 128 a core); the op model's TPU figures (hardware.py).
TPU_V3_CORES = ('devices=8,tflops=61.5,memory_gib=16,memory_gbps=450,'
                'link_gbps=70,latency_us=5,efficiency=0.85,tile=128,'
                'tile_k=128,cores=2,launch_us=1,fuse=elementwise')
# NVIDIA Tesla P100 PCIe 16 GB (datasheet): 18.7 TFLOP/s FP16, 732 GB/s,
# 56 SMs, no tensor cores (efficiency: what its FP16 GEMMs reach, ASSUMED),
# PCIe 3.0 x16 between GPUs, ~12 GB/s each way.
P100_PCIE = ('devices=8,tflops=18.7,memory_gib=16,memory_gbps=732,'
             'link_gbps=12,latency_us=10,efficiency=0.7,tile=128,'
             'tile_k=32,cores=56,launch_us=5')

# NVIDIA Tesla V100 SXM2 16 GB (datasheet): 125 TFLOP/s FP16 tensor, 900
# GB/s, 80 SMs, NVLink 300 GB/s both ways (150 each way); Volta's 128 x 128
# x 32 tiles; a node's one 100 Gb/s NIC (12.5 GB/s) is the inter-node
# link of the all-reduce's ring.
def _V100(devices):
  hosts = max(1, devices // 8)
  return (f'devices={devices},hosts={hosts},tflops=125,memory_gib=16,'
          'memory_gbps=900,link_gbps=150,network_gbps=12.5,latency_us=10,'
          'efficiency=0.75,tile=128,tile_k=32,cores=80,launch_us=5,'
          'fuse=elementwise')


# Paper schedule names -> Cadence's (ZB-1p, ZB's searched schedule of 1F1B's
# memory, is run as zb_h1, its hand-made schedule of that memory: ZB reports
# ZB-1p a little faster).
SCHEDULES = {'1F1B': '1f1b', 'ZB-1p': 'zb_h1', 'GPipe': 'gpipe'}
# Megatron-LM's non-interleaved pipeline schedule is 1F1B (PipeDream-Flush;
# Narayanan et al. 2021); with one stage it is data parallelism alone.
# What a paper leaves unsaid, as run here.
ASSUMED = ('ZB: BF16 activations (the A100 peak of FP16 and BF16 is the '
           'same), no re-materialisation (its peak memory, 30-43 GB for '
           '1F1B, leaves no room for doubt either way), feed-forward 4 x '
           'hidden, vocabulary 50304; GPipe: batch 32 in every row (the '
           'paper adjusts it "to fit memory if necessary"), a decoder-only '
           'stack of the same layers for its Transformer; DLPerf: FP16 run '
           'as BF16 (the same V100 tensor rate is assumed), '
           '--checkpoint-activations as remat always, feed-forward 4 x '
           'hidden.')


def _ZbTable4():
  """ZB Table 4: 1F1B and ZB-1p, samples per GPU per second."""
  table = {
      # model: (GPUs, micro-batch, Ms, {schedule: figures})
      'zb-1.5b': (8, 6, (24, 32, 64), {'1F1B': (11.8, 12.5, 13.6),
                                       'ZB-1p': (12.9, 13.4, 14.2)}),
      'zb-6.2b': (8, 3, (24, 32, 64), {'1F1B': (3.50, 3.70, 4.03),
                                       'ZB-1p': (3.88, 4.00, 4.20)}),
      'zb-14.6b': (16, 1, (48, 64, 128), {'1F1B': (1.40, 1.49, 1.64),
                                          'ZB-1p': (1.61, 1.67, 1.76)}),
      'zb-28.3b': (32, 1, (96, 128, 256), {'1F1B': (0.76, 0.80, 0.88),
                                           'ZB-1p': (0.87, 0.90, 0.96)}),
  }
  rows = []
  for model, (gpus, mb, ms, figures) in table.items():
    for schedule, values in figures.items():
      for m, value in zip(ms, values):
        rows.append(Row('ZB', 'Table 4', model, _A100[gpus], 1, gpus, mb, m,
                        schedule, value, 'samples/GPU/s'))
  return rows


def _ZbTable9():
  """ZB Table 9: 1F1B with m <= p, samples per GPU per second."""
  table = {'zb-1.5b': (8, 6, (2, 4, 8), (3.56, 5.74, 8.26)),
           'zb-6.2b': (8, 3, (2, 4, 8), (1.04, 1.69, 2.45)),
           'zb-14.6b': (16, 1, (4, 8, 16), (0.39, 0.65, 0.95))}
  return [Row('ZB', 'Table 9', model, _A100[gpus], 1, gpus, mb, m, '1F1B',
              value, 'samples/GPU/s')
          for model, (gpus, mb, ms, values) in table.items()
          for m, value in zip(ms, values)]


def _GPipe():
  """GPipe Tables 2 and 3: throughput normalised to K=2 (M=1 on TPU)."""
  rows = []
  for m, values in ((1, (1, 1.07, 1.3)), (4, (1.7, 3.2, 4.8)),
                    (32, (1.8, 3.4, 6.3))):
    for k, value in zip((2, 4, 8), values):
      rows.append(Row('GPIPE', 'Table 2', 'gpipe-t48', TPU_V3_CORES, 1, k,
                      32 // m, m, 'GPipe', value, 'x K=2 M=1'))
  for k, value in zip((2, 4, 8), (1, 1.8, 3.3)):
    rows.append(Row('GPIPE', 'Table 3', 'gpipe-t24', P100_PCIE, 1, k, 1, 32,
                    'GPipe', value, 'x K=2'))
  return rows


def _DlPerf():
  """DLPerf's Megatron-LM rows: ms an iteration."""
  return [Row('DLPERF', 'GPT table', 'dlperf-0.5b', _V100(r * k), r, k, 2,
              m, '1F1B', ms, 'ms/iteration')
          for r, k, m, ms in ((8, 4, 32, 4893.55), (32, 1, 1, 683.51),
                              (8, 1, 1, 480.96), (1, 1, 1, 464.12))]


ROWS = _ZbTable4() + _ZbTable9() + _GPipe() + _DlPerf()


def BaseOf(row):
  """The row a normalised figure is relative to (None: an absolute one)."""
  if row.unit == 'x K=2 M=1':
    return row._replace(devices=2, micro_batch=32, micro_batches=1,
                        published=1)
  if row.unit == 'x K=2':
    return row._replace(devices=2, published=1)
  return None
