"""Collectives as seen from inside a step: nests in, nests out, for this replica.

Each wrapper checks its arguments, meets the other replicas at one collective
(`replica_context`), and is differentiable: its gradient is a collective too.
"""

import numbers
import threading
from typing import List

import tensorflow as tf
from tensorflow.python.eager import record

from replicator.collectives import reductions
from replicator.collectives import replica_context
from replicator.collectives import gathering
from replicator.collectives import reduce_options

# Every collective's IdentityN (`_with_gradient`) is differentiated by one
# gradient, registered once for the process: it calls the function kept for
# that op in its graph's `_GRADIENTS` attribute. (A name registered per
# collective would grow TensorFlow's gradient registry with every trace, and
# keep every traced graph alive through the functions' closures; kept on the
# graph, they go with it.)
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


def current_replica(method: str) -> replica_context.ReplicaContext:
  replica = replica_context.current()
  if replica is None:
    raise RuntimeError(
        f"{method} is only valid while a step runs: call it inside the step_fn "
        "given to repl.run(step_fn, ...).")
  return replica


def _flatten(value, method):
  flat = tf.nest.flatten(value, expand_composites=False)
  try:
    flat = [tf.convert_to_tensor(v) for v in flat]  # IndexedSlices too
  except (TypeError, ValueError) as error:
    raise TypeError(
        f"{method}: value must be a tensor or a nest of tensors, got "
        f"{value!r}.") from error
  return flat


def _collective(method, value, merge_fn, grad_fn, single_fn=lambda flat: flat):
  """Runs `merge_fn` over every replica's flat values; differentiable.

  The gradient of a collective is a collective of the upstream gradients:
  `grad_fn(xs, ys, summed_dys, replica)` gets this replica's float inputs,
  their outputs and the sums over replicas of their upstream gradients, and
  returns the inputs' gradients (it may run collectives of its own, every
  replica in the same order). So, as on one device with the whole batch, a
  replica's input receives the gradient of every replica's loss
  (cross-replica batch norm, losses over gathered values).
  """
  replica = current_replica(method.split("(")[0])
  flat = _flatten(value, method)
  if not flat:
    return value
  if replica.group.num_replicas == 1:  # the identity, checked and shaped as on N
    return tf.nest.pack_sequence_as(value, single_fn(flat))
  name = f"{method} of {len(flat)} tensor(s)"
  merge = lambda values: merge_fn(values, replica.group)
  if not any(x.dtype.is_floating for x in flat):
    return tf.nest.pack_sequence_as(value, replica.collective(name, flat, merge))

  def forward(*inputs):
    return replica.collective(name, list(inputs), merge)

  return tf.nest.pack_sequence_as(
      value, with_summed_gradient(name, forward, flat, grad_fn))


def with_summed_gradient(name: str, forward, inputs: List[tf.Tensor], grad_fn):
  """`forward(*inputs)`'s outputs, differentiated by `grad_fn` alone.

  For a computation across replicas (one that holds collectives): its
  outputs' upstream gradients are summed over every replica first, in one
  collective, and `grad_fn(xs, ys, summed_dys, replica)` gets this replica's
  float inputs, its float outputs and their sums, and returns the float
  inputs' gradients (it may run collectives of its own, every
  replica in the same order). What `forward` computes in between is never
  differentiated.
  """
  replica = current_replica(name)

  def forward_and_backward(*xs):
    outputs = forward(*xs)

    def backward(*upstream):
      upstream = [tf.zeros_like(y) if dy is None else tf.convert_to_tensor(dy)
                  for dy, y in zip(upstream, outputs)]
      floats = [i for i, x in enumerate(xs) if x.dtype.is_floating]
      float_outputs = [i for i, y in enumerate(outputs) if y.dtype.is_floating]
      summed = replica.collective(
          f"the gradient of {name}", [upstream[i] for i in float_outputs],
          lambda values: reductions.all_reduce(
              values, reduce_options.ReduceOp.SUM, replica.group.devices,
              num_replicas=replica.group.num_replicas, workers=replica.group.workers))
      grads = [None] * len(xs)
      float_grads = grad_fn([xs[i] for i in floats],
                            [outputs[i] for i in float_outputs], summed, replica)
      for i, grad in zip(floats, float_grads):
        grads[i] = grad
      return grads

    return outputs, backward

  return _with_gradient(forward_and_backward, list(inputs))


