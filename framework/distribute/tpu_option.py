"""The `tpu` option: a TPUStrategy over a Cloud TPU's cores (--tpu).

It applies whenever --tpu is given (it is the registry's first line, so it
wins over a TF_CONFIG, which it then refuses), connects with tpu.Connect
and trains with tpu_programs.TpuTrainProgram. Its flags, --tpu,
--tpu_zone and --tpu_project, are declared here (`TpuFlags`) and read
before TensorFlow loads; the module imports TensorFlow (tpu.py) only when
the option is created, which is why it is not tpu.py itself.

Example:
  setup = distribution.Create(tpu='local', worker_split_size=2)
  setup.num_local_replicas   # the TPU's cores / 2
"""
import dataclasses

from cadence.framework.distribute import flag_fields
from cadence.framework.distribute import option

Flag = flag_fields.Flag


@dataclasses.dataclass
class TpuFlags:
  """The `tpu` option's flags."""
  tpu: str = Flag('', 'Train on this Cloud TPU: local (this TPU VM\'s), its '
                  'name (the tpu extra; with --tpu_zone/--tpu_project off '
                  'its VM) or grpc://host:port; replicas of '
                  '--worker_split_size cores, pipeline stage s on logical '
                  'core s.')
  tpu_zone: str = Flag('', 'GCE zone of the --tpu name (default: this '
                       'VM\'s).')
  tpu_project: str = Flag('', 'GCP project of the --tpu name (default: this '
                          'VM\'s).')


class TpuSetup(option.Setup):
  """The `tpu` option; see the module docstring.

  One model split (a replica's logical cores) that the strategy replicates
  over all replicas: `num_local_replicas` is the strategy's.
  """

  name = 'tpu'
  FLAGS = TpuFlags
  CHOSEN_BY = '--tpu'

  @classmethod
  def CheckFlags(cls, own):
    for name in ('tpu_zone', 'tpu_project'):
      if getattr(own, name) and not own.tpu:
        raise option.SetupError(
            f'--{name}={getattr(own, name)!r} needs --tpu (the TPU\'s '
            'name); without --tpu the run is local.')

  @classmethod
  def Applies(cls, flags):
    return bool(cls.FlagsOf(flags).tpu)

  @classmethod
  def Create(cls, flags):
    # TensorFlow loads here: the registry is read before it (trainer.py).
    from cadence.framework import cluster as cluster_lib  # pylint: disable=g-import-not-at-top
    from cadence.framework.distribute import tpu as tpu_lib  # pylint: disable=g-import-not-at-top
    own = cls.FlagsOf(flags)
    if flags.tf_config is not None:
      raise option.SetupError(
          f'--tpu={own.tpu!r} with $TF_CONFIG or --cluster_spec: a TPU run '
          'takes its hosts from the TPU; drop one.')
    if flags.worker_replicas != 1:
      raise option.SetupError(
          f'--tpu={own.tpu!r} with --worker_replicas={flags.worker_replicas}: '
          'on a TPU the replicas are its cores / --worker_split_size; leave '
          '--worker_replicas at 1.')
    try:
      strategy, devices = tpu_lib.Connect(own.tpu, own.tpu_zone,
                                          own.tpu_project,
                                          flags.worker_split_size)
    except tpu_lib.TpuError as e:
      raise option.SetupError(str(e)) from None
    cluster = cluster_lib.Cluster.Params().Set(
        devices=devices, device_type='TPU',
        worker_split_size=flags.worker_split_size,
        split_size_from=option.SplitSizeFrom(flags)).Instantiate()
    return cls(cluster=cluster, strategy=strategy)

  @property
  def num_local_replicas(self):
    return self.strategy.num_replicas_in_sync

  @classmethod
  def CheckParams(cls, model_params):
    from cadence.framework.distribute import tpu_programs  # pylint: disable=g-import-not-at-top
    tpu_programs.TpuRunner.CheckParams(model_params.task)

  def TrainProgram(self, model_params, logdir, xla=False, **kwargs):
    from cadence.framework.distribute import tpu_programs  # pylint: disable=g-import-not-at-top
    return tpu_programs.TpuTrainProgram(
        model_params, logdir, self.strategy, xla=xla, cluster=self.cluster,
        **kwargs)
