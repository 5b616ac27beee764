"""The all-reduce core: reductions over the per-replica values of one step.

Every function here takes `values`, a list with one entry per local replica
(each a flat list of tensors with matching shapes and dtypes), and returns one
such list per replica, placed on that replica's device. The step traces every
replica into one graph, so a reduction is a handful of in-graph ops: no
rendezvous, no transport of our own.
"""

import dataclasses
import enum
import numbers
from typing import List, Optional, Sequence

import tensorflow as tf
from tensorflow.python.ops import collective_ops
from tensorflow.python.ops import nccl_ops

from replicator import packing


class ReduceOp(enum.Enum):
  """How values from different replicas are combined."""
  SUM = "sum"
  MEAN = "mean"
  MAX = "max"
  MIN = "min"


class Compression(enum.Enum):
  """The dtype float values travel and are summed in (then cast back)."""
  NONE = None
  BF16 = tf.bfloat16
  FP16 = tf.float16


@dataclasses.dataclass(frozen=True)
class AllReduceOptions:
  """Tuning of the all-reduce core.

  Attributes:
    pack_bytes: gradients are concatenated into buckets of at most this many
      bytes (per dtype) and each bucket is reduced with one collective.
    compression: `Compression.BF16` / `FP16` halve the bytes moved; the sum is
      then computed in that precision too (relative error ~ 2**-8 for bf16,
      2**-11 for fp16; TensorFlow's collective sums in the dtype it is given:
      1.001 + 2.001 in bfloat16 gives 3). The relative error holds only
      inside the dtype's range. `BF16` keeps float32's range (up to 3.4e38,
      down to 1.2e-38). `FP16` does not: a value or a sum above 65504 becomes
      inf, values below 6.1e-5 lose precision (subnormal) and values below
      3e-8, half the smallest float16 (N times that for a MEAN, divided by the
      N replicas before the sum so that a mean that fits does not overflow),
      flush to 0, so small gradients vanish. Prefer `BF16` for gradients;
      `FP16` needs values known to lie in its range (loss scaling).
    sum_in_float32: with compression, values still travel compressed but are
      added in float32: every value is rounded once, the sums not at all.
      Between workers this is an all-gather of the compressed buckets and a
      local sum (each worker receives W-1 buckets instead of a ring's ~2):
      an accuracy option, not a speed one (TensorFlow's gather over gRPC
      was 1.4x-2.6x slower than a float32 all-reduce at 2-4 workers on a
      2-core machine, benchmarks/RESULTS.md).
    timeout_s: multi-worker: a worker that does not answer the heartbeat for
      half this long counts as lost, and every other worker raises
      `WorkerLost` (a busy worker still answers). The constructor waits at
      most 10 x timeout_s (10 minutes by default) for every worker to start.
  """
  pack_bytes: int = 32 * 2**20
  compression: Compression = Compression.NONE
  timeout_s: float = 60.0
  sum_in_float32: bool = False

  def __post_init__(self):
    if (not isinstance(self.pack_bytes, int) or isinstance(self.pack_bytes, bool)
        or self.pack_bytes <= 0):
      raise ValueError(
          f"pack_bytes: expected a positive int, got {self.pack_bytes!r}.")
    if not isinstance(self.compression, Compression):
      raise TypeError(
          f"compression: expected a replicator.Compression, got "
          f"{self.compression!r}; use e.g. Compression.BF16.")
    if (not isinstance(self.timeout_s, numbers.Real)
        or isinstance(self.timeout_s, bool)):
      raise TypeError(
          f"timeout_s: expected a number of seconds (int or float), got "
          f"{self.timeout_s!r}; e.g. timeout_s=60.0.")
    if self.timeout_s <= 0:
      raise ValueError(f"timeout_s: must be > 0, got {self.timeout_s!r}.")
    if not isinstance(self.sum_in_float32, bool):
      raise TypeError(
          f"sum_in_float32: expected True or False, got {self.sum_in_float32!r}.")
    if self.sum_in_float32 and self.compression is Compression.NONE:
      raise ValueError(
          "sum_in_float32: True only changes a compressed all-reduce, and "
          "compression is Compression.NONE; set compression=Compression.BF16 "
          "(or FP16) too, or leave sum_in_float32 out.")


def check_options(options) -> AllReduceOptions:
  """`options`, or the defaults for None; a clear error for anything else."""
  if options is None:
    return AllReduceOptions()
  if not isinstance(options, AllReduceOptions):
    raise TypeError(
        f"all_reduce: expected replicator.AllReduceOptions, got {options!r}; "
        "e.g. replicator.AllReduceOptions(pack_bytes=4 * 2**20).")
  return options