def _with_gradient(forward, inputs: List[tf.Tensor]) -> List[tf.Tensor]:
  """`tf.custom_gradient(forward)(*inputs)` in a graph, without its variable search.

  `tf.custom_gradient` walks the graph back from the outputs to the inputs to
  find the variables read in between. A collective's outputs depend on every
  replica's inputs, so that walk would go through every other replica's step
  up to this point, once per collective: a large part of tracing a deep model
  with cross-replica batch norm. A collective reads no variables: this does
  what `tf.custom_gradient` does otherwise (an IdentityN whose gradient is
  `backward`, for `tf.gradients`, and recorded so, for `tf.GradientTape`).
  """
  outputs, backward = forward(*inputs)
  outputs = [tf.convert_to_tensor(y) for y in outputs]

  def gradient(*upstream):  # IdentityN's gradients: outputs' (none), inputs'
    return [None] * len(outputs) + list(backward(*upstream[:len(outputs)]))

  graph = tf.compat.v1.get_default_graph()
  with graph.gradient_override_map({"IdentityN": _GRADIENT}):
    both = tf.identity_n(outputs + list(inputs))
  with _gradients_lock:  # (a graph has no __dict__ to setdefault in)
    gradients = getattr(graph, _GRADIENTS, None)
    if gradients is None:
      gradients = {}
      setattr(graph, _GRADIENTS, gradients)
  gradients[both[0].op.name] = gradient
  record.record_operation("replicator_collective", both, outputs + list(inputs),
                          gradient)
  return both[:len(outputs)]


def replica_id() -> tf.Tensor:
  strategy = replica_context.strategy_replica()
  if strategy is not None:
    return strategy.replica_id()
  replica = current_replica("replica_id")
  return tf.constant(replica.replica_id, tf.int32, name="replica_id")


def all_reduce(value, op=reduce_options.ReduceOp.SUM,
               options: reduce_options.AllReduceOptions = reduce_options.AllReduceOptions(),
               method: str = "all_reduce"):
  op = reduce_options.check_reduce_op(op)
  strategy = replica_context.strategy_replica()
  if strategy is not None:
    flat = _flatten(value, f"{method}({op.name})")
    reduce_options.check_reducible(flat, op, method)
    return tf.nest.pack_sequence_as(value, strategy.all_reduce(flat, op, options))

  def single(flat):  # one replica: the identity, after N replicas' checks
    reduce_options.check_reducible(flat, op, method)
    return flat

  def merge(values, group):
    reduce_options.check_reducible(values[0], op, method)
    reduce_options.check_same_shapes(values, method, group.first_replica_id)
    return reductions.all_reduce(values, op, group.devices, options,
                                  num_replicas=group.num_replicas,
                                  workers=group.workers)

  def grad(xs, ys, summed_dys, replica):
    if op is reduce_options.ReduceOp.SUM:
      return summed_dys
    if op is reduce_options.ReduceOp.MEAN:
      n = replica.group.num_replicas
      return [dy / tf.cast(n, dy.dtype) for dy in summed_dys]
    # As tf.reduce_max's gradient: the replicas that tie for the extreme
    # share it equally, element by element (else each got all of it).
    ties = [tf.cast(tf.equal(x, y), x.dtype) for x, y in zip(xs, ys)]
    counts = replica.collective(
        f"the tie count of {method}", ties,
        lambda values: reductions.all_reduce(
            values, reduce_options.ReduceOp.SUM, replica.group.devices,
            num_replicas=replica.group.num_replicas, workers=replica.group.workers))
    return [tie * dy / tf.maximum(count, 1) for tie, dy, count
            in zip(ties, summed_dys, counts)]

  return _collective(f"{method}({op.name})", value, merge, grad, single)


