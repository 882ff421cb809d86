"""What a distribution option is: a `Setup` subclass, chosen from the flags.

A distribution option is one way of spreading a run over devices and hosts
(one host, several hosts, parameter servers, a TPU). It is a subclass of
`Setup` that says:

  name                the option's one spelling, in the registry;
  FLAGS               a dataclass of its own flags, declared once (fields
                      `flag_fields.Flag(default, help)`: --<field name>),
                      which trainer.py defines in absl; the option reads
                      their values with `FlagsOf(flags)`, and
                      `CheckFlags` checks them before TensorFlow loads
                      (raise SetupError; none by default). Its flags given
                      when another option runs are refused
                      (distribution.CheckChosenFlags);
  Applies(flags)      whether the trainer's `Flags` (and TF_CONFIG) ask for
                      it: the registry (distribution.py) runs the first
                      option that applies;
  CHOSEN_BY           what makes it apply, in words, for the line that
                      refuses its flags without it (e.g. '--tpu');
  Create(flags)       its devices, cluster and tf.distribute strategy,
                      before any other TF op: an instance, which the
                      trainer runs on;

and, on that instance, how the trainer runs on it. The defaults here are
synchronous data parallelism (the `local` and `multi_worker` options keep
them all); an option overrides what differs:

  TrainProgram(...)   its train program: by default one task copy per local
                      replica and `programs.TrainProgram` with the
                      synchronous runner; for a step that runs differently,
                      the same program with a runner of its own (the public
                      interface of framework/train/runners.py: `Step`,
                      `Iterator`, `Call`, ...; tpu_programs.TpuRunner,
                      ps_programs.PsRunner);
  CheckJob(...)       classmethod: jobs and flags it cannot run (a
                      SetupError);
  CheckParams(...)    classmethod: what its train program cannot run of
                      the experiment's params (a ValueError naming the
                      params path; by default the synchronous runner's),
                      from the params alone;
  serves, Serve(...)  a task that only serves others (a parameter server);
  runs_steps          whether this task runs the train steps (its memory is
                      checked against the step's estimate);
  Agreement()         how the hosts agree on the step a signal stops at
                      (framework/train/preemption.py);
  PeerFailed(...)     the line of a job whose peer task failed;
  is_chief, num_local_replicas, str(setup).

No TensorFlow at import: the registry and the options' flags are read
before it loads (trainer.py); the methods that need it import it.

Example (an option's instance, as the registry creates it):
  setup = distribution.Create(worker_replicas=2)   # local.LocalSetup
  with setup.cluster:
    setup.TrainProgram(model_params, '/tmp/run').Run()
"""
import dataclasses
import math

from cadence.framework.distribute import flag_fields


class SetupError(ValueError):
  """A device or cluster flag that cannot work; the trainer exits 2."""


def CheckNumber(name, value, low, meaning, integer=False):
  """Raises SetupError unless the flag --name's `value` is an int (with
  `integer`) or a finite number, >= `low`; the line says what it means, e.g.
  --worker_gpus=-1 must be an int >= 0 (GPUs to use; 0: all visible)."""
  kinds = int if integer else (int, float)
  if (isinstance(value, kinds) and not isinstance(value, bool) and
      value >= low and (integer or math.isfinite(value))):
    return
  raise SetupError(f'--{name}={value!r} must be '
                   f'{"an int" if integer else "a number"} >= {low} '
                   f'({meaning}).')


@dataclasses.dataclass(frozen=True)
class Flags:
  """The trainer's flags that choose and configure a distribution option.

  The flags every option reads are fields; each option's own flags (its
  FLAGS: --tpu, --worker_gpus, --peer_timeout_s...) are in `options`, and
  read as attributes too (`flags.tpu`). `distribution.Flags(...)` makes
  one with every registered option's flags, at their defaults unless
  given; an option reads its own with `FlagsOf`, which gives the default
  of any flag `options` lacks.

  Attributes:
    run_locally: 'cpu' or 'gpu'.
    worker_replicas: replicas on this host, an int >= 1.
    worker_split_size: devices per replica, an int >= 1.
    tf_config: the multi-host configuration (distribution.ReadTfConfig: a
      checked TF_CONFIG dict), or None.
    options: {flag name: value} of the options' own flags.
    worker_split_size_from: where worker_split_size came from, as errors
      name it (`SplitSizeFrom`; the cluster's split_size_from): the flag
      as typed, or the experiment's WORKER_SPLIT_SIZE; '': the flag.
  """
  run_locally: str = 'cpu'
  worker_replicas: int = 1
  worker_split_size: int = 1
  tf_config: dict = None
  options: dict = dataclasses.field(default_factory=dict)
  worker_split_size_from: str = ''

  def __post_init__(self):
    for name, value in self.options.items():
      if hasattr(self, name):
        raise ValueError(f'Flags: the option flag {name!r} would hide '
                         f'Flags.{name}.')
      object.__setattr__(self, name, value)   # flags.tpu, as before.


def SplitSizeFrom(flags):
  """Where `flags.worker_split_size` came from, as an error names it: its
  worker_split_size_from, else '--worker_split_size=K'."""
  return (flags.worker_split_size_from or
          f'--worker_split_size={flags.worker_split_size}')


