"""Collectives between worker processes, and what keeps every worker's in step.

TensorFlow's own `CollectiveReduceV2` / `CollectiveGatherV2` over gRPC (the
engine of `MultiWorkerMirroredStrategy`), one call per collective on each
worker's first device. Every worker traces the same program, so each takes
its instance key from a counter (`cluster.CollectiveKeys`) with no exchange.
TensorFlow keeps the shape a collective first had under its key for the life
of the process and aborts every collective when a later call under that key
has another: a collective whose shape is known only at run time takes its key
at run time, one per shape, after the workers found their shapes equal.
"""

import dataclasses
from typing import Optional

import tensorflow as tf
from tensorflow.python.ops import collective_ops


@dataclasses.dataclass(frozen=True)
class StandInWorkers:
  """The other workers while a step is traced only to build it (never run).

  Collectives across workers become stand-ins of the right shape, and no
  collective instance key is used up (every worker must draw the same keys).
  """
  num_workers: int


def across_workers(value: tf.Tensor, merge_op: str, workers,
                   instance_key: Optional[int] = None) -> tf.Tensor:
  """Combines this worker's `value` with the other workers' (gRPC collective)."""
  if workers is None or workers.num_workers == 1 or isinstance(workers, StandInWorkers):
    return value
  if instance_key is None:
    value = same_shape_everywhere(value, workers)
  return collective_ops.all_reduce_v2(
      value, group_size=workers.num_workers, group_key=workers.group_key,
      instance_key=instance_key or _instance_key(merge_op, value, workers),
      merge_op=merge_op,
      final_op="Id", communication_hint="ring", timeout=workers.timeout_s)


def same_shape_everywhere(value: tf.Tensor, workers) -> tf.Tensor:
  """`value` once every worker's is found to have its shape; else an error on each.

  Only values whose shape is known at run time only are checked.

  Values of a shape known only at run time take their collective's key at run
  time (`_instance_key`): workers whose shapes differed would wait on
  different keys forever. Their shapes travel first, in a collective of a
  static shape.
  """
  if not _run_time_shape(value):
    return value
  shape = tf.shape(value, out_type=tf.int64)
  every = tf.reshape(gather_workers(shape, workers), [workers.num_workers, -1])
  check = tf.debugging.Assert(
      tf.reduce_all(tf.equal(every, every[:1])),
      ["a reduction across workers (all_sum, all_mean, all_max, all_min, "
       "broadcast) got values of different shapes on different workers; reduce "
       "values of one shape (all_gather takes parts of different sizes). Each "
       "worker's shape:", every], summarize=-1)
  with tf.control_dependencies([check]):
    return tf.identity(value)


def _instance_key(kind: str, value: tf.Tensor, workers):
  """A new collective's instance key: a tensor where its shape is known at run time only."""
  key = workers.next(_signature(kind, value))
  if not _run_time_shape(value):
    return key
  return workers.key_for_shape(tf.shape(value))


def _run_time_shape(value: tf.Tensor) -> bool:
  """Whether `value`'s collective takes its key at run time: known rank, some dim not.

  (Of unknown rank, it keeps one key: a change of shape aborts, as in TensorFlow.)
  """
  return value.shape.rank is not None and not value.shape.is_fully_defined()


def _signature(kind: str, value: tf.Tensor):
  """What workers must agree on for a collective: `(kind, dtype, static dims)`.

  The dims are None where the rank is unknown, a dim None where it is.
  """
  dims = tuple(value.shape.as_list()) if value.shape.rank is not None else None
  return kind, value.dtype.name, dims


def min_and_max_across_workers(value: tf.Tensor, workers,
                               instance_key: Optional[int] = None):
  """The smallest and largest of the workers' `value`s (scalar or vector; one collective)."""
  both = across_workers(tf.stack([value, -value]), "Min", workers, instance_key)
  return both[0], -both[1]


_GATHERED_AS_INT32 = (tf.bool, tf.int8, tf.uint8, tf.int16, tf.uint16)


def gather_workers(value: tf.Tensor, workers) -> tf.Tensor:
  """Every worker's `value` concatenated along axis 0, in worker order.

  Every worker's `value` must have the same shape (`gathering` pads parts
  that differ).
  """
  if workers is None or workers.num_workers == 1:
    return value
  if isinstance(workers, StandInWorkers):
    return tf.concat([value] * workers.num_workers, 0)
  if value.dtype in _GATHERED_AS_INT32:  # CollectiveGatherV2 has no kernel
    return tf.cast(gather_workers(tf.cast(value, tf.int32), workers), value.dtype)
  if value.dtype == tf.bfloat16:  # CollectiveGatherV2 has no bfloat16 kernel
    return _gather_bfloat16(value, workers)
  gathered = collective_ops.all_gather_v2(
      value, group_size=workers.num_workers, group_key=workers.group_key,
      instance_key=_instance_key("Gather", value, workers), communication_hint="ring",
      timeout=workers.timeout_s)
  return _leading_times(gathered, value, workers.num_workers)


def _leading_times(gathered: tf.Tensor, value: tf.Tensor, num_workers: int):
  """`gathered` given the static shape the op loses: `value`'s, axis 0 x workers."""
  if value.shape.rank:
    leading = None if value.shape[0] is None else value.shape[0] * num_workers
    gathered.set_shape([leading] + value.shape[1:])
  return gathered


def _gather_bfloat16(value: tf.Tensor, workers) -> tf.Tensor:
  """`gather_workers` of bfloat16 values, as pairs bitcast to int32 words."""
  flat = tf.reshape(value, [-1])
  size = flat.shape[0] if flat.shape[0] is not None else tf.size(flat)
  pairs = tf.reshape(tf.pad(flat, [[0, size % 2]]), [-1, 2])
  words = gather_workers(tf.bitcast(pairs, tf.int32), workers)
  halves = tf.reshape(tf.bitcast(words, tf.bfloat16), [workers.num_workers, -1])
  shape = tf.shape(value)
  gathered = tf.reshape(halves[:, :size],
                        tf.concat([[workers.num_workers * shape[0]], shape[1:]], 0))
  return _leading_times(gathered, value, workers.num_workers)


def checked_min_and_max(values, workers, device: str):
  """The elementwise min and max of the workers' int `values`, as lists, now.

  One eager collective on a key of the checks' range (`next_check`), which
  matches on every worker even where their programs' keys do not.
  """
  with tf.device(device):
    low, high = min_and_max_across_workers(
        tf.constant(values, tf.int64), workers, instance_key=workers.next_check())
  return low.numpy().tolist(), high.numpy().tolist()
