"""`run`: several steps per call, outputs, input sharing and exhaustion."""

import functools

import numpy as np
import pytest
import sonnet as snt
import tensorflow as tf

import catalogue
import replicator


def _trainer(repl):
  with repl.context():
    model = catalogue.mlp()
    optimizer = repl.wrap_optimizer(snt.optimizers.Adam(1e-2))

  def step_fn(batch):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
          batch[1], model(batch[0])))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply(grads, model.trainable_variables)
    return {"loss": loss, "replica": repl.replica_id}

  return model, step_fn


@pytest.mark.parametrize("name", sorted(catalogue.REPLICATORS))
def test_steps_k_equals_k_calls(name):
  x, y = catalogue.classification_data()
  results = []
  for calls, steps in ((1, 4), (4, 1), (2, 2)):
    tf.random.set_seed(0)
    repl = catalogue.make(name)
    model, step_fn = _trainer(repl)
    input_fn = catalogue.input_fn_for(x, y, 32)
    for _ in range(calls):
      out = repl.run(step_fn, input_fn, steps=steps)
    results.append(([v.numpy() for v in model.variables], out["loss"].numpy()))
  for variables, loss in results[1:]:
    np.testing.assert_array_equal(loss, results[0][1])
    for a, b in zip(variables, results[0][0]):
      np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", sorted(catalogue.REPLICATORS))
def test_outputs_have_leading_replica_axis_in_id_order(name):
  repl = catalogue.make(name)
  n = repl.num_replicas
  out = repl.run(lambda scale: {"id": repl.replica_id,
                                "vec": tf.fill([3], tf.cast(repl.replica_id, tf.float32) * scale)},
                 args=(tf.constant(2.0),))
  np.testing.assert_array_equal(out["id"].numpy(), np.arange(n))
  assert out["vec"].shape == (n, 3)
  np.testing.assert_array_equal(out["vec"].numpy()[:, 0], 2.0 * np.arange(n))


@pytest.mark.parametrize("name", sorted(catalogue.REPLICATORS))
def test_finite_input_stops_every_replica_at_the_same_step(name):
  repl = catalogue.make(name)
  n = repl.num_replicas
  per_replica = 4
  num_batches = 5 * n + n - 1  # 5 full steps, then a partial group of batches

  def input_fn(ctx):
    ds = tf.data.Dataset.range(num_batches * per_replica)
    return ds.batch(ctx.per_replica_batch_size(per_replica * n), drop_remainder=True)

  with repl.context():
    counter = tf.Variable(0, dtype=tf.int64)

  def step_fn(batch):
    counter.assign_add(1)
    return tf.reduce_sum(batch)

  out = repl.run(step_fn, input_fn, steps=2)
  assert out.shape == (n,)
  with pytest.raises(replicator.InputExhausted) as info:
    repl.run(step_fn, input_fn, steps=10)
  assert info.value.steps_completed == 3
  assert isinstance(info.value, tf.errors.OutOfRangeError)
  last = info.value.outputs.numpy()
  # Step 5 used batches 4n .. 5n-1 (one per replica).
  want = [sum(range((4 * n + r) * per_replica, (4 * n + r + 1) * per_replica))
          for r in range(n)]
  np.testing.assert_array_equal(last, want)
  assert int(counter) == 5
  for copy in counter.replicas:
    assert int(copy.numpy()) == 5
  with pytest.raises(replicator.InputExhausted) as again:
    repl.run(step_fn, input_fn)
  assert again.value.steps_completed == 0 and again.value.outputs is None
  repl.reset_input(input_fn)
  first = repl.run(step_fn, input_fn)
  np.testing.assert_array_equal(
      first.numpy(), [sum(range(r * per_replica, (r + 1) * per_replica)) for r in range(n)])


