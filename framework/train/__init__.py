"""What runs a task: the train loop, eval and decode, checkpoints, reports.

Why a room of its own: none of it is needed to define or inspect a model,
and all of it is needed to train one. It imports the core and the pipeline
room (for nothing but what a task's FProp already uses).

  programs        TrainProgram: the train loop (boundaries, summaries,
                  checkpoints, preemption) around a state and a runner.
  train_state     TrainState: learners, counters, EMA; what a checkpoint
                  holds.
  runners         how one step runs on a strategy (SyncRunner: synchronous
                  replicas); the seam a distribution option supplies.
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
