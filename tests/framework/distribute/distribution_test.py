"""distribution: the registry of options; flags that cannot run.

The registry chooses the first option that applies to the flags, and an
option registered from outside (the README's toy, its module run from
there) runs through the trainer exactly as the default path does; its own
flag, declared once in its FLAGS dataclass, is defined, parsed and handed
to it as the built-in options' are. Of the flags and TF_CONFIG
that cannot run (SetupErrors), only the checks that fail before TensorFlow
is touched run here (a strategy or a server changes the process for good);
the clusters that work are tests/trainer_multihost_test.py and
tests/trainer_ps_test.py.
"""
import dataclasses
import io
import os
import re
import socket
import sys
import time
from unittest import mock

from absl import flags as absl_flags
import tensorflow as tf

from cadence.framework.distribute import distribution
from cadence.framework.distribute import flag_fields
from cadence.framework.distribute import local
from cadence.framework.distribute import multi_worker
from cadence.framework.jobs import trainer_lib
from cadence.framework.train import checkpointer
from cadence.tests import readme_blocks
from cadence.tests import test_utils

_PS_CLUSTER = {'chief': ['127.0.0.1:1'], 'ps': ['127.0.0.1:2'],
               'worker': ['127.0.0.1:3', '127.0.0.1:4']}


def _PsConfig(cluster=None, task_type='chief', index=0):
  return {'cluster': cluster or _PS_CLUSTER,
          'task': {'type': task_type, 'index': index}}


class ParameterServerSetupTest(tf.test.TestCase):

  def testPipelineOrReplicasPerWorkerAreRefused(self):
    for flags in (dict(worker_split_size=2), dict(worker_replicas=2)):
      with self.subTest(**flags):
        with self.assertRaisesRegex(
            distribution.SetupError,
            r'^Parameter-server training \(TF_CONFIG with a "ps" job\) runs '
            r'one replica of one device per worker, without a pipeline: '
            rf'--worker_replicas={flags.get("worker_replicas", 1)} and '
            rf'--worker_split_size={flags.get("worker_split_size", 1)} '
            r".*must both be 1\. Pipelined models train on several hosts "
            r'with MultiWorkerMirroredStrategy'):
          distribution.Create(tf_config=_PsConfig(), **flags)

  def testTheClusterNeedsAChiefAndWorkers(self):
    for cluster in ({'ps': ['h:1'], 'worker': ['h:2']},
                    {'chief': ['h:0'], 'ps': ['h:1']}):
      with self.subTest(jobs=sorted(cluster)):
        with self.assertRaisesRegex(
            distribution.SetupError,
            r'needs one "chief" \(the coordinator\) and at least one '
            r'"worker"; it has '):
          distribution.Create(tf_config=_PsConfig(cluster))

  def testOnlyChiefWorkerAndPsTasks(self):
    with self.assertRaisesRegex(
        distribution.SetupError,
        r"task type 'evaluator': parameter-server training runs 'chief', "
        r"'worker' and 'ps' tasks; run evaler and decoder jobs without "
        r'TF_CONFIG\.'):
      distribution.Create(tf_config=_PsConfig(task_type='evaluator'))

  def testClusterSpecFlagNamesPsTasks(self):
    config = distribution.ParseClusterSpec(
        'chief=h:4@ps=h:1,h:2@worker=h:3', 'ps', 1)
    self.assertEqual({'chief': ['h:4'], 'ps': ['h:1', 'h:2'],
                      'worker': ['h:3']}, config['cluster'])
    self.assertEqual({'type': 'ps', 'index': 1}, config['task'])


# The README's toy option (its module "framework/distribute/one_device.py",
# run from the README as written there).
_ONE_DEVICE = readme_blocks.Module('cadence.framework.distribute.one_device')
OneDeviceFlags = _ONE_DEVICE.OneDeviceFlags
OneDeviceSetup = _ONE_DEVICE.OneDeviceSetup


_WORKERS = {'worker': ['127.0.0.1:1', '127.0.0.1:2']}


class PeerWaitTest(tf.test.TestCase):
  """A peer that never comes is a SetupError after --peer_timeout_s,
  raised before the strategy exists (framework/distribute/peer_wait.py)."""

  def testMultiWorkerAndPsChiefRefuseAfterTheTimeout(self):
    workers = test_utils.LocalCluster(worker=2)
    ps = test_utils.LocalCluster(chief=1, ps=1, worker=1)
    for config, missing in (
        (_PsConfig(workers, 'worker', 0),
         f"worker 1 at {workers['worker'][1]}"),
        (_PsConfig(ps),
         f"ps 0 at {ps['ps'][0]}, worker 0 at {ps['worker'][0]}")):
      with self.subTest(jobs=sorted(config['cluster'])):
        start = time.monotonic()
        with self.assertRaisesRegex(
            distribution.SetupError,
            rf'^\d of \d peer\(s\) never accepted a connection within '
            rf'--peer_timeout_s=0\.5 s: {re.escape(missing)}\. '):
          distribution.Create(tf_config=config, peer_timeout_s=0.5)
        self.assertBetween(time.monotonic() - start, 0.5, 3)
    # The multi-worker host listened on its port while it waited: free now.
    socket.create_server(('', int(workers['worker'][0].split(':')[1]))
                         ).close()


