"""N replicas with global batch B train like one device on the same batches."""

import keras
import pytest
import sonnet as snt
import tensorflow as tf

import catalogue

STEPS = 20
GLOBAL_BATCH = 32
OPTIMIZERS = {
    "sonnet_sgd": lambda: snt.optimizers.SGD(0.1),
    "sonnet_adam": lambda: snt.optimizers.Adam(1e-2),
    "keras_sgd": lambda: keras.optimizers.SGD(0.1),
    "keras_adam": lambda: keras.optimizers.Adam(1e-2),
}


def loss_fn(model, x, y):
  return tf.reduce_mean(
      tf.nn.sparse_softmax_cross_entropy_with_logits(y, model(x)))


def train_oracle(initial, make_optimizer, x, y, steps=STEPS):
  """Plain TensorFlow on one device, no library."""
  model = catalogue.mlp()
  model(x[:1])
  for var, value in zip(model.variables, initial):
    var.assign(value)
  optimizer = make_optimizer()

  @tf.function
  def step(xb, yb):
    with tf.GradientTape() as tape:
      loss = loss_fn(model, xb, yb)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply(grads, model.trainable_variables)

  for i in range(steps):
    step(x[i * GLOBAL_BATCH:(i + 1) * GLOBAL_BATCH],
         y[i * GLOBAL_BATCH:(i + 1) * GLOBAL_BATCH])
  return [v.numpy() for v in model.variables]


@pytest.mark.parametrize("optimizer_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("replicator_name", sorted(catalogue.REPLICATORS))
def test_training_matches_one_device(replicator_name, optimizer_name):
  x, y = catalogue.classification_data()
  repl = catalogue.make(replicator_name)
  with repl.context():
    model = catalogue.mlp()  # built lazily, inside the first step
    optimizer = repl.wrap_optimizer(OPTIMIZERS[optimizer_name]())

  def step_fn(batch):
    xb, yb = batch
    with tf.GradientTape() as tape:
      loss = loss_fn(model, xb, yb)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply(grads, model.trainable_variables)
    return loss

  # The model is built lazily inside this first step; its optimizer's slots
  # are created lazily inside the first training step.
  def build_fn(batch):
    return loss_fn(model, batch[0], batch[1])

  input_fn = catalogue.input_fn_for(x, y, GLOBAL_BATCH)
  eval_input = catalogue.input_fn_for(x, y, GLOBAL_BATCH)
  repl.run(build_fn, eval_input)
  start = [v.numpy() for v in model.variables]
  repl.run(step_fn, input_fn, steps=STEPS)

  expected = train_oracle(start, OPTIMIZERS[optimizer_name], x, y)
  for var, want in zip(model.variables, expected):
    for copy in var.replicas:
      assert catalogue.norm_relative(copy.numpy(), want) < 1e-5, var.name
  repl.assert_replicas_in_sync(model.variables)


def keras_mlp():
  return keras.Sequential([
      keras.layers.Dense(16, "relu", kernel_initializer=keras.initializers.GlorotUniform(1)),
      keras.layers.Dense(4, kernel_initializer=keras.initializers.GlorotUniform(2))])


@pytest.mark.parametrize("replicator_name", sorted(catalogue.REPLICATORS))
def test_a_keras_model_built_in_the_first_step_trains_like_one_device(replicator_name):
  x, y = catalogue.classification_data()
  repl = catalogue.make(replicator_name)
  with repl.context():
    model = keras_mlp()  # built inside the first step
    optimizer = repl.wrap_optimizer(keras.optimizers.Adam(1e-2))

  def step_fn(batch):
    with tf.GradientTape() as tape:
      loss = loss_fn(model, *batch)
    optimizer.apply(tape.gradient(loss, model.trainable_variables),
                    model.trainable_variables)
    return loss

  repl.run(step_fn, catalogue.input_fn_for(x, y, GLOBAL_BATCH), steps=STEPS)

  oracle = keras_mlp()
  oracle_optimizer = keras.optimizers.Adam(1e-2)

  @tf.function
  def oracle_step(xb, yb):
    with tf.GradientTape() as tape:
      loss = loss_fn(oracle, xb, yb)
    oracle_optimizer.apply(tape.gradient(loss, oracle.trainable_variables),
                           oracle.trainable_variables)

  for i in range(STEPS):
    batch = slice(i * GLOBAL_BATCH, (i + 1) * GLOBAL_BATCH)
    oracle_step(x[batch], y[batch])
  for var, want in zip(model.variables, oracle.variables):
    for copy in var.value.replicas:
      assert catalogue.norm_relative(copy.numpy(), want.numpy()) < 1e-5, var.name
  # The wrapped optimizer shows the base's state (step count, slots).
  assert len(optimizer.variables) == len(oracle_optimizer.variables) > 2
  for var, want in zip(optimizer.variables, oracle_optimizer.variables):
    assert catalogue.norm_relative(var.numpy(), want.numpy()) < 1e-5, var.name
  repl.assert_replicas_in_sync(list(model.variables) + list(optimizer.variables))
