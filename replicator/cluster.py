"""Several worker processes: finding them, connecting them, naming collectives.

Workers talk through TensorFlow's own collective ops over gRPC (the engine of
`MultiWorkerMirroredStrategy`). TensorFlow's gRPC collectives are not
authenticated: run them on a trusted network only.
"""

import itertools
import threading

import tensorflow as tf
from tensorflow.core.protobuf import config_pb2
from tensorflow.core.protobuf import tensorflow_server_pb2
from tensorflow.python.eager import context as eager_context

from replicator.mesh import Mesh

_JOB = "worker"


def device_name(worker_index: int, local_device: str) -> str:
  return f"/job:{_JOB}/replica:0/task:{worker_index}/device:{local_device}"


_connected = None


def connect(mesh: Mesh) -> None:
  """Starts this process's gRPC server and enables collectives with its peers.

  Must run before TensorFlow executes anything in this process.
  """
  global _connected
  spec = (mesh.worker_addresses, mesh.worker_index)
  if _connected is not None:
    if _connected != spec:
      raise RuntimeError(
          f"cluster: this process already joined {_connected}; one process "
          "joins one cluster.")
    return
  cpu = tf.config.list_physical_devices("CPU")[0]  # does not start the runtime
  num_local_cpus = len(tf.config.get_logical_device_configuration(cpu) or [cpu])
  if eager_context.context()._context_handle is not None:  # pylint: disable=protected-access
    raise RuntimeError(
        "cluster: TensorFlow already ran an op in this process, so it can no "
        "longer join a cluster. Create the MultiGpuReplicator first, before "
        "any tensor, variable or dataset.")
  session_config = config_pb2.ConfigProto()
  session_config.device_count["CPU"] = num_local_cpus  # keep logical CPUs
  session_config.experimental.collective_group_leader = f"/job:{_JOB}/replica:0/task:0"
  server_def = tensorflow_server_pb2.ServerDef(
      cluster=tf.train.ClusterSpec({_JOB: list(mesh.worker_addresses)}).as_cluster_def(),
      job_name=_JOB, task_index=mesh.worker_index, protocol="grpc",
      default_session_config=session_config)
  ctx = eager_context.context()
  ctx.configure_collective_ops(
      collective_leader=session_config.experimental.collective_group_leader)
  ctx.enable_collective_ops(server_def)
  _connected = spec


class CollectiveKeys:
  """Instance keys for cross-worker collectives.

  Every worker traces the same program in the same order, so a shared counter
  gives matching keys on every worker without any communication.
  """

  def __init__(self, num_workers: int, worker_index: int, timeout_s: float,
               group_key: int = 1):
    self.num_workers = num_workers
    self.worker_index = worker_index
    self.timeout_s = timeout_s
    self.group_key = group_key
    self._counter = itertools.count(1)
    self._lock = threading.Lock()

  def next(self) -> int:
    with self._lock:
      return next(self._counter)
