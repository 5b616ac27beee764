"""The other workers of a job, seen from one: joining them, and noticing a loss.

Outside steps a replicator talks to its peers eagerly: to wait for them, to give
them the chief's initial values, and for `Checkpointer`'s barrier and agreements.
"""

import hashlib

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops

from replicator import errors
from replicator.collectives import between_workers
from replicator.multiworker import cluster
from replicator.multiworker import liveness
from replicator.collectives import packing
from replicator.mesh import Mesh

_SYNC_PACK_BYTES = 64 * 2**20  # initial values travel in buckets of this size


class Peers:
  """This worker's link to the other workers of `mesh`.

  Args:
    mesh: a mesh of several workers.
    keys: the replicator's `CollectiveKeys`.
    device: where this worker's eager collectives run.
    timeout_s: `AllReduceOptions.timeout_s`: how long to wait for a peer.
  """

  def __init__(self, mesh: Mesh, keys: cluster.CollectiveKeys, device: str,
               timeout_s: float):
    self._mesh = mesh
    self._keys = keys
    self._device = device
    self._timeout_s = timeout_s
    self._heartbeat = None

  @property
  def is_chief(self) -> bool:
    return self._mesh.is_chief

  def join(self):
    """Returns once every worker has started, then watches them; waits for the
    others' servers up to 10 x `AllReduceOptions.timeout_s` (workers start
    minutes apart on a busy cluster), then raises naming those still missing."""
    join_timeout_s = 10 * self._timeout_s
    missing = liveness.unjoined_peers(self._mesh, join_timeout_s)
    if missing:
      names = ", ".join(f"{w} ({self._mesh.worker_addresses[w]})" for w in missing)
      raise TimeoutError(
          f"cluster: worker {self._mesh.worker_index} waited {join_timeout_s:g} s "
          f"(10 x AllReduceOptions.timeout_s) and worker(s) {names} did not join. "
          "Start every worker of TF_CONFIG's cluster (python -m replicator.launch "
          "starts local ones), check that it did not fail before creating its "
          "replicator, or raise AllReduceOptions(timeout_s=...) for slow starts.")
    self._heartbeat = liveness.Heartbeat(self._mesh, self._timeout_s / 2)
    # After it, every worker's runtime is ready. Every server answers by now, so
    # a peer that does not join this collective made other replicators before
    # this one (each takes a collective group of its own, in order).
    try:
      self.merge([1], "Add", steps_completed=0, timeout_s=join_timeout_s)
    except tf.errors.DeadlineExceededError as error:
      raise TimeoutError(
          f"cluster: worker {self._mesh.worker_index}'s MultiGpuReplicator (number "
          f"{self._keys.group_key - cluster.FIRST_GROUP_KEY + 1} of this process's) "
          f"waited {join_timeout_s:g} s for the other workers' and they "
          "did not join, though every worker's server answers: the workers made "
          "different numbers of replicators before this one, or made them in "
          "another order. Make the same replicators on every worker, in the same "
          "order (an evaluation replicator on the chief alone waits forever).") from error

  def merge(self, values, merge_op: str, steps_completed: int,
            timeout_s=None) -> np.ndarray:
    """`values` (int64s) merged over the workers with `merge_op`, eagerly.

    `steps_completed` is what a `WorkerLost` raised meanwhile reports;
    `timeout_s`, if given, limits the wait (else the keys' `timeout_s`).
    """
    try:
      with tf.device(self._device):
        return between_workers.across_workers(
            tf.constant(values, tf.int64), merge_op, self._keys,
            timeout_s=timeout_s).numpy()
    except tf.errors.OpError as error:
      self.raise_if_lost(error, steps_completed)
      raise

  def raise_if_lost(self, error, steps_completed: int):
    """Raises `WorkerLost` for `error` if the heartbeat, looking at every peer
    now (the error may come before its next look), finds a worker gone; any
    other error is the step's own, for the caller to re-raise."""
    loss = self._heartbeat.verdict() if self._heartbeat is not None else None
    if loss is None:
      return
    address = (self._mesh.worker_addresses[loss.worker]
               if loss.worker is not None else "")
    raise errors.WorkerLost(loss.worker, steps_completed, address,
                            loss.reason) from error

  def send_initial_values(self, variables, steps_completed: int):
    """Every copy of `variables` takes the chief's first copy's value.

    Eagerly (a function to trace would cost a large model's first call more
    than the values' travel does), packed as gradients are, and broadcast: a
    few collectives, not one per variable. `steps_completed`: as for `merge`.
    """
    try:
      fixed = [v for v in variables if v.shape.is_fully_defined()]
      with tf.device(self._device):
        values = [self._value_or_spec(variable) for variable in fixed]
        fixed, values = self._differing(fixed, values)
        synced = [None] * len(values)
        for group in packing.buckets(values, _SYNC_PACK_BYTES):
          dtype = values[group[0]].dtype
          layout = packing.Layout.of([values[i].shape for i in group], dtype)
          packed = (packing.pack([values[i] for i in group], layout) if self._mesh.is_chief
                    else tf.zeros(packing.packed_shape(layout), dtype))  # (its shape only)
          total = between_workers.from_chief(packed, self._keys, self._mesh.is_chief)
          for i, value in zip(group, packing.unpack(total, layout)):
            synced[i] = value
      for variable, value in zip(fixed, synced):
        for copy in variable.replicas:
          copy.assign(value)
      varying = [v for v in variables if not v.shape.is_fully_defined()]

      @tf.function(autograph=False)
      def send_varying():  # (shape=[None]): in a function, where their shapes travel first
        for variable in varying:
          with tf.device(self._device):
            value = variable.replicas[0].read_value()
            value = between_workers.across_workers(
                value if self._mesh.is_chief else tf.zeros_like(value), "Add", self._keys)
          for copy in variable.replicas:
            copy.assign(value)

      if varying:
        send_varying()
    except tf.errors.OpError as error:
      self.raise_if_lost(error, steps_completed)
      raise

  def _value_or_spec(self, variable):
    """`variable`'s value, or on a worker other than the chief, where it has
    none (its initial value was left to the chief's: `lifting`), its spec."""
    primary = variable.replicas[0]
    if (not self._mesh.is_chief
        and not resource_variable_ops.var_is_initialized_op(primary.handle)):
      return tf.TensorSpec(primary.shape, primary.dtype)
    return primary.read_value()

  def _differing(self, variables, values):
    """Those of `variables` (and their `values`) that some worker holds otherwise.

    Values every worker computed alike (zeros and constants: about half the
    bytes of a ResNet-50 and its momentum) need not travel. One collective of
    each value's digest says which differ, alike on every worker.
    """
    if not variables:
      return variables, values
    # A value left to the chief's differs from any (digests are >= 0).
    digests = [_digest(value) if isinstance(value, tf.Tensor) else -1 for value in values]
    low, high = between_workers.checked_min_and_max(digests, self._keys, self._device)
    differ = [i for i, (a, b) in enumerate(zip(low, high)) if a != b]
    return [variables[i] for i in differ], [values[i] for i in differ]

  def stop(self):
    if self._heartbeat is not None:
      self._heartbeat.stop()


