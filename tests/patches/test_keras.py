"""Keras 3 state inside a step: metrics and SUM-aggregated layer weights."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import catalogue

METRICS = {
    "mean": lambda: keras.metrics.Mean(),
    "sum": lambda: keras.metrics.Sum(),
    "accuracy": lambda: keras.metrics.SparseCategoricalAccuracy(),
    "auc": lambda: keras.metrics.AUC(num_thresholds=7),
    "f1": lambda: keras.metrics.F1Score(average="macro"),  # assign(self + x)
    "iou": lambda: keras.metrics.MeanIoU(num_classes=3),  # assign(self + x)
}


def _update(name, metric, x, labels, probabilities):
  if name in ("mean", "sum"):
    metric.update_state(x)
  elif name == "accuracy":
    metric.update_state(labels, probabilities)
  elif name == "auc":
    metric.update_state(tf.cast(labels > 0, tf.float32), probabilities[:, 1])
  elif name == "f1":
    metric.update_state(tf.one_hot(labels, 3), probabilities)
  else:
    metric.update_state(labels, tf.argmax(probabilities, -1))


@pytest.mark.parametrize("replicator_name", sorted(catalogue.REPLICATORS))
def test_keras_metrics_updated_in_a_step_equal_one_device_on_all_the_data(replicator_name):
  rng = np.random.RandomState(0)
  x = rng.randn(192).astype(np.float32)  # whole steps for 1 to 8 replicas
  labels = rng.randint(0, 3, 192).astype(np.int32)
  probabilities = rng.dirichlet(np.ones(3), 192).astype(np.float32)
  repl = catalogue.make(replicator_name)
  with repl.context():
    metrics = {name: make() for name, make in METRICS.items()}

  def input_fn(ctx):
    return tf.data.Dataset.from_tensor_slices((x, labels, probabilities)).batch(
        ctx.per_replica_batch_size(8 * repl.num_replicas), drop_remainder=True)

  def step_fn(batch):
    for name, metric in metrics.items():
      _update(name, metric, *batch)
    return tf.constant(0.0)

  with pytest.raises(tf.errors.OutOfRangeError):  # every batch, then the end
    repl.run(step_fn, input_fn, steps=1000)
  for name, metric in metrics.items():
    oracle = METRICS[name]()
    _update(name, oracle, x, labels, probabilities)
    np.testing.assert_allclose(metric.result().numpy(), oracle.result().numpy(),
                               rtol=1e-5, err_msg=name)
    repl.assert_replicas_in_sync(metric.variables)
    metric.reset_state()
    np.testing.assert_allclose(metric.result().numpy(), 0.0, err_msg=name)


class Counter(keras.layers.Layer):
  """Counts the examples it has seen, in a SUM-aggregated weight."""

  def build(self, input_shape):
    self.seen = self.add_weight(shape=(), initializer="zeros", trainable=False,
                                aggregation="sum")

  def call(self, x):
    self.seen.assign_add(tf.cast(tf.shape(x)[0], self.seen.dtype))
    return x


@pytest.mark.parametrize("replicator_name", sorted(catalogue.REPLICATORS))
def test_a_sum_aggregated_keras_weight_adds_every_replicas_change(replicator_name):
  repl = catalogue.make(replicator_name)
  with repl.context():
    counter = Counter()

  def input_fn(ctx):
    return tf.data.Dataset.from_tensor_slices(
        tf.zeros([16 * repl.num_replicas, 2])).batch(4, drop_remainder=True)

  repl.run(counter, input_fn, steps=3)
  for copy in counter.seen.value.replicas:
    assert copy.numpy() == 3 * 4 * repl.num_replicas


@pytest.mark.parametrize("replicator_name", sorted(catalogue.REPLICATORS))
def test_synchronized_batch_normalization_uses_the_global_batch(replicator_name):
  """Keras sums its statistics over tf.distribute's replica context, which a
  step does not have: without the library's fix the flag did nothing."""
  rng = np.random.RandomState(0)
  x = rng.randn(16, 3).astype(np.float32)
  x[:4] += 4.0  # replicas' batches differ in mean
  y = rng.randn(16, 1).astype(np.float32)

  def make():
    keras.utils.set_random_seed(1)
    return keras.Sequential([
        keras.Input((3,)), keras.layers.Dense(3),
        keras.layers.BatchNormalization(momentum=0.5, synchronized=True),
        keras.layers.Dense(1)])

  repl = catalogue.make(replicator_name)
  with repl.context():
    model = make()
    optimizer = repl.wrap_optimizer(keras.optimizers.SGD(0.1))
  batch = 16 // repl.num_replicas

  def input_fn(ctx):
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True)

  def step_fn(data):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean((model(data[0], training=True) - data[1]) ** 2)
    optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
    return repl.all_mean(loss)

  loss = repl.run(step_fn, input_fn)
  one_device = make()  # synchronized=True alone is plain batch norm
  with tf.GradientTape() as tape:
    expected = tf.reduce_mean((one_device(x, training=True) - y) ** 2)
  keras.optimizers.SGD(0.1).apply(tape.gradient(expected, one_device.trainable_variables),
                                  one_device.trainable_variables)
  np.testing.assert_allclose(loss.numpy(), [expected.numpy()] * repl.num_replicas, rtol=1e-5)
  for ours, theirs in zip(model.weights, one_device.weights):
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-5, atol=1e-6,
                               err_msg=ours.path)
