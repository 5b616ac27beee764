"""`ReplicaGenerator`: what `Replicator.random_generator` gives on the in-graph engine."""

import logging
from typing import Sequence

import numpy as np
import tensorflow as tf

from replicator.collectives import replica_context
from replicator.variables import registry


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
    self._replica_ids = tuple(replica_ids)
    self._num_replicas = num_replicas
    with registry.replica_local():
      root = tf.random.Generator.from_seed(seed)
      splits = root.split(num_replicas) if num_replicas > 1 else [root]
      self._initial_states = np.stack([s.state.numpy() for s in splits])
      self._generators = []
      for replica_id, device in zip(replica_ids, devices):
        with tf.device(device):
          self._generators.append(tf.random.Generator.from_state(
              self._initial_states[replica_id], root.algorithm))

  def __getattr__(self, name):
    if name.startswith("_"):
      raise AttributeError(name)
    replica = replica_context.current()
    return getattr(self._generators[replica.index if replica else 0], name)

  def _serialize_to_tensors(self):
    with tf.device("/device:CPU:0"):
      return {"states": tf.stack([tf.identity(g.state) for g in self._generators]),
              "num_replicas": tf.constant(self._num_replicas, tf.int64)}

  def _restore_from_tensors(self, restored_tensors):
    states = self._resumed_states(restored_tensors["states"].numpy(),
                                  int(restored_tensors["num_replicas"]))
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
