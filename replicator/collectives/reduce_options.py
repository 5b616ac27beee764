"""What a reduction is asked for: its op, its options, and the values it takes.

`ReduceOp`, `Compression` and `AllReduceOptions` are public values (Optax-style
options rather than flags); the checks here run before any collective is
built, so a bad argument fails on one replica too, naming what to change.
"""

import dataclasses
import enum
import numbers
from typing import List, Optional, Sequence

import tensorflow as tf


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
      bytes (per dtype, counted in the gradients' own dtype) and each bucket
      is reduced with one collective.
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
      `FP16` needs values known to lie in its range (loss scaling). Between
      GPUs of one worker, NCCL takes float16 but not bfloat16: a `BF16` sum
      there is an `add_n` on the first GPU (half the bytes copied, but no
      NCCL ring).
    sum_in_float32: with compression, values still travel compressed but are
      added in float32: every value is rounded once, the sums not at all.
      Between workers this is an all-gather of the compressed buckets and a
      local sum (each worker receives W-1 buckets instead of a ring's ~2):
      an accuracy option, not a speed one (TensorFlow's gather over gRPC is
      slower than a float32 all-reduce; see benchmarks/RESULTS.md).
    buckets_in_flight: multi-worker: how many buckets' collectives may cross
      at once (bucket i waits only for bucket i - k, in the order the buckets
      fill). TensorFlow moves each ring's bytes through gRPC on a few threads,
      so k rings side by side use more of a host's cores. None (the default):
      2, or 1 where this host runs more of the job's workers than it has
      cores, and rings side by side compete for them (benchmarks/RESULTS.md,
      item 3).
    timeout_s: multi-worker: a worker that does not answer the heartbeat for
      half this long counts as lost, and every other worker raises
      `WorkerLost` (a busy worker still answers). The constructor waits at
      most 10 x timeout_s (10 minutes by default) for every worker to start.
  """
  pack_bytes: int = 16 * 2**20
  compression: Compression = Compression.NONE
  timeout_s: float = 60.0
  sum_in_float32: bool = False
  buckets_in_flight: Optional[int] = None

  def lanes(self, crowded: bool) -> int:
    """Buckets in flight: as set, else 2, or 1 on a `crowded` host (more
    workers than cores)."""
    if self.buckets_in_flight is not None:
      return self.buckets_in_flight
    return 1 if crowded else 2

  def __post_init__(self):
    positive_int = lambda x: isinstance(x, int) and not isinstance(x, bool) and x > 0
    if not positive_int(self.pack_bytes):
      raise ValueError(f"pack_bytes: expected a positive int, got {self.pack_bytes!r}.")
    if self.buckets_in_flight is not None and not positive_int(self.buckets_in_flight):
      raise ValueError(
          f"buckets_in_flight: expected a positive int or None (2, or 1 on a host "
          f"with more workers than cores), got {self.buckets_in_flight!r}; 1 sends "
          "buckets one after another.")
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
  not_floats = [t for t in tensors if not (t.dtype.is_floating or t.dtype.is_complex)]
  if op is ReduceOp.MEAN and not_floats:
    raise TypeError(
        f"op: ReduceOp.MEAN needs floating values, got {not_floats[0].dtype.name}; cast "
        "first or use ReduceOp.SUM.")
  complex_ = [t for t in tensors if t.dtype.is_complex]
  if op in (ReduceOp.MAX, ReduceOp.MIN) and complex_:
    raise TypeError(
        f"{method}: {complex_[0].dtype.name} values have no order, so ReduceOp."
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
