"""Whether the copies of replicated variables still agree, bit for bit."""

from typing import Callable, Optional, Sequence

import tensorflow as tf

from replicator import errors
from replicator.engine import variables


def assert_in_sync(variables_to_check, replica_ids: Sequence[int],
                   copies_of: Optional[Callable] = None):
  """Raises `ReplicasDiverged` naming the first variable whose copies differ.

  `replica_ids`: the global ids of the replicas that hold the local copies.
  `copies_of(variable)`: its copies, where another engine made it.
  """
  for variable in tf.nest.flatten(variables_to_check):
    if copies_of is not None:
      _compare(variable.name, [_checksum(c) for c in copies_of(variable)], replica_ids)
      continue
    inner = getattr(variable, "value", None)  # a Keras 3 variable wraps ours
    if isinstance(inner, variables.ReplicatedVariable):
      variable = inner
    if not isinstance(variable, variables.ReplicatedVariable):
      raise TypeError(
          f"variables: {getattr(variable, 'name', variable)!r} is not a "
          "replicated variable; create it inside repl.context().")
    _compare(variable.name, [_checksum(copy) for copy in variable.replicas],
             replica_ids)


def _compare(name: str, sums, replica_ids):
  for r, value in enumerate(sums[1:], start=1):
    if value != sums[0]:
      raise errors.ReplicasDiverged(
          f"Variable {name!r} differs between replica "
          f"{replica_ids[0]} and replica {replica_ids[r]} (checksums "
          f"{sums[0]} vs {value}).")


def _checksum(variable) -> int:
  """A position-weighted sum of the raw bits of `variable`, on its device."""
  with tf.device(variable.device):
    value = tf.reshape(variable.read_value(), [-1])
    if value.dtype.is_bool:
      value = tf.cast(value, tf.uint8)
    bits = {1: tf.uint8, 2: tf.uint16, 4: tf.uint32, 8: tf.uint64}[value.dtype.size]
    words = tf.cast(tf.bitcast(value, bits), tf.int64) if value.dtype != bits else tf.cast(value, tf.int64)
    weights = tf.range(1, tf.size(words, out_type=tf.int64) + 1) % 65521 + 1
    return int(tf.reduce_sum(words * weights))
