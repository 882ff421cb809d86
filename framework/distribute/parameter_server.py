"""The `parameter_server` option: a TF_CONFIG with a "ps" job.

The cluster has one 'chief', the coordinator, which runs
ParameterServerStrategy and its train program (ps_programs.PsTrainProgram:
asynchronous steps scheduled on the workers, variables on the servers);
'worker' and 'ps' tasks start a tf.distribute.Server and only serve
(`Serve`) until the run is finished and the chief has exited. Before
its task is created, each checks what the chief would refuse of the job
and the params (sync_run.CheckBeforeDevices: `CheckJob`, the params
checked as a build checks them, and `CheckParams`, the runner's refusals,
e.g. learner.shard_optimizer_state), so every task of a refused command
exits 2 with the chief's line. Before its
strategy connects to them, the chief waits until every 'ps' and 'worker'
task accepts a TCP connection (peer_wait.py: a line every 10 s names
those not seen yet; --peer_timeout_s ends the wait with exit 2, a signal
with exit 0). One device
per worker: no pipeline, one replica. The cluster runs trainer jobs only,
without --xla; a signal stops the chief at its next boundary (the workers
do not stop by themselves), and a failed task stops the chief with one
line (exit 4) while the others keep serving.

Its flags are the multi_worker option's (--worker_gpus, --peer_timeout_s:
multi_worker.MultiHostFlags, declared there). TensorFlow is imported where
it is used: the options' flags are read before it loads.

Example (on each task, the same TF_CONFIG cluster, its own task):
  TF_CONFIG='{"cluster": {"chief": ["h0:2222"], "ps": ["h1:2222"],
              "worker": ["h2:2222"]}, "task": {"type": "ps", "index": 0}}' \\
    python trainer.py --model=... --logdir=/shared/run --job=trainer
"""
import dataclasses

from cadence.framework.distribute import local
from cadence.framework.distribute import multi_worker
from cadence.framework.distribute import option
from cadence.framework.distribute import peer_wait