class RegistryTest(tf.test.TestCase):

  def testTheFirstOptionThatAppliesIsChosen(self):
    self.assertEqual(('tpu', 'parameter_server', 'multi_worker', 'local'),
                     distribution.Names())
    table = (
        (dict(), 'local'),
        (dict(worker_replicas=2, worker_split_size=2), 'local'),
        (dict(run_locally='gpu'), 'local'),
        (dict(tf_config=_PsConfig(_WORKERS, 'worker', 1)), 'multi_worker'),
        (dict(tf_config=_PsConfig(dict(_WORKERS, evaluator=['h:3']),
                                  'evaluator')), 'multi_worker'),
        (dict(tf_config=_PsConfig()), 'parameter_server'),
        (dict(tf_config=_PsConfig(task_type='ps', index=0)),
         'parameter_server'),
        (dict(tpu='my-tpu'), 'tpu'),
        # The TPU option refuses a TF_CONFIG itself (tests/trainer_bad_
        # inputs_test.py), so it must be the one chosen.
        (dict(tpu='grpc://h:8470', tf_config=_PsConfig()), 'tpu'),
    )
    for flags, name in table:
      with self.subTest(**flags):
        self.assertEqual(name, distribution.Choose(
            distribution.Flags(**flags)).name)

  def testRegisterNamesTheMistake(self):
    with self.assertRaisesRegex(
        ValueError, r"^Distribution option LocalSetup: name 'local' is "
        r'empty or registered already\.$'):
      distribution.Register(local.LocalSetup)
    with self.assertRaisesRegex(
        KeyError, r"Distribution option 'locale'; expected one of \['tpu', "
        r"'parameter_server', 'multi_worker', 'local'\]\."):
      distribution.Register(OneDeviceSetup, before='locale')
    self.assertNotIn('one_device', distribution.Names())

  def testAToyOptionTrainsThroughTheTrainerAsTheDefaultPathDoes(self):
    tmp = self.get_temp_dir()

    def _Train(logdir):
      with mock.patch.object(sys, 'stderr', io.StringIO()) as err:
        code = trainer_lib.Main(trainer_lib.TrainerOptions(
            model='synthetic.linear_regression.RegressionTiny',
            logdir=logdir, job='trainer', max_steps=5, peak_tflops=1.0))
      self.assertEqual(0, code, err.getvalue())
      return checkpointer.ReadValues(os.path.join(logdir, 'train', 'ckpt-5'))

    distribution.Register(OneDeviceSetup, before='local')
    try:
      self.assertEqual(('tpu', 'parameter_server', 'multi_worker',
                        'one_device', 'local'), distribution.Names())
      self.assertIsInstance(distribution.Create(), OneDeviceSetup)
      self.assertIsInstance(distribution.Create(worker_replicas=2),
                            local.LocalSetup)
      toy = _Train(os.path.join(tmp, 'toy'))
    finally:
      distribution.Unregister('one_device')
    self.assertIsInstance(distribution.Create(), local.LocalSetup)
    default = _Train(os.path.join(tmp, 'default'))
    self.assertCountEqual(default, toy)
    weights = [k for k in default if k.startswith('model/')]
    self.assertNotEmpty(weights)
    for key in default:
      self.assertAllEqual(default[key], toy[key], msg=key)


