"""A golden module trained on two replicas restores, through `Checkpointer`, on one.

How every golden trains on every replicator, against a one-device oracle, is
`test_goldens_conformance.py`'s.
"""

import numpy as np
import pytest
import sonnet as snt
import tensorflow as tf

import catalogue
import goldens
import replicator

GLOBAL_BATCH = 8


def _loss(golden, module, x):
  return tf.reduce_mean(tf.square(tf.cast(golden.forward(module, x), tf.float32) - 0.5))


def _step_fn(golden, module, optimizer):
  def step_fn(x):
    with tf.GradientTape() as tape:
      loss = _loss(golden, module, x)
    optimizer.apply(tape.gradient(loss, module.trainable_variables),
                    module.trainable_variables)
    return loss
  return step_fn


def _input_fn(inputs):
  return lambda ctx: tf.data.Dataset.from_tensor_slices(inputs).batch(
      ctx.per_replica_batch_size(GLOBAL_BATCH), drop_remainder=True).repeat()


@pytest.mark.parametrize("golden", goldens.GOLDENS, ids=lambda g: g.name)
def test_golden_trained_on_two_replicas_restores_on_one(golden, tmp_path):
  repl = catalogue.make("multi_gpu_2")
  with repl.context():
    module = golden.make()
    optimizer = repl.wrap_optimizer(snt.optimizers.SGD(0.1))

  inputs = golden.inputs(GLOBAL_BATCH)
  step_fn, input_fn = _step_fn(golden, module, optimizer), _input_fn(inputs)
  repl.run(step_fn, input_fn, steps=2)
  replicator.Checkpointer(str(tmp_path), module=module, optimizer=optimizer).save(step=2)
  # Trainable only: tf.train.Checkpoint does not save a Keras SeedGenerator's state
  # either (checked with plain Keras).
  saved = [v.numpy() for v in module.trainable_variables]

  one = catalogue.make("gpu")
  with one.context():
    restored = golden.make()
    golden.forward(restored, tf.constant(inputs[:1]))  # builds it
  assert replicator.Checkpointer(str(tmp_path), module=restored).restore_latest() == 2
  values = [v.numpy() for v in restored.trainable_variables]
  assert len(values) == len(saved)
  for value, expected in zip(values, saved):
    np.testing.assert_array_equal(value, expected)