@dataclasses.dataclass
class ParameterServerSetup(option.Setup):
  """A task of parameter-server training; see the module docstring.

  Attributes (besides Setup's):
    num_ps: the cluster's parameter servers.
    server: this task's tf.distribute.Server for a 'worker' or 'ps' task
      (it only serves); None on the chief.
  """
  num_ps: int = 0
  server: object = None

  name = 'parameter_server'
  FLAGS = multi_worker.MultiHostFlags   # Shared: declared once, there.
  CHOSEN_BY = 'TF_CONFIG or --cluster_spec with a "ps" job'

  @classmethod
  def CheckFlags(cls, own):
    multi_worker.MultiWorkerSetup.CheckFlags(own)

  @classmethod
  def Applies(cls, flags):   # After tpu: no --tpu.
    return (flags.tf_config is not None and
            'ps' in flags.tf_config['cluster'])

  @classmethod
  def Create(cls, flags):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    own = cls.FlagsOf(flags)
    jobs = flags.tf_config['cluster']
    task_type = flags.tf_config['task'].get('type', '')
    index = int(flags.tf_config['task'].get('index', 0))
    if len(jobs.get('chief', [])) != 1 or not jobs.get('worker'):
      raise option.SetupError(
          'TF_CONFIG with a "ps" job (parameter-server training) needs one '
          '"chief" (the coordinator) and at least one "worker"; it has '
          f'{", ".join(f"{len(v)} {k!r}" for k, v in jobs.items())}.')
    if task_type not in ('chief', 'worker', 'ps'):
      raise option.SetupError(
          f'TF_CONFIG task type {task_type!r}: parameter-server training '
          "runs 'chief', 'worker' and 'ps' tasks; run evaler and decoder "
          'jobs without TF_CONFIG.')
    if flags.worker_replicas != 1 or flags.worker_split_size != 1:
      fix = ' '.join(f'--{name}=1' for name in ('worker_replicas',
                                                 'worker_split_size')
                     if getattr(flags, name) != 1)
      raise option.SetupError(
          'Parameter-server training (TF_CONFIG with a "ps" job) runs one '
          'replica of one device per worker, without a pipeline: '
          f'--worker_replicas={flags.worker_replicas} and '
          f'{option.SplitSizeFrom(flags)} (devices per replica) must both '
          'be 1. Pipelined models train on several hosts with '
          'MultiWorkerMirroredStrategy (TF_CONFIG without "ps"), or give '
          f'{fix} to train here.')
    device_type, num_devices = local.LocalDevices(flags.run_locally, 1, 1,
                                                  own.worker_gpus)
    spec = tf.train.ClusterSpec(jobs)
    server = strategy = None
    if task_type == 'chief':
      # The strategy connects to every server and blocks in C++ until all
      # answer: wait for them in Python first (peer_wait.py). The servers
      # start at once and wait for nobody, so the chief need not listen.
      try:
        peer_wait.WaitForTasks(flags.tf_config, ('ps', 'worker'),
                               own.peer_timeout_s, listen=False)
      except peer_wait.WaitError as e:
        raise option.SetupError(str(e)) from None
      strategy = tf.distribute.experimental.ParameterServerStrategy(
          tf.distribute.cluster_resolver.SimpleClusterResolver(
              spec, task_type='chief', task_id=0, rpc_layer='grpc'))
    else:
      server = tf.distribute.Server(spec, job_name=task_type,
                                    task_index=index, protocol='grpc',
                                    start=True)
    return cls(cluster=local.LocalCluster(device_type, num_devices, 1),
               strategy=strategy, num_workers=len(jobs['worker']),
               worker_index=index, task_type=task_type,
               num_ps=len(jobs['ps']), server=server)

  @property
  def is_chief(self):
    return self.task_type == 'chief'   # The coordinator.

  @property
  def serves(self):
    return self.server is not None

  @property
  def runs_steps(self):
    return False   # The workers run them.

  @classmethod
  def CheckJob(cls, job, trains, xla):
    if not trains:
      raise option.SetupError(
          f'--job={job} with parameter servers (TF_CONFIG with a "ps" job): '
          'the cluster runs --job=trainer or trainer_and_evaler; run evaler '
          'and decoder jobs without TF_CONFIG.')
    if xla:
      raise option.SetupError(
          '--xla with parameter servers: the coordinator dispatches '
          'uncompiled steps; drop --xla or the "ps" job.')

  @classmethod
  def CheckParams(cls, model_params):
    from cadence.framework.distribute import ps_programs  # pylint: disable=g-import-not-at-top
    ps_programs.PsRunner.CheckParams(model_params.task)

  def TrainProgram(self, model_params, logdir, xla=False, **kwargs):
    from cadence.framework.distribute import ps_programs  # pylint: disable=g-import-not-at-top
    self.CheckJob('trainer', trains=True, xla=xla)
    return ps_programs.PsTrainProgram(
        model_params, logdir, self.strategy, num_workers=self.num_workers,
        num_ps=self.num_ps, cluster=self.cluster, **kwargs)

  def Agreement(self):
    return None   # The chief stops the run; the workers do not.

  def Serve(self, finished, should_stop):
    from cadence.framework.distribute import ps_programs  # pylint: disable=g-import-not-at-top
    ps_programs.Serve(self, finished, should_stop=should_stop)

  def PeerFailed(self, error, latest):
    return ('a task of this parameter-server cluster failed or left '
            f'({error}); the chief stops, the other tasks keep serving. The '
            f'latest checkpoint is {latest}: restart the failed task, then '
            'the chief, to resume from it.')

  def __str__(self):
    role = ('the chief (coordinator)' if self.task_type == 'chief' else
            f'{self.task_type} {self.worker_index}')
    return (f'parameter-server training (1 chief, {self.num_workers} '
            f'worker(s), {self.num_ps} parameter server(s)): this task is '
            f'{role}')
