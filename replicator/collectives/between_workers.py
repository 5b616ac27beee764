"""Collectives between worker processes, and what keeps every worker's in step.

TensorFlow's `CollectiveReduceV2` / `CollectiveGatherV2` over gRPC, one call
per collective on each worker's first device. Every worker traces the same
program, so each takes its instance key from a counter
(`multiworker.cluster.CollectiveKeys`) with no exchange. TensorFlow keeps the
shape a collective first had under its key for the life of the process and
aborts every collective when a later call under that key has another: a
collective whose shape is known only at run time travels flattened and padded
to a size class (`_size_class`, at most 1/64 larger) and takes its key at run
time, one per class, after the workers found their shapes equal.
"""

from typing import Optional

import tensorflow as tf
from tensorflow.python.ops import collective_ops

from replicator.collectives import wire


def across_workers(value: tf.Tensor, merge_op: str, keys,
                   instance_key: Optional[int] = None,
                   ordering_token: Optional[tf.Tensor] = None,
                   timeout_s: Optional[float] = None) -> tf.Tensor:
  """Combines this worker's `value` with the other workers' (gRPC collective).

  A collective given an `ordering_token` (a resource handle) waits only for
  the previous one with the same token, not for every one built before it.
  `timeout_s` replaces `keys.timeout_s` for this collective (0: no limit).
  """
  if keys is None or keys.num_workers == 1:
    return value
  again = lambda v: across_workers(v, merge_op, keys, instance_key, ordering_token, timeout_s)
  if value.dtype in wire.REDUCED_WIDER:  # CollectiveReduceV2 has no kernel
    return tf.cast(again(tf.cast(value, wire.REDUCED_WIDER[value.dtype])), value.dtype)
  if value.dtype.is_complex:  # no kernel: real and imaginary parts, as floats
    both = again(tf.stack([tf.math.real(value), tf.math.imag(value)]))
    return tf.complex(both[0], both[1])
  if value.dtype == tf.uint64:  # as int64 bits: sums wrap alike; the order, sign bit flipped
    flip = (lambda v: v) if merge_op == "Add" else (
        lambda v: tf.bitwise.bitwise_xor(v, tf.constant(1 << 63, tf.uint64)))
    return flip(tf.bitcast(again(tf.bitcast(flip(value), tf.int64)), tf.uint64))

  def reduce(wire, key):
    return collective_ops.all_reduce_v2(
        wire, group_size=keys.num_workers, group_key=keys.group_key,
        instance_key=key, merge_op=merge_op, final_op="Id",
        communication_hint="ring",
        timeout=keys.timeout_s if timeout_s is None else timeout_s,
        ordering_token=ordering_token)

  if instance_key is not None or value.shape.is_fully_defined():
    return reduce(value, instance_key or keys.next(_signature(merge_op, value)))
  value = same_shape_everywhere(value, keys)
  flat, size, key = _in_size_class(merge_op, value, keys)
  total = tf.reshape(reduce(flat, key)[:size], tf.shape(value))
  total.set_shape(value.shape)
  return total


# What `CollectiveBcastSendV2` carries; other dtypes travel as int32 words.
_BROADCAST = frozenset({tf.bool, tf.float16, tf.float32, tf.float64, tf.int32, tf.int64})


def from_chief(value: tf.Tensor, keys, is_chief: bool) -> tf.Tensor:
  """The chief's `value` (of a static shape) on every worker, bit for bit: one
  broadcast, which carries half the bytes of a sum to which only the chief
  gives its value. The others' `value` gives only the shape and dtype."""
  if keys is None or keys.num_workers == 1:
    return value
  if value.dtype not in _BROADCAST:
    words = from_chief(wire.to_words(value), keys, is_chief)
    return wire.from_words(words, value.dtype)
  options = dict(group_size=keys.num_workers, group_key=keys.group_key,
                 instance_key=keys.next(_signature("Broadcast", value)),
                 communication_hint="ring", timeout=keys.timeout_s)
  if is_chief:
    return collective_ops.broadcast_send_v2(value, **options)
  return collective_ops.broadcast_recv_v2(value.shape.as_list(), value.dtype, **options)


