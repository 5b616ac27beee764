"""Collectives as seen from inside a step: nests in, nests out, for this replica.

Each checks its arguments and flattens the nest once for every engine, then
hands the flat tensors to the replica traced on this thread
(`replica_context.current()`).
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


def reduce_scatter(value, op=reduce_options.ReduceOp.SUM, method: str = "reduce_scatter"):
  op = reduce_options.check_reduce_op(op)
  if op not in (reduce_options.ReduceOp.SUM, reduce_options.ReduceOp.MEAN):
    raise ValueError(
        f"{method}: op must be ReduceOp.SUM or ReduceOp.MEAN, got ReduceOp.{op.name}. "
        f"For this replica's slice of the "
        f"{'maximum' if op is reduce_options.ReduceOp.MAX else 'minimum'}, slice "
        f"all_{op.name.lower()}(value) by repl.replica_id.")
  replica = current_replica(method)
  flat = _flatten(value, f"{method}({op.name})")
  if not flat:
    return value
  reduce_options.check_reducible(flat, op, method)
  for index, x in enumerate(flat):
    _check_divisible(x, replica.num_replicas, method,
                     f"tensor {index} of the {len(flat)} in the value"
                     if len(flat) > 1 else "the value")
  return tf.nest.pack_sequence_as(value, replica.reduce_scatter(flat, op, method=method))


def _check_divisible(x: tf.Tensor, num_replicas: int, method: str, where: str):
  """Raises unless `x`'s axis 0 splits into `num_replicas` equal slices."""
  if x.shape.rank == 0:
    raise ValueError(
        f"{method}: {where} is a scalar, which has no axis 0 to split between "
        f"the {num_replicas} replicas. Give a tensor whose axis 0 is a multiple "
        f"of {num_replicas}, or reduce it whole with all_reduce.")
  if x.shape.rank is None or x.shape[0] is None:
    raise ValueError(
        f"{method}: axis 0 of {where} (shape {x.shape}) is known only when the step "
        f"runs; it must be a multiple of the {num_replicas} replicas when the step "
        f"is traced. Give it a fixed size: pad it to a multiple of {num_replicas} "
        "rows and tf.ensure_shape it.")
  if x.shape[0] % num_replicas:
    raise ValueError(
        f"{method}: axis 0 of {where} (shape {x.shape}) has {x.shape[0]} rows, not a "
        f"multiple of the {num_replicas} replicas, so it cannot be split into equal "
        f"slices: pad axis 0 to a multiple of {num_replicas} (tf.pad with zeros, "
        "which a SUM or MEAN leaves unchanged), or use all_reduce.")
