"""Where Keras 3 (TensorFlow backend) needs help to be replica-correct.

The fixes patch Keras' TensorFlow backend, and only if Keras is already
imported (the library never imports it for you); `install` is idempotent and
runs when a replicator is built and before a new step compiles. Each is guarded
by a test that fails if the replicas go wrong again.

1. Seeds. Keras random ops (`Dropout`, `keras.random.*`, augmentation layers)
   are stateless ops seeded by a `SeedGenerator` (a replicated variable, the
   same on every replica) or an int, so every replica would drop the same units
   and draw the same noise. Inside a step, replica r's seed is offset by a
   function of r: replica 0 draws what one device would, the others differ.
2. `assign_add` / `assign_sub`. Keras implements them as `assign(self + x)`, so
   a variable aggregated by SUM (a layer's counter) would get N times its old
   value plus the changes. They go to our variable's own `assign_add`, which
   sums the changes.
3. `BatchNormalization(synchronized=True)`. Keras sums its statistics over the
   replicas of the `tf.distribute` replica context, which inside a step is
   the default one (a single replica): the flag did nothing. Inside a step the
   sums go through our all-reduce instead, so the statistics are those of the
   global batch, as under `MirroredStrategy`.
"""

import sys

import tensorflow as tf

from replicator.collectives import replica_context
from replicator.patches import randomness
from replicator.collectives import reduce_options
from replicator.collectives import in_step
from replicator.engine import variables

_SEEDED_MODULES = ("keras.src.backend.tensorflow.random",
                   "keras.src.backend.tensorflow.image")
_VARIABLE_MODULE = "keras.src.backend.tensorflow.core"
_NN_MODULE = "keras.src.backend.tensorflow.nn"


def _fold_replica_into_seed(draw_seed):
  def replica_draw_seed(seed):
    value = draw_seed(seed)
    replica = replica_context.current()
    if replica is None or not replica.replica_id:
      return value
    return value + tf.constant([randomness.fold(replica.replica_id), 0], value.dtype)
  replica_draw_seed.replicator_original = draw_seed
  return replica_draw_seed


def _delegate_to_replicated(method):
  original = getattr(_variable_class(), method)

  def update(self, value):
    inner = getattr(self, "_value", None)
    if isinstance(inner, variables.ReplicatedVariable) and replica_context.current():
      return getattr(inner, method)(tf.cast(value, inner.dtype))
    return original(self, value)
  update.replicator_original = original
  update.__name__ = method
  return update


def _sum_over_replicas(compute_moments_sync):
  """Keras' synchronized moments, summed over this step's replicas."""
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
  moments_over_replicas.replicator_original = compute_moments_sync
  return moments_over_replicas


def _variable_class():
  return getattr(sys.modules.get(_VARIABLE_MODULE), "Variable", None)


def install():
  """Applies the fixes if Keras is imported (idempotent)."""
  for name in _SEEDED_MODULES:
    module = sys.modules.get(name)
    draw_seed = getattr(module, "draw_seed", None)
    if draw_seed is not None and not hasattr(draw_seed, "replicator_original"):
      module.draw_seed = _fold_replica_into_seed(draw_seed)
  variable_class = _variable_class()
  if variable_class is not None:
    for method in ("assign_add", "assign_sub"):
      if not hasattr(getattr(variable_class, method), "replicator_original"):
        setattr(variable_class, method, _delegate_to_replicated(method))
  nn = sys.modules.get(_NN_MODULE)
  compute_moments_sync = getattr(nn, "_compute_moments_sync", None)
  if (compute_moments_sync is not None and
      not hasattr(compute_moments_sync, "replicator_original")):
    nn._compute_moments_sync = _sum_over_replicas(compute_moments_sync)  # pylint: disable=protected-access
