"""Where Keras 3 (TensorFlow backend) needs help to be replica-correct.

The fixes patch Keras' TensorFlow backend, only while a step is traced:
`patches.registry` lists them and says why each is needed (a Keras that lacks
one of the names gets a warning, and steps run without that fix). Each is
guarded by a test that fails if the replicas go wrong.

1. Seeds: inside a step, replica r's Keras seed is offset by a function of r,
   so replicas draw different numbers (replica 0 what one device would).
2. `assign_add` / `assign_sub` go to our variable's own, which sums the changes.
3. `BatchNormalization(synchronized=True)` sums its statistics over the
   replicas with our all-reduce: the statistics of the global batch.
4. Inside `tf.distribute`'s replica context (the strategy engine's steps), the
   wrapped optimizer's update, whose gradients it has averaged already, skips
   Keras' sum of them and its `merge_call`: each replica updates its own copy.
"""

import tensorflow as tf

from replicator.collectives import in_step
from replicator.collectives import reduce_options
from replicator.collectives import replica_context
from replicator.variables import replicated as variables
from replicator.patches import randomness


def fold_replica_into_seed(draw_seed):
  """Keras' `draw_seed`, offset by the replica inside a step (fix 1)."""
  def replica_draw_seed(seed):
    value = draw_seed(seed)
    replica = replica_context.current()
    return value if replica is None else randomness.offset_seed(value, replica)
  return replica_draw_seed


def delegate_to_replicated(method: str):
  """Makes Keras' `Variable.<method>` ours inside a step (fix 2)."""
  def make(original):
    def update(self, value):
      inner = getattr(self, "_value", None)
      if replica_context.current() is not None and (
          isinstance(inner, variables.ReplicatedVariable)  # the in-graph engine's
          or hasattr(inner, "_replicator_reduce_op")):  # the strategy engine's
        return getattr(inner, method)(tf.cast(value, inner.dtype))
      return original(self, value)
    update.__name__ = method
    return update
  return make


def sum_over_replicas(compute_moments_sync):
  """Keras' synchronized moments, summed over this step's replicas (fix 3)."""
  def moments_over_replicas(x, axes, keepdims):
    if replica_context.current() is None:
      return compute_moments_sync(x, axes, keepdims)
    # As Keras computes them, with our all-reduce for the replica context's.
    total, squares, count = in_step.all_reduce(
        [tf.reduce_sum(x, axis=axes, keepdims=True),
         tf.reduce_sum(tf.square(x), axis=axes, keepdims=True),
         tf.reduce_sum(tf.ones_like(x), axis=axes, keepdims=True)],
        reduce_options.ReduceOp.SUM)
    mean = tf.math.divide_no_nan(total, count)
    variance = tf.maximum(tf.math.divide_no_nan(squares, count) - tf.square(mean), 0.0)
    if not keepdims:
      mean, variance = tf.squeeze(mean, axes), tf.squeeze(variance, axes)
    return mean, variance
  return moments_over_replicas


def reduced_once(all_reduce_sum_gradients):
  """Keras' gradient sum, skipped for the wrapped optimizer's update (fix 4)."""
  def all_reduce_sum_gradients_unless_reduced(self, grads_and_vars):
    if _reduced_by_the_wrapper():
      return list(grads_and_vars)
    return all_reduce_sum_gradients(self, grads_and_vars)
  return all_reduce_sum_gradients_unless_reduced


def _reduced_by_the_wrapper() -> bool:
  """Whether the wrapped optimizer's update is being traced (its gradients
  already reduced over the replicas) where Keras would reduce them again:
  in a `tf.distribute` replica context of the step's replicas."""
  replica = replica_context.current()
  return (replica is not None and replica.in_tf_distribute_context
          and replica_context.local_writes())


class _OwnCopies:
  """As a `tf.distribute.Strategy` to Keras' update: each replica's own copy."""

  class extended:  # pylint: disable=invalid-name
    @staticmethod
    def update(var, fn, args=(), kwargs=None, group=True):
      del group
      return fn(var, *args, **(kwargs or {}))


def updates_own_copies(maybe_merge_call):
  """TensorFlow's `maybe_merge_call`, without the merge for the wrapped
  optimizer's update inside a strategy step (fix 4)."""
  def maybe_merge_call_unless_local(fn, strategy, *args, **kwargs):
    if _reduced_by_the_wrapper():
      return fn(_OwnCopies, *args, **kwargs)
    return maybe_merge_call(fn, strategy, *args, **kwargs)
  return maybe_merge_call_unless_local
