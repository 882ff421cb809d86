"""The trainer's devices, cluster and strategy: the registry of options.

Lingvo's flags say how a job spreads over devices. Every option reads
these (option.Flags):

  --run_locally         cpu or gpu;
  --worker_replicas     data-parallel replicas on this host;
  --worker_split_size   devices per replica (its pipeline stages; default:
                        the experiment's WORKER_SPLIT_SIZE);
  TF_CONFIG             several hosts (or --cluster_spec, --task_type and
                        --task_index, which say the same; checked by
                        framework/distribute/tf_config.py);

and each option declares its own, once, in its module (its FLAGS):

  --tpu                 a Cloud TPU (with --tpu_zone, --tpu_project):
                        tpu_option.TpuFlags;
  --worker_gpus         GPUs of this host to use (--run_locally=gpu; 0:
                        all): local.LocalFlags, read by the multi-host
                        options too;
  --peer_timeout_s      with TF_CONFIG, the longest wait for the peer
                        tasks before the strategy starts (peer_wait.py):
                        multi_worker.MultiHostFlags, which parameter_server
                        shares.

A *distribution option* turns them into devices, a cluster and a
tf.distribute strategy, and says how the trainer runs on them (its train
program, the tasks that only serve, how the hosts agree to stop): a
`option.Setup` subclass in a module of its own (framework/distribute/
option.py says what it holds). The registry below lists the options in the
order they are tried; `Create` runs the first whose `Applies(flags)` holds:

  tpu               --tpu=<name or address>: TPUStrategy over the TPU's
                    cores, replicas of worker_split_size cores each, stage
                    s on logical core s (tpu_option.py; tpu.py connects,
                    tpu_programs.py trains);
  parameter_server  a TF_CONFIG with a "ps" job: the 'chief' runs
                    ParameterServerStrategy and its coordinator, 'worker'
                    and 'ps' tasks serve (parameter_server.py,
                    ps_programs.py);
  multi_worker      a TF_CONFIG without one: MultiWorkerMirroredStrategy,
                    the same command on every host (multi_worker.py);
  local             this host alone: the default strategy for one replica,
                    MirroredStrategy over several (local.py).

Either way the replicas' variables are per-replica copies, and gradients are
reduced stage by stage by tf.distribute's cross-device ops
(framework/train/replicas.py). MultiWorkerMirroredStrategy must exist before
any other TF op, so `Create` runs first in the trainer.

Adding an option is one module and one registry line: a Setup subclass
with its name, `Applies` and `Create` (and whatever it runs differently:
`TrainProgram`, `CheckJob`, `Serve`...; the base class's defaults are
synchronous data parallelism), and a `Register` line below, before the
options it must win over. Its own flags are its FLAGS, a dataclass of
`flag_fields.Flag(default, help)` fields, declared nowhere else: trainer.py
defines every registered option's (`DefineFlags`; a flag's help starts
with its options), hands their values over as one mapping
(`FlagValues` -> TrainerOptions.option_flags -> `Create(**option_flags)`),
and checks them before TensorFlow loads (the option's `CheckFlags`), and
refuses one given when none of its options runs (`CheckChosenFlags`:
--peer_timeout_s without TF_CONFIG, --worker_gpus with --tpu); the
option reads them with `FlagsOf(flags)`. Adding a flag to an option is one
field of its FLAGS, read where the option uses it. Two options that read the same flag share its declaration (a FLAGS
that subclasses the other's, or the same class); `Register` refuses a flag
declared twice or named like a common one. The modules of the options
import TensorFlow only inside the methods that use it, since trainer.py
reads the registry before TensorFlow loads.

A toy: the README's "A distribution option of one's own" writes one in
full, `one_device.py` (one replica on the CPU its flag --one_device_cpu
names, under the default strategy and the plain train program, chosen
instead of `local` when the flags ask for one device), with its two lines
here:

  from cadence.framework.distribute import one_device
  Register(one_device.OneDeviceSetup, before='local')

tests/readme_test.py trains it through trainer.py, and
tests/framework/distribute/distribution_test.py registers it, parses its
flag and trains it through trainer_lib. (An option may read another's
flag as an attribute, `flags.tpu`: the Flags made here hold every
registered option's flags.)

Example (two hosts, the same command on each):
  TF_CONFIG='{"cluster": {"worker": ["h0:2222", "h1:2222"]},
              "task": {"type": "worker", "index": 0}}' \\
    python trainer.py --model=... --logdir=/shared/run --job=trainer
"""
import dataclasses

