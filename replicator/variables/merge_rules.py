"""What a write to a replicated variable inside a step becomes: the merge rules.

Both engines' variables (`replicated.ReplicatedVariable`, the in-graph
engine's, and the strategy engine's replica-local ones) merge a write over
the replicas before writing their own copy, so that the copies never drift.
`Rule.of(aggregation, dtype, synchronization)` is the rule of one variable:

- float variables take the mean unless their aggregation says otherwise;
- integer and boolean variables, and ONLY_FIRST_REPLICA ones, take replica
  0's value, so counters advance once a step (`reduce_op_of` gives None);
- SUM variables sum: `assign_add` and `assign_sub` the deltas, `assign` the
  values, except on an ON_READ variable (a metric's accumulator, written as
  `assign(total + x)`), where `assign` sums the changes, `old + sum(v_r - old)`:
  summing the values would count the old total once per replica;
- a slice assignment (`var[i, 1:].assign(x)`) merges its value as `assign`
  does, without the sum of changes;
- a scatter (`scatter_*`, `scatter_nd_*`) takes the rows of every replica, in
  replica order, which every replica then applies (replica 0's rows alone where
  the rule is replica 0's value); the rows of an additive scatter (`ADDITIVE`)
  to a MEAN variable are divided by the replica count, as a dense `assign_add`
  is averaged.

`Rule.dense` and `Rule.rows` make the merged value with the `Replicas` they
are given, each engine's own collectives: one collective a write.
"""

import dataclasses
from typing import Callable, List, Optional, Protocol, Tuple

import tensorflow as tf

from replicator.collectives import reduce_options

ReduceOp = reduce_options.ReduceOp

# The scatters whose rows are deltas: summed where several replicas write a row.
ADDITIVE = frozenset({"scatter_add", "scatter_sub", "scatter_nd_add", "scatter_nd_sub"})
# Every scatter a replicated variable merges.
SCATTERS = ("scatter_add", "scatter_sub", "scatter_mul", "scatter_div", "scatter_min",
            "scatter_max", "scatter_update", "scatter_nd_update", "scatter_nd_add",
            "scatter_nd_sub")
# The dense writes `Rule.dense` merges (`slice`: a strided slice's assignment).
DENSE = ("assign", "assign_add", "assign_sub", "slice")

_OPTIONS = reduce_options.AllReduceOptions()


class Replicas(Protocol):
  """The collectives of a write, over every replica of the step: the part of
  `replica_context.Replica` a merge uses. The strategy engine passes its
  replica; the in-graph engine meets its replicas at one rendezvous named for
  the write (`replicated.ReplicatedVariable`), without the gradients of the
  public collectives, which a write never needs.
  """
  num_replicas: int

  def all_reduce(self, flat: List[tf.Tensor], op: ReduceOp,
                 options: reduce_options.AllReduceOptions) -> List[tf.Tensor]:
    ...

  def all_gather(self, flat: List[tf.Tensor], axis: int) -> List[tf.Tensor]:
    ...

  def broadcast(self, flat: List[tf.Tensor], source: int) -> List[tf.Tensor]:
    ...


def reduce_op_of(aggregation, dtype) -> Optional[ReduceOp]:
  """How a variable's writes merge: SUM, MEAN, or None (replica 0's value)."""
  if aggregation == tf.VariableAggregation.SUM:
    return ReduceOp.SUM
  if aggregation == tf.VariableAggregation.ONLY_FIRST_REPLICA or not dtype.is_floating:
    return None
  return ReduceOp.MEAN


@dataclasses.dataclass(frozen=True)
class Rule:
  """The merge of one variable's writes inside a step.

  Attributes:
    reduce_op: SUM, MEAN, or None for replica 0's value (`reduce_op_of`).
    sums_changes: `assign` sums the replicas' changes (a SUM, ON_READ variable).
  """
  reduce_op: Optional[ReduceOp]
  sums_changes: bool

  @classmethod
  def of(cls, aggregation, dtype, synchronization) -> "Rule":
    """The rule of a variable made with `aggregation`, `dtype` and `synchronization`."""
    reduce_op = reduce_op_of(aggregation or tf.VariableAggregation.NONE, tf.as_dtype(dtype))
    return cls(reduce_op, reduce_op is ReduceOp.SUM
               and synchronization == tf.VariableSynchronization.ON_READ)

  def dense(self, method: str, value: tf.Tensor, read_old: Callable[[], tf.Tensor],
            replicas: Replicas) -> tf.Tensor:
    """The value that `method` (one of `DENSE`) of `value` writes on every
    replica; `read_old()` reads this replica's copy (for the sum of changes)."""
    if self.reduce_op is None:
      return replicas.broadcast([value], 0)[0]
    if method == "assign" and self.sums_changes:
      old = read_old()
      return old + replicas.all_reduce([value - old], self.reduce_op, _OPTIONS)[0]
    return replicas.all_reduce([value], self.reduce_op, _OPTIONS)[0]

  def rows(self, method: str, indices, values, dtype,
           replicas: Replicas) -> Tuple[tf.Tensor, tf.Tensor]:
    """The `(indices, values)` that `method` (one of `SCATTERS`) applies on
    every replica: every replica's, concatenated in replica order."""
    flat = [tf.convert_to_tensor(indices), tf.convert_to_tensor(values, dtype)]
    if self.reduce_op is None:
      return tuple(replicas.broadcast(flat, 0))
    indices, values = replicas.all_gather(flat, 0)
    if self.reduce_op is ReduceOp.MEAN and method in ADDITIVE:
      values = values / tf.cast(replicas.num_replicas, values.dtype)
    return indices, values
