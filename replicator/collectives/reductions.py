"""The all-reduce core: reductions over the per-replica values of one step.

Each takes `values`, one flat list of tensors per local replica (matching
shapes and dtypes), and returns one such list per replica, on its device: a
handful of ops in the step's graph, which holds every replica.
"""

import functools
from typing import List, Sequence

import tensorflow as tf
from tensorflow.python.ops import gen_resource_variable_ops as resource_variable_ops
from tensorflow.python.ops import nccl_ops

from replicator.collectives import between_workers
from replicator.collectives import packing
from replicator.collectives import wire
from replicator.collectives.reduce_options import AllReduceOptions
from replicator.collectives.reduce_options import check_reducible
from replicator.collectives.reduce_options import ReduceOp


def spread(value: tf.Tensor, devices: Sequence[str]) -> List[tf.Tensor]:
  return _on_devices(tf.identity, [value] * len(devices), devices)


def spread_each(tensors: Sequence[tf.Tensor], devices: Sequence[str]) -> List[List[tf.Tensor]]:
  """Every one of `tensors` on each device: one list of them per device."""
  copies = [spread(t, devices) for t in tensors]
  return [[each[r] for each in copies] for r in range(len(devices))]


def dense(value):
  return tf.convert_to_tensor(value) if isinstance(value, tf.IndexedSlices) else value


def _gpus_split() -> bool:
  """Whether a physical GPU holds several logical GPUs of this process, where
  NCCL refuses two ranks on one GPU ("NCCL: invalid usage"), as
  MirroredStrategy also avoids it."""
  return (len(tf.config.list_logical_devices("GPU"))
          > len(tf.config.list_physical_devices("GPU")))


def _by_nccl(devices: Sequence[str], dtype: tf.DType = tf.float32) -> bool:
  """Whether a sum of `dtype` over these local replicas is NCCL's (several GPUs,
  each a physical GPU of its own, and a dtype NCCL takes), not an `add_n`."""
  return (len(devices) > 1 and all("GPU" in d.upper() for d in devices)
          and wire.carried(wire.NCCL, dtype) and not _gpus_split())


def merged_by_collectives(devices: Sequence[str], keys=None) -> bool:
  """Whether a sum over these replicas takes collective kernels (NCCL, a ring
  between workers: each a launch or a round trip) rather than an `add_n`."""
  return _by_nccl(devices) or (keys is not None and keys.num_workers > 1)


def _sum(parts: List[tf.Tensor], options: AllReduceOptions,
         devices: Sequence[str], keys, ordering_token,
         finish, finish_on_each_device: bool) -> List[tf.Tensor]:
  """Sums `parts` (one per local replica) over every replica of the job.

  Returns `finish(sum)` on each local replica's device; the sum is in the
  parts' dtype (float32 for compressed parts with `options.sum_in_float32`).
  On several GPUs of one worker the sum is NCCL's (`_by_nccl`), finished on
  each GPU; elsewhere an `add_n`, then one collective between workers,
  finished once on the first device and handed on (or,
  `finish_on_each_device`, handed on and finished on each).
  """
  wide = options.sum_in_float32 and parts[0].dtype.is_floating  # compressed parts
  if _by_nccl(devices, parts[0].dtype) and (
      keys is None or keys.num_workers == 1) and not wide:
    return _on_devices(finish, nccl_ops.all_sum(_on_devices(tf.identity, parts, devices)),
                       devices)
  with tf.device(devices[0]):
    if wide:
      total = _sum_wide(parts, keys)
    else:
      total = parts[0] if len(parts) == 1 else tf.add_n(parts)
      total = between_workers.across_workers(total, "Add", keys,
                                             ordering_token=ordering_token)
    if finish_on_each_device:
      return _on_devices(finish, spread(total, devices), devices)
    return spread(finish(total), devices)


def _sum_wide(parts, keys) -> tf.Tensor:
  """The float32 sum of compressed `parts` and of the other workers' sums."""
  local_sum = lambda: tf.add_n([tf.cast(p, tf.float32) for p in parts])
  if keys is None or keys.num_workers == 1:
    return local_sum()
  # Several local replicas: their float32 sum is rounded once to travel.
  mine = parts[0] if len(parts) == 1 else tf.cast(local_sum(), parts[0].dtype)
  mine = between_workers.same_shape_everywhere(mine, keys)
  gathered = between_workers.gather_workers(mine, keys)
  total = tf.reshape(tf.reduce_sum(
      tf.reshape(tf.cast(gathered, tf.float32), [keys.num_workers, -1]), 0),
                     tf.shape(mine))  # a single tensor is not packed flat
  total.set_shape(mine.shape)
  return total


def _lanes(count: int, num_buckets: int, device: str, keys) -> list:
  """The ordering token of each of `count` lanes, or None where there is one lane.

  A collective waits for the previous one of its lane only
  (`AllReduceOptions.buckets_in_flight`). A token is the handle of a variable
  that never exists. Safe because the gRPC ring's instance keys let lanes
  finish in any order on each worker (NCCL between workers would not).
  """
  if count == 1 or num_buckets == 1 or keys is None or keys.num_workers == 1:
    return [None]
  with tf.device(device):
    return [resource_variable_ops.var_handle_op(
        dtype=tf.float32, shape=[], shared_name=f"replicator_bucket_lane_{lane}")
            for lane in range(min(count, num_buckets))]


