"""What a write to a replicated variable inside a step becomes: the merge rules.

Both engines' variables (`replicated.ReplicatedVariable`, the in-graph
engine's, and the strategy engine's replica-local ones) merge a write over
the replicas before writing their own copy, so that the copies never drift.
`Rule.of(aggregation, dtype, synchronization)` is one variable's rule (the
rules: docs/design.md, "The merge rules"). `Rule.dense` and `Rule.rows` make
the merged value with the collectives of the `Replica` they are given (the
in-graph engine's as `replicated._Collectives`, named for the write, without
gradients): one collective a write.
"""

import dataclasses
from typing import Callable, Optional, Tuple

import tensorflow as tf

from replicator.collectives import reduce_options
from replicator.collectives import replica_context

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


@dataclasses.dataclass(frozen=True)
class Rule:
  """The merge of one variable's writes inside a step.

  Attributes:
    reduce_op: SUM for SUM variables; else None for replica 0's value (integer,
      boolean and ONLY_FIRST_REPLICA variables, so counters advance once a
      step), MEAN for the others.
    sums_changes: `assign` sums the replicas' changes (a SUM, ON_READ variable).
  """
  reduce_op: Optional[ReduceOp]
  sums_changes: bool

  @classmethod
  def of(cls, aggregation, dtype, synchronization) -> "Rule":
    """The rule of a variable made with `aggregation`, `dtype` and `synchronization`."""
    reduce_op = ReduceOp.MEAN
    if aggregation == tf.VariableAggregation.SUM:
      reduce_op = ReduceOp.SUM
    elif (aggregation == tf.VariableAggregation.ONLY_FIRST_REPLICA
          or not tf.as_dtype(dtype).is_floating):
      reduce_op = None
    return cls(reduce_op, reduce_op is ReduceOp.SUM
               and synchronization == tf.VariableSynchronization.ON_READ)

  def dense(self, method: str, value: tf.Tensor, read_old: Callable[[], tf.Tensor],
            replicas: replica_context.Replica) -> tf.Tensor:
    """The value that `method` (one of `DENSE`) of `value` writes on every
    replica; `read_old()` reads this replica's copy (for the sum of changes)."""
    if self.reduce_op is None:
      return replicas.broadcast([value], 0)[0]
    if method == "assign" and self.sums_changes:
      old = read_old()
      return old + replicas.all_reduce([value - old], self.reduce_op, _OPTIONS)[0]
    return replicas.all_reduce([value], self.reduce_op, _OPTIONS)[0]

  def rows(self, method: str, indices, values, dtype,
           replicas: replica_context.Replica) -> Tuple[tf.Tensor, tf.Tensor]:
    """The `(indices, values)` that `method` (one of `SCATTERS`) applies on
    every replica: every replica's, concatenated in replica order."""
    flat = [tf.convert_to_tensor(indices), tf.convert_to_tensor(values, dtype)]
    if self.reduce_op is None:
      return tuple(replicas.broadcast(flat, 0))
    indices, values = replicas.all_gather(flat, 0)
    if self.reduce_op is ReduceOp.MEAN and method in ADDITIVE:
      values = values / tf.cast(replicas.num_replicas, values.dtype)
    return indices, values
