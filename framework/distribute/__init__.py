"""How a run is spread over devices and hosts.

Why a room of its own: each distribution option (one host, several hosts,
parameter servers, a TPU) is a strategy plus the train program that runs
under it; they build on the train loop (framework/train) and nothing in the
train loop needs to know which option runs it.

  distribution    the options: devices, the strategy and the Setup.
  tpu, tpu_programs
                  a Cloud TPU: connect, cut its cores into replicas, and the
                  replicated train program.
  ps_placement, ps_programs
                  parameter servers: variable placement, and the
                  coordinator's train program.
  coordinated_exit
                  the hosts of a multi-host job finish together.
"""
