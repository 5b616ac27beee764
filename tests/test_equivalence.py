"""N replicas with global batch B train like one device on the same batches."""

import keras
import numpy as np
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
