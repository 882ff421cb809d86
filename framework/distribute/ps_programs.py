"""Parameter-server training: asynchronous data parallelism on TF2's
ParameterServerStrategy and ClusterCoordinator.

The cluster (TF_CONFIG, the `parameter_server` option of
framework/distribute/parameter_server.py) has one 'chief', the coordinator
that runs this program, 'worker' tasks that compute and 'ps' tasks that hold
the variables; workers and parameter servers only serve (the sync
mode's server job, framework/jobs/sync_jobs.py). `PsTrainProgram` is `TrainProgram` with its state built in the
strategy's scope and the step runner `PsRunner`: three things change from
synchronous replicas (framework/train/runners.py SyncRunner):

  * where the state lives: the task, its optimizer slots, the EMA and the
    counters are created in the strategy's scope, so they live on the
    parameter servers, placed by `train.ps_placement` (least_loaded:
    tensorpack's greedy policy by bytes; round_robin: TF's default; see
    framework/distribute/ps_placement.py). Slots and EMA copies sit beside their
    variable. The bytes per server are logged at start;
  * how steps run: the chief schedules calls of the same compiled loop
    (`TrainProgram.train_loop`, several steps per call) on the workers
    through the coordinator. Each worker reads the variables from the
    servers, computes its gradients and applies them there, without waiting
    for the others (asynchronous: the updates of two workers may interleave,
    as in any parameter-server training). Between two boundaries (summary,
    log, checkpoint) the chief splits the steps into calls, at least one
    per worker, and waits for all of them, so the global step stops exactly
    at each boundary;
  * the input: each worker reads its own share of the data. The coordinator
    runs one dataset function on every worker, so the share cannot be a
    Python value: each worker's input takes a ticket (an int64 counter on a
    server, read-and-incremented when its iterator is built) and reads
    input shard `ticket % num_workers` (`num_input_shards=num_workers`,
    `input_shard_index=i`; the input generator defines what a shard is).
    On resume every shard starts at input position / num_workers.

Workers and parameter servers start a server (distribution.Create) and
`Serve` until the run is finished (the trainer's own test: the checkpoint
at max_steps, and for trainer_and_evaler the final decode) and the chief's
port is closed (it has exited: the servers must outlive it, or its exit
fails on functions it cannot remove from them). A chief that exits before
the run is finished (it failed, or refused what only it checks: its
logdir, say) leaves them serving, each saying so at once and every minute
while no chief answers: rerun the chief to resume from the latest
checkpoint, or stop them (SIGTERM).

Checkpoints and summaries are written by the chief in the layout of the
synchronous program (model variables keyed by path), so evaler and decoder
jobs read them as usual. A pipelined model (worker_split_size > 1) is
refused by distribution.Create.

Known limits: updates are not reproducible (asynchronous); after a worker
fails the coordinator reruns its call on another worker, which may run
steps twice and pass a boundary (the program then writes at the next one,
and at the end past max_steps).

Example (on the chief; setup from distribution.Create under TF_CONFIG):
  program = PsTrainProgram(model_params, '/tmp/run', setup.strategy,
                           num_workers=2, num_ps=2)
  program.Run()
"""
import math
import time

from absl import logging
import tensorflow as tf

from cadence.framework.distribute import peer_wait
from cadence.framework.distribute import ps_placement
from cadence.framework.train import preemption
from cadence.framework.train import programs
from cadence.framework.train import runners
from cadence.framework import validation


def SplitSteps(num_steps, num_calls, steps_per_loop=0):
  """Step counts of the loop calls that together run `num_steps` steps.

  At least `num_calls` calls (one per worker) when there are that many
  steps, each of at most `steps_per_loop` steps when it is set, the counts
  as even as possible.

  Example:
    SplitSteps(20, 2)       # [10, 10]
    SplitSteps(7, 2, 2)     # [2, 2, 2, 1]
  """
  calls = max(1, min(num_steps, num_calls))
  if steps_per_loop:
    calls = max(calls, math.ceil(num_steps / steps_per_loop))
  base, extra = divmod(num_steps, calls)
  return [base + 1] * extra + [base] * (calls - extra)


def PsTrainProgram(model_params, logdir, strategy, num_workers, num_ps,
                   **kwargs):
  """A TrainProgram of a task on parameter servers; see the module
  docstring.

  Args:
    model_params: the model's params (`model_registry.GetParams(key,
      'Train')`); the task is built here, in the strategy's scope.
    logdir: the experiment's logdir (checkpoints and summaries in
      logdir/train, written by this chief).
    strategy: a tf.distribute.experimental.ParameterServerStrategy.
    num_workers: the cluster's 'worker' tasks.
    num_ps: the cluster's 'ps' tasks.
    **kwargs: TrainProgram's peak_flops, on_checkpoint, start_time,
      cluster, steps_per_loop, watcher (the chief's: it stops the run at
      the next boundary; the workers' loops do not read it).

  Returns:
    A programs.TrainProgram whose runner is a PsRunner
    (`program.runner.placement`: the PsPlacement that placed the
    variables, bytes per server).
  """
  policy = validation.CheckOneOf(
      'task.train', 'ps_placement', model_params.task.train.ps_placement,
      ps_placement.POLICIES)
  coordinator = (
      tf.distribute.experimental.coordinator.ClusterCoordinator(strategy))
  if kwargs.get('watcher') is None:  # Its flag: a variable of the chief.
    kwargs['watcher'] = preemption.Watcher(signals=())
  with strategy.scope():
    placement = ps_placement.PsPlacement(strategy, policy, num_ps)
    with placement.Scope():
      task = model_params.Instantiate().task
      # One replica per worker: the program sees a single host.
      program = programs.TrainProgram(
          [task], logdir, strategy, runner=PsRunner,
          runner_args=dict(coordinator=coordinator,
                           num_ps_workers=num_workers, placement=placement),
          **kwargs)
  logging.info('Parameter servers: %s', placement.Report())
  return program


