"""TPU set-up: resolve and connect to a Cloud TPU, and its TPUStrategy.

`--tpu=<local, name or grpc://host:port>` (with `--tpu_zone`,
`--tpu_project` for a name, as Lingvo has them) makes the trainer run on a
TPU:

  1. `TPUClusterResolver` finds the TPU's workers: 'local' is the TPU of
     this TPU VM (Google's current architecture: nothing to look up), a
     grpc address (a TPU Node's) is taken as is, and a name is looked up
     with the Cloud TPU API;
  2. `tf.config.experimental_connect_to_cluster` connects this process
     (the host) to them, and `initialize_tpu_system` starts the TPU;
  3. a `DeviceAssignment` groups the cores into replicas of
     `worker_split_size` cores each (`BuildDeviceAssignment`), and
     `TPUStrategy` runs one replica's program on every group.

The model's pipeline stages go on the *logical cores* of a replica: stage s
on logical core s. The Cluster of a TPU run has one model split whose
devices are `LogicalCore(0) ... LogicalCore(S - 1)`
('/device:TPU_REPLICATED_CORE:s'); the strategy replicates that split over
all replicas. `cluster.DeviceScope` turns such a device into
`strategy.extended.experimental_logical_device(s)`, which creates the
variables of the stage on core s of every replica and, inside the compiled
step, places its ops there.

The `tpu` distribution option, which applies whenever --tpu is given and
trains with tpu_programs.TpuTrainProgram, is tpu_option.py (with its
flags, read before TensorFlow loads, which this module imports). A failure
to resolve, connect or initialise is a `TpuError` (the trainer exits 2
with its one line). A TPU name needs
the Cloud TPU API's client (setup.py's `tpu` extra: google-api-python-client
>= 2); without it the trainer says so before trying. Left to itself,
TensorFlow's resolver builds the API object with oauth2client (deprecated)
and recommends cloud-tpu-client, which pins google-api-python-client 1.8,
whose google-api-core 1.x pins protobuf < 4 and so breaks TensorFlow
2.16+. `_TpuApi` builds the object instead, with google-auth's Application
Default Credentials, and hands it to the resolver (its `service`
argument), which then needs neither. gRPC retries an unreachable
address for a long time by default; the connection is made with
GRPC_FAIL_FAST=true so a wrong address fails in well under a second.

Example:
  strategy, cores = tpu.Connect('my-tpu', zone='us-central2-b',
                                worker_split_size=2)
"""
import contextlib
import importlib.util
import math
import os

import numpy as np
import tensorflow as tf

from cadence.framework import cluster as cluster_lib


class TpuError(ValueError):
  """The TPU cannot be resolved, reached or split as asked."""


# Logical cores are placement, so they live with the Cluster.
LOGICAL_CORE_TYPE = cluster_lib.LOGICAL_CORE_TYPE
LogicalCore = cluster_lib.LogicalCore
LogicalCoreIndex = cluster_lib.LogicalCoreIndex
LogicalCoreScope = cluster_lib.LogicalCoreScope


def ComputationShape(mesh_shape, cores_per_replica):
  """The block of the TPU mesh one replica of `cores_per_replica` cores uses.

  Fills the cores of a chip first (the last mesh dimension), then chips
  along x, y and z, so a replica's cores are neighbours.

  Args:
    mesh_shape: the topology's mesh shape [x, y, z, cores per chip].
    cores_per_replica: cores per replica (`worker_split_size`), an int >= 1.

  Returns:
    A list of 4 ints whose product is `cores_per_replica`.

  Raises:
    TpuError: the cores cannot be cut into such blocks.
  """
  mesh = [int(d) for d in mesh_shape]
  shape, left = [1] * len(mesh), cores_per_replica
  for dim in [len(mesh) - 1] + list(range(len(mesh) - 1)):
    take = math.gcd(left, mesh[dim])
    shape[dim], left = take, left // take
  if left != 1 or any(m % s for m, s in zip(mesh, shape)):
    raise TpuError(
        f'--worker_split_size={cores_per_replica}: cannot cut this TPU '
        f'(mesh shape {mesh}, {int(np.prod(mesh))} cores) into replicas of '
        f'{cores_per_replica} neighbouring cores; use a divisor of the '
        'cores per chip times a power of two that fits the mesh.')
  return shape


