"""`StrategyReplica`: the strategy engine's `Replica`, on `tf.distribute`'s collectives.

Sums and means are `ReplicaContext.all_reduce` (on a TPU, one cross-replica
sum); a gather is each replica's words at its place among zeros, summed;
maxima and minima reduce a gather; a broadcast is the sum of the source's
words and zeros. Dtypes that a TPU's sum does not take travel as
`collectives.wire` encodes them, on the stand-in too, so the suite runs what a
TPU traces. Their gradients are the in-graph engine's (written here where the
words carry none).
"""

from typing import Callable, List, Optional

import tensorflow as tf

from replicator.collectives import gathering
from replicator.collectives import reduce_options
from replicator.collectives import replica_context
from replicator.collectives import wire

ReduceOp = reduce_options.ReduceOp


class StrategyReplica(replica_context.Replica):
  """The replica whose step `tf.distribute` traces on this thread.

  The `method` and `what` of its collectives are not in its errors, which
  name the collective a TPU traces (`all_reduce`, `all_gather`).

  Args:
    num_replicas: replicas in the job.
    alone: the step is traced outside `strategy.run` (to make its variables,
      or to compile it with XLA on a stand-in): each collective gives a
      tensor of the shape and dtype it gives in the step, from this
      replica's values alone.
  """

  in_tf_distribute_context = True

  def __init__(self, num_replicas: int, alone: bool = False):
    self.num_replicas = num_replicas
    self.alone = alone
    self.function_copies = {}  # see `patches.nested_functions`

  def replica_id(self) -> tf.Tensor:
    if self.alone:
      return tf.constant(0, tf.int32, name="replica_id")
    replica_id = tf.distribute.get_replica_context().replica_id_in_sync_group
    return tf.cast(replica_id, tf.int32, name="replica_id")

  def static_replica_id(self) -> Optional[int]:
    # An int on the stand-in's threads and in a trace alone; None on a TPU.
    if self.alone:
      return 0
    replica_id = tf.distribute.get_replica_context().replica_id_in_sync_group
    value = tf.get_static_value(replica_id)
    return None if value is None else int(value)

  def static_local_index(self) -> Optional[int]:
    # A trace of one replica's is one host's, whose copies are in replica order.
    return self.static_replica_id()

  def with_summed_gradient(self, name: str, forward: Callable[..., List[tf.Tensor]],
                           inputs: List[tf.Tensor], grad_fn: Callable) -> List[tf.Tensor]:
    del name, grad_fn  # the collectives in `forward` differentiate themselves
    return list(forward(*inputs))

  def all_reduce(self, flat: List[tf.Tensor], op: ReduceOp,
                 options: reduce_options.AllReduceOptions, *,
                 method: str = "all_reduce", what: Optional[str] = None) -> List[tf.Tensor]:
    del method, what
    _check_tpu_values(flat, "all_reduce")
    if self.alone or self.num_replicas == 1:
      return [tf.identity(x) for x in flat]
    if op in (ReduceOp.MAX, ReduceOp.MIN):
      every = self._gather([tf.expand_dims(x, 0) for x in flat], 0)
      return [_REDUCE[op, e.dtype == tf.bool](e, axis=0) for e in every]
    travel = options.compression.value
    # Each this replica's own tensor: a value every replica shares (made outside
    # the step) would be taken by tf.distribute as already reduced.
    sent = [tf.identity(tf.cast(x, travel) if travel is not None and x.dtype.is_floating
                        and x.dtype.size > travel.size else x) for x in flat]
    tf_op = (tf.distribute.ReduceOp.MEAN if op is ReduceOp.MEAN
             else tf.distribute.ReduceOp.SUM)
    reduced = _without_complex(sent, lambda parts: _by_dtype(
        parts, lambda group: _sums(group, tf_op)))
    return [tf.cast(r, x.dtype) for r, x in zip(reduced, flat)]

  def all_gather(self, flat: List[tf.Tensor], axis: int, *, method: str = "all_gather",
                 what: Optional[str] = None) -> List[tf.Tensor]:
    del method, what
    _check_tpu_values(flat, "all_gather")
    parts = [gathering.gather_part(x, axis) for x in flat]
    if self.alone or self.num_replicas == 1:  # (a concat of one is its identity)
      return [tf.concat([part] * self.num_replicas, axis) for part in parts]
    return self._gather(parts, axis)

  def broadcast(self, flat: List[tf.Tensor], source_replica: int, *,
                method: str = "broadcast", what: Optional[str] = None) -> List[tf.Tensor]:
    del method, what
    _check_tpu_values(flat, "broadcast")
    if self.alone or self.num_replicas == 1:
      return [tf.identity(x) for x in flat]
    is_source = tf.equal(self.replica_id(), source_replica)
    results = wire.broadcast_words(flat, is_source, _sum_words)
    # The gradient of the source's value is the sum of every replica's
    # upstream gradient; the others' values get none.
    return [_with_gradient(x, result, lambda upstream, s=is_source: tf.where(
        s, _sum_words([upstream])[0], tf.zeros_like(upstream)))
            for x, result in zip(flat, results)]

  def _gather(self, flat, axis):
    """Each replica's rows at their place among zeros, summed as 32-bit
    words (`wire.gather_words`): exact for every dtype, where a TPU's own
    gather (a one-hot mask times the value) turns inf into NaN, and with no
    merge_call (the stand-in's gather is one)."""
    replica_id = self.replica_id()
    results = wire.gather_words(flat, replica_id, self.num_replicas, axis, _sum_words)

    def own_rows(upstream, x):  # this replica's rows of the upstream sum
      axis_ = axis % x.shape.rank
      begin = [0] * x.shape.rank
      begin[axis_] = replica_id * x.shape[axis_]
      return tf.slice(_sum_words([upstream])[0], tf.stack(begin), x.shape)
    return [_with_gradient(x, result, lambda upstream, x=x: own_rows(upstream, x))
            for x, result in zip(flat, results)]


