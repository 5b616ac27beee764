"""Buckets: many tensors reduced as one, then cut back out of the sum without copies.

`tf.split` of a 1-D tensor copies every byte; a `tf.slice` whose start and end
fall on TensorFlow's 64-byte buffer alignment shares the sum's buffer (SliceOp's
aligned fast path; checked on the CPU only). So in a bucket of large tensors
each starts on that alignment (zeros pad the gaps) and comes back as a slice; a
bucket of small tensors, where an op per tensor costs more than the copy, is cut
out by one split (benchmarks/RESULTS.md, item 3).
"""

import dataclasses
from typing import List, Sequence

import tensorflow as tf

_ALIGN_BYTES = 64  # TensorFlow's allocators align every buffer to this
_SLICE_MIN_MEAN_BYTES = 64 * 1024  # below, one split copies faster than slicing


def buckets(tensors: Sequence[tf.Tensor], pack_bytes: int) -> List[List[int]]:
  """Groups tensor indices by dtype into buckets of at most `pack_bytes`.

  Filled from the last tensor backwards and returned in that order: gradients
  arrive last layer first and collectives between workers run in the order
  they are built, so the first bucket on the wire is the first ready and
  crosses during the backward pass (as PyTorch DDP and
  MultiWorkerMirroredStrategy order them).
  """
  by_dtype = {}
  for index in reversed(range(len(tensors))):
    by_dtype.setdefault(tensors[index].dtype, []).append(index)
  groups = []
  for indices in by_dtype.values():
    current, current_bytes = [], 0
    for index in indices:
      nbytes = (tensors[index].shape.num_elements() or 0) * tensors[index].dtype.size
      if current and current_bytes + nbytes > pack_bytes:
        groups.append(current)
        current, current_bytes = [], 0
      current.append(index)
      current_bytes += nbytes
    groups.append(current)
  return groups


@dataclasses.dataclass(frozen=True)
class Layout:
  """Where each tensor of a bucket lies in the packed 1-D tensor.

  Attributes:
    shapes: the tensors' shapes, in bucket order.
    padding: zeros after each tensor, in elements.
    sliced: tensors come back as slices that share the sum's buffer (else
      one split, which copies).
  """
  shapes: tuple
  padding: tuple
  sliced: bool

  @classmethod
  def of(cls, shapes: Sequence[tf.TensorShape], wire_dtype: tf.DType) -> "Layout":
    """The layout of a bucket of `shapes` that travels as `wire_dtype`."""
    sizes = [shape.num_elements() for shape in shapes]
    sliced = (len(sizes) > 1
              and sum(sizes) * wire_dtype.size >= _SLICE_MIN_MEAN_BYTES * len(sizes))
    # Aligned in elements, so also in the wider dtype a compressed sum may
    # come back in (float32 from bfloat16 with sum_in_float32).
    step = max(1, _ALIGN_BYTES // wire_dtype.size)
    padding = tuple(-size % step if sliced else 0 for size in sizes)
    return cls(tuple(shapes), padding, sliced)


def pack(tensors: Sequence[tf.Tensor], layout: Layout) -> tf.Tensor:
  """One tensor holding `tensors` as `layout` says (the tensor itself for one)."""
  if len(tensors) == 1:
    return tensors[0]
  parts = []
  for tensor, padding in zip(tensors, layout.padding):
    parts.append(tf.reshape(tensor, [-1]))
    if padding:
      parts.append(tf.zeros([padding], tensor.dtype))
  return tf.concat(parts, 0)


def packed_shape(layout: Layout) -> tf.TensorShape:
  """The shape of `pack`'s tensor for `layout`."""
  if len(layout.shapes) == 1:
    return tf.TensorShape(layout.shapes[0])
  return tf.TensorShape([sum(shape.num_elements() for shape in layout.shapes)
                         + sum(layout.padding)])


def unpack(packed: tf.Tensor, layout: Layout) -> List[tf.Tensor]:
  """The tensors of `packed` (or of its reduction), in their shapes."""
  if len(layout.shapes) == 1:
    return [packed]
  sizes = [shape.num_elements() for shape in layout.shapes]
  if not layout.sliced:
    return [tf.reshape(piece, shape)
            for piece, shape in zip(tf.split(packed, sizes), layout.shapes)]
  pieces, start = [], 0
  for shape, size, padding in zip(layout.shapes, sizes, layout.padding):
    pieces.append(tf.reshape(tf.slice(packed, [start], [size]), shape))
    start += size + padding
  return pieces
