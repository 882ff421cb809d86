"""cadence.framework.testing: a kit for the tests of one's own layers and
pipelined experiments. Public: these names stay stable.

  CheckLayer(layer_params, *inputs, ...)       a layer's FPropMeta against
      its FProp: output shapes, the products' FLOPs, the activation bytes
      its backward keeps (act, act_weights, residuals), a gradient for
      every trainable variable, randomness replayed by the step seed.
      Returns a LayerReport; raises LayerCheckError (an AssertionError)
      listing every failed check with its numbers.
  CheckPipelinedExperiment(key or params, schedules=, splits=,
      micro_batches=, ...)                       one step of every layout
      against the unpipelined model: loss and gradients within a
      tolerance. Returns a PipelineReport; raises PipelineCheckError.
  SetLogicalCpus(n)                            n logical CPU devices, for
      pipelines in one process (before TensorFlow runs anything).
  measure                                      the measurements themselves
      (Flops, SavedBytes, ResidualBytes, StatefulRandomOps).

Example (tests/my_block_test.py of one's own package):
  from cadence.framework import testing
  from my_pkg import layers

  def testMyBlock():
    testing.CheckLayer(layers.MyBlock.Params().Set(dim=16), [4, 16])

  def testMyExperimentPipelines():
    testing.CheckPipelinedExperiment('examples.pipelined_mlp.PipelinedMlp',
                                     splits=(1, 2), micro_batches=(1, 4))
"""
from cadence.framework.testing import measure
from cadence.framework.testing.layer_check import CHECKS
from cadence.framework.testing.layer_check import CheckLayer
from cadence.framework.testing.layer_check import Figure
from cadence.framework.testing.layer_check import LayerCheckError
from cadence.framework.testing.layer_check import LayerReport
from cadence.framework.testing.pipeline_check import CheckPipelinedExperiment
from cadence.framework.testing.pipeline_check import CompareLossAndGrads
from cadence.framework.testing.pipeline_check import Layout
from cadence.framework.testing.pipeline_check import Layouts
from cadence.framework.testing.pipeline_check import PipelineCheckError
from cadence.framework.testing.pipeline_check import PipelineReport
from cadence.framework.testing.pipeline_check import SetLogicalCpus
