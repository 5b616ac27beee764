"""Several worker processes: finding them, connecting them, naming collectives.

Workers talk through TensorFlow's own collective ops over gRPC (the engine of
`MultiWorkerMirroredStrategy`). TensorFlow's gRPC collectives are not
authenticated: run them on a trusted network only.
"""

import contextlib
import itertools
import os
import threading

import tensorflow as tf
from tensorflow.core.protobuf import config_pb2
from tensorflow.core.protobuf import tensorflow_server_pb2
from tensorflow.python.eager import context as eager_context

from replicator import mesh as mesh_lib
from replicator.mesh import Mesh

_JOB = mesh_lib.JOB
_connected = None


def connect(mesh: Mesh) -> None:
  """Starts this process's gRPC server and enables collectives with its peers.

  Must run before TensorFlow executes anything, unless `MultiWorkerMirroredStrategy`
  started the server for the same cluster (then both work side by side; it can
  also be made after, as the collectives are configured as it configures them).
  """
  global _connected
  spec = (mesh.worker_addresses, mesh.worker_index)
  if _connected is not None:
    if _connected != spec:
      raise RuntimeError(
          f"cluster: this process already joined {_connected}; one process "
          "joins one cluster.")
    return
  ctx = eager_context.context()
  started = ctx._collective_ops_server_def  # pylint: disable=protected-access
  if started is not None:  # by MultiWorkerMirroredStrategy, say
    _check_same_cluster(started, mesh)
    _connected = spec
    return
  cpu = tf.config.list_physical_devices("CPU")[0]  # does not start the runtime
  num_local_cpus = len(tf.config.get_logical_device_configuration(cpu) or [cpu])
  if ctx._context_handle is not None:  # pylint: disable=protected-access
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
  # As MultiWorkerMirroredStrategy configures them, which it checks.
  ctx.configure_collective_ops(
      collective_leader=session_config.experimental.collective_group_leader,
      scoped_allocator_enabled_ops=("CollectiveReduce",),
      device_filters=(f"/job:{_JOB}/task:{mesh.worker_index}",))
  ctx.enable_collective_ops(server_def)
  try:
    ctx.ensure_initialized()  # starts the server
  except tf.errors.UnknownError as error:  # of other causes too: its words tell
    if "gRPC server" not in str(error):  # (patches/error_texts.py)
      raise
    address = mesh.worker_addresses[mesh.worker_index]
    raise RuntimeError(
        f"cluster: worker {mesh.worker_index} could not start its gRPC server on "
        f"{address} (TF_CONFIG's address for it): the port is taken, by another "
        "program or a worker of an earlier run still alive, or the host is not "
        "this machine's. Stop that process or give this worker a free port "
        "(python -m replicator.launch picks free ports).") from error
  _connected = spec


def _check_same_cluster(server_def, mesh: Mesh) -> None:
  """Raises unless the running server is this mesh's worker, in its cluster."""
  jobs = {job.name: [job.tasks[i] for i in sorted(job.tasks)]
          for job in server_def.cluster.job}
  if (server_def.job_name != _JOB or server_def.task_index != mesh.worker_index
      or jobs.get(_JOB) != list(mesh.worker_addresses)):
    raise RuntimeError(
        f"cluster: this process already runs a TensorFlow server as task "
        f"{server_def.task_index} of job {server_def.job_name!r} in {jobs}, "
        f"but the replicator's cluster is worker {mesh.worker_index} of "
        f"{list(mesh.worker_addresses)} (job {_JOB!r}). A process joins one "
        "cluster: give both the same TF_CONFIG, or create the replicator "
        "before anything else starts a server.")


FIRST_GROUP_KEY = 1 << 24  # far from tf.distribute's (from 1)
_group_keys = itertools.count(FIRST_GROUP_KEY)


