"""What `trainer.py` runs: the command line, the modes and their exit codes.

Why a room of its own: it is the top of the house, the only place that
puts the core, the pipeline, training, distribution and planning
together; nothing imports it but trainer.py and the tests.

  command_line      the flags checked before TensorFlow loads (no TF).
  user_error        a user's mistake: one line, exit 2 (no TF).
  mode_registry     trainer modes as a registry: name, flags, checks, Run.
  modes             the built-in modes, in --mode's order: sync_mode,
                    inspect_params_mode, inspect_model_mode,
                    inspect_pipeline_mode, export_mode, plan_mode (each
                    one module; the planning itself is framework/planning/).
  run_params        an experiment's params with the command line's
                    overrides; a run's params.txt.
  tf_log            TensorFlow's C++ log lines hidden unless --tf_log.
  trainer_lib       Main(options): set-up, the sync job, exit codes.
  inspect_lib       the model report: variables, FLOPs and memory.
  inspect_pipeline  a profiled step's timeline and measured memory.
  export            a checkpoint as a SavedModel, written whole.
  process_exit      how trainer.py ends its process, at once.
"""
