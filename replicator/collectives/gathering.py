"""All-gather: every replica's part, concatenated in replica order.

Across workers the parts may differ in size along the gathered axis (uneven
batches), which TensorFlow's gather collective answers by aborting every
collective of the job. So, unless a part's shape is static (then it is every
worker's), the workers first exchange their parts' shapes (one collective per
call), check them, pad each part to the largest, gather, and drop the padding.
"""

from typing import List, Sequence

import tensorflow as tf

from replicator.collectives import between_workers
from replicator.collectives import reductions


def gather_part(part: tf.Tensor, axis: int) -> tf.Tensor:
  """A replica's part of an all-gather: scalars become vectors of one."""
  if part.shape.rank != 0:
    return part
  if axis not in (0, -1):
    raise ValueError(f"axis: all_gather of scalars takes axis 0, got {axis}.")
  return tf.reshape(part, [1])


def all_gather(values: List[List[tf.Tensor]], axis: int,
               devices: Sequence[str], keys=None) -> List[List[tf.Tensor]]:
  """Concatenates matching tensors of all replicas along `axis`, in replica order
  (scalars into a vector); across workers the parts may differ in size along it."""
  with tf.device(devices[0]):
    gathered = [tf.concat([gather_part(reductions.dense(r[index]), axis)
                           for r in values], axis=axis)
                for index in range(len(values[0]))]
    if keys is not None and keys.num_workers > 1:
      gathered = _across_workers(gathered, axis, keys)
  return reductions.spread_each(gathered, devices)


def _across_workers(local: List[tf.Tensor], axis: int, keys) -> List[tf.Tensor]:
  """`_gather_uneven` of `local` with `axis` moved first and back."""
  fronts, orders = [], []
  for value in local:
    rank = value.shape.rank
    if rank is None:
      raise ValueError(
          "value: all_gather across workers needs tensors of known rank, got one "
          "of unknown rank (from tf.py_function, say); tf.ensure_shape it.")
    order = [axis % rank] + [d for d in range(rank) if d != axis % rank]
    fronts.append(tf.transpose(value, order) if axis % rank else value)
    orders.append(order)
  return [tf.transpose(front, [order.index(d) for d in range(len(order))])
          if order[0] else front for front, order in zip(_gather_uneven(fronts, keys), orders)]


def _gather_uneven(fronts: List[tf.Tensor], keys) -> List[tf.Tensor]:
  """Every worker's `fronts` concatenated along axis 0; sizes there may differ.

  A part of a static shape is that shape on every worker (the program check
  compares static shapes): gathered at once. The other parts' shapes travel
  first. Gathered in the parts' order, so that the program check sees which is
  which. The result's size is static where the part's is on this worker: a
  run-time check makes every worker's part that size.
  """
  num_workers = keys.num_workers
  uneven = [not front.shape.is_fully_defined() for front in fronts]
  if not any(uneven):
    return [between_workers.gather_workers(front, keys) for front in fronts]
  # Per tensor: (static size or -1, then the run-time shape), in one vector.
  mine = tf.concat([
      tf.concat([tf.constant([-1 if front.shape[0] is None else front.shape[0]],
                             tf.int64),
                 tf.shape(front, out_type=tf.int64)], 0)
      for front, is_uneven in zip(fronts, uneven) if is_uneven], 0)
  every = tf.reshape(between_workers.gather_workers(mine, keys), [num_workers, -1])
  out, start = [], 0
  for index, front in enumerate(fronts):
    if not uneven[index]:
      out.append(between_workers.gather_workers(front, keys))
      continue
    width = 1 + front.shape.rank
    shapes = every[:, start + 1:start + width]
    declared = every[:, start]
    start += width
    sizes = shapes[:, 0]
    most = tf.reduce_max(sizes)
    # Checked the same way on every worker from the same figures, before the data
    # travels: an error everywhere rather than a gather that would abort.
    checks = [
        tf.debugging.Assert(
            tf.reduce_all(tf.equal(shapes[:, 1:], shapes[:1, 1:])),
            [f"all_gather across workers: tensor {index}'s parts differ in shape "
             "beyond the gathered axis (only that axis may differ between "
             "workers); each worker's shape, gathered axis first:", shapes],
            summarize=-1),
        tf.debugging.Assert(
            tf.logical_or(tf.reduce_all(declared < 0),
                          tf.equal(tf.reduce_min(sizes), most)),
            [f"all_gather across workers: tensor {index}'s gathered axis has a "
             "static size on some worker (a dataset batched with "
             "drop_remainder=True, say), but the workers' parts have different "
             "sizes at run time. Give it one static size on every worker, or none "
             "on any. Each worker's static size (-1: none) and size:",
             declared, sizes], summarize=-1)]
    with tf.control_dependencies(checks):
      padding = [[0, most - tf.shape(front, out_type=tf.int64)[0]]]
      padded = tf.pad(front, padding + [[0, 0]] * (front.shape.rank - 1))
    rows = between_workers.gather_workers(padded, keys)
    kept = tf.reshape(tf.sequence_mask(sizes, most), [-1])
    out.append(between_workers.leading_times(tf.boolean_mask(rows, kept), front,
                                             num_workers))
  return out
