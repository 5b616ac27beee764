"""A compiled step is called through its concrete function: what changes
between calls (tensor values, a new iterator, a variable's value) still arrives."""

import numpy as np
import pytest
import tensorflow as tf

import catalogue
from replicator.engines import calls


class _Counts:
  def __init__(self):
    self.dispatched = 0  # calls through `tf.function`'s own dispatch
    self.concrete = 0  # calls of a concrete function with flat inputs


@pytest.fixture
def dispatches(monkeypatch):
  """The calls of compiled steps, by the way they went."""
  counts = _Counts()
  init = calls.ConcreteCall.__init__

  def counting_init(self, function):
    def through_dispatch(*args, **kwargs):
      counts.dispatched += 1
      return function(*args, **kwargs)

    def concrete_function(*args, **kwargs):
      concrete = function.get_concrete_function(*args, **kwargs)
      call_flat = concrete._call_flat  # pylint: disable=protected-access

      class Counted:
        inputs = concrete.inputs
        captured_inputs = property(lambda _: concrete.captured_inputs)

        def _call_flat(self, *flat):
          counts.concrete += 1
          return call_flat(*flat)
      return Counted()

    through_dispatch.get_concrete_function = concrete_function
    init(self, through_dispatch)

  monkeypatch.setattr(calls.ConcreteCall, "__init__", counting_init)
  return counts


@pytest.mark.parametrize("name", ["gpu", "multi_gpu_2"])
def test_tensor_args_are_read_on_every_call(name, dispatches):
  repl = catalogue.make(name)
  n = repl.num_replicas
  step_fn = lambda scale, offset: tf.cast(repl.replica_id, tf.float32) * scale + offset
  for k in range(5):
    out = repl.run(step_fn, args=(tf.constant(float(k)), tf.constant([1.0, 2.0])))
    np.testing.assert_array_equal(
        out.numpy(), np.arange(n, dtype=np.float32)[:, None] * k + [1.0, 2.0])
  assert (dispatches.dispatched, dispatches.concrete) == (0, 5)  # each through it


@pytest.mark.parametrize("name", ["gpu", "multi_gpu_2"])
def test_the_data_and_variables_of_each_call_arrive(name, dispatches):
  repl = catalogue.make(name)
  n = repl.num_replicas
  with repl.context():
    total = tf.Variable(0, dtype=tf.int64)

  def step_fn(batch):
    total.assign_add(tf.reduce_sum(batch))  # replica 0's change, once a step
    return total.read_value()

  input_fn = lambda ctx: tf.data.Dataset.range(1000).batch(2)
  expected = 0
  for step in range(4):
    got = repl.run(step_fn, input_fn)
    expected += 4 * n * step + 1  # replica 0's batch of step `step`: 2nk, 2nk + 1
    np.testing.assert_array_equal(got.numpy(), [expected] * n)
  total.assign(100)  # written outside a step: the next step reads it
  repl.reset_input(input_fn)  # a new iterator: the data starts again
  np.testing.assert_array_equal(repl.run(step_fn, input_fn).numpy(), [101] * n)
  np.testing.assert_array_equal(repl.run(step_fn, input_fn).numpy(), [101 + 4 * n + 1] * n)
  assert (dispatches.dispatched, dispatches.concrete) == (0, 6)


def test_arguments_it_cannot_flatten_go_through_the_tf_function(dispatches):
  repl = catalogue.make("multi_gpu_2")
  for k in range(3):
    out = repl.run(lambda x: 2 * x, args=(np.full([2], k, np.float32),))
    np.testing.assert_array_equal(out.numpy(), [[2 * k] * 2] * 2)
  assert (dispatches.dispatched, dispatches.concrete) == (3, 0)


@pytest.mark.parametrize("name", ["tpu_engine_2"])
def test_the_strategy_engines_loop_reads_its_inputs_on_every_call(name, dispatches):
  repl = catalogue.make(name)
  n = repl.num_replicas
  input_fn = lambda ctx: tf.data.Dataset.range(1000).batch(2, drop_remainder=True)
  step_fn = lambda batch, scale: tf.reduce_sum(batch) * scale
  for k, steps in enumerate((1, 3, 1, 2)):
    out = repl.run(step_fn, input_fn, args=(tf.constant(k, tf.int64),), steps=steps)
    taken = 1 + 3 + 1 + 2 if k == 3 else (1, 4, 5)[k]  # steps run so far
    first = 2 * n * (taken - 1)  # the last step's batch of replica 0
    np.testing.assert_array_equal(
        out.numpy(), [(2 * (first + 2 * r) + 1) * k for r in range(n)])
  assert (dispatches.dispatched, dispatches.concrete) == (0, 4)


@pytest.mark.parametrize("name", ["gpu", "multi_gpu_2"])
def test_the_in_graph_loop_reads_steps_and_data_on_every_call(name, dispatches):
  repl = catalogue.make(name)
  n = repl.num_replicas
  input_fn = lambda ctx: tf.data.Dataset.range(1000)
  taken = 0
  for steps in (2, 3, 2, 5):
    out = repl.run(lambda x: x, input_fn, steps=steps)
    taken += steps
    np.testing.assert_array_equal(out.numpy(), n * (taken - 1) + np.arange(n))
  assert (dispatches.dispatched, dispatches.concrete) == (0, 4)
