"""Where replicas live: an immutable `workers x devices_per_worker` description."""

import dataclasses
import json
import os
import re
from typing import List, Optional, Sequence, Tuple

import tensorflow as tf

_DEVICE_RE = re.compile(r"^(?:/job:[^/]+)?(?:/replica:\d+)?(?:/task:\d+)?/?(?:device:)?([A-Za-z_]+):(\d+)$")


def canonical_device(name: str) -> str:
  """Returns `name` as `TYPE:index` (e.g. `'/cpu:1'` -> `'CPU:1'`).

  >>> canonical_device("/job:localhost/replica:0/task:0/device:CPU:1")
  'CPU:1'
  """
  match = _DEVICE_RE.match(name.strip()) if isinstance(name, str) else None
  if match is None:
    raise ValueError(
        f"devices: {name!r} is not a device name. Use names such as '/gpu:0', "
        "'CPU:1' or '/job:localhost/replica:0/task:0/device:GPU:0'.")
  return f"{match.group(1).upper()}:{int(match.group(2))}"


def _local_devices(device_type: Optional[str]) -> Tuple[str, ...]:
  """Local device names, found without starting the TensorFlow runtime."""
  types = [device_type.upper()] if device_type else ["GPU", "CPU"]
  for kind in types:
    physical = tf.config.list_physical_devices(kind)
    count = sum(len(tf.config.get_logical_device_configuration(d) or [d])
                for d in physical)
    if count:
      return tuple(f"{kind}:{i}" for i in range(count))
  raise ValueError(f"device_type: no local device of type {device_type!r}.")


JOB = "worker"  # the job name of every worker in the cluster


def worker_device(worker_index: int, local_device: str) -> str:
  """The full name of `local_device` ('CPU:1') on worker `worker_index`."""
  return f"/job:{JOB}/replica:0/task:{worker_index}/device:{local_device}"


