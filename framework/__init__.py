"""The core of Cadence, and the rooms of its engine.

The core (this folder) is what a layer, a task and an experiment are made
of: `hyperparams` (Params), `nested_map`, `shapes`, `validation`,
`step_seed`, `weight_init`, `base_layer`, `cluster` (devices and
placement), `device_call`, `cost` and `op_cost` (a layer's cost record),
`atomic_file` (files written whole), `model_registry`, the base
input generator, and the base task with what its params embed (`learner`,
`optimizer`, `lr_schedule`: a task's params hold its learner's, so they are
part of the model's definition, not of the loop that runs it).

The rooms run what the core defines; imports run one way, each room
importing the core and the rooms above it in this list, never one below:

  pipeline/    cells run over micro-batches and steps: traced cells,
               remat, Recurrent, the schedules (data) and their executor,
               the memory estimate and the timeline.
  train/       what runs a task: the train loop and its replicas, eval and
               decode programs, checkpoints, reports and summaries,
               preemption, the XLA step checks.
  distribute/  how a run is spread over devices and hosts: the strategy of
               each distribution option and its train program (mirrored,
               several hosts, parameter servers, TPU).
  planning/    which layout to run: the planner, its model of a model
               (from params, without weights), its measurements on this
               host, the step simulator and the hardware presets.
  jobs/        what `trainer.py` runs: the command line, the modes and
               their exit codes (a thin application over the rooms).
  testing/     the test kit users import for their own tests (public):
               a layer's FPropMeta held to its FProp, a pipelined
               experiment to its unpipelined model. It imports the core,
               pipeline/ and layers/; nothing of Cadence imports it.

`layers/`, `tasks/` and `params/` import the core and `pipeline/`, never
`train/`, `distribute/`, `planning/` or `jobs/` (tests/layering_test.py).
"""