def all_gather(value, axis: int = 0):
  strategy = replica_context.strategy_replica()
  if strategy is not None:
    return tf.nest.pack_sequence_as(
        value, strategy.all_gather(_flatten(value, "all_gather"), axis))

  def grad(xs, ys, summed_dys, replica):
    del ys
    # Each replica's part of the gathered gradient starts after the earlier
    # replicas' parts, whose sizes may differ (allow_uneven_batches).
    parts = [gathering.gather_part(x, axis) for x in xs]
    workers = replica.group.workers
    # Replicas trace apart, so a static size may differ between them (rows
    # picked by replica_id): the starts are found over the local replicas,
    # at trace time, where they can be.
    starts = replica.collective(
        "the static part sizes of all_gather", parts,
        lambda values: _static_starts(values, axis, workers))
    if starts is not None:
      sizes = [part.shape[axis] for part in parts]
    else:
      sizes = [tf.shape(part)[axis] for part in parts]
      all_sizes = replica.collective(
          "the part sizes of all_gather", sizes,
          lambda values: gathering.all_gather(
              values, 0, replica.group.devices, workers=workers))
      starts = [tf.reduce_sum(every[:replica.replica_id]) for every in all_sizes]
    grads = []
    for x, summed_dy, size, start in zip(xs, summed_dys, sizes, starts):
      along = tf.equal(tf.range(summed_dy.shape.rank), axis % summed_dy.shape.rank)
      part = tf.slice(summed_dy, tf.where(along, start, 0), tf.where(along, size, -1))
      grads.append(tf.reshape(part, tf.shape(x)))  # scalars too
    return grads

  return _collective(
      "all_gather", value,
      lambda values, group: gathering.all_gather(
          values, axis, group.devices, workers=group.workers), grad,
      lambda flat: [gathering.gather_part(t, axis) for t in flat])


def _static_starts(values, axis: int, workers):
  """Per local replica, where each of its parts starts in the gathered tensor.

  `values[r]`: local replica r's parts. None for every replica unless every
  part's size along `axis` is static. With several workers, each worker's
  concatenation of its replicas' parts must be fully static too: then
  `gathering` gathered it at once, and the program check made its shape
  every worker's, so the workers before this one hold that many rows each.
  The same answer on every worker, as the sizes collective it saves must be.
  """
  several = workers is not None and workers.num_workers > 1
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
  worker = workers.worker_index if several else 0
  return [[worker * total + sum(replica[index].shape[axis] for replica in values[:r])
           for index, total in enumerate(local_totals)]
          for r in range(len(values))]


def broadcast(value, source_replica: int = 0):
  strategy = replica_context.strategy_replica()
  replica = strategy or current_replica("broadcast")
  if (not isinstance(source_replica, numbers.Integral)
      or isinstance(source_replica, bool)):
    raise TypeError(
        f"broadcast: source_replica must be a Python int (a replica id known "
        f"when the step is traced), got {source_replica!r}. To choose the "
        "source at run time, all_sum(tf.where(repl.replica_id == source, "
        "value, tf.zeros_like(value))).")
  source_replica = int(source_replica)
  num_replicas = strategy.num_replicas if strategy else replica.group.num_replicas
  if not 0 <= source_replica < num_replicas:
    raise ValueError(
        f"broadcast: source_replica must be in [0, {num_replicas}), "
        f"got {source_replica}.")
  if strategy is not None:
    return tf.nest.pack_sequence_as(
        value, strategy.broadcast(_flatten(value, "broadcast"), source_replica))

  def grad(xs, ys, summed_dys, replica):
    del xs, ys
    if replica.replica_id == source_replica:
      return summed_dys
    return [tf.zeros_like(dy) for dy in summed_dys]

  return _collective(
      "broadcast", value,
      lambda values, group: reductions.broadcast(
          values, source_replica, group.devices, group.num_replicas,
          group.first_replica_id, group.workers), grad)
