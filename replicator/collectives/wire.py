"""What each transport's kernel carries, and how a value of another dtype travels on it.

The one place, for both engines, that says which dtypes each kernel takes:
`TPU_SUM` (a TPU's `cross_replica_sum`, under `TPUStrategy`'s all-reduce and
all-gather; the strategy engine treats its stand-in as a TPU, so the suite
executes the encodings a TPU traces), `NCCL` (between physical GPUs), and
between workers (`CollectiveReduceV2` / `CollectiveGatherV2`: `REDUCED_WIDER`,
`GATHERED_AS_INT32`, `GATHERED_AS_BITS`).

The encodings arrive exact: a narrow integer is summed as int32 and cast back
(it wraps as its own arithmetic does); a 64-bit integer as four 16-bit limbs
in int32 (exact for up to 32,768 replicas); a gather or a broadcast moves
each value's bits as 32-bit words, so inf and NaN arrive bit for bit (a TPU's
own `all_gather` multiplies by a one-hot mask, which turns inf into NaN).
"""

from typing import Callable

import tensorflow as tf

TPU_SUM = "cross_replica_sum"
NCCL = "NcclAllReduce"

CARRIES = {
    # cross_replica_sum also takes uint32, which the stand-in's CPU
    # collectives do not: it travels as int32 bits (sums wrap alike), so that
    # the suite executes what a TPU traces.
    TPU_SUM: frozenset({tf.bfloat16, tf.float16, tf.float32, tf.float64,
                        tf.int32}),
    NCCL: frozenset({tf.float16, tf.float32, tf.float64, tf.int32, tf.int64}),
}

# Between workers: dtypes reduced as a wider one (sums wrap alike when cast
# back; booleans as 0/1, so Max is any worker's and Min every worker's).
REDUCED_WIDER = {tf.bool: tf.int32, tf.int8: tf.int32, tf.uint8: tf.int32,
                 tf.int16: tf.int32, tf.uint16: tf.int32, tf.uint32: tf.int64}
# Between workers: dtypes gathered as int32, and as the bits of a signed one.
GATHERED_AS_INT32 = (tf.bool, tf.int8, tf.uint8, tf.int16, tf.uint16)
GATHERED_AS_BITS = {tf.uint32: tf.int32, tf.uint64: tf.int64}

_SIGNED = {1: tf.int8, 2: tf.int16}
_LIMB_BITS = 16
_LIMBS = 64 // _LIMB_BITS


def carried(transport: str, dtype: tf.DType) -> bool:
  """Whether `transport`'s kernel takes `dtype` as it is."""
  return dtype in CARRIES[transport]


def to_words(x: tf.Tensor) -> tf.Tensor:
  """`x`'s bits as int32 words: shape `x.shape + [words per element]`."""
  if x.dtype == tf.bool:
    x = tf.cast(x, tf.uint8)
  size = x.dtype.size
  if size < 4:
    return tf.expand_dims(tf.cast(tf.bitcast(x, _SIGNED[size]) if x.dtype != _SIGNED[size]
                                  else x, tf.int32), -1)
  words = tf.bitcast(x, tf.int32)
  return tf.expand_dims(words, -1) if size == 4 else words


def from_words(words: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
  """The inverse of `to_words`, for a value of `dtype`."""
  if dtype == tf.bool:
    return tf.cast(from_words(words, tf.uint8), tf.bool)
  size = dtype.size
  if size < 4:
    narrow = tf.cast(words[..., 0], _SIGNED[size])
    return narrow if dtype == _SIGNED[size] else tf.bitcast(narrow, dtype)
  return tf.bitcast(words[..., 0] if size == 4 else words, dtype)


def exact_sum(x: tf.Tensor, transport: str,
              sum_: Callable[[tf.Tensor], tf.Tensor]) -> tf.Tensor:
  """The sum over replicas of `x` (a number), by `sum_` of what `transport`
  carries. Floats of a dtype it does not carry are an error of the caller's."""
  if carried(transport, x.dtype) or not x.dtype.is_integer:
    return sum_(x)
  if x.dtype.size < 4:
    return tf.cast(sum_(tf.cast(x, tf.int32)), x.dtype)
  if x.dtype.size == 4:  # the same bits: sums wrap alike
    other = tf.int32 if x.dtype == tf.uint32 else tf.uint32
    return tf.bitcast(sum_(tf.bitcast(x, other)), x.dtype)
  # 64 bits: 16-bit limbs summed in int32, recombined wrapping mod 2**64.
  bits = tf.bitcast(x, tf.uint64) if x.dtype == tf.int64 else x
  mask = tf.constant(2**_LIMB_BITS - 1, tf.uint64)
  limbs = tf.stack([
      tf.cast(tf.bitwise.bitwise_and(
          tf.bitwise.right_shift(bits, tf.constant(_LIMB_BITS * k, tf.uint64)), mask),
              tf.int32) for k in range(_LIMBS)], -1)
  summed = tf.cast(sum_(limbs), tf.int64)
  total = summed[..., 0]
  for k in range(1, _LIMBS):
    total += tf.bitwise.left_shift(summed[..., k], tf.constant(_LIMB_BITS * k, tf.int64))
  return total if x.dtype == tf.int64 else tf.bitcast(total, tf.uint64)


def gather_words(parts, replica_id: tf.Tensor, num_replicas: int, axis: int,
                 sum_: Callable[[list], list]) -> list:
  """Every replica's `parts` concatenated along `axis`, in replica order, by
  one int32 sum (`sum_` of a list) of each replica's words at its place
  among zeros: exact for every dtype (one replica writes each place)."""
  placed = []
  for part in parts:
    words = to_words(part)
    rank = words.shape.rank
    axis_ = axis % part.shape.rank
    size = part.shape[axis_]
    before = replica_id * size
    paddings = [[0, 0]] * rank
    paddings[axis_] = [before, (num_replicas - 1) * size - before]
    placed.append(tf.pad(words, paddings))
  return [from_words(words, part.dtype) for words, part in zip(sum_(placed), parts)]


def broadcast_words(flat, is_source: tf.Tensor, sum_: Callable[[list], list]) -> list:
  """The source replica's `flat`, on every replica, bit for bit: an int32 sum
  to which only the source gives its words."""
  sent = [tf.where(is_source, w, tf.zeros_like(w)) for w in map(to_words, flat)]
  return [from_words(words, x.dtype) for words, x in zip(sum_(sent), flat)]