@dataclasses.dataclass(frozen=True, init=False)
class Mesh:
  """The replicas of a job: `num_workers` processes of `devices_per_worker` each.

  Replica `r` lives on worker `r // devices_per_worker`, on that worker's
  device `local_devices[r % devices_per_worker]`: the global replica id orders
  replicas worker by worker, and `devices[r]` names its device. A `Mesh` is a
  value: hashable, comparable, and free of any handle on the runtime.

  Args:
    devices: the devices of one worker (every worker has the same ones), e.g.
      `["/gpu:0", "/gpu:1"]`.
    num_workers, worker_index, worker_addresses: the job's workers and this
      process's place among them (see `from_cluster`).

  >>> mesh = Mesh(devices=["/cpu:0"])
  >>> mesh.num_replicas, mesh.is_chief
  (1, True)
  """

  local_devices: Tuple[str, ...]
  num_workers: int
  worker_index: int
  worker_addresses: Tuple[str, ...]

  def __init__(self, devices: Sequence[str], num_workers: int = 1,
               worker_index: int = 0, worker_addresses: Sequence[str] = ()):
    if isinstance(devices, str) or not isinstance(devices, Sequence):
      raise ValueError(
          f"devices: expected a list of device names, got {devices!r}.")
    if not devices:
      raise ValueError("devices: the list is empty; give at least one device.")
    names = tuple(canonical_device(d) for d in devices)
    for index, name in enumerate(names):
      if name in names[:index]:
        raise ValueError(
            f"devices: {devices[index]!r} appears twice; each replica needs its own "
            "device.")
    if num_workers < 1:
      raise ValueError(f"num_workers: must be >= 1, got {num_workers}.")
    if not 0 <= worker_index < num_workers:
      raise ValueError(
          f"worker_index: must be in [0, {num_workers}), got {worker_index}.")
    object.__setattr__(self, "local_devices", names)
    object.__setattr__(self, "num_workers", num_workers)
    object.__setattr__(self, "worker_index", worker_index)
    object.__setattr__(self, "worker_addresses", tuple(worker_addresses))

  @property
  def devices(self) -> Tuple[str, ...]:
    """Every replica's device, indexed by global replica id: local names
    ('CPU:0') on one worker, full names on several
    ('/job:worker/replica:0/task:1/device:GPU:0')."""
    if self.num_workers == 1:
      return self.local_devices
    return tuple(worker_device(w, d) for w in range(self.num_workers)
                 for d in self.local_devices)

  @classmethod
  def local(cls, device_type: Optional[str] = None) -> "Mesh":
    """This process's devices: every GPU if there is one, else every logical CPU."""
    return cls(devices=_local_devices(device_type))

  @classmethod
  def from_cluster(cls, resolver=None, *, worker_addresses=None,
                   worker_index: Optional[int] = None,
                   devices: Optional[Sequence[str]] = None) -> "Mesh":
    """The mesh of a multi-worker job.

    Args:
      resolver: a `tf.distribute.cluster_resolver.ClusterResolver` (for
        example `SlurmClusterResolver()` or `TFConfigClusterResolver()`);
        None reads `TF_CONFIG` unless `worker_addresses` is given.
      worker_addresses: `host:port` of every worker, worker 0 (the chief)
        first; with `worker_index`, this process's position in that list.
      devices: this worker's devices (default: every local GPU, else every
        logical CPU); every worker must have as many.
    """
    if worker_addresses is not None:
      if worker_index is None:
        raise ValueError(
            "worker_index: required with worker_addresses (this process's "
            "position in the list, 0 for the chief).")
      addresses, index = tuple(worker_addresses), worker_index
    elif resolver is not None:
      addresses, index = _from_resolver(resolver)
    else:
      found = _from_tf_config(os.environ.get("TF_CONFIG", ""))
      if found is None:
        raise ValueError(
            "resolver: no cluster found: TF_CONFIG is unset or lists one "
            "worker. Start the workers with `python -m replicator.launch`, set "
            "TF_CONFIG, or pass a cluster resolver or worker_addresses.")
      addresses, index = found
    local = tuple(devices) if devices is not None else _local_devices(None)
    return cls(devices=local, num_workers=len(addresses), worker_index=index,
               worker_addresses=addresses)

  def validate_local(self) -> None:
    """Raises `ValueError` naming the first device this process does not have."""
    known = {canonical_device(d.name) for d in tf.config.list_logical_devices()}
    for name in self.local_devices:
      if name not in known:
        raise ValueError(
            f"devices: {name!r} is not a device of this process; it has "
            f"{sorted(known)}. For several CPU replicas, use "
            "MultiGpuReplicator(cpu_replicas=N), made before any TensorFlow op runs.")

  @property
  def devices_per_worker(self) -> int:
    """Devices (one replica each) of every worker."""
    return len(self.local_devices)

  @property
  def num_replicas(self) -> int:
    """Replicas on every worker together."""
    return self.num_workers * self.devices_per_worker

  @property
  def local_replica_ids(self) -> Tuple[int, ...]:
    """Global ids of this worker's replicas (worker i holds a contiguous range)."""
    first = self.worker_index * self.devices_per_worker
    return tuple(range(first, first + self.devices_per_worker))

  @property
  def is_chief(self) -> bool:
    """Whether this is worker 0."""
    return self.worker_index == 0

  def device_type(self) -> str:
    """`CPU`, `GPU` or `TPU`: the type of this worker's devices."""
    return self.local_devices[0].split(":")[0]


def worker_index_in_tf_config() -> int:
  found = _from_tf_config(os.environ.get("TF_CONFIG", ""))
  return found[1] if found else 0


def workers_in_tf_config() -> int:
  found = _from_tf_config(os.environ.get("TF_CONFIG", ""))
  return len(found[0]) if found else 1


_TF_CONFIG_SHAPE = ('{"cluster": {"worker": ["host:port", ...]}, '
                    '"task": {"type": "worker", "index": 0}}')