def same_shape_everywhere(value: tf.Tensor, keys) -> tf.Tensor:
  """`value` once every worker's is found to have its shape; else an error on each.

  Only a value whose shape is known at run time only is checked: its
  collective takes its key at run time (`_in_size_class`), and workers whose
  shapes differed would wait on different keys forever. The shapes travel
  first, in a collective of a static shape (of unknown rank, the ranks first).
  """
  if value.shape.is_fully_defined():
    return value
  shape = tf.shape(value, out_type=tf.int64)
  if value.shape.rank is None:
    shape = _same_everywhere(shape, tf.reshape(tf.size(shape, out_type=tf.int64), [1]),
                             keys, "ranks")
  return _same_everywhere(value, shape, keys, "shapes")


def _same_everywhere(value: tf.Tensor, figures: tf.Tensor, keys, what: str):
  """`value` once every worker's int64 vector `figures` is found equal to this one's."""
  every = tf.reshape(gather_workers(figures, keys), [keys.num_workers, -1])
  check = tf.debugging.Assert(
      tf.reduce_all(tf.equal(every, every[:1])),
      ["a reduction across workers (all_sum, all_mean, all_max, all_min, "
       "broadcast) got values of different shapes on different workers; reduce "
       "values of one shape (all_gather takes parts of different sizes). Each "
       f"worker's {what}:", every], summarize=-1)
  with tf.control_dependencies([check]):
    return tf.identity(value)


def _in_size_class(kind: str, value: tf.Tensor, keys):
  """`value` flattened and padded to its size class; its size; the class's key
  (one per class: a key keeps the shape its collective first had)."""
  # Its own kind for the program check: a collective of this shape static on
  # another worker has another key there (a static one), and the dims alone
  # would match (an unknown dim matches any).
  keys.next(_signature(f"{kind} (run-time shape)", value))
  flat = tf.reshape(value, [-1])
  size = tf.size(flat, out_type=tf.int64)
  padded, size_class = _size_class(size)
  # Never empty: TensorFlow's gather of empty tensors crashes the process
  # (size 0 travels as 1 element, in a class of its own).
  flat = tf.pad(flat, [[0, tf.maximum(padded, 1) - size]])
  return flat, size, keys.key_for_size_class(size_class)


_MANTISSA_BITS = 6  # classes m * 2**e, m in [64, 128): at most 1/64 of padding
_POWERS_OF_TWO = [1 << bit for bit in range(63)]


