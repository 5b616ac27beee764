"""Variables made in the first step: one trace to make them, their initial values."""

import numpy as np
import pytest
import sonnet as snt
import tensorflow as tf

import catalogue


@pytest.mark.parametrize("name", ["gpu", "multi_gpu_2", "tpu_engine_2"])
def test_the_first_run_traces_step_fn_once_per_replica(name):
  repl = catalogue.make(name)
  x, y = catalogue.classification_data()
  with repl.context():
    model = catalogue.mlp()  # built in the first step, with the optimizer's slots
    optimizer = repl.wrap_optimizer(snt.optimizers.Adam(1e-2))
  train = catalogue.train_step(model, optimizer)
  traces = []

  def step_fn(batch):
    traces.append(1)
    return train(batch)

  input_fn = catalogue.input_fn_for(x, y, 32)
  repl.run(step_fn, input_fn)
  # One worker: the real step makes the variables (replica 0 first), with no
  # build trace before it, and outside the trace: tf.function's own variable
  # creation would trace it twice. The strategy engine traces step_fn alone
  # first (to make them: TPUStrategy cannot in its step) and, on its stand-in,
  # once more compiled with XLA; then tf.distribute traces each replica.
  once = repl.num_local_replicas + (0 if catalogue.in_graph(name) else 2)
  assert len(traces) == once
  repl.run(step_fn, input_fn, steps=3)  # the loop reuses the traced step
  repl.run(step_fn, input_fn)
  assert len(traces) == once


def _values(variables):
  return [v.numpy() for v in variables]


@pytest.mark.parametrize("name", ["gpu", "multi_gpu_2", "tpu_engine_2"])
def test_variables_made_in_the_step_start_from_their_initial_values(name):
  repl = catalogue.make(name)
  made = {}
  seed = (3, 4)

  def step_fn():
    if not made:
      made["graph"] = tf.Variable(tf.random.stateless_normal([3, 2], seed) * 2.0)
      made["python"] = tf.Variable(1.5)
      made["numpy"] = tf.Variable(np.arange(4, dtype=np.int64))
      made["callable"] = tf.Variable(lambda: tf.fill([2], 7.0))
      made["typed"] = tf.Variable(tf.ones([2], tf.bfloat16), dtype=tf.bfloat16)
      made["any_shape"] = tf.Variable(tf.range(3.0), shape=tf.TensorShape(None))
    return tf.add_n([tf.reduce_sum(tf.cast(v, tf.float32)) for v in made.values()])

  with repl.context():
    total = repl.run(step_fn)
  want = {
      "graph": tf.random.stateless_normal([3, 2], seed).numpy() * 2.0,
      "python": np.float32(1.5),
      "numpy": np.arange(4, dtype=np.int64),
      "callable": np.full([2], 7.0, np.float32),
      "typed": np.ones([2], np.float32),
      "any_shape": np.arange(3.0, dtype=np.float32),
  }
  for key, variable in made.items():
    assert variable.dtype == tf.as_dtype(want[key].dtype) or key == "typed", key
    for copy in variable.replicas:
      np.testing.assert_array_equal(np.asarray(copy.numpy(), np.float64),
                                    np.asarray(want[key], np.float64), err_msg=key)
  np.testing.assert_allclose(
      total, [sum(np.sum(np.asarray(v, np.float64)) for v in want.values())]
      * repl.num_local_replicas, rtol=1e-6)


def test_a_variable_initialized_from_another_made_in_the_same_step():
  repl = catalogue.make("multi_gpu_2")
  made = []

  def step_fn():
    if not made:
      made.append(tf.Variable(tf.fill([2], 3.0)))
      made.append(tf.Variable(made[0] * 2.0))  # an EMA of the weights starts so
    return made[1].read_value()

  with repl.context():
    np.testing.assert_array_equal(repl.run(step_fn), [[6.0, 6.0]] * 2)
  for copy in made[1].replicas:
    np.testing.assert_array_equal(copy.numpy(), [6.0, 6.0])


