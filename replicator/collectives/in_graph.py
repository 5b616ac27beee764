"""The collectives of the in-graph engine's replica (`ReplicaContext`), and their gradients.

A collective meets the other local replicas at one rendezvous, where every
replica's flat values are merged at once (`reductions`, `gathering`); its
gradient is a collective too.
"""

import threading
from typing import Callable, List, Optional

import tensorflow as tf
from tensorflow.python.eager import record

from replicator.collectives import gathering
from replicator.collectives import reduce_options
from replicator.collectives import reductions

ReduceOp = reduce_options.ReduceOp

# Every collective's IdentityN (`_with_gradient`) is differentiated by one
# gradient registered once, which calls the function kept for that op in its
# graph's `_GRADIENTS` (one registered per collective would grow TensorFlow's
# registry with every trace and keep every traced graph alive).
_GRADIENT = "ReplicatorCollective"
_GRADIENTS = "_replicator_collective_gradients"  # op name -> its gradient
_gradients_lock = threading.Lock()


def _collective_gradient(op, *upstream):
  gradients = getattr(op.graph, _GRADIENTS, {})
  if op.name not in gradients:
    raise LookupError(
        f"The gradient of replicator's collective op {op.name!r} was asked of a "
        "graph that it was not traced in (a copy of the step's graph, which keeps "
        "no Python functions): differentiate the step's collectives inside "
        "step_fn (tf.GradientTape or tf.gradients).")
  return gradients[op.name](*upstream)


try:
  tf.RegisterGradient(_GRADIENT)(_collective_gradient)
except KeyError:  # already, by this module before a reload: it finds the same
  pass


class InGraphCollectives:
  """The `Replica` collectives of `ReplicaContext`: each meets the other local
  replicas at `self.collective(name, flat, merge)` and gets this replica's
  part of `merge(every replica's flat)`."""

  def all_reduce(self, flat: List[tf.Tensor], op: ReduceOp,
                 options: reduce_options.AllReduceOptions, *,
                 method: str = "all_reduce", what: Optional[str] = None) -> List[tf.Tensor]:
    group = self.group

    def merge(values):
      reduce_options.check_same_shapes(values, method, group.first_replica_id)
      return reductions.all_reduce(values, op, group.devices, options,
                                   num_replicas=group.num_replicas, keys=group.keys)

    def grad(xs, ys, summed_dys):
      if op is ReduceOp.SUM:
        return summed_dys
      if op is ReduceOp.MEAN:
        return [dy / tf.cast(group.num_replicas, dy.dtype) for dy in summed_dys]
      # As tf.reduce_max's gradient: the replicas that tie for the extreme
      # share it equally, element by element (else each got all of it).
      ties = [tf.cast(tf.equal(x, y), x.dtype) for x, y in zip(xs, ys)]
      counts = self.collective(f"the tie count of {method}", ties, self._summed)
      return [tie * dy / tf.maximum(count, 1) for tie, dy, count
              in zip(ties, summed_dys, counts)]

    return self._collective(f"{method}({op.name})", what, flat, merge, grad)

  def all_gather(self, flat: List[tf.Tensor], axis: int, *, method: str = "all_gather",
                 what: Optional[str] = None) -> List[tf.Tensor]:
    group = self.group
    merge = lambda values: gathering.all_gather(values, axis, group.devices, keys=group.keys)

    def grad(xs, ys, summed_dys):
      del ys
      # This replica's part starts after the earlier replicas' parts, whose
      # sizes may differ (allow_uneven_batches), statically too (rows picked by
      # replica_id): found over the local replicas at trace time where they can be.
      parts = [gathering.gather_part(x, axis) for x in xs]
      starts = self.collective(
          f"the static part sizes of {method}", parts,
          lambda values: _static_starts(values, axis, group.keys))
      if starts is not None:
        sizes = [part.shape[axis] for part in parts]
      else:
        sizes = [tf.shape(part)[axis] for part in parts]
        all_sizes = self.collective(
            f"the part sizes of {method}", sizes,
            lambda values: gathering.all_gather(values, 0, group.devices,
                                                keys=group.keys))
        starts = [tf.reduce_sum(every[:self.static_replica_id()]) for every in all_sizes]
      grads = []
      for x, summed_dy, size, start in zip(xs, summed_dys, sizes, starts):
        along = tf.equal(tf.range(summed_dy.shape.rank), axis % summed_dy.shape.rank)
        part = tf.slice(summed_dy, tf.where(along, start, 0), tf.where(along, size, -1))
        grads.append(tf.reshape(part, tf.shape(x)))  # scalars too
      return grads

    return self._collective(method, what, flat, merge, grad,
                            lambda: [gathering.gather_part(t, axis) for t in flat])

  def broadcast(self, flat: List[tf.Tensor], source_replica: int, *,
                method: str = "broadcast", what: Optional[str] = None) -> List[tf.Tensor]:
    group = self.group
    merge = lambda values: reductions.broadcast(values, source_replica, group.devices,
                                                group.first_replica_id, group.keys)

    def grad(xs, ys, summed_dys):
      del xs, ys
      if self.static_replica_id() == source_replica:
        return summed_dys
      return [tf.zeros_like(dy) for dy in summed_dys]

    return self._collective(method, what, flat, merge, grad)

  def with_summed_gradient(self, name: str, forward: Callable, inputs: List[tf.Tensor],
                           grad_fn: Callable) -> List[tf.Tensor]:
    """As `Replica.with_summed_gradient`: the upstream gradients are summed in
    one collective, and what `forward` computes is never differentiated
    (`grad_fn` may run collectives, every replica in the same order)."""
    xs = list(inputs)
    outputs = [tf.convert_to_tensor(y) for y in forward(*xs)]

    def backward(*upstream):
      upstream = [tf.zeros_like(y) if dy is None else tf.convert_to_tensor(dy)
                  for dy, y in zip(upstream, outputs)]
      floats = [i for i, x in enumerate(xs) if x.dtype.is_floating]
      float_outputs = [i for i, y in enumerate(outputs) if y.dtype.is_floating]
      summed = self.collective(f"the gradient of {name}",
                               [upstream[i] for i in float_outputs], self._summed)
      grads = [None] * len(xs)
      float_grads = grad_fn([xs[i] for i in floats],
                            [outputs[i] for i in float_outputs], summed)
      for i, grad in zip(floats, float_grads):
        grads[i] = grad
      return grads

    return _with_gradient(outputs, xs, backward)

  def _summed(self, values: List[List[tf.Tensor]]) -> List[List[tf.Tensor]]:
    """The merge of a sum over every replica (of gradients, of tie counts)."""
    group = self.group
    return reductions.all_reduce(values, ReduceOp.SUM, group.devices,
                                 num_replicas=group.num_replicas, keys=group.keys)

  def _collective(self, label: str, what: Optional[str], flat: List[tf.Tensor], merge,
                  grad_fn, single: Callable[[], List[tf.Tensor]] = None):
    """`merge` run over every replica's `flat`, differentiated by `grad_fn`
    (`with_summed_gradient`): as on one device with the whole batch, a
    replica's input receives the gradient of every replica's loss. On one
    replica the collective is `single()` (by default the identity).
    """
    if self.num_replicas == 1:
      return flat if single is None else single()
    name = f"{label} of {what or f'{len(flat)} tensor(s)'}"
    if not any(x.dtype.is_floating for x in flat):
      return self.collective(name, flat, merge)
    return self.with_summed_gradient(
        name, lambda *inputs: self.collective(name, list(inputs), merge), flat, grad_fn)


