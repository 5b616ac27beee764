"""Whether the copies of replicated variables still agree, bit for bit."""

from typing import Callable, Sequence

import tensorflow as tf

from replicator import errors


def assert_in_sync(variables_to_check, replica_ids: Sequence[int],
                   copies_of: Callable):
  """Raises `ReplicasDiverged` naming the first variable whose copies differ.

  `replica_ids`: the global ids of the replicas that hold the local copies.
  `copies_of(variable)`: its local copies, from the engine that made it
  (raising where it is not a replicated variable).
  """
  for variable in tf.nest.flatten(variables_to_check):
    sums = [_checksum(c) for c in copies_of(variable)]
    for r, value in enumerate(sums[1:], start=1):
      if value != sums[0]:
        raise errors.ReplicasDiverged(
            f"Variable {variable.name!r} differs between replica "
            f"{replica_ids[0]} and replica {replica_ids[r]} (checksums "
            f"{sums[0]} vs {value}).")


def _checksum(variable) -> int:
  """A position-weighted sum of the raw bits of `variable`, on its device."""
  with tf.device(variable.device):
    value = tf.reshape(variable.read_value(), [-1])
    if value.dtype.is_bool:
      value = tf.cast(value, tf.uint8)
    bits = {1: tf.uint8, 2: tf.uint16, 4: tf.uint32, 8: tf.uint64}[value.dtype.size]
    words = tf.cast(tf.bitcast(value, bits), tf.int64)  # (to its own dtype: itself)
    weights = tf.range(1, tf.size(words, out_type=tf.int64) + 1) % 65521 + 1
    return int(tf.reduce_sum(words * weights))