def _tf_config_error(key: Optional[str], found: str) -> ValueError:
  """`key` None: the whole of TF_CONFIG."""
  return ValueError(
      f"TF_CONFIG: {'it' if key is None else repr(key)} {found}; expected {_TF_CONFIG_SHAPE} (a 'chief' "
      "list beside 'worker' is worker 0). Set TF_CONFIG to that shape on every "
      "worker, each with its own index, or start the workers with "
      "`python -m replicator.launch`.")


def _addresses(cluster, job: str) -> tuple:
  addresses = cluster.get(job, [])
  if (not isinstance(addresses, (list, tuple)) or
      not all(isinstance(a, str) for a in addresses)):
    raise _tf_config_error(f"cluster.{job}", f"is {addresses!r}, not a list of "
                           "'host:port' strings")
  return tuple(addresses)


def _from_tf_config(raw: str):
  """`(addresses, index)` of the cluster in a TF_CONFIG string, or None."""
  if not raw:
    return None
  try:
    config = json.loads(raw)
  except ValueError as error:
    raise ValueError(f"TF_CONFIG: not valid JSON ({error}): {raw!r}") from error
  if not isinstance(config, dict):
    raise _tf_config_error(None, f"is a {type(config).__name__}, not an object")
  cluster = config.get("cluster", {})
  if not isinstance(cluster, dict):
    raise _tf_config_error("cluster", f"is a {type(cluster).__name__} ({cluster!r}), "
                           "not an object of jobs")
  chiefs = _addresses(cluster, "chief")
  addresses = chiefs + _addresses(cluster, "worker")
  if len(addresses) < 2:
    return None
  # Without its task, every worker would take itself for the chief.
  if "task" not in config:
    raise _tf_config_error("task", "is missing, so this worker's place in the "
                           "cluster is unknown")
  task = config["task"]
  if not isinstance(task, dict):
    raise _tf_config_error("task", f"is a {type(task).__name__} ({task!r}), not an object")
  kind = task.get("type", "worker")
  if kind not in ("chief", "worker"):
    raise ValueError(
        f"TF_CONFIG: task type {kind!r} is not supported; use 'worker' (or "
        "'chief' for worker 0).")
  index = task.get("index", 0)
  if isinstance(index, str) and index.isdigit():  # "1" names worker 1 too
    index = int(index)
  jobs = len(chiefs) if kind == "chief" else len(addresses) - len(chiefs)
  if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < jobs:
    raise _tf_config_error("task.index", f"is {index!r}, not an int in [0, {jobs}) "
                           f"(the {kind} list's positions)")
  return addresses, (len(chiefs) if kind == "worker" else 0) + index


def _from_resolver(resolver):
  spec = resolver.cluster_spec().as_dict()
  jobs = [job for job in ("chief", "worker") if job in spec]
  if not jobs:
    raise ValueError(f"resolver: its cluster has no 'worker' job: {spec!r}.")
  addresses = tuple(a for job in jobs for a in spec[job])
  offset = len(spec.get("chief", [])) if resolver.task_type == "worker" else 0
  return addresses, offset + int(resolver.task_id or 0)


def configure_logical_cpus(count: int = 8) -> List[str]:
  """Splits the CPU into `count` logical devices; returns their names.

  TensorFlow fixes its devices when the runtime starts, so call this once per
  process, before any op runs. Calling it again with the same count, or once
  TensorFlow has started with that many (one, unconfigured), is a no-op.
  """
  cpu = tf.config.list_physical_devices("CPU")[0]
  existing = tf.config.get_logical_device_configuration(cpu)
  if not existing or len(existing) != count:
    try:
      tf.config.set_logical_device_configuration(
          cpu, [tf.config.LogicalDeviceConfiguration()] * count)
    except RuntimeError as error:
      started = len(tf.config.list_logical_devices("CPU"))
      if started != count:
        raise RuntimeError(
            f"count: cannot split the CPU into {count} devices: TensorFlow has "
            f"already started with {started}. Call configure_logical_cpus before "
            "any TensorFlow op runs.") from error
  return [f"CPU:{i}" for i in range(count)]