def check_reduce_op(op) -> ReduceOp:
  if not isinstance(op, ReduceOp):
    raise TypeError(
        f"op: expected a replicator.ReduceOp (SUM, MEAN, MAX, MIN), got {op!r}.")
  return op


def _spread(value: tf.Tensor, devices: Sequence[str]) -> List[tf.Tensor]:
  out = []
  for device in devices:
    with tf.device(device):
      out.append(tf.identity(value))
  return out


def _dense(value):
  if isinstance(value, tf.IndexedSlices):
    return tf.convert_to_tensor(value)
  return value


def _on_gpus(devices: Sequence[str]) -> bool:
  return len(devices) > 1 and all("GPU" in d.upper() for d in devices)


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
  return collective_ops.all_reduce_v2(
      value, group_size=workers.num_workers, group_key=workers.group_key,
      instance_key=instance_key or workers.next(), merge_op=merge_op,
      final_op="Id", communication_hint="ring", timeout=workers.timeout_s)


def min_and_max_across_workers(value: tf.Tensor, workers,
                               instance_key: Optional[int] = None):
  """The smallest and largest of the workers' scalar `value`s (one collective)."""
  both = across_workers(tf.stack([value, -value]), "Min", workers, instance_key)
  return both[0], -both[1]


def _sum(parts: List[tf.Tensor], options: AllReduceOptions,
         devices: Sequence[str], workers=None) -> List[tf.Tensor]:
  """Sums `parts` (one per local replica) over every replica of the job.

  Returns the sum on each local replica's device, in the parts' dtype (float32
  for compressed parts with `options.sum_in_float32`). On several GPUs of one
  worker the sum is NCCL's all-reduce; elsewhere an `add_n`, then one
  collective between workers.
  """
  if options.sum_in_float32 and parts[0].dtype.is_floating:  # compressed parts
    return _spread(_sum_wide(parts, devices[0], workers), devices)
  if _on_gpus(devices) and (workers is None or workers.num_workers == 1):
    return nccl_ops.all_sum(_on_devices(tf.identity, parts, devices))
  with tf.device(devices[0]):
    total = parts[0] if len(parts) == 1 else tf.add_n(parts)
    total = across_workers(total, "Add", workers)
  return _spread(total, devices)



def gather_workers(value: tf.Tensor, workers) -> tf.Tensor:
  """Every worker's `value` concatenated along axis 0, in worker order."""
  if workers is None or workers.num_workers == 1:
    return value
  if isinstance(workers, StandInWorkers):
    return tf.concat([value] * workers.num_workers, 0)
  if value.dtype == tf.bfloat16:  # CollectiveGatherV2 has no bfloat16 kernel
    flat = tf.reshape(value, [-1])
    odd = flat.shape[0] % 2
    pairs = tf.reshape(tf.pad(flat, [[0, odd]]), [-1, 2])
    words = gather_workers(tf.bitcast(pairs, tf.int32), workers)
    halves = tf.reshape(tf.bitcast(words, tf.bfloat16), [workers.num_workers, -1])
    return tf.reshape(halves[:, :flat.shape[0]],
                      [workers.num_workers * value.shape[0]] + value.shape[1:])
  gathered = collective_ops.all_gather_v2(
      value, group_size=workers.num_workers, group_key=workers.group_key,
      instance_key=workers.next(), communication_hint="ring",
      timeout=workers.timeout_s)
  if value.shape.rank:  # the op loses the static shape that the build's stand-in had
    leading = None if value.shape[0] is None else value.shape[0] * workers.num_workers
    gathered.set_shape([leading] + value.shape[1:])
  return gathered


def _sum_wide(parts, device, workers) -> tf.Tensor:
  """The float32 sum of compressed `parts` and of the other workers' sums."""
  with tf.device(device):
    local_sum = lambda: tf.add_n([tf.cast(p, tf.float32) for p in parts])
    if workers is None or workers.num_workers == 1:
      return local_sum()
    # Several local replicas: their float32 sum is rounded once to travel.
    mine = parts[0] if len(parts) == 1 else tf.cast(local_sum(), parts[0].dtype)
    gathered = gather_workers(mine, workers)
    return tf.reduce_sum(
        tf.reshape(tf.cast(gathered, tf.float32), [workers.num_workers, -1]), 0)


def _on_devices(fn, values: Sequence[tf.Tensor], devices: Sequence[str]):
  out = []
  for value, device in zip(values, devices):
    with tf.device(device):
      out.append(fn(value))
  return out


