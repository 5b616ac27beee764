"""Misuse that TensorFlow, Sonnet or Keras would report obscurely, or not at all."""

import json
import os
from unittest import mock

import keras
import numpy as np
import pytest
import sonnet as snt
import tensorflow as tf

import catalogue
import replicator

OPTIMIZERS = {"sonnet": lambda: snt.optimizers.SGD(0.1),
              "keras": lambda: keras.optimizers.SGD(0.1)}


def _variable_and_optimizer(repl, kind):
  with repl.context():
    w = tf.Variable([1.0, 2.0], name="w")
    optimizer = repl.wrap_optimizer(OPTIMIZERS[kind]())
  return w, optimizer


@pytest.mark.parametrize("name", ["gpu", "multi_gpu_2", "tpu_engine_2"])
@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
@pytest.mark.parametrize("in_step", [True, False])
def test_apply_with_every_gradient_none_raises(name, kind, in_step):
  repl = catalogue.make(name)
  w, optimizer = _variable_and_optimizer(repl, kind)
  for grads, variables in [([None], [w]), ([], [])]:
    apply = lambda grads=grads, variables=variables: optimizer.apply(grads, variables)
    with pytest.raises(ValueError,
                       match=r"(updates|grads): .*(every gradient is None|no variables)"
                             r".*tape"):
      if in_step:
        repl.run(apply)
      else:
        apply()
  np.testing.assert_array_equal(w.numpy(), [1.0, 2.0])
  repl.shutdown()


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_apply_with_some_gradients_none_still_updates_the_others(kind):
  repl = catalogue.make("multi_gpu_2")
  w, optimizer = _variable_and_optimizer(repl, kind)
  with repl.context():
    frozen = tf.Variable([5.0], name="frozen")

  def step_fn():  # replica r's gradient is r + 1: their mean is 1.5
    grad = tf.cast(repl.replica_id + 1, tf.float32) * tf.ones([2])
    optimizer.apply([grad, None], [w, frozen])

  repl.run(step_fn)
  np.testing.assert_allclose(w.numpy(), np.array([1.0, 2.0]) - 0.1 * 1.5, rtol=1e-6)
  np.testing.assert_array_equal(frozen.numpy(), [5.0])
  repl.shutdown()


def test_an_integer_gradient_of_a_float_variable_names_both_dtypes():
  repl = catalogue.make("multi_gpu_2")
  w, optimizer = _variable_and_optimizer(repl, "sonnet")
  with pytest.raises(TypeError, match=r"updates: the gradient of variable 'w.*' is int32, "
                                      r"but the variable is float32.*tf.cast"):
    repl.run(lambda: optimizer.apply([tf.constant([1, 2])], [w]))
  np.testing.assert_array_equal(w.numpy(), [1.0, 2.0])
  repl.shutdown()


def test_an_integer_gradient_through_keras_is_cast_as_keras_does():
  repl = catalogue.make("multi_gpu_2")
  w, optimizer = _variable_and_optimizer(repl, "keras")
  oracle = tf.Variable([1.0, 2.0])
  keras.optimizers.SGD(0.1).apply([tf.constant([1, 2])], [oracle])  # one device

  repl.run(lambda: optimizer.apply([tf.constant([1, 2])], [w]))
  np.testing.assert_allclose(w.numpy(), oracle.numpy(), rtol=1e-6)
  repl.assert_replicas_in_sync([w])
  repl.shutdown()


def test_a_replicated_variable_is_a_tensor_to_tensorflow():
  repl = catalogue.make("multi_gpu_2")
  with repl.context():
    no_drop = tf.Variable(0.0)
    half = tf.Variable(0.5)
  x = np.arange(1.0, 9.0, dtype=np.float32)
  assert tf.is_tensor(no_drop)
  np.testing.assert_array_equal(tf.nn.dropout(x, rate=no_drop).numpy(), x)

  def step_fn():
    return (tf.constant(tf.is_tensor(no_drop)), tf.nn.dropout(x, rate=no_drop),
            tf.nn.dropout(x, rate=half))

  is_tensor, kept, dropped = repl.run(step_fn)
  assert is_tensor.numpy().tolist() == [True, True]
  np.testing.assert_array_equal(kept.numpy(), np.stack([x, x]))
  # rate 0.5: each value is dropped (0) or kept and scaled by 1 / (1 - 0.5)
  assert np.all((dropped.numpy() == 0) | (dropped.numpy() == 2 * x))
  repl.shutdown()


