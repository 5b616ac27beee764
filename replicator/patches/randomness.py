"""Every replica draws its own random numbers.

Stateful `tf.random` ops take their seed from TensorFlow's `get_seed`; inside a
step we fold the replica id into the op seed, so replicas tracing the same code
with the same seeds still draw different, reproducible streams. A
`tf.random.Generator` made in a replicator context hashes the replica id into
its key in a step (`Replicator.random_generator` gives every replica a
generator of its own: `engines.in_graph.generators`). Keras' random ops
get the same treatment in `keras_compat`. `patches.registry` lists what these
replace, installed only while a step is traced.
"""

import tensorflow as tf

from replicator.collectives import replica_context
from replicator.variables import replicated as variables

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