@pytest.mark.parametrize("name", sorted(catalogue.REPLICATORS))
def test_a_step_that_finds_no_data_changes_nothing(name):
  # One step a call is gated, not wrapped in a tf.cond: effects that do not
  # depend on the batch (a constant added, a value from the variable alone)
  # must still wait until every replica is known to have its batch.
  repl = catalogue.make(name)
  n = repl.num_replicas

  def input_fn(ctx):  # 3 steps
    return tf.data.Dataset.range(3 * n * 2).map(lambda i: tf.cast(i, tf.float32)).batch(
        ctx.per_replica_batch_size(2 * n), drop_remainder=True)

  with repl.context():
    counter = tf.Variable(0, dtype=tf.int64)
    doubled = tf.Variable(1.0)
    seen = tf.Variable(0.0)

  def step_fn(batch):
    counter.assign_add(1)
    doubled.assign(doubled + tf.ones_like(doubled) * doubled)
    seen.assign_add(tf.reduce_sum(batch))
    return counter.read_value()

  for _ in range(3):
    repl.run(step_fn, input_fn)
  for _ in range(2):
    with pytest.raises(replicator.InputExhausted) as info:
      repl.run(step_fn, input_fn)
    assert info.value.steps_completed == 0 and info.value.outputs is None
  assert int(counter) == 3 and float(doubled) == 8.0
  # each step adds the mean over replicas of their batch sums
  assert float(seen) == sum(range(3 * n * 2)) / n
  repl.assert_replicas_in_sync([counter, doubled, seen])
  repl.reset_input(input_fn)
  np.testing.assert_array_equal(repl.run(step_fn, input_fn).numpy(), [4] * n)


@pytest.mark.parametrize("name", ["gpu", "multi_gpu_2"])
def test_step_fns_own_out_of_range_error_is_not_taken_for_the_end_of_input(name):
  repl = catalogue.make(name)
  with repl.context():
    total = tf.Variable(0.0)
  empty = iter(tf.data.Dataset.range(0))

  def step_fn(batch):
    total.assign_add(tf.reduce_sum(batch) + tf.cast(next(empty), tf.float32))

  input_fn = lambda ctx: tf.data.Dataset.range(8).map(
      lambda i: tf.cast(i, tf.float32)).batch(2, drop_remainder=True)
  with pytest.raises(tf.errors.OutOfRangeError) as info:
    repl.run(step_fn, input_fn)
  assert not isinstance(info.value, replicator.InputExhausted)
  assert float(total) == 0.0


@pytest.mark.parametrize("name", sorted(catalogue.REPLICATORS))
def test_a_step_that_returns_nothing_or_none_leaves(name):
  repl = catalogue.make(name)
  n = repl.num_replicas

  def input_fn(ctx):  # 4 steps: every replica gets [i, i] at step i
    return tf.data.Dataset.range(4).flat_map(
        lambda i: tf.data.Dataset.from_tensors(tf.fill([2], i)).repeat(n))

  with repl.context():
    total = tf.Variable(0.0)

  def update_only(batch):  # no return statement
    total.assign_add(tf.cast(tf.reduce_sum(batch), tf.float32))

  def with_none(batch):
    total.assign_add(tf.cast(tf.reduce_sum(batch), tf.float32))
    return {"nothing": None, "sum": tf.reduce_sum(batch), "pair": (None, repl.replica_id)}

  assert repl.run(update_only, input_fn) is None
  assert repl.run(update_only, input_fn, steps=1) is None
  out = repl.run(with_none, input_fn, steps=1)
  assert out["nothing"] is None and out["pair"][0] is None
  np.testing.assert_array_equal(out["pair"][1].numpy(), np.arange(n))
  np.testing.assert_array_equal(out["sum"].numpy(), [4] * n)  # batch [2, 2]
  with pytest.raises(replicator.InputExhausted) as info:
    repl.run(with_none, input_fn, steps=3)
  assert info.value.steps_completed == 1 and info.value.outputs["nothing"] is None
  np.testing.assert_array_equal(info.value.outputs["sum"].numpy(), [6] * n)
  # Each step adds the mean over replicas of 2 * batch value: 0 + 2 + 4 + 6.
  assert float(total) == 12.0
  repl.assert_replicas_in_sync([total])
  repl.reset_input(input_fn)
  with pytest.raises(replicator.InputExhausted) as info:
    repl.run(update_only, input_fn, steps=5)
  assert info.value.steps_completed == 4 and info.value.outputs is None
  assert float(total) == 24.0


@pytest.mark.parametrize("name", ["gpu", "multi_gpu_2", "multi_gpu_4"])
@pytest.mark.parametrize("short", ["one_replica", "every_replica",
                                   "one_replica, unknown rank"])
