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
  """

  def __init__(self, num_replicas: int, alone: bool = False):
    self.num_replicas = num_replicas
    self.alone = alone

  def replica_id(self) -> tf.Tensor:
    if self.alone:
      return tf.constant(0, tf.int32, name="replica_id")
    replica_id = tf.distribute.get_replica_context().replica_id_in_sync_group
    return tf.cast(replica_id, tf.int32, name="replica_id")

  def all_reduce(self, flat: List[tf.Tensor], op: ReduceOp,
                 options: reduce_options.AllReduceOptions) -> List[tf.Tensor]:
    if self.alone or self.num_replicas == 1:
      return [tf.identity(x) for x in flat]
    if op in (ReduceOp.MAX, ReduceOp.MIN):
      reduce = tf.reduce_max if op is ReduceOp.MAX else tf.reduce_min
      every = self._gather([tf.expand_dims(_numeric(x), 0) for x in flat], 0)
      return [_restore(reduce(e, axis=0), x) for e, x in zip(every, flat)]
    travel = options.compression.value
    sent = [tf.cast(x, travel) if travel is not None and x.dtype.is_floating
            and x.dtype.size > travel.size else x for x in flat]
    tf_op = (tf.distribute.ReduceOp.MEAN if op is ReduceOp.MEAN
             else tf.distribute.ReduceOp.SUM)
    reduced = tf.distribute.get_replica_context().all_reduce(tf_op, sent)
    return [tf.cast(r, x.dtype) for r, x in zip(reduced, flat)]

  def all_gather(self, flat: List[tf.Tensor], axis: int) -> List[tf.Tensor]:
    parts = [gathering.gather_part(x, axis) for x in flat]
    if self.alone:
      return [tf.concat([part] * self.num_replicas, axis) for part in parts]
    if self.num_replicas == 1:
      return [tf.identity(part) for part in parts]
    gathered = self._gather([_numeric(p) for p in parts], axis)
    return [_restore(g, p) for g, p in zip(gathered, parts)]

  def broadcast(self, flat: List[tf.Tensor], source_replica: int) -> List[tf.Tensor]:
    if self.alone or self.num_replicas == 1:
      return [tf.identity(x) for x in flat]
    is_source = tf.equal(self.replica_id(), source_replica)
    sent = [_numeric(x) for x in flat]
    sent = [tf.where(is_source, x, tf.zeros_like(x)) for x in sent]
    summed = tf.distribute.get_replica_context().all_reduce(
        tf.distribute.ReduceOp.SUM, sent)
    return [_restore(s, x) for s, x in zip(summed, flat)]

  def _gather(self, flat, axis):
    return tf.distribute.get_replica_context().all_gather(flat, axis)


def _numeric(x: tf.Tensor) -> tf.Tensor:
  """Booleans travel as int32 (no all-reduce takes them)."""
  return tf.cast(x, tf.int32) if x.dtype == tf.bool else x


def _restore(value: tf.Tensor, like: tf.Tensor) -> tf.Tensor:
  return tf.cast(value, tf.bool) if like.dtype == tf.bool else value
