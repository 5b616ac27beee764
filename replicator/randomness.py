"""Every replica draws its own random numbers.

Stateful `tf.random` ops take their seed from `random_seed.get_seed`; inside a
step we fold the replica id into the op seed, so replicas tracing the same code
with the same seeds still draw different, reproducible streams. Keras 3 random
ops (`Dropout`, `keras.random.*`, random augmentation layers) are stateless ops
seeded by a `SeedGenerator` whose state is a replicated variable, identical on
every replica; the replica id is folded into each seed they draw the same way.
"""

import sys
from typing import Sequence

import tensorflow as tf
from tensorflow.python.framework import random_seed

from replicator import context
from replicator import variables

_GOLDEN = 0x9E3779B1
_original_get_seed = random_seed.get_seed


def _get_seed(op_seed):
  graph_seed, op_seed = _original_get_seed(op_seed)
  replica = context.current()
  if replica is not None and op_seed is not None and replica.replica_id:
    op_seed = (op_seed + _GOLDEN * replica.replica_id) % (2**31 - 1)
  return graph_seed, op_seed


def _fold_replica_into_keras_seed(draw_seed):
  def replica_draw_seed(seed):
    value = draw_seed(seed)
    replica = context.current()
    if replica is None or not replica.replica_id:
      return value
    fold = (_GOLDEN * replica.replica_id) % (2**31 - 1)
    return value + tf.constant([fold, 0], value.dtype)
  replica_draw_seed.replicator_original = draw_seed
  return replica_draw_seed


# Keras' TensorFlow backend modules that draw seeds for stateless random ops.
_KERAS_SEEDED_MODULES = ("keras.src.backend.tensorflow.random",
                         "keras.src.backend.tensorflow.image")


def install():
  """Routes `tf.random` and Keras seeding through the replica id (idempotent).

  Keras is patched only if it is already imported (the library never imports
  it); `Replicator.run` calls this again before it compiles a new step.
  """
  random_seed.get_seed = _get_seed
  for name in _KERAS_SEEDED_MODULES:
    module = sys.modules.get(name)
    draw_seed = getattr(module, "draw_seed", None)
    if draw_seed is not None and not hasattr(draw_seed, "replicator_original"):
      module.draw_seed = _fold_replica_into_keras_seed(draw_seed)


class ReplicaGenerator:
  """A `tf.random.Generator` per replica, split from one seed.

  Built by `Replicator.random_generator(seed)`. Inside a step each replica
  draws from its own generator (`normal`, `uniform`, ... as on
  `tf.random.Generator`); outside a step, local replica 0's is used.
  """

  def __init__(self, seed: int, replica_ids: Sequence[int], num_replicas: int,
               devices: Sequence[str]):
    if not isinstance(seed, int):
      raise TypeError(f"seed: expected an int, got {seed!r}.")
    with variables.replica_local():
      root = tf.random.Generator.from_seed(seed)
      splits = root.split(num_replicas) if num_replicas > 1 else [root]
      self._generators = []
      for replica_id, device in zip(replica_ids, devices):
        with tf.device(device):
          self._generators.append(
              tf.random.Generator.from_state(splits[replica_id].state.numpy(),
                                             splits[replica_id].algorithm))

  def _current(self) -> tf.random.Generator:
    replica = context.current()
    return self._generators[replica.index if replica else 0]

  def __getattr__(self, name):
    if name.startswith("_"):
      raise AttributeError(name)
    return getattr(self._current(), name)