from cadence.framework.distribute import flag_fields
from cadence.framework.distribute import local
from cadence.framework.distribute import multi_worker
from cadence.framework.distribute import option
from cadence.framework.distribute import parameter_server
from cadence.framework.distribute import peer_wait
from cadence.framework.distribute import tf_config
from cadence.framework.distribute import tpu_option

TF_CONFIG = tf_config.TF_CONFIG
Setup = option.Setup
SetupError = option.SetupError
# SIGTERM/SIGINT while a host waited for its peers; nothing was built.
Stopped = peer_wait.Stopped
PEER_TIMEOUT_S = peer_wait.DEFAULT_TIMEOUT_S
# The flags every option reads (option.Flags' fields), not any one's own.
_COMMON = tuple(f.name for f in dataclasses.fields(option.Flags))


def ParseClusterSpec(spec, task_type, task_index):
  """Lingvo's `--cluster_spec` ('worker=h:p,h:p@ps=h:p') as a TF_CONFIG dict.

  Raises:
    SetupError: a malformed spec or a task not in it (tf_config.py).
  """
  try:
    return tf_config.ParseClusterSpec(spec, task_type, task_index)
  except tf_config.ConfigError as e:
    raise SetupError(str(e)) from None


def ReadTfConfig(cluster_spec='', task_type='', task_index=0):
  """The multi-host configuration: --cluster_spec, else $TF_CONFIG, else None.

  Returns:
    The TF_CONFIG dict, checked (framework/distribute/tf_config.py), or None
    for a local run.

  Raises:
    SetupError: a configuration that cannot describe a cluster.
  """
  try:
    return tf_config.Read(cluster_spec, task_type, task_index)
  except tf_config.ConfigError as e:
    raise SetupError(str(e)) from None


# --- the registry ------------------------------------------------------------

_OPTIONS = []   # Setup subclasses, in the order they are tried.


def Register(setup_cls, before=None):
  """Adds the option `setup_cls` (a Setup subclass) to the registry.

  Args:
    setup_cls: the option; its `name` must be new, and its FLAGS' fields
      new flags (or fields it shares with another option's FLAGS, by
      subclassing that dataclass or naming it: declared once).
    before: the name of an option it is tried before (None: after all).

  Raises:
    ValueError: an empty or taken name, or a flag declared again.
    KeyError: `before` is not registered.
  """
  if not setup_cls.name or setup_cls.name in Names():
    raise ValueError(f'Distribution option {setup_cls.__name__}: name '
                     f'{setup_cls.name!r} is empty or registered already.')
  if not dataclasses.is_dataclass(setup_cls.FLAGS):
    raise ValueError(f'Distribution option {setup_cls.__name__}: FLAGS='
                     f'{setup_cls.FLAGS!r} must be a dataclass of Flag '
                     'fields.')
  taken = _Fields()
  for f in dataclasses.fields(setup_cls.FLAGS):
    if f.name in _COMMON:
      raise ValueError(f'Distribution option {setup_cls.__name__}: the flag '
                       f'--{f.name} is common to every option '
                       '(option.Flags); give its own flag another name.')
    if f.name in taken and taken[f.name][0] is not f:
      raise ValueError(
          f'Distribution option {setup_cls.__name__}: the flag --{f.name} '
          f'is option {taken[f.name][1][0]!r}\'s already; declare it once '
          '(a FLAGS that subclasses that option\'s shares it).')
  _OPTIONS.insert(len(_OPTIONS) if before is None else _Index(before),
                  setup_cls)


