"""Helpers for tests: several replicas on one CPU."""

import contextlib

import numpy as np
import sonnet as snt
import tensorflow as tf

from replicator import tpu
from replicator.collectives import reductions
from replicator.mesh import configure_logical_cpus  # noqa: F401  (public here)


@contextlib.contextmanager
def merges_as_collectives():
  """Within: local replicas merge their variables' writes by collectives, as
  between physical GPUs or workers (on logical devices a merge is an `add_n`),
  so that one process runs that path. Steps traced within keep it.
  """
  merged_by_collectives = reductions.merged_by_collectives
  reductions.merged_by_collectives = lambda devices, workers=None: True
  try:
    yield
  finally:
    reductions.merged_by_collectives = merged_by_collectives


def tpu_engine_on_cpus(num_replicas: int = 2):
  """A `TpuReplicator` on the strategy engine, over `num_replicas` logical CPUs.

  `TpuReplicator(num_tpu_cores_per_worker=num_replicas, emulate_on_cpu=True)`,
  the TPU emulator (1, 2, 4 or 8 replicas, as a TPU host has cores).

  >>> repl = tpu_engine_on_cpus(2)
  >>> repl.num_replicas
  2
  """
  if not isinstance(num_replicas, int) or isinstance(num_replicas, bool) or num_replicas < 1:
    raise ValueError(f"num_replicas: expected an int >= 1, got {num_replicas!r}.")
  return tpu.TpuReplicator(num_tpu_cores_per_worker=num_replicas, emulate_on_cpu=True)


def tpu_engine_on_fake_tpu(num_cores: int = 8, num_hosts: int = 1):
  """A `TpuReplicator` on TensorFlow's real `TPUStrategy`, over a fake TPU.

  The TPU exists only as metadata (`FakeTpuResolver`): `TPUStrategy` and its
  packed `TPUDistributedVariable`s are real, and `run` traces the whole call
  as a TPU's host would, then returns zeros of the traced shapes and dtypes
  instead of executing (a CPU has no TPU kernels). Variables are made
  eagerly, every core's copy on the CPU, so initial values and restores are
  real; `TPUStrategy`'s own writes outside a step reach only the first copy.
  README.md ("On a TPU") says what a trace shows and what only a TPU can.

  Args:
    num_cores: TPU cores per host (1, 2, 4 or 8).
    num_hosts: TPU hosts (a pod slice when more than 1).

  >>> repl = tpu_engine_on_fake_tpu(8)
  >>> repl.num_replicas
  8
  """
  strategy = snt.distribute.TpuReplicator(
      FakeTpuResolver(num_cores=num_cores, num_hosts=num_hosts))
  repl = tpu.TpuReplicator.__new__(tpu.TpuReplicator)
  repl._on_strategy(strategy, stand_in=False, num_workers=num_hosts,  # pylint: disable=protected-access
                    trace_only=True)
  return repl


# Core coordinates (x, y, z, core) of one TPU v2/v3 host's 8 cores, in
# device order; hosts of a pod slice stack along y.
_HOST_COORDINATES = [(0, 0, 0, 0), (0, 0, 0, 1), (1, 0, 0, 0), (1, 0, 0, 1),
                     (0, 1, 0, 0), (0, 1, 0, 1), (1, 1, 0, 0), (1, 1, 0, 1)]


class FakeTpuResolver(tf.distribute.cluster_resolver.TPUClusterResolver):
  """A `TPUClusterResolver` of a TPU that exists only as metadata: it answers
  `TPUStrategy`'s questions (cores, hosts, topology, devices) as a TPU v2/v3's
  would, without connecting to anything or initializing a TPU.

  Args:
    num_cores: cores per host (1, 2, 4 or 8).
    num_hosts: hosts, each with `num_cores` cores (more than one: a pod
      slice, its hosts as workers of the job "worker").
  """

  def __init__(self, num_cores: int = 8, num_hosts: int = 1):  # pylint: disable=super-init-not-called
    if num_cores not in (1, 2, 4, 8):
      raise ValueError(f"num_cores: {num_cores!r} is not a TPU host size; use "
                       "1, 2, 4 or 8.")
    if not isinstance(num_hosts, int) or isinstance(num_hosts, bool) or num_hosts < 1:
      raise ValueError(f"num_hosts: expected an int >= 1, got {num_hosts!r}.")
    self._num_cores = num_cores
    self._num_hosts = num_hosts

  def get_tpu_system_metadata(self):
    # pylint: disable=import-outside-toplevel
    from tensorflow.python.client import session
    from tensorflow.python.tpu import topology as topology_lib
    from tensorflow.python.tpu import tpu_system_metadata
    cores, hosts = self._num_cores, self._num_hosts
    job = "localhost" if hosts == 1 else "worker"
    used = _HOST_COORDINATES[:cores]
    mesh = [max(c[i] for c in used) + 1 for i in range(4)]
    coordinates = np.array(
        [[(x, y + host * mesh[1], z, core) for x, y, z, core in used]
         for host in range(hosts)], np.int32)
    mesh[1] *= hosts
    topology = topology_lib.Topology(mesh_shape=mesh,
                                     device_coordinates=coordinates)
    devices = []
    for host in range(hosts):
      task = f"/job:{job}/replica:0/task:{host}"
      devices += [session._DeviceAttributes(f"{task}/device:TPU:{i}", "TPU", 0, 0)  # pylint: disable=protected-access
                  for i in range(cores)]
      devices.append(session._DeviceAttributes(f"{task}/device:CPU:0", "CPU", 0, 0))  # pylint: disable=protected-access
    return tpu_system_metadata.TPUSystemMetadata(
        num_cores=cores * hosts, num_hosts=hosts, num_of_cores_per_host=cores,
        topology=topology, devices=devices)

  def master(self, task_type=None, task_id=None, rpc_layer=None):
    del task_type, task_id, rpc_layer
    return ""

  def cluster_spec(self):
    if self._num_hosts == 1:
      return tf.train.ClusterSpec({})
    return tf.train.ClusterSpec({"worker": [f"fake-tpu-host-{h}:8470"
                                            for h in range(self._num_hosts)]})

  def get_job_name(self):
    return "worker" if self._num_hosts > 1 else None

  @property
  def task_id(self):
    return 0

  def num_accelerators(self, task_type=None, task_id=None, config_proto=None):
    del task_type, task_id, config_proto
    return {"TPU": self._num_cores}