def test_a_step_runs_only_on_batches_of_one_size(name, short):
  """Batches without drop_remainder: a last step with some replicas' batches
  short would weight them like full ones in the mean over replicas."""
  repl = catalogue.make(name)
  n = repl.num_replicas

  def size(i):  # step 3 (elements 2n .. 3n-1) is short on one or every replica
    last = (i == 3 * n - 1) if short.startswith("one_replica") else (i >= 2 * n)
    return tf.where(last, 2, 4)

  def input_fn(ctx):
    ds = tf.data.Dataset.range(3 * n).map(lambda i: tf.fill([size(i)], i))
    if short.endswith("unknown rank"):  # as from a tf.py_function
      ds = ds.map(lambda x: tf.py_function(lambda v: v, [x], tf.int64))
    return ds

  with repl.context():
    steps_taken = tf.Variable(0, dtype=tf.int64)

  def step_fn(batch):
    steps_taken.assign_add(1)
    return tf.reduce_sum(batch)

  runs_short_step = short == "every_replica" or n == 1
  with pytest.raises(replicator.InputExhausted) as info:
    repl.run(step_fn, input_fn, steps=5)
  assert info.value.steps_completed == (3 if runs_short_step else 2)
  assert info.value.uneven_batches == (not runs_short_step)
  if not runs_short_step:
    assert "drop_remainder=True" in str(info.value)
  assert int(steps_taken) == info.value.steps_completed
  last = 2 * n + np.arange(n) if runs_short_step else n + np.arange(n)
  want = [(2 if runs_short_step else 4) * i for i in last]
  np.testing.assert_array_equal(info.value.outputs.numpy(), want)
  repl.reset_input(input_fn)  # the same with one step per call (without a loop:
  for _ in range(info.value.steps_completed):  # its gate keeps why it stopped)
    repl.run(step_fn, input_fn)
  with pytest.raises(replicator.InputExhausted) as info_one:
    repl.run(step_fn, input_fn)
  assert info_one.value.steps_completed == 0
  assert info_one.value.uneven_batches == (not runs_short_step)
  assert int(steps_taken) == 2 * info.value.steps_completed


@pytest.mark.parametrize("name", ["gpu", "multi_gpu_2"])
@pytest.mark.parametrize("steps", [1, 3])
def test_a_step_may_return_values_of_unknown_rank(name, steps):
  """As a tf.py_function's outputs (the loop's initial outputs needed a rank)."""
  repl = catalogue.make(name)
  n = repl.num_replicas

  def input_fn(ctx):
    ds = tf.data.Dataset.range(4 * n).map(lambda i: tf.fill([2], i))
    return ds.map(lambda x: tf.py_function(lambda v: v * 10, [x], tf.int64))

  out = repl.run(lambda batch: batch + 1, input_fn, steps=steps)
  last = (steps - 1) * n + np.arange(n)
  np.testing.assert_array_equal(out.numpy(), [[10 * i + 1] * 2 for i in last])


@pytest.mark.parametrize("name", ["multi_gpu_2", "multi_gpu_4"])
def test_batches_of_different_sizes_run_where_the_input_allows_them(name):
  repl = catalogue.make(name)
  n = repl.num_replicas

  def input_fn(ctx):  # replica r gets batches of r + 1 examples, 3 steps
    return replicator.allow_uneven_batches(tf.data.Dataset.range(3 * n).map(
        lambda i: tf.fill([i % n + 1], tf.cast(i, tf.float32))))

  def step_fn(batch):  # each example's weight: 1 / the global count
    return repl.all_sum(tf.reduce_sum(batch)) / repl.all_sum(
        tf.cast(tf.size(batch), tf.float32))

  with pytest.raises(replicator.InputExhausted) as info:
    repl.run(step_fn, input_fn, steps=4)
  assert info.value.steps_completed == 3 and not info.value.uneven_batches
  examples = [np.full(i % n + 1, i) for i in range(2 * n, 3 * n)]
  np.testing.assert_allclose(info.value.outputs.numpy(),
                             [np.concatenate(examples).mean()] * n, rtol=1e-6)
  with pytest.raises(TypeError, match="dataset: expected a tf.data.Dataset"):
    replicator.allow_uneven_batches([1, 2])


def test_step_functions_with_the_same_input_fn_share_one_stream():
  repl = catalogue.make("multi_gpu_2")

  def input_fn(ctx):
    return tf.data.Dataset.range(100).batch(1)

  first = repl.run(lambda b: b[0], input_fn)
  second = repl.run(lambda b: b[0] * 10, input_fn)
  np.testing.assert_array_equal(first.numpy(), [0, 1])
  np.testing.assert_array_equal(second.numpy(), [20, 30])