def test_a_step_that_raised_after_building_the_model_leaves_it_whole():
  repl = catalogue.make("multi_gpu_2")
  x, y = catalogue.classification_data()
  with repl.context():
    model = catalogue.mlp()
    optimizer = repl.wrap_optimizer(snt.optimizers.SGD(0.1))

  def broken(batch):
    model(batch[0])
    raise ValueError("a bug after the model was built")

  input_fn = catalogue.input_fn_for(x, y, 32)
  with pytest.raises(ValueError, match="a bug after the model was built"):
    repl.run(broken, input_fn)

  oracle = catalogue.mlp()  # the same seeded initializers, built in a function
  tf.function(lambda: oracle(x[:1]))()
  for variable, want in zip(model.variables, oracle.variables):
    for copy in variable.replicas:
      np.testing.assert_array_equal(copy.numpy(), want.numpy(), err_msg=variable.name)
  # The fixed step trains from there, every replica alike.
  repl.run(catalogue.train_step(model, optimizer), input_fn, steps=2)
  repl.assert_replicas_in_sync(model.variables)
  assert not np.array_equal(model.variables[0].numpy(), oracle.variables[0].numpy())


@pytest.mark.parametrize("step_draws", [False, True])
def test_random_initializers_do_not_make_a_step_one_that_draws(monkeypatch, step_draws):
  """Steps that draw random numbers run in the loop even for one step (their
  stream must continue between calls); a lazily built model's random
  initializers run once, outside the step, and must not send it there."""
  repl = catalogue.make("multi_gpu_2")
  with repl.context():
    model = catalogue.mlp()  # random initializers, built in the first step
  made = []

  def step_fn():
    out = model(tf.ones([2, 3]))
    if not made:  # the first trace, which decides
      noise = tf.random.uniform([2, 4], seed=7)
      made.append(tf.Variable(noise))
      if step_draws:  # the step uses the drawn values too
        out += noise
    return out + made[0]

  loops = []
  while_loop = tf.while_loop

  def counted(*args, **kwargs):
    loops.append(1)
    return while_loop(*args, **kwargs)

  monkeypatch.setattr(tf, "while_loop", counted)
  repl.run(step_fn)
  assert bool(loops) == step_draws


def test_a_stateful_op_before_a_variable_made_in_the_step_is_not_run_to_initialize_it():
  """TensorFlow orders stateful ops (tf.print, py_function) in program order at the
  end of a trace; the initial value's copy must not take the print along."""
  repl = catalogue.make("multi_gpu_2")
  made, printed = [], []

  def record():
    printed.append(1)
    return np.float32(0)

  def step_fn():
    tf.py_function(record, [], tf.float32)  # stateful, ordered before what follows
    if not made:
      made.append(tf.Variable(tf.py_function(
          lambda: np.arange(3, dtype=np.float32), [], tf.float32), shape=[3]))
    return tf.reduce_sum(made[0])

  with repl.context():
    np.testing.assert_array_equal(repl.run(step_fn), [3.0, 3.0])
  assert len(printed) == repl.num_local_replicas  # once per replica in the step, not at init
  for copy in made[0].replicas:
    np.testing.assert_array_equal(copy.numpy(), [0.0, 1.0, 2.0])


def test_building_many_models_in_their_steps_raises_no_retracing_warning(caplog):
  """A sweep builds a model in the first step of each run: the variables'
  initialization is not a `tf.function` that TensorFlow warns is retraced."""
  caplog.set_level("WARNING")
  for _ in range(7):
    repl = catalogue.make("gpu")
    with repl.context():
      model = snt.Linear(2)
    out = repl.run(lambda: model(tf.ones([1, 3])))  # pylint: disable=cell-var-from-loop
    np.testing.assert_allclose(out.numpy()[0], (tf.ones([1, 3]) @ model.w + model.b).numpy())
    repl.shutdown()
  assert "retracing" not in caplog.text


@pytest.mark.parametrize("after_a_collective", [False, True])
def test_a_variable_made_on_another_replica_than_the_first_names_the_cause(
    after_a_collective):
  repl = catalogue.make("multi_gpu_2")

  class Scaled(snt.Module):
    def __call__(self, x):
      if after_a_collective and not hasattr(self, "scale"):
        # A scale from the global batch: every replica checks before the
        # collective, replica 0 makes the variable after it.
        self.scale = tf.Variable(1.0 / tf.sqrt(repl.all_mean(tf.reduce_mean(x * x))))
      if not after_a_collective and tf.get_static_value(repl.replica_id) == 1:
        self.scale = tf.Variable(1.0)  # a branch on the replica id
      return x * getattr(self, "scale", 1.0)

  module = Scaled()
  cause = (r"checked whether to create it .* before a collective \(all_mean"
           if after_a_collective else r"Either step_fn branches on the replica id")
  with pytest.raises(RuntimeError, match=r"created a variable of shape \(\) on replica 1 "
                     r"in its first run.*" + cause):
    repl.run(lambda: module(tf.fill([4], tf.cast(repl.replica_id + 1, tf.float32))))