@dataclasses.dataclass
class Setup:
  """What the trainer runs on, and how: one distribution option's instance.

  Attributes:
    cluster: the Cluster of this host's devices (model splits = replicas).
    strategy: the tf.distribute strategy over the replicas.
    num_workers: hosts training together.
    worker_index: this host's index (0: the chief, which writes); with
      parameter servers, the task's index in its TF_CONFIG job.
    task_type: 'worker' (or 'chief'), or 'ps', 'evaluator' from TF_CONFIG;
      '' for a local run.
  """
  cluster: object   # A cluster.Cluster.
  strategy: object
  num_workers: int = 1
  worker_index: int = 0
  task_type: str = ''

  name = ''   # The option's registry name; each subclass sets it.
  FLAGS = flag_fields.NoFlags   # A dataclass of its own flags (`Flag`s).
  # What makes `Applies` hold, in words: the line refusing this option's
  # flags when another option runs names it (e.g. '--tpu'); '': the name.
  CHOSEN_BY = ''

  @classmethod
  def FlagsOf(cls, flags):
    """This option's FLAGS with their values in `flags` (a Flags, or a dict
    {flag name: value}); a flag not there has its default."""
    return flag_fields.Read(cls.FLAGS, getattr(flags, 'options', flags))

  @classmethod
  def CheckFlags(cls, own):
    """Checks this option's own flags (`own`: its FLAGS) before TensorFlow
    loads, whether or not the option is chosen; raises SetupError naming
    the flag and the value. None by default."""

  @classmethod
  def Applies(cls, flags):
    """Whether `flags` (a Flags) ask for this option."""
    raise NotImplementedError(f'{cls.__name__}.Applies')

  @classmethod
  def Create(cls, flags):
    """The option's instance for `flags`: configures this host's devices
    and creates the strategy. Called before any other TF op.

    Raises:
      SetupError: a flag value this machine or cluster cannot run.
    """
    raise NotImplementedError(f'{cls.__name__}.Create')

  @property
  def num_local_replicas(self):
    return self.cluster.num_splits

  @property
  def num_replicas(self):
    return self.num_local_replicas * self.num_workers

  @property
  def is_chief(self):
    """Whether this task writes the checkpoints, summaries and params."""
    return self.worker_index == 0

  @property
  def serves(self):
    """Whether this task only serves other tasks (`Serve`), with no job of
    its own."""
    return False

  @property
  def runs_steps(self):
    """Whether this task runs the train steps itself (the memory check of
    a step runs on it even without --device_memory_gib)."""
    return True

  @classmethod
  def CheckJob(cls, job, trains, xla):
    """Raises SetupError if this option cannot run `job` (the --job flag;
    `trains`: a trainer job) with `xla` (the --xla flag). The trainer asks
    it of every task before the option is created (before a task waits for
    its peers or serves them)."""
    del job, trains, xla

  @classmethod
  def CheckParams(cls, model_params):
    """Refuses what this option's train program cannot run of
    `model_params`, from the params alone (its runner's CheckParams, e.g.
    a knob the runner refuses); by default the synchronous runner's
    (runners.SyncRunner.CheckParams: train.gradient_sync). The trainer
    runs it on every task of a trainer job before the option is created,
    those that only serve included, so that each refuses what the chief
    refuses, in the same line.

    Raises:
      ValueError: naming the params path, the value and the rule.
    """
    from cadence.framework.train import runners  # pylint: disable=g-import-not-at-top
    runners.SyncRunner.CheckParams(model_params.task)

  def TrainProgram(self, model_params, logdir, xla=False, **kwargs):
    """This option's train program, its task(s) built from `model_params`.

    Args:
      model_params: the model's params (`model_registry.GetParams(key,
        'Train')`).
      logdir: the experiment's logdir.
      xla: compile each replica's step with XLA (--xla).
      **kwargs: TrainProgram's peak_flops, on_checkpoint, start_time,
        steps_per_loop, watcher.

    Returns:
      A `programs.TrainProgram`; its `tasks` are the task copies built.
    """
    from cadence.framework.train import programs  # pylint: disable=g-import-not-at-top
    from cadence.framework.train import replicas  # pylint: disable=g-import-not-at-top
    tasks = replicas.BuildReplicas(model_params, self.cluster)
    return programs.TrainProgram(
        tasks, logdir, self.strategy, cluster=self.cluster,
        num_workers=self.num_workers, worker_index=self.worker_index,
        xla=xla, **kwargs)

  def Agreement(self):
    """The preemption agreement of the hosts: on several, all-reduced stop
    flags, so every host stops at the same step; None for one."""
    from cadence.framework.train import preemption  # pylint: disable=g-import-not-at-top
    if self.num_workers == 1:
      return None
    return preemption.AllReduceAgreement(self.strategy)

  def Serve(self, finished, should_stop):
    """Serves the other tasks until the run is over (when `serves`).

    Args:
      finished: () -> a message when the run is finished, else None.
      should_stop: () -> what asked this task to stop, or None.
    """
    raise NotImplementedError(f'{type(self).__name__} does not serve.')

  def FinishTogether(self):
    """After a normal end: returns once the job's other hosts are done too
    (True), or at once when it has none (False)."""
    return False

  def PeerFailed(self, error, latest):
    """The message of a job whose peer task failed, or None when it has
    no peers (the error is then its own, and raised as it is).

    Args:
      error: 'ErrorType: first line' of what the step raised.
      latest: the latest checkpoint's path, or 'none'.
    """
    if self.num_workers == 1:
      return None
    return (f'a peer host of this {self.num_workers}-host job failed or left '
            f'({error}); this host stops. The latest checkpoint is {latest}: '
            'rerun the same command on every host to resume from it.')

  def __str__(self):
    where = (f'{self.task_type} {self.worker_index} of {self.num_workers} '
             'hosts' if self.task_type else 'one host')
    return (f'{self.cluster!r}: {self.num_replicas} replica(s) of '
            f'{self.cluster.num_devices_per_split} device(s), {where}')