class OptionFlagsTest(tf.test.TestCase):
  """An option's own flags are its FLAGS dataclass: one declaration, which
  the registry defines in absl, reads back and hands to the option."""

  def setUp(self):
    super().setUp()
    distribution.Register(OneDeviceSetup, before='local')
    self.addCleanup(distribution.Unregister, 'one_device')

  def testAToyOptionsFlagIsDefinedParsedAndReceived(self):
    values = absl_flags.FlagValues()   # Not the trainer's global FLAGS.
    distribution.DefineFlags(absl_flags, values)
    values(['trainer.py', '--one_device_cpu=1'])
    # The definition came from the dataclass field.
    flag = values['one_device_cpu']
    self.assertEqual('Option one_device: The CPU of this host the '
                     'one_device option trains on.', flag.help)
    self.assertEqual('int', flag.parser.flag_type())
    self.assertEqual(0, flag.default)
    self.assertEqual(1, values.one_device_cpu)
    # The values go by one generic path: a mapping of the options' flags.
    option_flags = distribution.FlagValues(values)
    self.assertEqual(1, option_flags['one_device_cpu'])
    self.assertEqual('', option_flags['tpu'])
    self.assertEqual(OneDeviceFlags(1),
                     OneDeviceSetup.FlagsOf(distribution.Flags(
                         **option_flags)))
    setup = distribution.Create(**option_flags)
    self.assertIsInstance(setup, OneDeviceSetup)
    self.assertEqual(['/device:CPU:1'],
                     setup.cluster.devices)
    # Through the trainer's options, as trainer.py hands them over.
    setup = trainer_lib.ConfigureDevices(trainer_lib.TrainerOptions(
        model='synthetic.linear_regression.RegressionTiny',
        option_flags=option_flags))
    self.assertIsInstance(setup, OneDeviceSetup)
    self.assertEqual(['/device:CPU:1'],
                     setup.cluster.devices)

  def testAnOptionsFlagIsRefusedWhenAnotherOptionRuns(self):
    # Generic: the toy's flag, given (not at its default) where `local`
    # runs, names the option it needs; at its default it is not given.
    two = distribution.Flags(worker_replicas=2, one_device_cpu=1)
    line = (r'^--one_device_cpu=1 needs option one_device; this run is '
            r'option local \(this host alone: no --tpu, TF_CONFIG or '
            r'--cluster_spec\)\.$')
    with self.assertRaisesRegex(distribution.SetupError, line):
      distribution.CheckChosenFlags(two)
    with self.assertRaisesRegex(distribution.SetupError, line):
      distribution.Create(worker_replicas=2, one_device_cpu=1)
    self.assertIs(local.LocalSetup, distribution.CheckChosenFlags(
        distribution.Flags(worker_replicas=2, one_device_cpu=0)))
    self.assertIs(OneDeviceSetup, distribution.CheckChosenFlags(
        distribution.Flags(one_device_cpu=1)))
    # A flag several options share is refused only where none of them runs.
    config = {'cluster': {'worker': ['h:1', 'h:2']},
              'task': {'type': 'worker', 'index': 0}}
    self.assertIs(multi_worker.MultiWorkerSetup,
                  distribution.CheckChosenFlags(distribution.Flags(
                      tf_config=config, peer_timeout_s=5.0, worker_gpus=1)))
    with self.assertRaisesRegex(
        distribution.SetupError, r'^--peer_timeout_s=5\.0 needs option '
        r'parameter_server \(TF_CONFIG or --cluster_spec with a "ps" job\) '
        r'or multi_worker \(TF_CONFIG or --cluster_spec without a "ps" '
        r'job\); this run is option one_device\.$'):
      distribution.CheckChosenFlags(distribution.Flags(peer_timeout_s=5.0))

  def testTheBuiltInOptionsFlagsComeFromTheirDataclasses(self):
    values = absl_flags.FlagValues()
    distribution.DefineFlags(absl_flags, values)
    values(['trainer.py', '--tpu_zone=us-central2-b', '--worker_gpus=2',
            '--peer_timeout_s=30'])
    self.assertEqual("Option tpu: GCE zone of the --tpu name (default: this "
                     "VM's).", values['tpu_zone'].help)
    # Declared once (local.LocalFlags), read by three options.
    self.assertEqual('Options parameter_server, multi_worker, local: GPUs '
                     'to use with --run_locally=gpu (0: all visible).',
                     values['worker_gpus'].help)
    self.assertEqual('float', values['peer_timeout_s'].parser.flag_type())
    self.assertEqual(dict(tpu='', tpu_zone='us-central2-b', tpu_project='',
                          worker_gpus=2, peer_timeout_s=30.0,
                          one_device_cpu=0),
                     distribution.FlagValues(values))
    with self.assertRaisesRegex(
        distribution.SetupError, r"^--tpu_zone='us-central2-b' needs --tpu "
        r"\(the TPU's name\); without --tpu the run is local\.$"):
      distribution.CheckFlags(distribution.FlagValues(values))

  def testAFlagIsDeclaredOnce(self):
    @dataclasses.dataclass
    class GpuFlags:
      worker_gpus: int = flag_fields.Flag(1, 'GPUs, declared again.')

    @dataclasses.dataclass
    class ReplicaFlags:
      worker_replicas: int = flag_fields.Flag(1, 'A common flag.')

    for flags_cls, regex in (
        (GpuFlags, r"the flag --worker_gpus is option 'parameter_server'\'s "
         r'already; declare it once'),
        (ReplicaFlags, r'the flag --worker_replicas is common to every '
         r'option')):
      with self.subTest(flags=flags_cls.__name__):
        toy = type('ToySetup', (OneDeviceSetup,),
                   dict(name='toy', FLAGS=flags_cls))
        with self.assertRaisesRegex(ValueError, regex):
          distribution.Register(toy)
        self.assertNotIn('toy', distribution.Names())
    with self.assertRaisesRegex(TypeError, r'^Flags\(\) got tpu_zon: not a '
                                r'flag of the options '):
      distribution.Flags(tpu_zon='x')


if __name__ == '__main__':
  tf.test.main()