def _static_starts(values, axis: int, keys):
  """Per local replica, where each of its parts starts in the gathered tensor.

  `values[r]`: local replica r's parts. None for every replica unless every
  part's size along `axis` is static and, with several workers, each worker's
  concatenation of them is fully static too: `gathering` then gathered it at
  once, and the program check made its shape every worker's. The same answer
  on every worker, as the sizes collective it saves must be.
  """
  several = keys is not None and keys.num_workers > 1
  local_totals = []
  for index in range(len(values[0])):
    parts = [replica[index] for replica in values]
    sizes = [part.shape[axis] for part in parts]
    if any(size is None for size in sizes):
      return [None] * len(values)
    if several:
      rank = parts[0].shape.rank
      others = tf.TensorShape([None] * (rank - 1))
      for part in parts:
        dims = part.shape.as_list()
        others = others.merge_with(dims[:axis % rank] + dims[axis % rank + 1:])
      if not others.is_fully_defined():
        return [None] * len(values)
    local_totals.append(sum(sizes))
  worker = keys.worker_index if several else 0
  return [[worker * total + sum(replica[index].shape[axis] for replica in values[:r])
           for index, total in enumerate(local_totals)]
          for r in range(len(values))]


def _with_gradient(outputs: List[tf.Tensor], inputs: List[tf.Tensor],
                   backward) -> List[tf.Tensor]:
  """`outputs` of `inputs`, differentiated by `backward`, as `tf.custom_gradient`
  would give them in a graph, without its variable search.

  `tf.custom_gradient` walks the graph back from the outputs to the inputs to
  find the variables read in between: through every other replica's step, once
  per collective (a large part of tracing a deep model with cross-replica batch
  norm). A collective reads no variables: this is the rest of what it does (an
  IdentityN whose gradient is `backward`, recorded on the tape too).
  """
  def gradient(*upstream):  # IdentityN's gradients: outputs' (none), inputs'
    return [None] * len(outputs) + list(backward(*upstream[:len(outputs)]))

  graph = tf.compat.v1.get_default_graph()
  with graph.gradient_override_map({"IdentityN": _GRADIENT}):
    both = tf.identity_n(outputs + inputs)
  with _gradients_lock:  # (a graph has no __dict__ to setdefault in)
    if not hasattr(graph, _GRADIENTS):
      setattr(graph, _GRADIENTS, {})
  getattr(graph, _GRADIENTS)[both[0].op.name] = gradient
  record.record_operation("replicator_collective", both, outputs + inputs, gradient)
  return both[:len(outputs)]