class CollectiveKeys:
  """Instance keys for cross-worker collectives: every worker traces the same
  program in the same order, so a counter gives matching keys unexchanged. The
  checks that they did draw keys of their own (`next_check`), which still match
  where the programs' keys do not.
  """

  _CHECK_KEYS = 1 << 30  # the first key of the checks' range
  # A collective of a run-time shape takes its key at run time, one per size class
  # (`collectives.between_workers` says why), from a slot of `_CLASSES_PER_SLOT` keys.
  _SHAPE_KEYS = 1 << 29
  _CLASSES_PER_SLOT = 1 << 12
  _SLOTS = ((1 << 30) - (1 << 29)) // _CLASSES_PER_SLOT
  # Keys derived from a replayed key (`replaying`): `_DERIVED_PER_BASE` for each
  # of the first `_DERIVED_BASES` keys, above the checks' range and under 2**31.
  _DERIVED_KEYS = 3 << 29
  _DERIVED_PER_BASE = 1 << 5
  _DERIVED_BASES = (1 << 29) // _DERIVED_PER_BASE

  def __init__(self, num_workers: int, worker_index: int, timeout_s: float):
    self.num_workers = num_workers
    self.worker_index = worker_index
    self.timeout_s = timeout_s
    # Each replicator counts instance keys from 1, in a group of its own: workers
    # make their replicators in the same order, so the groups match.
    self.group_key = next(_group_keys)
    self.issued = 0  # keys given out by `next`
    self.shape_slots = 0  # slots given out by `key_for_size_class`
    # This host runs more of the job's workers than it has cores
    # (`host_is_crowded`): buckets go one at a time by default.
    self.crowded = False
    self._signatures = {}  # key -> what its collective carries
    # In `replaying`: (the keys `next` gives again, the derived keys after them).
    self._replay = None
    self._checks = itertools.count(self._CHECK_KEYS)
    self._lock = threading.Lock()

  def next(self, signature=None) -> int:
    """A new key, for a collective of `signature` (its kind, dtype and shape);
    in `replaying`, the next of its keys."""
    with self._lock:
      if self._replay is not None:
        return self._replayed(signature)
      self.issued += 1
      self._signatures[self.issued] = signature
      return self.issued

  @contextlib.contextmanager
  def recorded(self):
    """Yields a list that holds, once the block ends, the keys issued in it."""
    first = self.issued
    keys = []
    yield keys
    keys.extend(range(first + 1, self.issued + 1))

  @contextlib.contextmanager
  def replaying(self, keys):
    """In the block, `next` gives `keys` again (`recorded`'s, each for a
    collective of the signature it had), then keys derived from the first of
    them, not counted: a function that stands for another on other workers
    (the loop of several steps for the function of one) pairs its first
    collectives with the other's, and one traced later on some workers than on
    others (lazily) takes the same keys everywhere without moving the counter."""
    if not keys or keys[0] >= self._DERIVED_BASES:
      raise ValueError(f"keys: {keys} cannot be replayed (one at least, each under "
                       f"{self._DERIVED_BASES}).")
    first = self._DERIVED_KEYS + keys[0] * self._DERIVED_PER_BASE
    self._replay = (list(keys), iter(range(first, first + self._DERIVED_PER_BASE)))
    try:
      yield
      if self._replay[0]:
        raise RuntimeError(
            f"cluster: keys {self._replay[0]} were to be given again and no "
            "collective took them: two functions meant to share their collectives "
            "traced different ones.")
    finally:
      self._replay = None

  def _replayed(self, signature) -> int:
    pending, derived = self._replay
    if not pending:
      key = next(derived, None)
      if key is None:
        raise RuntimeError(
            f"cluster: more than {self._DERIVED_PER_BASE} collectives were traced "
            "after replayed keys; they have no keys left.")
      return key
    key = pending.pop(0)
    if self._signatures.get(key) != signature:
      raise RuntimeError(
          f"cluster: a collective of {signature} was traced where key {key} "
          f"({self._signatures.get(key)}) was to be given again: two functions "
          "meant to share their collectives traced different ones.")
    return key

  def key_for_size_class(self, size_class: tf.Tensor) -> tf.Tensor:
    """A new collective's instance key, at run time, for its `size_class` (an
    int64 scalar in [0, 4096), the padded size it carries): one key per class."""
    with self._lock:
      slot = self.shape_slots
      self.shape_slots += 1
    if slot >= self._SLOTS:
      raise RuntimeError(
          f"cluster: {slot} collectives of run-time shapes were traced in this "
          "process, more than their instance keys allow; a step retraced on "
          "every call (a Python value that changes in its arguments, say) is "
          "the usual cause.")
    return tf.cast(self._SHAPE_KEYS + slot * self._CLASSES_PER_SLOT
                   + tf.cast(size_class, tf.int64), tf.int32)

  def signatures(self, after: int) -> list:
    """The signatures of the keys issued after key `after`, in order."""
    return [self._signatures.get(key) for key in range(after + 1, self.issued + 1)]

  def next_check(self) -> int:
    with self._lock:
      return next(self._checks)


def host_is_crowded(mesh: Mesh) -> bool:
  """Whether this worker's host runs more of the job's workers than it has cores
  (hosts told apart by their addresses as written: "127.0.0.1" is not "localhost")."""
  if not mesh.worker_addresses:
    return False
  host = lambda address: address.rsplit(":", 1)[0]
  mine = host(mesh.worker_addresses[mesh.worker_index])
  here = sum(1 for address in mesh.worker_addresses if host(address) == mine)
  try:
    cores = len(os.sched_getaffinity(0))
  except AttributeError:  # not on Linux
    cores = os.cpu_count() or 1
  return here > cores
