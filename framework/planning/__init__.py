"""Planning: which layout (replicas, devices, stages, micro-batches,
schedule, remat) trains a model fastest on a cluster, before running it.

Why a room of its own: the planner reads every other room (a model's
costs from its params and layers, the pipeline's schedules and memory
estimate, the train loop it times on this host, the strategies it
calibrates), and nothing but the trainer's `--mode=plan` and the benches
reads it.

  hardware      a cluster described (presets, or `key=value` text; no TF):
                devices, memory, links, shared compute, an op-level model.
  step_model    a training step's time simulated from a schedule's action
                lists and their costs (no TF).
  plan_model    a model's units, costs and memory under any layout, from
                its params alone (built without weights).
  plan_measure  this host measured: its units' times, its real steps, its
                memory bandwidth and concurrency (--plan_measure).
  planner       every layout simulated, fitted to real steps, ranked, and
                reported (`Plan`).
"""
