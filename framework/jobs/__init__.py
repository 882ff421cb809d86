"""What `trainer.py` runs: the command line, the modes and their exit codes.

Why a room of its own: it is the top of the house, the only place that
puts the core, the pipeline, training, distribution and planning
together; nothing imports it but trainer.py and the tests.

  trainer_options   the common flags, each declared once (with its check);
                    TrainerOptions (no TF).
  command_line      the flags checked before TensorFlow loads (no TF).
  params_overrides  the override flags' text, read and checked (no TF).
  user_error        a user's mistake: one line, exit 2 (no TF).
  mode_registry     trainer modes as a registry: name, flags, checks, Run.
  modes             the built-in modes, in --mode's order: sync_mode,
                    inspect_params_mode, inspect_model_mode,
                    inspect_pipeline_mode, export_mode, plan_mode (each
                    one module, no TF at its top; the planning itself is
                    framework/planning/).
  job_flag          --job's forms (no TF).
  sync_run          the sync mode's run: the job checked, built and run.
  sync_jobs         what each --job runs: train, eval, decode, serve.
  run_params        an experiment's params with the command line's
                    overrides; a run's params.txt.
  tf_log            TensorFlow's C++ log lines hidden unless --tf_log.
  trainer_lib       Main(options): logs, devices, the mode run.
  exit_codes        the exit codes, and a failure's one line.
  inspect_lib       the model report: variables, FLOPs and memory.
  inspect_pipeline  a profiled step's timeline and measured memory.
  export            a checkpoint as a SavedModel, written whole.
  process_exit      how trainer.py ends its process, at once.

The modules import one another without a circle (tests/layering_test.py):
a mode module loads no TensorFlow at its top and imports what its Run
needs inside it; nothing it imports imports the modes back.
"""
