"""Every replica draws its own random numbers.

Stateful `tf.random` ops take their seed from `random_seed.get_seed`; inside a
step we fold the replica id into the op seed, so replicas tracing the same code
with the same seeds still draw different, reproducible streams. Keras' random
ops get the same treatment in `keras_compat`.
"""

from typing import Sequence

import tensorflow as tf
from tensorflow.python.framework import random_seed

from replicator import context
from replicator import variables

_GOLDEN = 0x9E3779B1
_original_get_seed = random_seed.get_seed


def fold(replica_id: int) -> int:
  """The seed offset of replica `replica_id` (0 for replica 0)."""
  return (_GOLDEN * replica_id) % (2**31 - 1)


def _get_seed(op_seed):
  graph_seed, op_seed = _original_get_seed(op_seed)
  replica = context.current()
  if replica is not None and op_seed is not None and replica.replica_id:
    op_seed = (op_seed + fold(replica.replica_id)) % (2**31 - 1)
  return graph_seed, op_seed


def install():
  """Routes `tf.random` seeding through `_get_seed` (idempotent)."""
  random_seed.get_seed = _get_seed


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