@pytest.mark.parametrize("name", sorted(catalogue.REPLICATORS))
def test_random_draws_continue_one_stream_whatever_steps_each_call(name):
  def draw():
    return tf.random.uniform([3], seed=5)  # the op seed fixes each replica's stream

  stream = catalogue.make(name)
  one_per_call = [stream.run(draw).numpy() for _ in range(7)]
  repl = catalogue.make(name)
  got = [repl.run(draw, steps=k).numpy() for k in (1, 1, 2, 2, 1)]
  # No call repeats another call's numbers (they did when steps=1 and
  # steps=k were compiled apart, each with random kernels of its own).
  assert len({row.tobytes() for row in one_per_call}) == 7
  assert len({row.tobytes() for row in got}) == 5
  for last_step, expected in zip((0, 1, 3, 5, 6), got):
    np.testing.assert_array_equal(expected, one_per_call[last_step])


@pytest.mark.parametrize("name", catalogue.MULTI)
def test_a_variable_passed_in_args_is_each_replicas_copy(name):
  repl = catalogue.make(name)
  n = repl.num_replicas
  with repl.context():
    total = tf.Variable(0.0)

  def step_fn(variable, scale):
    variable.assign_add(tf.cast(repl.replica_id, tf.float32) * scale)  # the mean is added
    return variable.read_value()

  for _ in range(3):
    out = repl.run(step_fn, args=(total, tf.constant(2.0)))
  expected = 3 * 2.0 * (n - 1) / 2
  np.testing.assert_allclose(out.numpy(), [expected] * n)
  np.testing.assert_allclose([copy.numpy() for copy in total.replicas], [expected] * n)


def test_outputs_and_argument_shapes_may_change_from_call_to_call():
  repl = catalogue.make("multi_gpu_2")

  def step_fn(mode, x):
    if mode == "train":
      return {"loss": tf.reduce_sum(x)}
    return {"accuracy": tf.reduce_mean(x), "loss": 2.0 * tf.reduce_sum(x)}

  x = tf.range(3, dtype=tf.float32)
  assert set(repl.run(step_fn, args=("train", x))) == {"loss"}
  out = repl.run(step_fn, args=("eval", x), steps=2)
  np.testing.assert_allclose(out["accuracy"].numpy(), [1.0, 1.0])
  np.testing.assert_allclose(out["loss"].numpy(), [6.0, 6.0])
  np.testing.assert_allclose(repl.run(step_fn, args=("train", x))["loss"].numpy(), [3.0, 3.0])
  double = lambda v: v * 2
  for value in (tf.range(5, dtype=tf.float32), tf.range(4, dtype=tf.float64)):
    for steps in (1, 2):
      out = repl.run(double, args=(value,), steps=steps)
      np.testing.assert_allclose(out.numpy(), [2 * value.numpy()] * 2)
      assert out.dtype == value.dtype


def test_changing_steps_does_not_retrace():
  repl = catalogue.make("multi_gpu_2")
  traces = []

  def step_fn(batch):
    traces.append(1)
    return batch

  input_fn = lambda ctx: tf.data.Dataset.range(1000).batch(2)
  repl.run(step_fn, input_fn, steps=2)
  count = len(traces)
  repl.run(step_fn, input_fn, steps=5)
  repl.run(step_fn, input_fn, steps=7)
  assert len(traces) == count  # steps=1 has a compiled form of its own


def test_generator_step_without_input():
  repl = catalogue.make("multi_gpu_4")
  with repl.context():
    total = tf.Variable(0.0)

  def step_fn(delta):
    total.assign_add(delta)  # aggregated: the mean of identical deltas
    return total.read_value()

  out = repl.run(step_fn, args=(tf.constant(1.5),), steps=4)
  np.testing.assert_allclose(out.numpy(), [6.0] * 4)


