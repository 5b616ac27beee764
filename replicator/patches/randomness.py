"""Every replica draws its own random numbers.

Stateful `tf.random` ops get the replica id folded into their op seed
(`seed_per_replica`), a `tf.random.Generator` made in a replicator context and
Keras' seeds (`keras_compat`) get it in their key (`key_per_replica`,
`offset_seed`): replicas draw different, reproducible streams.
"""

import tensorflow as tf

from replicator.collectives import replica_context
from replicator.variables import replicated as variables

GOLDEN = 0x9E3779B1


def fold(replica_id: int) -> int:
  """The seed offset of replica `replica_id` (0 for replica 0)."""
  return (GOLDEN * replica_id) % (2**31 - 1)


def offset_seed(seed: tf.Tensor, replica) -> tf.Tensor:
  """A `[2]` seed (Keras') with `fold` of `replica`'s id added to its first
  element; where one trace serves every replica (a TPU's), the offset is
  computed when the step runs."""
  replica_id = replica.static_replica_id()
  if replica_id is not None:
    return seed + tf.constant([fold(replica_id), 0], seed.dtype) if replica_id else seed
  offset = (tf.cast(replica.replica_id(), tf.int64) * GOLDEN) % (2**31 - 1)
  return seed + tf.stack([tf.cast(offset, seed.dtype), tf.zeros([], seed.dtype)])


def seed_per_replica(get_seed):
  """TensorFlow's `get_seed`, with the replica folded into a step's op seeds."""
  def get_seed_per_replica(op_seed):
    graph_seed, op_seed = get_seed(op_seed)
    replica = replica_context.current()
    replica_id = None if replica is None else replica.static_replica_id()
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
  (replica 0 those of a plain generator). A generator made in a strategy's
  scope (the strategy engine's) is keyed so too, in place of tf.distribute's
  hash, which would change replica 0's key.
  """
  def preprocess_key_per_replica(generator, key):
    replica = replica_context.current()
    if replica is None:
      return preprocess_key(generator, key)
    if getattr(generator, "_distribution_strategy", None) is not None:
      return _key_of(replica, key, generator.algorithm)
    key = preprocess_key(generator, key)
    if isinstance(generator.state, variables.ReplicatedVariable):
      return _key_of(replica, key, generator.algorithm)
    return key
  return preprocess_key_per_replica


def _key_of(replica, key: tf.Tensor, algorithm) -> tf.Tensor:
  """`key` hashed with `replica`'s id, but replica 0's unchanged; where one
  trace serves every replica (a TPU's), chosen when the step runs."""
  replica_id = replica.static_replica_id()
  if replica_id is not None:
    return _hashed(key, tf.constant([replica_id, 0], tf.uint64), algorithm) if replica_id else key
  replica_id = replica.replica_id()
  hashed = _hashed(key, tf.cast(tf.stack([replica_id, 0]), tf.uint64), algorithm)
  return tf.where(tf.equal(replica_id, 0), key, hashed)


def _hashed(key: tf.Tensor, counter: tf.Tensor, algorithm) -> tf.Tensor:
  return tf.raw_ops.StatelessRandomUniformFullIntV2(
      shape=[1], key=key, counter=counter, dtype=tf.uint64, alg=algorithm)
