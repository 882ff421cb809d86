"""The pipeline engine: cells run over micro-batches on their devices.

Why a room of its own: the engine is the part of Cadence most likely to
grow (new schedules, a faster executor, a planner), and every piece of it
answers the same question: which stage runs which micro-batch, where and
when. It imports only the core.

  cell_program    one cell traced once, run forward and backward, checked.
  remat_policy    which forward tensors a backward keeps or recomputes.
  recurrent       Recurrent: one cell over the steps of a sequence.
  microbatch      cutting a batch into micro-batches and stitching it back.
  partition       the optimal contiguous cut of costs into stages.
  schedules       schedules as data: actions per device, one registry.
  executor        the one executor that runs any schedule's actions, with
                  the loss outside (StackedRecurrent) or inside
                  (PipelineLoss) the pipeline.
  memory_estimate each stage's bytes at every moment of a schedule.
  timeline        a profiled step as actions per device.
  timeline_chart  its chart: what ran when, on which device.
  memory_profile  each device's measured peak in a profiled step.
"""
