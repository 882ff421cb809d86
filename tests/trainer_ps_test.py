"""Parameter-server training through trainer.py: 1 chief, 2 PS, 2 workers.

Five `python trainer.py --job=trainer` processes on localhost, the same
flags for all, each its role from TF_CONFIG (ports bound to port 0), train
RegressionTiny for 60 steps. Every process must exit 0 on its own: the
chief after its final checkpoint, the servers once the run is finished and
the chief has exited. The chief logs the bytes on each parameter server
(least_loaded: within the largest variable of each other), the train loss
summaries fall, and the checkpoint has the synchronous layout: a task built
here restores every variable by path (as an evaler does), and its Dev loss
is below the untrained weights'.

A cluster given a command the chief refuses (sharded optimizer state, which
parameter servers cannot run): every task, ps and worker included, exits 2
with the chief's one line, before any serves or waits (they used to serve
the refused chief for ever).
"""
import os
import re

import tensorflow as tf

from cadence.framework import model_registry
from cadence.framework.train import checkpointer
from cadence.framework.train import summary_utils
from cadence.tests import test_utils

_KEY = 'synthetic.linear_regression.RegressionTiny'
_STEPS = 60
_TASKS = (('chief', 0), ('ps', 0), ('ps', 1), ('worker', 0), ('worker', 1))
# RegressionTiny's largest variable: the 8 x 16 float32 matrix.
_LARGEST_BYTES = 8 * 16 * 4


def _DevLoss(task, batch):
  metrics, _ = task.FPropTower(task.theta, batch)
  return float(metrics.loss[0])


class ParameterServerTrainingTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.logdir = os.path.join(tf.compat.v1.test.get_temp_dir(), 'ps_run')
    cluster = test_utils.LocalCluster(chief=1, ps=2, worker=2)
    flags = [f'--model={_KEY}', f'--logdir={cls.logdir}', '--job=trainer',
             f'--max_steps={_STEPS}']
    runs = [test_utils.TrainerRun(*flags, script=True, cluster=cluster,
                                  task=task) for task in _TASKS]
    cls.results = {}
    try:
      for task, run in zip(_TASKS, runs):
        cls.results[task] = run.Finish(timeout=300)
        if cls.results[task][0] != 0:
          break  # A failed chief leaves the servers serving: stop them.
    finally:  # A failure must not leave servers behind.
      for run in runs:
        run.Kill()

  def testEveryTaskExitsZeroByItself(self):
    for task, (code, _, err) in self.results.items():
      with self.subTest(task=task):
        self.assertEqual(0, code, err[-3000:])
        self.assertNotIn('Traceback', err)
    for job, index in _TASKS[1:]:
      _, _, err = self.results[job, index]
      self.assertIn('parameter-server training (1 chief, 2 worker(s), 2 '
                    f'parameter server(s)): this task is {job} {index}', err)
      self.assertIn('The run is finished: '
                    f'{os.path.join(self.logdir, "train")} holds the '
                    f'checkpoint of step {_STEPS} (max_steps {_STEPS}); the '
                    f'chief has exited: this {job} task stops.', err)

  def testLeastLoadedBytesPerServerAreLogged(self):
    _, _, err = self.results['chief', 0]
    m = re.search(r'least_loaded placement on 2 parameter server\(s\): '
                  r'ps 0 ([\d,]+) bytes \(\d+ variables\), ps 1 ([\d,]+) '
                  r'bytes', err)
    self.assertIsNotNone(m, err[-3000:])
    b0, b1 = (int(g.replace(',', '')) for g in m.groups())
    # Logged bytes hold Adam's 2 slots per variable: 3 x the model's.
    self.assertLessEqual(abs(b0 - b1), 3 * _LARGEST_BYTES)
    self.assertGreater(min(b0, b1), 0)

  def testTrainLossFalls(self):
    losses = summary_utils.ReadScalars(
        os.path.join(self.logdir, 'train'))['loss']
    self.assertEqual([20, 40, 60], [step for step, _ in losses])
    first, last = losses[0][1], losses[-1][1]
    self.assertLess(last, 0.5 * first, losses)

  def testCheckpointRestoresByPathAndBeatsTheUntrainedWeights(self):
    path = os.path.join(self.logdir, 'train', f'ckpt-{_STEPS}')
    params = model_registry.GetParams(_KEY, 'Dev')
    task = params.Instantiate().task
    batch = next(iter(params.input.Instantiate().Dataset()))
    untrained = _DevLoss(task, batch)
    ckpt = tf.train.Checkpoint(model=checkpointer.KeyedVariables(
        checkpointer.TaskVariables(task)))
    ckpt.read(path).assert_existing_objects_matched()
    trained = _DevLoss(task, batch)
    self.assertLess(trained, 0.5 * untrained)


class RefusedClusterTest(tf.test.TestCase):

  def testEveryTaskRefusesWhatTheChiefRefusesWithItsLine(self):
    logdir = os.path.join(self.get_temp_dir(), 'refused')
    cluster = test_utils.LocalCluster(chief=1, ps=1, worker=1)
    flags = [f'--model={_KEY}', f'--logdir={logdir}', '--job=trainer',
             '--model_params_override=task.train.learner.'
             'shard_optimizer_state=True']
    tasks = (('chief', 0), ('ps', 0), ('worker', 0))
    runs = [test_utils.TrainerRun(*flags, script=True, cluster=cluster,
                                  task=task) for task in tasks]
    try:   # A task that served would outlive the timeout: a failure.
      results = [run.Finish(timeout=120) for run in runs]
    finally:
      for run in runs:
        run.Kill()
    for task, (code, _, err) in zip(tasks, results):
      with self.subTest(task=task):
        test_utils.AssertUserErrorLine(
            self, code, err, r"^Error: Bad params: regression's "
            r'train\.learner: shard_optimizer_state=True does not apply to '
            r'parameter servers: they hold each slot once already, on the '
            r'servers\.$')
        self.assertNotIn('Serving the chief', err)
    self.assertFalse(os.path.exists(logdir))


if __name__ == '__main__':
  tf.test.main()