def _size_class(size: tf.Tensor):
  """The padded size for `size` elements (int64, elementwise), and its class.

  Sizes under 128 are their own class; a larger size rounds up to the next
  m * 2**e with m in [64, 128), class 128 + 64 (e - 1) + (m - 64). Distinct
  classes for distinct padded sizes, and under 4,096 of them for any int64.
  """
  top = 1 << _MANTISSA_BITS
  floor_log2 = tf.reduce_sum(tf.cast(size[..., None] >= _POWERS_OF_TWO, tf.int64), -1) - 1
  shift = tf.maximum(floor_log2 - _MANTISSA_BITS, 0)
  mantissa = tf.bitwise.right_shift(
      size + tf.bitwise.left_shift(tf.constant(1, tf.int64), shift) - 1, shift)
  carry = mantissa >= 2 * top  # rounded up to the next power of two
  mantissa = tf.where(carry, mantissa // 2, mantissa)
  shift = tf.where(carry, shift + 1, shift)
  padded = tf.bitwise.left_shift(mantissa, shift)
  size_class = tf.where(tf.equal(shift, 0), size,
                        2 * top + (shift - 1) * top + (mantissa - top))
  return padded, size_class


def _signature(kind: str, value: tf.Tensor):
  """What workers must agree on for a collective: `(kind, dtype, static dims)`
  (dims None where the rank is unknown, a dim None where it is)."""
  dims = tuple(value.shape.as_list()) if value.shape.rank is not None else None
  return kind, value.dtype.name, dims


def min_and_max_across_workers(value: tf.Tensor, keys,
                               instance_key: Optional[int] = None):
  """The smallest and largest of the workers' `value`s (scalar or vector; one collective)."""
  both = across_workers(tf.stack([value, -value]), "Min", keys, instance_key)
  return both[0], -both[1]


def gather_workers(value: tf.Tensor, keys) -> tf.Tensor:
  """Every worker's `value`, of one shape on every worker (`gathering` pads
  parts that differ), concatenated along axis 0 in worker order."""
  if keys is None or keys.num_workers == 1:
    return value
  if value.dtype in wire.GATHERED_AS_INT32:  # CollectiveGatherV2 has no kernel
    return tf.cast(gather_workers(tf.cast(value, tf.int32), keys), value.dtype)
  if value.dtype.is_complex:  # nor for these: (real, imaginary) pairs of floats
    pairs = gather_workers(tf.bitcast(value, value.dtype.real_dtype), keys)
    return tf.bitcast(pairs, value.dtype)
  if value.dtype in wire.GATHERED_AS_BITS:  # nor for these: their bits, as signed ints
    signed = gather_workers(tf.bitcast(value, wire.GATHERED_AS_BITS[value.dtype]), keys)
    return tf.bitcast(signed, value.dtype)

  def gather(wire, key):
    return collective_ops.all_gather_v2(
        wire, group_size=keys.num_workers, group_key=keys.group_key,
        instance_key=key, communication_hint="ring", timeout=keys.timeout_s)

  if value.dtype == tf.bfloat16:  # nor for bfloat16: pairs of them as int32 words
    flat = tf.reshape(value, [-1])
    size = flat.shape[0] if flat.shape[0] is not None else tf.size(flat)
    pairs = tf.reshape(tf.pad(flat, [[0, size % 2]]), [-1, 2])
    words = gather_workers(tf.bitcast(pairs, tf.int32), keys)
    rows = tf.reshape(tf.bitcast(words, tf.bfloat16), [keys.num_workers, -1])[:, :size]
  elif value.shape.num_elements() == 0:  # TensorFlow's gather of empty tensors crashes
    done = gather(tf.zeros([1], value.dtype), keys.next(_signature("Gather", value)))
    with tf.control_dependencies([done]):
      return tf.zeros([keys.num_workers * value.shape[0]] + value.shape[1:], value.dtype)
  elif value.shape.is_fully_defined():
    return leading_times(gather(value, keys.next(_signature("Gather", value))), value,
                          keys.num_workers)
  else:
    flat, size, key = _in_size_class("Gather", value, keys)
    rows = tf.reshape(gather(flat, key), [keys.num_workers, -1])[:, :size]
  shape = tf.shape(value)
  gathered = tf.reshape(rows, tf.concat([[keys.num_workers * shape[0]], shape[1:]], 0))
  return leading_times(gathered, value, keys.num_workers)


def leading_times(gathered: tf.Tensor, value: tf.Tensor, num_workers: int):
  """`gathered` given the static shape the op loses: `value`'s, axis 0 x workers."""
  if value.shape.rank:
    leading = None if value.shape[0] is None else value.shape[0] * num_workers
    gathered.set_shape([leading] + value.shape[1:])
  return gathered


def checked_min_and_max(values, keys, device: str):
  """The elementwise min and max of the workers' int `values`, as lists, now:
  one eager collective on a key of the checks' range (`next_check`), which
  matches on every worker even where their programs' keys do not."""
  with tf.device(device):
    low, high = min_and_max_across_workers(
        tf.constant(values, tf.int64), keys, instance_key=keys.next_check())
  return low.numpy().tolist(), high.numpy().tolist()