@pytest.mark.parametrize("steps", [2**63, 0, -1, True, 1.0, "2"])
def test_steps_out_of_range_or_not_an_int(steps):
  repl = catalogue.make("gpu")
  with pytest.raises(ValueError, match=r"steps: expected an int in \[1, 2\*\*63 - 1\]"):
    repl.run(lambda: tf.constant(1.0), steps=steps)
  repl.shutdown()


def test_steps_up_to_the_int64_maximum_are_accepted():
  repl = catalogue.make("gpu")
  input_fn = lambda ctx: tf.data.Dataset.range(4).batch(2)
  out = repl.run(lambda x: tf.reduce_sum(x), input_fn, steps=np.int64(1))
  np.testing.assert_array_equal(out.numpy(), [0 + 1])
  with pytest.raises(replicator.InputExhausted) as info:  # runs until the data ends
    repl.run(lambda x: tf.reduce_sum(x), input_fn, steps=2**63 - 1)
  assert info.value.steps_completed == 1
  repl.shutdown()


@pytest.mark.parametrize("config, match", [
    ({"cluster": ["a:1", "b:1"], "task": {"type": "worker", "index": 0}},
     r"TF_CONFIG: 'cluster' is a list"),
    ({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": "one"}},
     r"TF_CONFIG: 'task.index' is 'one'"),
    ({"cluster": {"worker": ["a:1", "b:1"]}},
     r"TF_CONFIG: 'task' is missing"),
])
def test_tf_config_of_the_wrong_shape(config, match):
  expected = r".*expected .*\"cluster\": \{\"worker\": \[\"host:port\""
  with mock.patch.dict(os.environ, {"TF_CONFIG": json.dumps(config)}):
    with pytest.raises(ValueError, match=match + expected):
      replicator.Mesh.from_cluster(devices=["/cpu:0"])


@pytest.mark.parametrize("global_batch_size", [0, -4, 2.0, True, "8"])
def test_per_replica_batch_size_of_a_non_positive_or_non_int(global_batch_size):
  ctx = replicator.InputContext(1, 0, 2)
  with pytest.raises(ValueError, match=r"global_batch_size: expected a positive int"):
    ctx.per_replica_batch_size(global_batch_size)
  assert ctx.per_replica_batch_size(np.int64(8)) == 4


def test_an_unbatched_dataset_of_scalars_runs_and_a_step_needing_a_batch_names_input_fn():
  """Each replica takes one element a step, of any rank (as tf.distribute feeds
  them); where step_fn needs a batch, the error on the shape names input_fn and
  the fix."""
  repl = catalogue.make("multi_gpu_2")
  unbatched = lambda ctx: tf.data.Dataset.from_tensor_slices(np.arange(8.0, dtype=np.float32))
  np.testing.assert_array_equal(repl.run(lambda x: x, unbatched).numpy(), [0.0, 1.0])
  with pytest.raises(ValueError, match=r"(?s)input_fn: .* element is a scalar .*no batch "
                                       r"dimension.*ds.batch\(ctx.per_replica_batch_size"):
    repl.run(lambda x: x[0], unbatched)

  def batched(ctx):
    return unbatched(ctx).batch(ctx.per_replica_batch_size(4), drop_remainder=True)

  sums = repl.run(lambda x: tf.reduce_sum(x), batched)
  np.testing.assert_array_equal(sums.numpy(), [0.0 + 1.0, 2.0 + 3.0])
  repl.shutdown()