def test_a_new_step_fn_each_call_warns_once(caplog):
  repl = catalogue.make("multi_gpu_2")
  with repl.context():
    v = tf.Variable(2.0)
  ds = tf.data.Dataset.range(100).batch(1)
  inputs = [lambda ctx: ds, lambda ctx: ds.skip(5), lambda ctx: ds.skip(10)]

  def step_fn(batch):
    return tf.cast(batch[0], tf.float32) * v

  with caplog.at_level("WARNING"):  # one step_fn, three inputs: no warning
    for input_fn in inputs:
      repl.run(step_fn, input_fn)
  assert "step_fn object" not in caplog.text
  with caplog.at_level("WARNING"):  # a new lambda each call, four times: one warning
    outs = [repl.run(lambda: v * 3.0).numpy().tolist() for _ in range(4)]
  assert outs == [[6.0, 6.0]] * 4
  assert caplog.text.count("third different step_fn object made from the same code") == 1
  caplog.clear()

  def times(s):
    return v * s

  with caplog.at_level("WARNING"):  # a new partial each call
    outs = [repl.run(functools.partial(times, s)).numpy().tolist() for s in (1.0, 2.0, 3.0)]
  assert outs == [[2.0, 2.0], [4.0, 4.0], [6.0, 6.0]]
  assert "third different step_fn object made from the same code (times" in caplog.text
  assert "test_run.py" in caplog.text


def test_a_new_input_fn_each_call_restarts_the_data_and_warns(caplog):
  repl = catalogue.make("multi_gpu_2")
  ds = tf.data.Dataset.range(100).batch(1)

  def step_fn(batch):
    return batch[0]

  with caplog.at_level("WARNING"):
    firsts = [repl.run(step_fn, lambda ctx: ds).numpy().tolist() for _ in range(3)]
  assert firsts == [[0, 1]] * 3  # each lambda is a new input, from its first batch
  assert "third different input_fn" in caplog.text
  caplog.clear()
  input_fn = lambda ctx: ds
  with caplog.at_level("WARNING"):
    seen = [repl.run(step_fn, input_fn).numpy().tolist() for _ in range(3)]
  assert seen == [[0, 1], [2, 3], [4, 5]]
  assert "input_fn" not in caplog.text


def test_python_numbers_that_change_in_args_warn_once(caplog):
  repl = catalogue.make("multi_gpu_2")
  traces = []

  def step_fn(scale, training):
    traces.append(1)
    return tf.constant(2.0) * scale * (1.0 if training else 0.5)

  with caplog.at_level("WARNING"):
    repl.run(step_fn, args=(0.5, True))
    repl.run(step_fn, args=(tf.constant(0.5), False))  # a tensor; a bool may change
    np.testing.assert_allclose(repl.run(step_fn, args=(0.5, True)).numpy(), [1.0, 1.0])
  assert "changed since the last call" not in caplog.text
  before = len(traces)
  with caplog.at_level("WARNING"):
    for i in range(3):
      out = repl.run(step_fn, args=(0.25 * i, True))
  np.testing.assert_allclose(out.numpy(), [1.0, 1.0])
  assert len(traces) > before  # each new number traced the step again
  assert caplog.text.count("changed since the last call (") == 1
  assert "args=(tf.constant(lr),)" in caplog.text


def test_gpu_replicator_jit_compile_trains_as_without_and_really_compiles():
  x, y = catalogue.classification_data()
  results = {}
  for jit in (False, True):
    tf.random.set_seed(0)
    repl = replicator.GpuReplicator(device="/cpu:0", jit_compile=jit)
    model, step_fn = _trainer(repl)  # variables created on the first run
    out = repl.run(step_fn, catalogue.input_fn_for(x, y, 32), steps=4)
    results[jit] = ([v.numpy() for v in model.variables], out["loss"].numpy())
  for a, b in zip(results[True][0], results[False][0]):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(results[True][1], results[False][1], rtol=1e-4)

  # An op XLA cannot compile: runs without jit_compile, fails with it.
  def host_step(value):
    return tf.strings.to_number(tf.strings.as_string(value))
  two = (tf.constant(2.0),)
  plain = replicator.GpuReplicator(device="/cpu:0").run(host_step, args=two)
  np.testing.assert_array_equal(plain.numpy(), [2.0])
  with pytest.raises(tf.errors.InvalidArgumentError, match="XLA|compil"):
    replicator.GpuReplicator(device="/cpu:0", jit_compile=True).run(host_step, args=two)


def test_gpu_replicator_jit_compile_must_be_a_bool():
  with pytest.raises(TypeError, match="jit_compile.*'yes'"):
    replicator.GpuReplicator(device="/cpu:0", jit_compile="yes")