def Unregister(name):
  """Removes option `name` from the registry (for tests)."""
  del _OPTIONS[_Index(name)]


def _Index(name):
  if name not in Names():
    raise KeyError(f'Distribution option {name!r}; expected one of '
                   f'{list(Names())}.')
  return Names().index(name)


def Names():
  """The registered options' names, in the order they are tried."""
  return tuple(cls.name for cls in _OPTIONS)


def _Fields():
  """{flag name: (its dataclasses.Field, [names of the options it is
  declared for])} of every registered option's own flags, in registry
  order."""
  out = {}
  for setup_cls in _OPTIONS:
    for f in dataclasses.fields(setup_cls.FLAGS):
      out.setdefault(f.name, (f, []))[1].append(setup_cls.name)
  return out


def FlagNames():
  """The names of the registered options' own flags (each once)."""
  return tuple(_Fields())


def DefineFlags(flags_module, flag_values=None):
  """Defines the registered options' own flags in absl (`flags_module`:
  absl's `flags`), each once, from its FLAGS field: its help line starts
  with the option(s) it is for."""
  for name, (f, names) in _Fields().items():
    options = f'Option{"s" if len(names) > 1 else ""} {", ".join(names)}'
    flag_fields.Define(flags_module, f, name,
                       f'{options}: {f.metadata["help"]}', flag_values,
                       module_name=__name__)


def FlagValues(flag_values):
  """{flag name: value} of the registered options' own flags in absl's
  parsed `flag_values` (or any object with them as attributes; a flag it
  lacks has its default): what trainer.py hands trainer_lib
  (TrainerOptions.option_flags), and `Create` takes as keywords."""
  return {name: getattr(flag_values, name, f.default)
          for name, (f, _) in _Fields().items()}


def CheckFlags(option_flags):
  """Runs every registered option's `CheckFlags` on its own flags, before
  TensorFlow loads (command_line.Check).

  Args:
    option_flags: {flag name: value} (`FlagValues`); a flag not there has
      its default.

  Raises:
    SetupError: naming the flag, the value and the rule.
  """
  for setup_cls in _OPTIONS:
    setup_cls.CheckFlags(setup_cls.FlagsOf(option_flags))


def Flags(run_locally='cpu', worker_replicas=1, worker_split_size=1,
          tf_config=None, worker_split_size_from='', **option_flags):
  """The option.Flags of these values, with every registered option's own
  flags: `option_flags` (e.g. tpu='my-tpu'), the others at their defaults.

  Raises:
    TypeError: a keyword that is no registered option's flag.
  """
  fields = _Fields()
  unknown = sorted(set(option_flags) - set(fields))
  if unknown:
    raise TypeError(f'Flags() got {", ".join(unknown)}: not a flag of the '
                    f'options {", ".join(Names())} (their flags: '
                    f'{", ".join(fields)}).')
  values = {name: option_flags.get(name, f.default)
            for name, (f, _) in fields.items()}
  return option.Flags(run_locally=run_locally,
                      worker_replicas=worker_replicas,
                      worker_split_size=worker_split_size,
                      tf_config=tf_config, options=values,
                      worker_split_size_from=worker_split_size_from)


def Choose(flags):
  """The option (Setup subclass) that runs `flags`: the first that applies.

  Raises:
    SetupError: none applies.
  """
  for setup_cls in _OPTIONS:
    if setup_cls.Applies(flags):
      return setup_cls
  raise SetupError(f'No distribution option runs {flags}; the options are '
                   f'{", ".join(Names())}.')


def _Described(setup_cls):
  """An option's name, with what chooses it (its CHOSEN_BY) if said."""
  by = setup_cls.CHOSEN_BY
  return f'{setup_cls.name} ({by})' if by else setup_cls.name


