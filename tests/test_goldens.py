"""Every golden module trains on every replicator as on one device (the oracle)."""

import numpy as np
import pytest
import sonnet as snt
import tensorflow as tf

import catalogue
import goldens
import replicator

GLOBAL_BATCH = 8
STEPS = 2


def _loss(golden, module, x):
  return tf.reduce_mean(tf.square(tf.cast(golden.forward(module, x), tf.float32) - 0.5))


def _step_fn(golden, module, optimizer, reduce=lambda loss: loss):
  def step_fn(x):
    with tf.GradientTape() as tape:
      loss = _loss(golden, module, x)
    optimizer.apply(tape.gradient(loss, module.trainable_variables),
                    module.trainable_variables)
    return reduce(loss)
  return step_fn


def _input_fn(inputs):
  return lambda ctx: tf.data.Dataset.from_tensor_slices(inputs).batch(
      ctx.per_replica_batch_size(GLOBAL_BATCH), drop_remainder=True).repeat()


def _plain(golden, jit_compile):
  """The oracle: the whole batch on one device, no replicator."""
  module = golden.make()
  optimizer = snt.optimizers.SGD(0.1)

  @tf.function(jit_compile=jit_compile)
  def step(x):
    with tf.GradientTape() as tape:
      loss = _loss(golden, module, x)
    variables = module.trainable_variables
    # Dense: Sonnet's sparse update needs `scatter_sub`, which Keras variables lack.
    optimizer.apply([tf.convert_to_tensor(g) for g in tape.gradient(loss, variables)],
                    variables)
    return loss

  x = tf.constant(golden.inputs(GLOBAL_BATCH))
  losses = [float(step(x)) for _ in range(STEPS)]
  return losses, [v.numpy() for v in module.trainable_variables]


# The catalogue's replicators (4 replicas add nothing to 2 here, and the suite must
# stay near 10 minutes on 2 cores), and one step compiled whole with XLA.
REPLICATORS = dict(catalogue.REPLICATORS, gpu_xla=(
    lambda: replicator.GpuReplicator(device="/cpu:0", jit_compile=True), 1))
del REPLICATORS["multi_gpu_4"]


@pytest.mark.parametrize("replicator_name", sorted(REPLICATORS))
@pytest.mark.parametrize("golden", goldens.GOLDENS, ids=lambda g: g.name)
def test_golden_trains_as_on_one_device(golden, replicator_name):
  # XLA rounds differently (and Sonnet's UnrolledLSTM even trains differently under
  # it): the oracle is compiled as the replicator compiles.
  xla = catalogue.runs_xla(replicator_name) or replicator_name.endswith("xla")
  plain_losses, plain_variables = _plain(golden, xla)
  repl = REPLICATORS[replicator_name][0]()
  with repl.context():
    module = golden.make()
    optimizer = repl.wrap_optimizer(snt.optimizers.SGD(0.1))

  step_fn = _step_fn(golden, module, optimizer, repl.all_mean)
  input_fn = _input_fn(golden.inputs(GLOBAL_BATCH))
  losses = [float(repl.run(step_fn, input_fn)[0]) for _ in range(STEPS)]
  repl.assert_replicas_in_sync(module.trainable_variables)
  np.testing.assert_allclose(losses, plain_losses, rtol=2e-5)
  assert len(module.trainable_variables) == len(plain_variables)
  for variable, expected in zip(module.trainable_variables, plain_variables):
    np.testing.assert_allclose(variable.numpy(), expected, rtol=2e-5, atol=1e-6,
                               err_msg=variable.name)


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