class PsRunner(runners.SyncRunner):
  """Steps scheduled on the workers by the chief's coordinator; see the
  module docstring.

  Args:
    state: the program's train_state.TrainState.
    coordinator: the chief's ClusterCoordinator.
    num_ps_workers: the cluster's 'worker' tasks.
    placement: the PsPlacement that placed the variables.
    **kwargs: runners.SyncRunner's other arguments.
  """

  NO_SHARDS = ('does not apply to parameter servers: they hold each slot '
               'once already, on the servers.')

  def __init__(self, state, coordinator, num_ps_workers, placement,
               **kwargs):
    super().__init__(state, **kwargs)
    self._coordinator = coordinator
    self._num_ps_workers = num_ps_workers
    self.placement = placement
    self.num_step_devices = num_ps_workers   # Workers compute concurrently.
    self._input_tickets = tf.Variable(
        tf.constant(0, tf.int64), trainable=False, name='input_tickets')

  def Iterator(self, dataset, start):
    """Per-worker iterators; each worker reads its own input shard."""
    del dataset  # The chief's dataset; the workers build their own.
    num = self._num_ps_workers
    start_batch = start // num
    inputs = [self.state.task.params.input.Copy().Set(
        num_input_shards=num, input_shard_index=i).Instantiate()
              for i in range(num)] if num > 1 else [self.input_generator]
    tickets = self._input_tickets

    def _WorkerDataset():
      datasets = [x.Dataset(start_batch=start_batch) for x in inputs]
      if num == 1:
        return datasets[0]
      shard = tickets.assign_add(1, read_value=True) % num
      return tf.data.Dataset.choose_from_datasets(
          datasets, tf.data.Dataset.from_tensors(shard).repeat())

    return iter(self._coordinator.create_per_worker_dataset(_WorkerDataset))

  def StopTensor(self):
    # The loop runs on the workers, which cannot read the chief's stop flag:
    # the chief looks at it between its calls (see Call).
    return tf.constant(False)

  def Call(self, loop, iterator, num_steps, keys):
    """Runs `num_steps` steps as calls of `loop` on the workers;
    {stat name: float} plus 'consecutive' and 'stop' (a signal to the
    chief: it stops at this boundary)."""
    results = [
        self._coordinator.schedule(
            loop, args=(iterator, tf.constant(n, tf.int32)))
        for n in SplitSteps(num_steps, self._num_ps_workers,
                            self.steps_per_loop)]
    self._coordinator.join()
    total = None
    for result in results:
      flat = result.fetch()[0]  # (stats, consecutive skips, stop)
      if flat.size:  # Learning rate: the last call's; the rest: summed.
        total = flat if total is None else total + flat
        last_lr = flat
    out = dict.fromkeys(keys, 0.0)
    if total is not None:
      out = dict(zip(keys, (float(v) for v in total)))
      if 'learning_rate' in out:
        out['learning_rate'] = float(last_lr[keys.index('learning_rate')])
    out['consecutive'] = int(self.state.consecutive.numpy())
    out['stop'] = self.watcher.requested is not None
    return out


def Serve(setup, finished, poll_secs=1.0, should_stop=lambda: None,
          look_secs=5.0, quiet_secs=60.0):
  """Serves as a 'worker' or 'ps' task until the run is over.

  It never waits in silence: every `look_secs` it tries the chief's port,
  and says at once when a chief it saw has gone before the run finished
  (the chief refused something this task could not check, failed, or was
  stopped), and every `quiet_secs` while no chief answers. It keeps
  serving then: a chief rerun resumes from the latest checkpoint on the
  same servers (SIGTERM stops this task).

  Args:
    setup: the task's parameter_server.ParameterServerSetup (its `server`
      started).
    finished: () -> a message when the run is finished, else None (the
      trainer's: its first clause is logged).
    poll_secs: seconds between two looks at the run.
    should_stop: () -> what asked this task to stop (e.g. 'SIGTERM'), or
      None; it stops at the next look.
    look_secs: seconds between two tries of the chief's port.
    quiet_secs: seconds between two lines while no chief answers.
  """
  chief = tf.train.ClusterSpec(setup.server.server_def.cluster).task_address(
      'chief', 0)
  logging.info('Serving the chief (coordinator) at %s; this %s task exits '
               'once the run is finished and the chief has exited.', chief,
               setup.task_type)
  up, next_look = False, 0.0
  gone = said = time.monotonic()   # No chief since; the last line about it.
  while True:
    reason = should_stop()
    if reason:
      logging.info('%s received: this %s task stops serving.', reason,
                   setup.task_type)
      return
    message = finished()
    if message and not peer_wait.Accepts(chief, 2.0):
      logging.info('%s; the chief has exited: this %s task stops.',
                   message.split(';')[0], setup.task_type)
      return
    now = time.monotonic()
    if now >= next_look:
      next_look = now + look_secs
      was_up, up = up, peer_wait.Accepts(chief, 2.0)
      if up:
        gone = said = now
      elif was_up:
        gone = said = now
        logging.warning(
            'The chief at %s has exited before the run finished (it stopped '
            'on an error, failed or was stopped; its own log says which): '
            'this %s task keeps serving, so that the chief, rerun, resumes '
            'from the latest checkpoint; stop it with SIGTERM.', chief,
            setup.task_type)
      elif now - said >= quiet_secs:
        said = now
        logging.warning(
            'No chief has answered at %s for %.0f s: this %s task keeps '
            'serving until the chief runs (again); stop it with SIGTERM.',
            chief, now - gone, setup.task_type)
    time.sleep(poll_secs)