def _with_gradient(x, result, gradient):
  """`result` (computed from `x`'s bits), whose gradient with respect to
  `x` is `gradient(upstream)`; not differentiable for other dtypes."""
  if not (x.dtype.is_floating or x.dtype.is_complex):
    return result

  @tf.custom_gradient
  def collective(value):
    del value
    return tf.identity(result), gradient
  return collective(x)


def _check_tpu_values(flat, method: str):
  """Raises for a value no TPU collective can carry: one that is not a
  number or a boolean, or whose shape is known only at run time."""
  for x in flat:
    if not (x.dtype.is_floating or x.dtype.is_integer or x.dtype.is_complex
            or x.dtype == tf.bool):
      raise TypeError(
          f"{method}: a TPU's collectives carry numbers and booleans, got a "
          f"{x.dtype.name} tensor. Collect numbers (token ids, codes) and turn "
          "them into text after run.")
    if not x.shape.is_fully_defined():
      raise ValueError(
          f"{method} on a TPU needs static shapes, got {x.shape}: a TPU step is "
          "one XLA computation of fixed shapes. Give the tensor a fixed shape "
          "(pad it to the largest size, or tf.ensure_shape it).")


# Maxima and minima of a gather; of booleans: any, every.
_REDUCE = {(ReduceOp.MAX, False): tf.reduce_max, (ReduceOp.MIN, False): tf.reduce_min,
           (ReduceOp.MAX, True): tf.reduce_any, (ReduceOp.MIN, True): tf.reduce_all}


def _sum_words(flat):
  """One sum of int32 tensors (words) over the replicas."""
  return _by_dtype(flat, lambda group: tf.distribute.get_replica_context().all_reduce(
      tf.distribute.ReduceOp.SUM, group))


def _sums(group, tf_op):
  """The sums (or means) over replicas of `group`, one dtype, each exact in
  a form `cross_replica_sum` takes (`wire.exact_sum`)."""
  context = tf.distribute.get_replica_context()
  if wire.carried(wire.TPU_SUM, group[0].dtype) or not group[0].dtype.is_integer:
    return context.all_reduce(tf_op, group)
  return [wire.exact_sum(x, wire.TPU_SUM,
                         lambda wide: context.all_reduce(tf.distribute.ReduceOp.SUM, wide))
          for x in group]


def _without_complex(flat, reduce):
  """`reduce(flat)`, complex tensors reduced as their real and imaginary parts
  (tf.distribute's collectives take real numbers)."""
  parts = []
  for x in flat:
    parts += [tf.math.real(x), tf.math.imag(x)] if x.dtype.is_complex else [x]
  reduced = iter(reduce(parts))
  return [tf.complex(next(reduced), next(reduced)) if x.dtype.is_complex else next(reduced)
          for x in flat]


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
