"""A `tf.function` that step_fn calls: traced for each replica, never shared."""

import functools

import numpy as np
import pytest
import sonnet as snt
import tensorflow as tf

import catalogue


def _called_in_step_fn(step_fn):
  decorated = tf.function(step_fn)
  return lambda batch: decorated(batch)


@pytest.mark.parametrize("decorate", [_called_in_step_fn, tf.function],
                         ids=["called_in_step_fn", "as_step_fn"])
@pytest.mark.parametrize("name", sorted(catalogue.REPLICATORS))
def test_a_decorated_step_trains_as_the_undecorated_one(name, decorate):
  """The whole step (loss, gradients, apply) as a tf.function, the model built on the
  first run; the replicas diverged before nested_functions."""
  results = []
  for wrap in (lambda f: f, decorate):
    tf.random.set_seed(0)
    repl = catalogue.make(name)
    with repl.context():
      model = catalogue.mlp()
      optimizer = repl.wrap_optimizer(snt.optimizers.Adam(1e-2))
    x, y = catalogue.classification_data()
    out = repl.run(wrap(catalogue.train_step(model, optimizer)),
                   catalogue.input_fn_for(x, y, 32), steps=4)
    repl.assert_replicas_in_sync(model.variables)
    results.append(([v.numpy() for v in model.variables], out.numpy()))
  np.testing.assert_allclose(results[1][1], results[0][1], rtol=1e-6)
  for a, b in zip(results[1][0], results[0][0]):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", catalogue.MULTI)
def test_updates_and_collectives_inside_a_tf_function_are_aggregated(name):
  repl = catalogue.make(name)
  n = repl.num_replicas
  with repl.context():
    v = tf.Variable(0.0)

  @tf.function
  def bump_and_sum(x):
    v.assign(v + x)  # replicated float variable: the mean of the replicas' values
    return repl.all_sum(x)

  out = repl.run(lambda: bump_and_sum(tf.cast(repl.replica_id, tf.float32) + 1.0))
  np.testing.assert_array_equal(out.numpy(), [n * (n + 1) / 2] * n)
  np.testing.assert_allclose([c.numpy() for c in v.replicas], [(n + 1) / 2] * n)


@pytest.mark.parametrize("name", catalogue.MULTI)
def test_an_xla_compiled_forward_and_backward_uses_each_replicas_variables(name):
  results = []
  for jit in (False, True):
    tf.random.set_seed(0)
    repl = catalogue.make(name)
    with repl.context():
      model = catalogue.mlp()
      optimizer = repl.wrap_optimizer(snt.optimizers.SGD(0.1))
    gradients = functools.partial(_loss_and_grads, model)
    if jit:
      gradients = tf.function(gradients, jit_compile=True)

    def step_fn(batch, model=model, optimizer=optimizer, gradients=gradients):
      loss, grads = gradients(*batch)
      optimizer.apply(grads, model.trainable_variables)
      return loss

    x, y = catalogue.classification_data()
    out = repl.run(step_fn, catalogue.input_fn_for(x, y, 32), steps=3)
    repl.assert_replicas_in_sync(model.variables)
    results.append(([v.numpy() for v in model.variables], out.numpy()))
  np.testing.assert_allclose(results[1][1], results[0][1], rtol=1e-5)
  for a, b in zip(results[1][0], results[0][0]):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _loss_and_grads(model, images, labels):
  with tf.GradientTape() as tape:
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels, model(images)))
  return loss, tape.gradient(loss, model.trainable_variables)


def test_a_collective_inside_an_xla_function_is_refused_by_name():
  repl = catalogue.make("multi_gpu_2")

  @tf.function(jit_compile=True)
  def total(x):
    return repl.all_sum(x)

  with pytest.raises(NotImplementedError, match="all_sum.*jit_compile=True.*'total'"):
    repl.run(lambda: total(tf.constant(1.0)))


@pytest.mark.parametrize("name", catalogue.MULTI)
def test_random_numbers_drawn_in_a_tf_function_differ_between_replicas(name):
  tf.random.set_seed(0)
  repl = catalogue.make(name)
  noise = tf.function(lambda: tf.random.normal([4], seed=1))
  out = repl.run(lambda: {"nested": noise(), "direct": tf.random.normal([4], seed=1)})
  nested, direct = out["nested"].numpy(), out["direct"].numpy()
  assert len({tuple(row) for row in nested}) == repl.num_replicas
  np.testing.assert_array_equal(nested, direct)  # as if drawn in step_fn itself


def test_a_replicated_variable_can_be_a_tf_function_argument():
  repl = catalogue.make("multi_gpu_2")
  with repl.context():
    v = tf.Variable([1.0, 2.0])
  scaled = tf.function(lambda variable, k: variable * k)
  np.testing.assert_array_equal(scaled(v, 3.0).numpy(), [3.0, 6.0])  # eager: copy 0
  out = repl.run(lambda: scaled.get_concrete_function(v, 2.0)(v, 2.0))
  np.testing.assert_array_equal(out.numpy(), [[2.0, 4.0]] * 2)


@pytest.mark.parametrize("name", catalogue.MULTI)
def test_a_tf_function_with_an_input_signature_gets_tensors_and_its_replica(name):
  repl = catalogue.make(name)
  with repl.context():
    v = tf.Variable(1.5)

  @tf.function(input_signature=[tf.TensorSpec([], tf.float32)])
  def scaled(k):  # k is a tensor even when given a Python number
    return v * k + tf.cast(repl.replica_id, tf.float32) + k.shape.rank

  out = repl.run(lambda: scaled(2))
  np.testing.assert_array_equal(out.numpy(), 3.0 + np.arange(repl.num_replicas))


@pytest.mark.parametrize("name", catalogue.MULTI)
def test_a_concrete_function_traced_outside_the_step_is_refused_by_name(name):
  repl = catalogue.make(name)
  with repl.context():
    v = tf.Variable(1.0, name="counter")
  bump = tf.function(lambda x: v.assign_add(x)).get_concrete_function(
      tf.TensorSpec([], tf.float32))  # captures the copies outside any replica
  with pytest.raises(ValueError, match="concrete function.*'counter.*tf.function itself"):
    repl.run(lambda: bump(tf.constant(1.0)))
  np.testing.assert_array_equal([c.numpy() for c in v.replicas], 1.0)  # nothing ran


class Trainer(snt.Module):
  """A train step written as a `tf.function` method, as in many research codebases."""

  def __init__(self, repl):
    super().__init__()
    self.model = catalogue.mlp()
    self.optimizer = repl.wrap_optimizer(snt.optimizers.Adam(1e-2))

  @tf.function
  def train_step(self, batch):
    images, labels = batch
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
          labels, self.model(images)))
    self.optimizer.apply(tape.gradient(loss, self.model.trainable_variables),
                         self.model.trainable_variables)
    return loss


@pytest.mark.parametrize("name", catalogue.MULTI)
def test_a_decorated_train_step_method_trains_as_on_one_replica(name):
  x, y = catalogue.classification_data()
  results = []
  for replicator_name in ("gpu", name):
    tf.random.set_seed(0)
    repl = catalogue.make(replicator_name)
    with repl.context():
      trainer = Trainer(repl)
    repl.run(trainer.train_step, catalogue.input_fn_for(x, y, 32), steps=3)
    repl.assert_replicas_in_sync(trainer.model.variables)
    results.append([v.numpy() for v in trainer.model.variables])
  for a, b in zip(results[1], results[0]):
    assert catalogue.norm_relative(a, b) < 1e-5