def _on_devices(fn, values: Sequence[tf.Tensor], devices: Sequence[str]):
  out = []
  for value, device in zip(values, devices):
    with tf.device(device):
      out.append(fn(value))
  return out


def _divides_first(op: ReduceOp, wire: tf.DType, options: AllReduceOptions) -> bool:
  """Where a mean is divided: before the sum for float16 on the wire, whose
  sum overflows (to inf) above 65504 where the mean need not (as PyTorch DDP
  does; exact for a power-of-two number of replicas); everywhere else once,
  after the sum, in the values' own dtype (`_divided`)."""
  return op is ReduceOp.MEAN and wire == tf.float16 and not options.sum_in_float32


def _divided(total: tf.Tensor, num_replicas: int, dtype: tf.DType) -> tf.Tensor:
  """`total / num_replicas` in `dtype`, from a sum in `dtype` or a wider or
  narrower one (a float16 value's sum added in float32 is divided there,
  since it may exceed float16's range where the mean does not)."""
  if dtype == tf.float16 and total.dtype != dtype:
    return tf.cast(tf.cast(total, tf.float32) / num_replicas, dtype)
  return tf.cast(total, dtype) / tf.constant(num_replicas, dtype)


def all_reduce(values: List[List[tf.Tensor]], op: ReduceOp,
               devices: Sequence[str],
               options: AllReduceOptions = AllReduceOptions(),
               num_replicas: int = None, keys=None) -> List[List[tf.Tensor]]:
  """Reduces matching tensors across replicas, packed by dtype into buckets.

  `keys` (a `multiworker.cluster.CollectiveKeys`) extends the reduction to
  the other workers' replicas; `num_replicas` is then the job's total.
  """
  num_replicas = num_replicas or len(values)
  values = [[dense(v) for v in replica] for replica in values]
  first = values[0]
  if not first:
    return [[] for _ in values]
  check_reducible(first, op)
  if op in (ReduceOp.MAX, ReduceOp.MIN):
    is_max = op is ReduceOp.MAX
    totals = []
    with tf.device(devices[0]):
      for index in range(len(first)):
        if first[index].dtype == tf.bool:  # max: any replica, min: every replica
          pairwise = tf.logical_or if is_max else tf.logical_and
        else:
          pairwise = tf.maximum if is_max else tf.minimum
        total = functools.reduce(pairwise, [replica[index] for replica in values])
        totals.append(between_workers.across_workers(total, "Max" if is_max else "Min", keys))
    return spread_each(totals, devices)
  results = [[None] * len(first) for _ in values]
  packable = all(t.shape.is_fully_defined() for t in first)
  groups = (packing.buckets(first, options.pack_bytes) if packable
            else [[i] for i in range(len(first))])
  lanes = _lanes(options.lanes(getattr(keys, "crowded", False)), len(groups),
                 devices[0], keys)
  for number, group in enumerate(groups):
    dtype = first[group[0]].dtype
    wire = (options.compression.value if dtype.is_floating else None) or dtype
    layout = packing.Layout.of([first[i].shape for i in group], wire)
    divide_first = _divides_first(op, wire, options)
    flat = []
    for replica, device in zip(values, devices):
      with tf.device(device):  # narrowed where it lives, so it travels narrow
        packed = packing.pack([tf.cast(replica[i], wire) for i in group], layout)
        if divide_first:
          packed = packed / tf.constant(num_replicas, wire)
        flat.append(packed)

    def finish(total, dtype=dtype, divide=op is ReduceOp.MEAN and not divide_first):
      # A compressed sum is widened whole, then unpacked (one cast, not one per
      # tensor; the layout's alignment holds in the wider dtype): before it is
      # handed on, or on each GPU where the narrow sum crosses between GPUs.
      return _divided(total, num_replicas, dtype) if divide else tf.cast(total, dtype)

    totals = _sum(flat, options, devices, keys, lanes[number % len(lanes)],
                  finish=finish,
                  finish_on_each_device=wire != dtype and any(
                      "GPU" in device.upper() for device in devices[1:]))
    for r, (device, total) in enumerate(zip(devices, totals)):
      with tf.device(device):
        pieces = packing.unpack(total, layout)
      for index, piece in zip(group, pieces):
        results[r][index] = piece
  return results


def broadcast(values: List[List[tf.Tensor]], source_replica: int,
              devices: Sequence[str], first_replica_id: int = 0,
              keys=None) -> List[List[tf.Tensor]]:
  """Gives every replica the values of replica `source_replica` (a global id,
  one of the job's: `in_step.broadcast` checks it)."""
  local = source_replica - first_replica_id
  if keys is None or keys.num_workers == 1:
    return spread_each([dense(value) for value in values[local]], devices)
  mine = 0 <= local < len(values)
  sent = []
  with tf.device(devices[0]):  # the source's worker contributes its values, the others zeros
    for value in values[local if mine else 0]:
      value = dense(value)
      sent.append(between_workers.across_workers(
          value if mine else tf.zeros_like(value), "Add", keys))
  return spread_each(sent, devices)
