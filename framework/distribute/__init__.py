"""How a run is spread over devices and hosts.

Why a room of its own: each distribution option (one host, several hosts,
parameter servers, a TPU) is a strategy plus the train program that runs
under it; they build on the train loop (framework/train) and nothing in the
train loop needs to know which option runs it.

  distribution    the registry of options: the first that applies to the
                  flags and TF_CONFIG creates the run's Setup.
  option          what an option is: a Setup subclass (its own flags,
                  when it applies, its devices and strategy, its train
                  program, what else the job needs), and the Flags that
                  choose it.
  flag_fields     flags declared once as dataclass fields, defined in
                  absl and read back: the options' and the trainer
                  modes' (no TensorFlow).
  local           one or several replicas on this host.
  multi_worker    several hosts, MultiWorkerMirroredStrategy.
  tf_config       $TF_CONFIG / --cluster_spec parsed and checked (no
                  TensorFlow: the trainer checks them before loading it).
  peer_wait       before a strategy starts, wait in Python (lines,
                  signals, --peer_timeout_s) for the peers it needs.
  tpu_option, tpu, tpu_programs
                  a Cloud TPU: the `tpu` option and its flags; connect
                  and cut its cores into replicas; the replicated train
                  program.
  parameter_server, ps_placement, ps_programs
                  parameter servers: the option, variable placement, and
                  the coordinator's train program.
  coordinated_exit
                  the hosts of a multi-host job finish together.
"""
