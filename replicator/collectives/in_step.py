"""Collectives as seen from inside a step: nests in, nests out, for this replica.

Each checks its arguments and flattens the nest once, the same for every
engine, then hands the flat tensors to the replica traced on this thread
(`replica_context.current()`), which meets the other replicas at one
collective, differentiable as on one device.
"""

import numbers

import tensorflow as tf

from replicator.collectives import reduce_options
from replicator.collectives import replica_context


def current_replica(method: str) -> replica_context.Replica:
  replica = replica_context.current()
  if replica is None:
    raise RuntimeError(
        f"{method} is only valid while a step runs: call it inside the step_fn "
        "given to repl.run(step_fn, ...).")
  return replica


def _flatten(value, method):
  flat = tf.nest.flatten(value, expand_composites=False)
  try:
    flat = [tf.convert_to_tensor(v) for v in flat]  # IndexedSlices too
  except (TypeError, ValueError) as error:
    raise TypeError(
        f"{method}: value must be a tensor or a nest of tensors, got "
        f"{value!r}.") from error
  return flat


def replica_id() -> tf.Tensor:
  return current_replica("replica_id").replica_id()


def all_reduce(value, op=reduce_options.ReduceOp.SUM,
               options: reduce_options.AllReduceOptions = reduce_options.AllReduceOptions(),
               method: str = "all_reduce"):
  op = reduce_options.check_reduce_op(op)
  replica = current_replica(method)
  flat = _flatten(value, f"{method}({op.name})")
  if not flat:
    return value
  reduce_options.check_reducible(flat, op, method)
  return tf.nest.pack_sequence_as(value, replica.all_reduce(flat, op, options, method=method))


def all_gather(value, axis: int = 0):
  replica = current_replica("all_gather")
  flat = _flatten(value, "all_gather")
  if not flat:
    return value
  return tf.nest.pack_sequence_as(value, replica.all_gather(flat, axis))


def broadcast(value, source_replica: int = 0):
  replica = current_replica("broadcast")
  if (not isinstance(source_replica, numbers.Integral)
      or isinstance(source_replica, bool)):
    raise TypeError(
        f"broadcast: source_replica must be a Python int (a replica id known "
        f"when the step is traced), got {source_replica!r}. To choose the "
        "source at run time, all_sum(tf.where(repl.replica_id == source, "
        "value, tf.zeros_like(value))).")
  source_replica = int(source_replica)
  if not 0 <= source_replica < replica.num_replicas:
    raise ValueError(
        f"broadcast: source_replica must be in [0, {replica.num_replicas}), "
        f"got {source_replica}.")
  flat = _flatten(value, "broadcast")
  if not flat:
    return value
  return tf.nest.pack_sequence_as(value, replica.broadcast(flat, source_replica))
