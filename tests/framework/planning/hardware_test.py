"""Tests for cadence.framework.planning.hardware: cluster texts."""
import unittest

from cadence.framework import op_cost
from cadence.framework.planning import hardware


class ParseTest(unittest.TestCase):

  def testH100Preset(self):
    hw = hardware.Parse('h100x8')
    self.assertEqual((8, 1, 8), (hw.num_devices, hw.num_hosts,
                                 hw.devices_per_host))
    self.assertEqual(989e12, hw.flops)
    self.assertEqual(80e9, hw.memory)
    self.assertEqual(450e9, hw.LinkBandwidth(0, 7))
    self.assertFalse(hw.shared)
    self.assertFalse(hw.needs_calibration)

  def testPresetWithItems(self):
    hw = hardware.Parse('h100x8, devices=16, hosts=2, latency_us=10')
    self.assertEqual((16, 2, 8), (hw.num_devices, hw.num_hosts,
                                  hw.devices_per_host))
    self.assertEqual(50e9, hw.LinkBandwidth(7, 8))     # Across hosts.
    self.assertEqual(450e9, hw.LinkBandwidth(8, 15))
    # 1 MB between hosts: 10 us + 1e6 / 50e9 s.
    self.assertAlmostEqual(10e-6 + 1e6 / 50e9, hw.Transfer(1e6, 0, 8))
    self.assertEqual(0.0, hw.Transfer(1e6, 3, 3))
    self.assertIn('devices=16', hw.name)

  def testCpuPresetNeedsCalibration(self):
    hw = hardware.Parse('cpu')
    self.assertTrue(hw.shared)
    self.assertTrue(hw.needs_calibration)
    hw = hw.Calibrated(flops=5e10, memory_bandwidth=1e10,
                       concurrency=(1.0, 1.5, 1.8), memory=2**34)
    self.assertFalse(hw.needs_calibration)
    self.assertEqual((5e10, 1e10, 2**34), (hw.flops, hw.memory_bandwidth,
                                           hw.memory))
    # No link bandwidth given: devices of a host copy through memory.
    self.assertEqual(1e10, hw.LinkBandwidth(0, 1))

  def testThroughputInterpolates(self):
    hw = hardware.Parse('cpu,devices=8,tflops=1,memory_gbps=10,'
                        'concurrency=1/1.5/1.8/1.8')
    self.assertEqual([1.0, 1.5, 1.65, 1.8, 1.8, 1.8],
                     [round(hw.Throughput(n), 6) for n in (1, 2, 3, 4, 6, 9)])
    alone = hardware.Parse('h100x8')
    self.assertEqual(1.0, alone.Throughput(1))

  def testCustomCluster(self):
    hw = hardware.Parse('devices=4,tflops=100,memory_gib=16,memory_gbps=800,'
                        'link_gbps=50,efficiency=0.4')
    self.assertEqual('custom', hw.name.split(' ')[0])
    self.assertEqual((4, 1e14, 0.4, 16 * 2**30, 8e11, 5e10),
                     (hw.num_devices, hw.flops, hw.efficiency, hw.memory,
                      hw.memory_bandwidth, hw.link_bandwidth))
    self.assertIn('4 device(s) on 1 host(s), 100 TFLOP/s', hw.Describe())

  def testProductEfficiencyOfTilesAndWaves(self):
    hw = hardware.Parse('devices=1,tflops=100,memory_gbps=1000,tile=128,'
                        'tile_k=64,cores=4,launch_us=2')
    self.assertTrue(hw.op_model)
    # Full tiles, 8 of them: two full waves of 4 cores.
    self.assertEqual(1.0, hw.ProductEfficiency((2, 256, 64, 256, True, 2)))
    # m = 64 fills half of its tiles' rows; k = 96 pads to 128.
    self.assertAlmostEqual(0.5 * 96 / 128, hw.ProductEfficiency(
        (1, 64, 96, 512, True, 2)))
    # 5 full tiles on 4 cores: two waves, the second a quarter full.
    self.assertAlmostEqual(5 / 8, hw.ProductEfficiency(
        (5, 128, 64, 128, True, 2)))

  def testOpSeconds(self):
    hw = hardware.Parse('devices=1,tflops=100,efficiency=0.5,memory_gbps=1000,'
                        'tile=128,tile_k=64,cores=4,launch_us=2')
    # A large product: its FLOPs at 50 TFLOP/s, plus the launch.
    big = op_cost.MatMul(1, 4096, 4096, 4096, size=2)
    self.assertAlmostEqual(big.flops / 50e12 + 2e-6, hw.OpSeconds(big))
    # A product of one row pads to a tile's 128: 1/128 of the rate.
    row = op_cost.MatMul(1, 1, 4096, 4096, size=2)
    self.assertAlmostEqual(row.flops * 128 / 50e12 + 2e-6,
                           hw.OpSeconds(row))
    # On slow memory it reads its weight for longer: bound by memory.
    slow = hw._replace(memory_bandwidth=1e10)
    self.assertAlmostEqual(row.bytes / 1e10 + 2e-6, slow.OpSeconds(row))
    # Memory-bound kinds: their bytes at the bandwidth.
    norm = op_cost.Norm(10**6, size=4)
    self.assertAlmostEqual(8e6 / 1e12 + 2e-6, hw.OpSeconds(norm))
    # `other`, and any op without the op model: FLOPs at the flat rate.
    self.assertAlmostEqual(1e-3, hw.OpSeconds(op_cost.Other(5e10)))
    flat = hardware.Parse('devices=1,tflops=100,efficiency=0.5,'
                          'memory_gbps=1000')
    self.assertFalse(flat.op_model)
    self.assertAlmostEqual(big.flops / 50e12, flat.OpSeconds(big))

  def testAcceleratorPresetsTimeOps(self):
    for name in ('h100x8', 'a100x8', 'tpu_v4_8', 'tpu_v5e_8'):
      with self.subTest(preset=name):
        hw = hardware.Parse(name)
        self.assertTrue(hw.op_model)
        self.assertIn('ops timed by kind and shape', hw.Describe())
    self.assertFalse(hardware.Parse('cpu').op_model)
    self.assertIn('989 TFLOP/s', hardware.Parse('h100x8').Describe())

  def testErrorsNameTheItemAndTheRule(self):
    cases = [
        ('', r'is empty: give a preset \(cpu, h100x8, a100x8, tpu_v4_8, '
             r'tpu_v5e_8\)'),
        ('h100', r"'h100' is not a preset .* Did you mean 'h100x8'\?"),
        ('h100x8,devcies=4', r"unknown key 'devcies'.*Did you mean "
                             r"'devices'\?"),
        ('h100x8,devices=0', r'devices=.0. must be an int >= 1'),
        ('h100x8,devices=2.5', r'devices=.2\.5. must be an int >= 1'),
        ('h100x8,efficiency=1.5', r'efficiency=.1\.5. must be a number in '
                                  r'\(0, 1\]'),
        ('h100x8,tflops=-3', r'tflops=.-3. must be a number > 0'),
        ('h100x8,link_gbps=nan', r'link_gbps=.nan. must be a number > 0'),
        ('h100x8,share=all', r"share='all' must be 'none' .*"),
        ('cpu,concurrency=2/3', r'concurrency=.2/3. must be .* starting at '
                                r'1'),
        ('cpu,concurrency=1/2/1.5', r'non-decreasing'),
        ('h100x8,hosts=3', r'hosts=3 must divide devices=8'),
        ('h100x8,devices', r"'devices' is not key=value"),
        ('h100x8,hosts=1,hosts=2', r'hosts is given twice'),
        ('devices=4', r'tflops=\.\.\. is needed without a preset'),
        ('devices=4,tflops=1', r'memory_gbps=\.\.\. is needed'),
        ('devices=4,tflops=1,memory_gbps=1,hosts=2', r'hosts=2 needs '
                                                     r'network_gbps'),
    ]
    for text, regex in cases:
      with self.subTest(text=text):
        with self.assertRaisesRegex(hardware.SpecError,
                                    r'^--plan_cluster.*' + regex):
          hardware.Parse(text)

  def testPresetsAreDescribed(self):
    self.assertEqual(list(hardware.PRESETS),
                     [line.split(':')[0] for line in hardware.Presets()])


if __name__ == '__main__':
  unittest.main()