def _divided(total: tf.Tensor, num_replicas: int, dtype: tf.DType) -> tf.Tensor:
  """`total / num_replicas` in `dtype`.

  A sum of float16 values that was added in bfloat16 or float32 may exceed
  float16's range where their mean does not: it is divided in float32 first.
  """
  if dtype == tf.float16 and total.dtype != dtype:
    return tf.cast(tf.cast(total, tf.float32) / num_replicas, dtype)
  return tf.cast(total, dtype) / tf.cast(num_replicas, dtype)


def check_reducible(tensors: Sequence[tf.Tensor], op: ReduceOp,
                    method: str = "all_reduce") -> None:
  """Raises for values `op` cannot reduce (checked on one replica too)."""
  for t in tensors:
    if not (t.dtype.is_floating or t.dtype.is_integer or t.dtype.is_complex
            or t.dtype == tf.bool):
      raise TypeError(
          f"{method}: cannot reduce {t.dtype.name} values (ReduceOp.{op.name}); "
          "reductions take numbers, and booleans with ReduceOp.MAX / MIN. To "
          "collect them from every replica, use all_gather.")
  if op in (ReduceOp.SUM, ReduceOp.MEAN) and any(t.dtype == tf.bool for t in tensors):
    raise TypeError(
        f"op: ReduceOp.{op.name} of booleans; use ReduceOp.MAX (any replica) or "
        "ReduceOp.MIN (every replica), or cast to a number first.")
  if op is ReduceOp.MEAN and not all(t.dtype.is_floating or t.dtype.is_complex
                                     for t in tensors):
    bad = next(t for t in tensors if not (t.dtype.is_floating or t.dtype.is_complex))
    raise TypeError(
        f"op: ReduceOp.MEAN needs floating values, got {bad.dtype.name}; cast "
        "first or use ReduceOp.SUM.")
  if op in (ReduceOp.MAX, ReduceOp.MIN):
    for t in tensors:
      if t.dtype.is_complex:
        raise TypeError(
            f"{method}: {t.dtype.name} values have no order, so ReduceOp."
            f"{op.name} is undefined for them; reduce tf.math.real, tf.math.imag "
            "or tf.abs of them instead.")


def check_same_shapes(values: List[List[tf.Tensor]], method: str,
                      first_replica_id: int = 0) -> None:
  """Raises if a tensor's static shape differs between replicas."""
  for index, tensor in enumerate(values[0]):
    shapes = [replica[index].shape for replica in values]
    if not all(shape.is_compatible_with(tensor.shape) for shape in shapes):
      listed = ", ".join(f"replica {first_replica_id + r}: {shape}"
                         for r, shape in enumerate(shapes))
      where = (f"tensor {index} of the {len(values[0])} in the value"
               if len(values[0]) > 1 else "the value")
      raise ValueError(
          f"{method}: {where} has a different shape on each replica ({listed}); "
          "a reduction combines tensors of one shape. Reduce each replica's "
          "tensor to a common shape first (tf.reduce_sum over the rows, say), "
          "or use all_gather to concatenate parts of different sizes.")


def gather_part(part: tf.Tensor, axis: int) -> tf.Tensor:
  """A replica's part of an all-gather: scalars become vectors of one."""
  if part.shape.rank != 0:
    return part
  if axis not in (0, -1):
    raise ValueError(f"axis: all_gather of scalars takes axis 0, got {axis}.")
  return tf.reshape(part, [1])