def variable_kinds(variables) -> list:
  """Each variable's dtype and shape, as workers compare them ("float32(2,)")."""
  return [f"{v.dtype.name}{v.shape}" for v in variables]


def listed(kinds) -> str:
  """`kinds` for an error message: the first 8, then "..."."""
  return ", ".join(kinds[:8]) + (", ..." if len(kinds) > 8 else "")


def digest(lines) -> int:
  """A digest of `lines` (strings) under 2**56, the same in every process."""
  return int.from_bytes(hashlib.sha256("\n".join(lines).encode()).digest()[:7], "big")


class NewVariables:
  """The variables a replicator made since the chief's values were last sent.

  Args:
    peers: the replicator's `Peers`.
    created: the replicator's replicated variables in creation order (a list
      that grows as it makes them).
    steps_completed: returns the replicator's steps so far (for `WorkerLost`).
  """

  def __init__(self, peers: Peers, created: list, steps_completed):
    self._peers = peers
    self._created = created
    self._steps_completed = steps_completed
    self._sent = 0  # how many of `created` were sent, or left unsent for good

  @property
  def left_to_chief(self) -> bool:
    """Whether values drawn in a step's first trace are left to the chief's
    (on every worker but the chief)."""
    return not self._peers.is_chief

  def pending(self) -> list:
    """The variables made since the last `send` or `keep_each_workers`."""
    return self._created[self._sent:]

  def send(self):
    """Gives every worker the chief's initial values of the pending variables."""
    new = self.pending()
    self._sent = len(self._created)
    if new:
      self._peers.send_initial_values(new, self._steps_completed())

  def keep_each_workers(self) -> list:
    """Leaves the pending variables as each worker made them (they differ); returns them."""
    kept = self.pending()
    self._sent = len(self._created)
    return kept

  def digest(self) -> int:
    """0 where nothing is pending, else a digest of the pending variables'
    number, dtypes and shapes (under 2**56): equal on every worker that made
    the same."""
    made = variable_kinds(self.pending())
    return 1 + digest([str(len(made))] + made) if made else 0


def _digest(value: tf.Tensor) -> int:
  """62 bits of SHA-1 of `value`'s dtype, shape and bytes (an int64 that
  negates without overflow, as `min_and_max_across_workers` needs)."""
  array = np.asarray(value.numpy())
  hashed = hashlib.sha1(f"{value.dtype.name}{array.shape}".encode())
  if array.dtype == object:  # strings
    for item in array.reshape(-1):
      hashed.update(len(item).to_bytes(8, "little") + item)
  else:
    hashed.update(np.ascontiguousarray(array).reshape(-1).view(np.uint8))
  return int.from_bytes(hashed.digest()[:8], "little") & ((1 << 62) - 1)