def BuildDeviceAssignment(topology, cores_per_replica):
  """Replicas of `cores_per_replica` cores each over the whole `topology`.

  Args:
    topology: a `tf.tpu.experimental.Topology`.
    cores_per_replica: cores per replica (its pipeline stages).

  Returns:
    A `tf.tpu.experimental.DeviceAssignment`; logical core s of replica r
    is `assignment.tpu_ordinal(replica=r, logical_core=s)`.
  """
  shape = ComputationShape(topology.mesh_shape, cores_per_replica)
  total = int(np.prod(topology.mesh_shape))
  return tf.tpu.experimental.DeviceAssignment.build(
      topology, computation_shape=shape,
      num_replicas=total // cores_per_replica)


@contextlib.contextmanager
def _FailFast():
  """gRPC calls fail at once on an unreachable address (not retried for
  minutes) while connecting; the previous setting comes back after."""
  before = os.environ.get('GRPC_FAIL_FAST')
  os.environ['GRPC_FAIL_FAST'] = 'true'
  try:
    yield
  finally:
    if before is None:
      os.environ.pop('GRPC_FAIL_FAST', None)
    else:
      os.environ['GRPC_FAIL_FAST'] = before


def _FirstLine(e):
  lines = [l.strip() for l in str(e).splitlines() if l.strip()]
  return f'{type(e).__name__}: {lines[0][:300] if lines else ""}'


def IsName(tpu):
  """True if `tpu` is a TPU's name, which the Cloud TPU API resolves (not a
  grpc:// address, nor 'local': the TPU of this VM)."""
  return bool(tpu) and not tpu.startswith('grpc://') and tpu != 'local'


def HasTpuApiClient():
  """True if the client of the Cloud TPU API that looks TPU names up is
  installed (setup.py's 'tpu' extra: google-api-python-client, which
  brings google-auth)."""
  return all(importlib.util.find_spec(m) is not None
             for m in ('googleapiclient', 'google.auth'))


def _TpuApi():
  """The Cloud TPU API object TensorFlow's resolver reads a name with (v1,
  its version), authorised by google-auth's Application Default
  Credentials: on a GCE or TPU VM its service account, elsewhere
  `gcloud auth application-default login`. Raises google-auth's error
  when there are none."""
  import google.auth  # pylint: disable=g-import-not-at-top
  from googleapiclient import discovery  # pylint: disable=g-import-not-at-top
  credentials, _ = google.auth.default(
      scopes=['https://www.googleapis.com/auth/cloud-platform'])
  return discovery.build('tpu', 'v1', credentials=credentials,
                         cache_discovery=False)


def _Address(resolver):
  """The resolver's grpc address, or a word saying it has none: asking
  may itself fail (a name it could not look up)."""
  try:
    return resolver.master() or 'this VM (--tpu=local)'
  except Exception:  # pylint: disable=broad-except
    return '(address unknown)'


def Connect(tpu, zone=None, project=None, worker_split_size=1):
  """Resolves, connects to and initialises the TPU; makes its strategy.

  Call before any other TF op (the connection changes the eager context).

  Args:
    tpu: 'local' (this TPU VM's TPU), the TPU's name (Cloud TPU API) or
      'grpc://host:port'.
    zone: the TPU's zone, for a name (None: this VM's zone).
    project: the TPU's GCP project, for a name (None: this VM's project).
    worker_split_size: cores per replica, an int >= 1: stage s of a
      pipelined model runs on logical core s of each replica.

  Returns:
    (strategy, devices): the TPUStrategy, and the logical core devices of
    one replica (`LogicalCore(s)` for s < worker_split_size).

  Raises:
    TpuError: the TPU cannot be resolved, reached or initialised, or not
      be cut into replicas of worker_split_size cores.
  """
  where = f'--tpu={tpu!r}' + (f' --tpu_zone={zone!r}' if zone else '') + (
      f' --tpu_project={project!r}' if project else '')
  if IsName(tpu) and not HasTpuApiClient():
    raise TpuError(f'{where}: a TPU name is looked up with the Cloud TPU '
                   'API, whose client is not installed: pip install -e '
                   '".[tpu]" (in one command with your TensorFlow extra, '
                   'e.g. ".[cpu,tpu]"); or give --tpu=local on a TPU VM, or '
                   'a TPU Node\'s grpc://host:8470 address.')
  try:
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
        tpu=tpu, zone=zone or None, project=project or None,
        service=_TpuApi() if IsName(tpu) else None)
  except Exception as e:  # pylint: disable=broad-except
    raise TpuError(f'{where}: cannot resolve the TPU ({_FirstLine(e)}). '
                   'Give the TPU\'s name (with --tpu_zone and --tpu_project '
                   'off its VM), --tpu=local on a TPU VM, or a TPU Node\'s '
                   'grpc://host:8470 address.') from None
  try:
    with _FailFast():
      tf.config.experimental_connect_to_cluster(resolver)
      topology = tf.tpu.experimental.initialize_tpu_system(resolver)
  except Exception as e:  # pylint: disable=broad-except
    raise TpuError(f'{where}: cannot connect to or initialise the TPU at '
                   f'{_Address(resolver)} ({_FirstLine(e)}).') from None
  assignment = BuildDeviceAssignment(topology, worker_split_size)
  strategy = tf.distribute.TPUStrategy(
      resolver, experimental_device_assignment=assignment)
  return strategy, [LogicalCore(s) for s in range(worker_split_size)]