def CheckChosenFlags(flags):
  """Refuses an option's own flag given (not at its default) when none of
  the options that declare it runs `flags` (a Flags); a flag typed at its
  default value counts as not given, as a mode's flags do
  (mode_registry.CheckModeFlags).

  Returns:
    The option that runs `flags` (`Choose`).

  Raises:
    SetupError: one line naming the flag, the option(s) it needs and what
      chooses them, and the option that runs.
  """
  chosen = Choose(flags)
  by_name = {setup_cls.name: setup_cls for setup_cls in _OPTIONS}
  for name, (f, names) in _Fields().items():
    value = flags.options.get(name, f.default)
    if chosen.name in names or value == f.default:
      continue
    needs = [_Described(by_name[n]) for n in names]
    needs = ' or '.join(filter(None, [', '.join(needs[:-1]), needs[-1]]))
    raise SetupError(f'--{name}={value!r} needs option {needs}; this run is '
                     f'option {_Described(chosen)}.')
  return chosen


# The options, in the order they are tried: one line each.
Register(tpu_option.TpuSetup)
Register(parameter_server.ParameterServerSetup)
Register(multi_worker.MultiWorkerSetup)
Register(local.LocalSetup)


def Option(run_locally='cpu', worker_replicas=1, worker_split_size=1,
           tf_config=None, worker_split_size_from='', **option_flags):
  """(the option that runs these flags, their Flags): what `Create` creates,
  chosen without creating anything (no TensorFlow op), so that what must be
  refused before a task waits for its peers or serves them can be
  (option.Setup.CheckJob, CheckParams). Arguments and errors: `Create`'s,
  its peer wait apart."""
  for flag, value in (('worker_replicas', worker_replicas),
                      ('worker_split_size', worker_split_size)):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise SetupError(f'--{flag}={value!r} must be an int >= 1.')
  flags = Flags(run_locally=run_locally, worker_replicas=worker_replicas,
                worker_split_size=worker_split_size, tf_config=tf_config,
                worker_split_size_from=worker_split_size_from,
                **option_flags)
  return CheckChosenFlags(flags), flags


def Create(run_locally='cpu', worker_replicas=1, worker_split_size=1,
           tf_config=None, worker_split_size_from='', **option_flags):
  """Configures devices and creates the strategy; call before any TF op.

  Args:
    run_locally: 'cpu' or 'gpu'.
    worker_replicas: replicas on this host, an int >= 1.
    worker_split_size: devices per replica, an int >= 1.
    tf_config: the multi-host configuration (`ReadTfConfig`), or None.
    worker_split_size_from: where worker_split_size came from, as layout
      errors name it (the flag as typed, or the experiment's
      WORKER_SPLIT_SIZE: the cluster's split_size_from); '': the flag.
    **option_flags: the options' own flags by name (`FlagNames`; each
      declared in its option's FLAGS): e.g. tpu='my-tpu' with tpu_zone and
      tpu_project (tpu_option.py), worker_gpus=2 (local.py: 0 is all
      visible), peer_timeout_s=60 (multi_worker.py: with tf_config, the
      longest wait for the peers; 0: no limit). Those not given have their
      defaults.

  Returns:
    The Setup of the option that applies (`Choose`).

  Raises:
    SetupError: a flag value this machine or cluster cannot run, an
      option's flag given when that option does not run
      (`CheckChosenFlags`), or a peer that never accepted a connection
      within peer_timeout_s.
    Stopped: SIGTERM or SIGINT while waiting for the peers.
    TypeError: a keyword that is no option's flag.
  """
  setup_cls, flags = Option(
      run_locally=run_locally, worker_replicas=worker_replicas,
      worker_split_size=worker_split_size, tf_config=tf_config,
      worker_split_size_from=worker_split_size_from, **option_flags)
  return setup_cls.Create(flags)
