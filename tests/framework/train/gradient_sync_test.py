"""Tests for cadence.framework.train.gradient_sync: one scheme chosen from
the params and the replica count, its name and slots checked from the
params alone, the registry.

The schemes' training is tested where it runs: the built-in all-reduce in
replicas_test (against one device), the sharded one in sharded_update_test
and trainer_sharded_test (bit for bit against the all-reduce), a scheme of
one's own in gradient_sync_addition_test.
"""
import tensorflow as tf

from cadence.framework import model_registry
from cadence.framework import validation
from cadence.framework.distribute import local
from cadence.framework.nested_map import NestedMap
from cadence.framework.train import gradient_sync
from cadence.framework.train import runners

_KEY = 'synthetic.linear_regression.RegressionTiny'
_BUILT_IN = "'auto', 'none', 'stage_all_reduce', 'sharded_state'"
_OWNER = r"^RegressionModel 'regression' \(params 'task'\): "


def _Train(**train):
  p = model_registry.GetParams(_KEY, 'Train')
  shard = train.pop('shard', False)
  p.task.train.learner.shard_optimizer_state = shard
  p.task.train.Set(**train)
  return p


class _Fake(gradient_sync.GradientSync):
  NAME = 'fake_for_a_test'


class GradientSyncTest(tf.test.TestCase):

  def testChosenOnceFromTheReplicasAndTheParams(self):
    choose = gradient_sync.Choose
    cases = [
        (dict(), 1, gradient_sync.NoSync),
        (dict(), 2, gradient_sync.StageAllReduceSync),
        (dict(shard=True), 4, gradient_sync.ShardedStateSync),
        # One replica has nothing to sync, whatever the name.
        (dict(shard=True), 1, gradient_sync.NoSync),
        (dict(gradient_sync='stage_all_reduce'), 1, gradient_sync.NoSync),
        (dict(gradient_sync='stage_all_reduce'), 2,
         gradient_sync.StageAllReduceSync),
        (dict(gradient_sync='sharded_state', shard=True), 2,
         gradient_sync.ShardedStateSync),
        (dict(gradient_sync='none'), 2, gradient_sync.NoSync),
    ]
    for train, replicas, want in cases:
      with self.subTest(train=train, replicas=replicas):
        self.assertIs(want, choose(_Train(**train).task.train, replicas,
                                   'regression'))

  def testBadNamesAndSlotsAreRefusedFromTheParams(self):
    cases = [
        (dict(gradient_sync='stage_allreduce'),
         rf"{_OWNER}train\.gradient_sync='stage_allreduce' must be one of "
         rf"{_BUILT_IN}\. Did you mean 'stage_all_reduce'\?$"),
        (dict(gradient_sync='stage_all_reduce', shard=True),
         rf"{_OWNER}train\.gradient_sync='stage_all_reduce' keeps whole "
         r'optimizer slots, and train\.learner\.shard_optimizer_state=True: '
         r"set shard_optimizer_state=False, or gradient_sync='auto'\.$"),
        (dict(gradient_sync='sharded_state'),
         rf"{_OWNER}train\.gradient_sync='sharded_state' updates sharded "
         r'optimizer slots, and train\.learner\.shard_optimizer_state=False: '
         r"set shard_optimizer_state=True, or gradient_sync='auto'\.$"),
    ]
    for train, message in cases:
      p = _Train(**train)
      with self.subTest(train=train):
        with self.assertRaisesRegex(ValueError, message):
          gradient_sync.CheckParams(p.task.train,
                                    validation.Owner(p.task))
        # The runner's params check, which the local option runs before
        # any devices are made (and the trainer turns into exit 2).
        with self.assertRaisesRegex(ValueError, message):
          runners.SyncRunner.CheckParams(p.task)
        with self.assertRaisesRegex(ValueError, message):
          local.LocalSetup.CheckParams(p)
    # 'none' with whole slots or sharded ones: one copy either way.
    for shard in (False, True):
      self.assertEqual('none', gradient_sync.CheckParams(
          _Train(gradient_sync='none', shard=shard).task.train, 'train'))

  def testNoSyncRefusesSeveralReplicas(self):
    task = _Train().Instantiate().task
    state = NestedMap(tasks=[task, task], task=task)
    with self.assertRaisesRegex(
        ValueError, rf"{_OWNER}train\.gradient_sync='none' leaves 4 replicas "
        r"apart; use 'auto' \(or another scheme\) with several replicas\.$"):
      gradient_sync.NoSync(state, None, None, num_workers=2)

  def testTheRegistry(self):
    self.assertEqual(('none', 'stage_all_reduce', 'sharded_state'),
                     gradient_sync.Names())
    try:
      self.assertIs(_Fake, gradient_sync.Register(_Fake))
      self.assertIs(_Fake, gradient_sync.Choose(
          _Train(gradient_sync='fake_for_a_test').task.train, 2, 'train'))
      with self.assertRaisesRegex(
          ValueError, r"^train\.gradient_sync='fake_for_a_test' is "
          r'registered already \(by _Fake\)\.$'):
        gradient_sync.Register(type('Other', (_Fake,), {}))
    finally:
      gradient_sync.Unregister('fake_for_a_test')
    self.assertNotIn('fake_for_a_test', gradient_sync.Names())
    for name in (None, 'auto'):
      with self.assertRaisesRegex(ValueError, r'needs a NAME other than '
                                  r"'auto'\.$"):
        gradient_sync.Register(type('Nameless', (_Fake,), {'NAME': name}))

  def testASchemeMustCombineTheVariablesLayersUpdate(self):
    state = NestedMap(tasks=[None, None], task=NestedMap(path='net'),
                      on_read=[('net.bn.moving_mean', None)])
    sync = _Fake(state, None, None)
    message = (r"^train\.gradient_sync='fake_for_a_test': _Fake does not "
               r'combine the copies of the variables a layer updates itself '
               r'\(net\.bn\.moving_mean\); override Combine and BeforeSave, '
               r'or subclass StageAllReduceSync')
    with self.assertRaisesRegex(NotImplementedError, message):
      sync.BeforeSave()
    with self.assertRaisesRegex(NotImplementedError, message):
      sync.Combine(state.on_read, [], [])
    sync.Combine([], [], [])   # Nothing to combine: nothing to do.


if __name__ == '__main__':
  tf.test.main()
