"""Every replica draws its own random numbers.

Stateful `tf.random` ops take their seed from TensorFlow's `get_seed`; inside a
step we fold the replica id into the op seed, so replicas tracing the same code
with the same seeds still draw different, reproducible streams. A
`tf.random.Generator` made in a replicator context hashes the replica id into
its key in a step, and `ReplicaGenerator` (`Replicator.random_generator`) gives
every replica a generator of its own, split from one seed. Keras' random ops
get the same treatment in `keras_compat`. `patches.registry` lists what these
replace, installed only while a step is traced.
"""

import logging
from typing import Sequence

import numpy as np
import tensorflow as tf

from replicator.collectives import replica_context
from replicator.engine import registry
from replicator.engine import variables

GOLDEN = 0x9E3779B1


def fold(replica_id: int) -> int:
  """The seed offset of replica `replica_id` (0 for replica 0)."""
  return (GOLDEN * replica_id) % (2**31 - 1)


def seed_per_replica(get_seed):
  """TensorFlow's `get_seed`, with the replica folded into a step's op seeds."""
  def get_seed_per_replica(op_seed):
    graph_seed, op_seed = get_seed(op_seed)
    replica_id = replica_context.static_replica_id()
    if replica_id and op_seed is not None:
      op_seed = (op_seed + fold(replica_id)) % (2**31 - 1)
    return graph_seed, op_seed
  return get_seed_per_replica


def key_per_replica(preprocess_key):
  """`tf.random.Generator._preprocess_key`, a key per replica in a step.

  A generator made in a replicator context has a replicated variable for its
  state, identical on every replica and advanced alike by each draw; as
  `tf.distribute` does for a generator made in a strategy's scope, each
  replica hashes its id into the key, so replicas draw different numbers
  (replica 0 those of a plain generator).
  """
  def preprocess_key_per_replica(generator, key):
    strategy = replica_context.strategy_replica()
    if (strategy is not None
        and getattr(generator, "_distribution_strategy", None) is not None):
      # tf.distribute hashes every replica's id into the key; as below, replica
      # 0 keeps it (and draws what one device would). On a TPU one trace serves
      # every replica: the choice is made when the step runs.
      replica_id = strategy.replica_id()
      counter = tf.cast(tf.stack([replica_id, 0]), tf.uint64)
      hashed = tf.raw_ops.StatelessRandomUniformFullIntV2(
          shape=[1], key=key, counter=counter, dtype=tf.uint64, alg=generator.algorithm)
      return tf.where(tf.equal(replica_id, 0), key, hashed)
    key = preprocess_key(generator, key)
    replica = replica_context.current()
    if (replica is None or not replica.replica_id or
        not isinstance(generator.state, variables.ReplicatedVariable)):
      return key
    counter = tf.constant([replica.replica_id, 0], tf.uint64)
    return tf.raw_ops.StatelessRandomUniformFullIntV2(
        shape=[1], key=key, counter=counter, dtype=tf.uint64, alg=generator.algorithm)
  return preprocess_key_per_replica


class ReplicaGenerator(tf.__internal__.tracking.Trackable):
  """A `tf.random.Generator` per replica, split from one seed.

  Built by `Replicator.random_generator(seed)`. Inside a step each replica
  draws from its own generator (`normal`, `uniform`, ... as on
  `tf.random.Generator`); outside a step, local replica 0's is used.

  It is trackable: kept on a module or passed to a `Checkpointer`, its streams
  are saved and a restored run continues them exactly. The chief saves its
  replicas' states; replicas of other workers resume from the same stream
  position (replicas draw in lockstep) with their own split keys. Restored on
  another number of replicas, the streams are split afresh from the saved
  state of replica 0, with a warning: reproducible, but not the saved streams.
  """

  def __init__(self, seed: int, replica_ids: Sequence[int], num_replicas: int,
               devices: Sequence[str]):
    if not isinstance(seed, int):
      raise TypeError(f"seed: expected an int, got {seed!r}.")
    self._replica_ids = tuple(replica_ids)
    self._num_replicas = num_replicas
    with registry.replica_local():
      root = tf.random.Generator.from_seed(seed)
      splits = root.split(num_replicas) if num_replicas > 1 else [root]
      self._initial_states = np.stack([s.state.numpy() for s in splits])
      self._generators = []
      for replica_id, device in zip(replica_ids, devices):
        with tf.device(device):
          self._generators.append(
              tf.random.Generator.from_state(splits[replica_id].state.numpy(),
                                             splits[replica_id].algorithm))

  def _current(self) -> tf.random.Generator:
    replica = replica_context.current()
    return self._generators[replica.index if replica else 0]

  def __getattr__(self, name):
    if name.startswith("_"):
      raise AttributeError(name)
    return getattr(self._current(), name)

  def _serialize_to_tensors(self):
    with tf.device("/device:CPU:0"):
      return {"states": tf.stack([tf.identity(g.state) for g in self._generators]),
              "num_replicas": tf.constant(self._num_replicas, tf.int64)}

  def _restore_from_tensors(self, restored_tensors):
    saved = restored_tensors["states"].numpy()
    saved_replicas = int(restored_tensors["num_replicas"])
    states = self._resumed_states(saved, saved_replicas)
    for generator, state in zip(self._generators, states):
      generator.reset(state)

  def _resumed_states(self, saved, saved_replicas):
    """This worker's replicas' states from the chief's `saved` ones."""
    initial = self._initial_states
    if saved_replicas == self._num_replicas:
      if all(r < len(saved) for r in self._replica_ids):
        return [saved[r] for r in self._replica_ids]
      if saved[0, -1] == initial[0, -1]:
        # Another worker's replicas: a split keeps the counter at 0 and draws
        # a key, and every replica draws the same shapes per step, so each is
        # at replica 0's counter with its own key.
        return [np.concatenate([saved[0, :-1], initial[r, -1:]])
                for r in self._replica_ids]
    logging.warning(
        "replicator: the random generator was saved on %d replica(s) and is "
        "restored on %d%s; each replica's stream is split afresh from the saved "
        "state of replica 0 (reproducible, but not the saved streams).",
        saved_replicas, self._num_replicas,
        " with another seed" if saved_replicas == self._num_replicas else "")
    with registry.replica_local():
      root = tf.random.Generator.from_state(saved[0], self._generators[0].algorithm)
      splits = root.split(self._num_replicas) if self._num_replicas > 1 else [root]
      return [splits[r].state.numpy() for r in self._replica_ids]
