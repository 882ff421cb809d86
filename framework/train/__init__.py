"""What runs a task: the train loop, eval and decode, checkpoints, reports.

Why a room of its own: none of it is needed to define or inspect a model,
and all of it is needed to train one. It imports the core and the pipeline
room (for nothing but what a task's FProp already uses).

  programs        TrainProgram: the compiled train loop over replicas.
  replicas        one task copy per replica, gradients all-reduced stage by
                  stage on the stages' devices.
  eval_programs   evaluation and decoding of checkpoints.
  checkpointer, checkpoint_files
                  atomic saves, restores, damaged-checkpoint recovery.
  train_report, summary_utils
                  the numbers a user reads, and TensorBoard summaries.
  preemption      SIGTERM/SIGINT: finish the step, save, exit.
  xla_step        the static-shape checks of a compiled step.
"""