def all_reduce(values: List[List[tf.Tensor]], op: ReduceOp,
               devices: Sequence[str],
               options: AllReduceOptions = AllReduceOptions(),
               num_replicas: int = None, workers=None) -> List[List[tf.Tensor]]:
  """Reduces matching tensors across replicas, packed by dtype into buckets.

  `workers` (a `cluster.CollectiveKeys`) extends the reduction to the other
  workers' replicas; `num_replicas` is then the job's total.
  """
  num_replicas = num_replicas or len(values)
  values = [[_dense(v) for v in replica] for replica in values]
  first = values[0]
  if not first:
    return [[] for _ in values]
  check_reducible(first, op)
  results = [[None] * len(first) for _ in values]
  if op in (ReduceOp.SUM, ReduceOp.MEAN):
    packable = all(t.shape.is_fully_defined() for t in first)
    groups = (packing.buckets(first, options.pack_bytes) if packable
              else [[i] for i in range(len(first))])
    for group in groups:
      dtype = first[group[0]].dtype
      narrow = options.compression.value if dtype.is_floating else None
      narrowed = lambda t: t if narrow is None else tf.cast(t, narrow)
      wire = narrow or dtype
      layout = packing.Layout.of([first[i].shape for i in group], wire)
      # A float16 sum overflows (to inf) above 65504 where the mean need not:
      # a float16 mean divides each replica's bucket first, as PyTorch DDP
      # does (exact for a power-of-two number of replicas, docs/design.md).
      divide_first = (op is ReduceOp.MEAN and wire == tf.float16
                      and not options.sum_in_float32)
      flat = []
      for replica, device in zip(values, devices):
        with tf.device(device):  # narrowed where it lives, so it travels narrow
          packed = packing.pack([narrowed(replica[i]) for i in group], layout)
          if divide_first:
            packed = packed / tf.cast(num_replicas, wire)
          flat.append(packed)
      totals = _sum(flat, options, devices, workers)
      divide_after = op is ReduceOp.MEAN and not divide_first
      for r, (device, total) in enumerate(zip(devices, totals)):
        with tf.device(device):
          # A compressed sum is unpacked first, then widened piece by piece.
          wide = total.dtype == dtype
          if wide and divide_after:
            total = total / tf.cast(num_replicas, dtype)
          pieces = packing.unpack(total, layout)
          if not wide and divide_after:  # divided before a cast to float16
            pieces = [_divided(p, num_replicas, dtype) for p in pieces]
          elif not wide:
            pieces = [tf.cast(p, dtype) for p in pieces]
        for index, piece in zip(group, pieces):
          results[r][index] = piece
  else:
    combine, merge_op = ((tf.maximum, "Max") if op is ReduceOp.MAX
                         else (tf.minimum, "Min"))
    with tf.device(devices[0]):
      for index in range(len(first)):
        boolean = first[index].dtype == tf.bool
        pairwise = combine
        if boolean:  # max: any replica, min: every replica
          pairwise = tf.logical_or if op is ReduceOp.MAX else tf.logical_and
        total = values[0][index]
        for replica in values[1:]:
          total = pairwise(total, replica[index])
        if boolean and workers is not None and workers.num_workers > 1:
          # collectives take no booleans: 0/1 integers between workers
          total = across_workers(tf.cast(total, tf.int32), merge_op, workers) > 0
        else:
          total = across_workers(total, merge_op, workers)
        for r, spread in enumerate(_spread(total, devices)):
          results[r][index] = spread
  return results


def all_gather(values: List[List[tf.Tensor]], axis: int,
               devices: Sequence[str], workers=None) -> List[List[tf.Tensor]]:
  """Concatenates matching tensors of all replicas along `axis`, in replica order.

  Across workers every worker's part must have the same shape. Scalars are
  gathered into a vector.
  """
  results = [[None] * len(values[0]) for _ in values]
  with tf.device(devices[0]):
    for index in range(len(values[0])):
      gathered = tf.concat([gather_part(_dense(r[index]), axis) for r in values],
                           axis=axis)
      if workers is not None and workers.num_workers > 1:
        rank = gathered.shape.rank
        axis_index = axis % rank
        order = [axis_index] + [d for d in range(rank) if d != axis_index]
        front = tf.transpose(gathered, order) if axis_index else gathered
        front = gather_workers(front, workers)
        inverse = [order.index(d) for d in range(rank)]
        gathered = tf.transpose(front, inverse) if axis_index else front
      for r, spread in enumerate(_spread(gathered, devices)):
        results[r][index] = spread
  return results


def broadcast(values: List[List[tf.Tensor]], source_replica: int,
              devices: Sequence[str], num_replicas: int = None,
              first_replica_id: int = 0, workers=None) -> List[List[tf.Tensor]]:
  """Gives every replica the values of replica `source_replica` (a global id)."""
  num_replicas = num_replicas or len(values)
  if not 0 <= source_replica < num_replicas:
    raise ValueError(
        f"source_replica: must be in [0, {num_replicas}), got {source_replica}.")
  local = source_replica - first_replica_id
  results = [[None] * len(values[0]) for _ in values]
  for index in range(len(values[0])):
    if workers is None or workers.num_workers == 1:
      value = _dense(values[local][index])
    else:  # the source's worker contributes its value, the others zeros
      with tf.device(devices[0]):
        mine = 0 <= local < len(values)
        value = _dense(values[local if mine else 0][index])
        if not mine:
          value = tf.zeros_like(value)
        if value.dtype.is_bool:
          value = tf.cast(across_workers(tf.cast(value, tf.int32), "Add", workers), tf.bool)
        else:
          value = across_workers(value, "Add", workers)
    for r, spread in enumerate(_spread(value, devices)):
      results[r][index] = spread
  return results
