"""What `trainer.py` runs: the jobs, their exit codes, the inspect modes.

Why a room of its own: it is the top of the house, the only place that
puts the core, the pipeline, training and distribution together; nothing
imports it but trainer.py and the tests.

  command_line      the flags checked before TensorFlow loads (no TF).
  tf_log            TensorFlow's C++ log lines hidden unless --tf_log.
  trainer_lib       Main(options): set-up, the job, exit codes.
  inspect_lib       --mode=inspect_model: variables, FLOPs and memory.
  inspect_pipeline  --mode=inspect_pipeline: a profiled step's timeline.
  plan_mode         --mode=plan: the planner's table printed, its
                    refusals as exit 2 (the planning is framework/planning/).
  process_exit      how trainer.py ends its process, at once.
"""
