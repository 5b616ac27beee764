"""Collectives as seen from inside a step: nests in, nests out, for this replica."""

import tensorflow as tf

from replicator import collectives
from replicator import context


def current_replica(method: str) -> context.ReplicaContext:
  replica = context.current()
  if replica is None:
    raise RuntimeError(
        f"{method} is only valid while a step runs: call it inside the step_fn "
        "given to repl.run(step_fn, ...).")
  return replica


def _flatten(value, method):
  flat = tf.nest.flatten(value, expand_composites=False)
  try:
    flat = [v if isinstance(v, tf.IndexedSlices) else tf.convert_to_tensor(v)
            for v in flat]
  except (TypeError, ValueError) as error:
    raise TypeError(
        f"{method}: value must be a tensor or a nest of tensors, got "
        f"{value!r}.") from error
  return flat


def _collective(method, value, merge_fn):
  replica = current_replica(method.split("(")[0])
  flat = _flatten(value, method)
  if not flat:
    return value
  merged = replica.collective(
      f"{method} of {len(flat)} tensor(s)", flat,
      lambda values: merge_fn(values, replica.group))
  return tf.nest.pack_sequence_as(value, merged)


def replica_id() -> tf.Tensor:
  replica = current_replica("replica_id")
  return tf.constant(replica.replica_id, tf.int32)


def all_reduce(value, op=collectives.ReduceOp.SUM,
               options: collectives.AllReduceOptions = collectives.AllReduceOptions(),
               method: str = "all_reduce"):
  op = collectives.check_reduce_op(op)
  return _collective(
      f"{method}({op.name})", value,
      lambda values, group: collectives.all_reduce(
          values, op, group.devices, options, num_replicas=group.num_replicas,
          workers=group.workers))


def all_gather(value, axis: int = 0):
  return _collective(
      "all_gather", value,
      lambda values, group: collectives.all_gather(
          values, axis, group.devices, workers=group.workers))


def broadcast(value, source_replica: int = 0):
  return _collective(
      "broadcast", value,
      lambda values, group: collectives.broadcast(
          values, source_replica, group.devices, group.num_replicas,
          group.first_replica_id, group.workers))
