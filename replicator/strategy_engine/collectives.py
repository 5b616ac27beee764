"""The collectives of a strategy step, on `tf.distribute`'s replica context.

`collectives.in_step` checks the arguments and flattens the nests, as for the
in-graph engine, and hands the flat tensors to the `StrategyReplica` entered on
the tracing thread. Sums and means are `ReplicaContext.all_reduce` (on a TPU,
one cross-replica sum); maxima and minima reduce an `all_gather`; a broadcast
is the sum of the source's value and zeros. Their gradients are TensorFlow's
(the gradient of a sum over replicas is the sum of the upstream gradients;
of a gather, this replica's rows of their sum), as the in-graph engine's.
"""

from typing import List

import tensorflow as tf

from replicator.collectives import gathering
from replicator.collectives import reduce_options

ReduceOp = reduce_options.ReduceOp


class StrategyReplica:
  """The replica whose step `tf.distribute` traces on this thread.

  Args:
    num_replicas: replicas in the job.
    alone: the step is traced outside `strategy.run` (to make its variables,
      or to compile it with XLA on a stand-in): each collective gives a
      tensor of the shape and dtype it gives in the step, from this
      replica's values alone.
    inline_functions: each replica is traced apart (a stand-in's threads, or
      alone), so a tf.function that step_fn calls is traced inline in each
      (`patches.nested_functions`) rather than keep the first one's trace.
  """

  def __init__(self, num_replicas: int, alone: bool = False,
               inline_functions: bool = False):
    self.num_replicas = num_replicas
    self.alone = alone
    self.inline_functions = inline_functions or alone
    self.function_copies = {}  # see `patches.nested_functions`

  def replica_id(self) -> tf.Tensor:
    if self.alone:
      return tf.constant(0, tf.int32, name="replica_id")
    replica_id = tf.distribute.get_replica_context().replica_id_in_sync_group
    return tf.cast(replica_id, tf.int32, name="replica_id")

  def static_replica_id(self):
    """This replica's id as a Python int where the trace is one replica's (the
    stand-in's threads, a trace alone); None on a TPU, which traces every
    replica at once."""
    if self.alone:
      return 0
    replica_id = tf.distribute.get_replica_context().replica_id_in_sync_group
    value = tf.get_static_value(replica_id)
    return None if value is None else int(value)

  def all_reduce(self, flat: List[tf.Tensor], op: ReduceOp,
                 options: reduce_options.AllReduceOptions) -> List[tf.Tensor]:
    if self.alone or self.num_replicas == 1:
      return [tf.identity(x) for x in flat]
    if op in (ReduceOp.MAX, ReduceOp.MIN):
      reduce = tf.reduce_max if op is ReduceOp.MAX else tf.reduce_min
      every = self._gather(_own([tf.expand_dims(_numeric(x), 0) for x in flat]), 0)
      return [_restore(reduce(e, axis=0), x) for e, x in zip(every, flat)]
    travel = options.compression.value
    sent = [tf.cast(x, travel) if travel is not None and x.dtype.is_floating
            and x.dtype.size > travel.size else x for x in flat]
    tf_op = (tf.distribute.ReduceOp.MEAN if op is ReduceOp.MEAN
             else tf.distribute.ReduceOp.SUM)
    reduced = _without_complex(_own(sent), lambda parts: _by_dtype(
        parts, lambda group: tf.distribute.get_replica_context().all_reduce(
            tf_op, group)))
    return [tf.cast(r, x.dtype) for r, x in zip(reduced, flat)]

  def all_gather(self, flat: List[tf.Tensor], axis: int) -> List[tf.Tensor]:
    parts = [gathering.gather_part(x, axis) for x in flat]
    if self.alone:
      return [tf.concat([part] * self.num_replicas, axis) for part in parts]
    if self.num_replicas == 1:
      return [tf.identity(part) for part in parts]
    gathered = _without_complex([_numeric(p) for p in parts],
                                lambda real: self._gather(_own(real), axis))
    return [_restore(g, p) for g, p in zip(gathered, parts)]

  def broadcast(self, flat: List[tf.Tensor], source_replica: int) -> List[tf.Tensor]:
    if self.alone or self.num_replicas == 1:
      return [tf.identity(x) for x in flat]
    is_source = tf.equal(self.replica_id(), source_replica)
    sent = [_numeric(x) for x in flat]
    sent = [tf.where(is_source, x, tf.zeros_like(x)) for x in sent]
    summed = _without_complex(sent, lambda parts: _by_dtype(
        parts, lambda group: tf.distribute.get_replica_context().all_reduce(
            tf.distribute.ReduceOp.SUM, group)))
    return [_restore(s, x) for s, x in zip(summed, flat)]

  def _gather(self, flat, axis):
    context = tf.distribute.get_replica_context()
    try:
      return _by_dtype(flat, lambda group: context.all_gather(group, axis))
    except RuntimeError as error:
      if "merge_call" not in str(error):
        raise
    # A strategy whose gather is a merge_call (MirroredStrategy, the stand-in),
    # inside a tf.function of step_fn: each replica's rows at their place among
    # zeros, summed (static shapes, as on a TPU).
    replica_id = self.replica_id()
    gathered = []
    for x in flat:
      rank = x.shape.rank
      axis_ = axis % rank
      size = x.shape[axis_]
      before = replica_id * size
      paddings = [[0, 0]] * rank
      paddings[axis_] = [before, (self.num_replicas - 1) * size - before]
      gathered.append(tf.pad(x, paddings))
    return _by_dtype(gathered, lambda group: context.all_reduce(
        tf.distribute.ReduceOp.SUM, group))


def _numeric(x: tf.Tensor) -> tf.Tensor:
  """Booleans travel as int32 (no all-reduce takes them)."""
  return tf.cast(x, tf.int32) if x.dtype == tf.bool else x


def _restore(value: tf.Tensor, like: tf.Tensor) -> tf.Tensor:
  return tf.cast(value, tf.bool) if like.dtype == tf.bool else value


def _own(flat):
  """This replica's tensors: a value every replica shares (a tensor made
  outside the step) would be taken by tf.distribute as already reduced."""
  return [tf.identity(x) for x in flat]


def _without_complex(flat, reduce):
  """`reduce(flat)`, complex tensors reduced as their real and imaginary parts
  (tf.distribute's collectives take real numbers)."""
  parts, kinds = [], []
  for x in flat:
    if x.dtype.is_complex:
      parts += [tf.math.real(x), tf.math.imag(x)]
      kinds.append(True)
    else:
      parts.append(x)
      kinds.append(False)
  reduced = iter(reduce(parts))
  return [tf.complex(next(reduced), next(reduced)) if complex_ else next(reduced)
          for complex_ in kinds]


def _by_dtype(flat, reduce):
  """`reduce` of each dtype's tensors, in `flat`'s order: tf.distribute packs
  the tensors of one call together, which takes a single dtype."""
  groups = {}
  for index, x in enumerate(flat):
    groups.setdefault(x.dtype, []).append(index)
  results = [None] * len(flat)
  for indices in groups.values():
    for index, value in zip(indices, reduce([flat[i] for i in indices])):
      results[index] = value
  return results
