"""TensorFlow's distribution-strategy test cases, translated to the replicators.

The cases of tensorflow/python/distribute/strategy_test_lib.py
(`DistributionTestBase`, `TwoDeviceDistributionTestBase`) and the checks of
the custom-training tutorials, over every replicator of `catalogue.py`: `run`
returning per-replica values, all-reduce of values and of their gradients,
`replica_id`, exceptions raised in step_fn, a global step counter, summaries
recorded for replica 0 only, a `tf.function` in the step, broadcast and
all-gather. Where TensorFlow runs a case with `run_in_function`, the step's
body here runs in a `tf.function` too. Every expectation is NumPy's.
"""

import threading

import numpy as np
import pytest
import tensorflow as tf

import catalogue

NAMES = sorted(catalogue.REPLICATORS)
# The TPU emulator compiles the step with XLA, which has no summary (or
# Assert) kernels.
NOT_XLA = catalogue.NOT_XLA
HANG_GUARD_S = 300  # a step that deadlocks fails the test instead of the run


class _TestException(Exception):
  """strategy_test_lib's exception: raised by step_fn, caught by its type."""


def _maybe_in_function(fn, in_function):
  return tf.function(fn) if in_function else fn


def _per_replica_input(values):
  """An input_fn giving replica r `values[r]` (a nest of arrays), batch of one."""
  n = len(tf.nest.flatten(values)[0])

  def input_fn(ctx):
    return tf.data.Dataset.from_tensor_slices(values).batch(
        ctx.per_replica_batch_size(n), drop_remainder=True)
  return input_fn


def _numpy(nest):
  return tf.nest.map_structure(lambda t: t.numpy(), nest)


def _run_guarded(fn):
  """`fn()` on a thread: its result or exception, or a failure if it hangs."""
  result = {}

  def target():
    try:
      result["value"] = fn()
    except BaseException as error:  # pylint: disable=broad-except
      result["error"] = error

  thread = threading.Thread(target=target, daemon=True)
  thread.start()
  thread.join(HANG_GUARD_S)
  assert not thread.is_alive(), f"the step hung for {HANG_GUARD_S} s"
  if "error" in result:
    raise result["error"]
  return result["value"]


@pytest.mark.parametrize("in_function", [False, True], ids=["eager_body", "tf_function"])
@pytest.mark.parametrize("name", NAMES)
def test_run_returns_per_replica_values(name, in_function):
  """TwoDeviceDistributionTestBase._test_run: per-replica values feed the next run."""
  repl = catalogue.make(name)
  n = repl.num_replicas
  first = _maybe_in_function(lambda: repl.replica_id + 1, in_function)

  def mine(stacked):  # this replica's entry of a value `run` returned
    return tf.gather(stacked, repl.replica_id)

  second = _maybe_in_function(
      lambda x: {"a": mine(x) * 2, "b": mine(x) * mine(x)}, in_function)
  third = _maybe_in_function(lambda b, a: mine(a) + 2 * mine(b) + 2, in_function)

  out1 = repl.run(first)
  assert out1.dtype == tf.int32
  np.testing.assert_array_equal(out1.numpy(), np.arange(1, n + 1))
  out2 = _numpy(repl.run(second, args=(out1,)))
  np.testing.assert_array_equal(out2["a"], 2 * np.arange(1, n + 1))
  np.testing.assert_array_equal(out2["b"], np.arange(1, n + 1) ** 2)
  out3 = repl.run(third, args=(out2["b"], out2["a"]))
  np.testing.assert_array_equal(out3.numpy(), out2["a"] + 2 * out2["b"] + 2)


@pytest.mark.parametrize("in_function", [False, True], ids=["eager_body", "tf_function"])
@pytest.mark.parametrize("name", NAMES)
def test_all_reduce_of_values_from_the_input(name, in_function):
  """_test_all_reduce_sum / _mean (TwoDevice's inputs, for n replicas), max and min."""
  repl = catalogue.make(name)
  n = repl.num_replicas
  rng = np.random.RandomState(7)
  values = {
      "scalar": np.array([1.0, 3.0, -2.5, 8.0, 5.5, -4.0, 2.25, 6.5][:n], np.float32),
      "vector": np.array([[39.0, 2.0], [3.0, 41.0], [-7.0, 0.5], [11.0, -6.0],
                          [5.0, 9.5], [-3.0, 17.0], [21.0, -1.5], [0.25, 4.0]][:n],
                         np.float32),
      "matrix": rng.randn(n, 3, 2).astype(np.float32),
      "int": rng.randint(-50, 50, [n, 4]).astype(np.int32),
  }

  def body(batch):
    x = tf.nest.map_structure(lambda t: t[0], batch)  # the batch of one
    floats = {k: v for k, v in x.items() if k != "int"}
    return {"sum": repl.all_sum(x), "mean": repl.all_mean(floats),
            "max": repl.all_max(x), "min": repl.all_min(x)}

  out = _numpy(repl.run(_maybe_in_function(body, in_function), _per_replica_input(values)))
  for op, reduce in (("sum", np.sum), ("mean", np.mean), ("max", np.max), ("min", np.min)):
    for key, got in out[op].items():
      want = reduce(values[key], axis=0).astype(values[key].dtype)
      assert got.dtype == values[key].dtype, (op, key)
      for r in range(n):
        np.testing.assert_allclose(got[r], want, rtol=1e-6, atol=1e-6,
                                   err_msg=f"{op} {key} {r}")


def _want_gradients(kind, c, x, weights):
  """NumPy: each replica's gradient of y_r = kind(x) * c_r (summed), w.r.t. its x_r.

  As on one device, replica r's input gets every replica's upstream gradient.
  """
  n = len(c)
  total = np.sum(c)
  if kind == "sum":
    return np.full(n, total)
  if kind == "mean":
    return np.full(n, total / n)
  if kind in ("max", "min"):  # distinct values: the extreme replica gets it all
    extreme = np.argmax(x) if kind == "max" else np.argmin(x)
    return np.where(np.arange(n) == extreme, total, 0.0)
  if kind == "broadcast":
    return np.where(np.arange(n) == n - 1, total, 0.0)
  # Gathers of y_r = sum(all_gather(x) * weights[r]): replica r's part of
  # every replica's weights.
  axis = int(kind[-1])
  parts = np.split(weights, n, axis=1 + axis)  # [n replicas' weights, part]
  return np.stack([np.sum(part, axis=0) for part in parts])


@pytest.mark.parametrize("in_function", [False, True], ids=["eager_body", "tf_function"])
@pytest.mark.parametrize("how", ["GradientTape", "tf.gradients"])
@pytest.mark.parametrize("name", NAMES)
def test_gradients_of_collectives_sum_the_upstream_gradients(name, how, in_function):
  """_test_collective_comms_gradients / _gradient_tape, for every collective.

  y_r = collective(x_r) * c_r on replica r: d(sum_r y_r)/dx_r, as one device
  differentiating the stacked computation.
  """
  repl = catalogue.make(name)
  n = repl.num_replicas
  rng = np.random.RandomState(11)
  c = np.array([1.0, 3.0, -2.0, 0.5, 1.5, -0.75, 2.5, -1.25][:n], np.float32)
  # distinct: max, min unique
  x = np.array([42.0, 40.0, 45.0, 41.0, 43.5, 39.0, 44.0, 40.5][:n], np.float32)
  vectors = rng.randn(n, 2, 3).astype(np.float32)
  weights = {0: rng.randn(n, 2 * n, 3).astype(np.float32),
             1: rng.randn(n, 2, 3 * n).astype(np.float32)}
  kinds = {
      "sum": repl.all_sum, "mean": repl.all_mean, "max": repl.all_max,
      "min": repl.all_min, "broadcast": lambda v: repl.broadcast(v, source_replica=n - 1),
  }

  def body(batch):
    scalar_c, scalar_x, vector, w0, w1 = (t[0] for t in batch)
    inputs = {kind: tf.identity(scalar_x) for kind in kinds}
    inputs.update(gather0=tf.identity(vector), gather1=tf.identity(vector))

    def outputs():
      ys = {kind: collective(inputs[kind]) * scalar_c for kind, collective in kinds.items()}
      ys["gather0"] = tf.reduce_sum(repl.all_gather(inputs["gather0"], axis=0) * w0)
      ys["gather1"] = tf.reduce_sum(repl.all_gather(inputs["gather1"], axis=1) * w1)
      return ys

    if how == "tf.gradients":
      ys = outputs()
      return {k: tf.gradients(ys[k], [inputs[k]])[0] for k in ys}
    with tf.GradientTape(persistent=True) as tape:
      tape.watch(inputs)
      ys = outputs()
    return {k: tape.gradient(ys[k], inputs[k]) for k in ys}

  input_fn = _per_replica_input((c, x, vectors, weights[0], weights[1]))
  got = _numpy(repl.run(_maybe_in_function(body, in_function), input_fn))
  for kind in list(kinds) + ["gather0", "gather1"]:
    gathered_weights = weights[int(kind[-1])] if kind.startswith("gather") else None
    want = _want_gradients(kind, c, x, gathered_weights)
    np.testing.assert_allclose(got[kind], want, rtol=1e-5, atol=1e-6, err_msg=kind)


@pytest.mark.parametrize("name", NAMES)
def test_each_replica_has_its_own_id(name):
  """DistributionTestBase._test_replica_id: ids 0..n-1, each once, everywhere."""
  repl = catalogue.make(name)
  n = repl.num_replicas

  @tf.function
  def inner():  # traced for each replica: its own id, not replica 0's
    return repl.replica_id

  def step_fn():
    return {"id": repl.replica_id, "in_function": inner(),
            "all": repl.all_gather(repl.replica_id)}

  out = _numpy(repl.run(step_fn))
  assert out["id"].dtype == np.int32 and out["id"].shape == (n,)
  np.testing.assert_array_equal(out["id"], np.arange(n))
  np.testing.assert_array_equal(out["in_function"], np.arange(n))
  np.testing.assert_array_equal(out["all"], np.tile(np.arange(n), (n, 1)))


@pytest.mark.parametrize("where", ["first_replica", "while_another_waits", "in_function"])
@pytest.mark.parametrize("name", NAMES)
def test_an_exception_in_step_fn_propagates_and_the_replicator_goes_on(name, where):
  """_test_call_and_merge_exceptions: step_fn's own exception, its type and
  message, whether raised by the first replica traced, by a later one while
  another waits at a collective (as a merge_call raises), or in a tf.function;
  then the same step_fn, fixed, and the replicator run as before."""
  repl = catalogue.make(name)
  n = repl.num_replicas
  with repl.context():
    counter = tf.Variable(0, dtype=tf.int64, trainable=False)
  calls = []
  broken = [True]
  raising_call = 1 if where != "while_another_waits" else min(2, n)

  def maybe_raise():
    calls.append(None)
    if broken[0] and len(calls) == raising_call:
      raise _TestException(f"step_fn failed at trace call {len(calls)}")

  inner = tf.function(maybe_raise)

  def step_fn():
    counter.assign_add(1)
    total = repl.all_sum(tf.cast(repl.replica_id, tf.float32) + 1.0)
    if where == "in_function":
      inner()
    else:
      maybe_raise()
    return repl.all_max(total)

  with pytest.raises(_TestException, match=f"step_fn failed at trace call {raising_call}"):
    _run_guarded(lambda: repl.run(step_fn))
  assert int(counter.numpy()) == 0  # nothing ran
  broken[0] = False
  want = n * (n + 1) / 2
  np.testing.assert_array_equal(repl.run(step_fn).numpy(), [want] * n)
  np.testing.assert_array_equal(repl.run(lambda: repl.all_sum(1.0)).numpy(), [n] * n)
  assert int(counter.numpy()) == 1
  repl.assert_replicas_in_sync([counter])


@pytest.mark.parametrize("name", NOT_XLA)
def test_an_error_at_run_time_propagates_and_the_step_runs_again(name):
  """A tf.debugging assertion failing on the last replica, at run time: its
  InvalidArgumentError and message; the same compiled step then runs. (What
  the other replicas wrote before the error is not specified, as in TensorFlow.)"""
  repl = catalogue.make(name)
  n = repl.num_replicas

  def step_fn(fail):
    fails_here = tf.logical_and(fail, tf.equal(repl.replica_id, n - 1))
    with tf.control_dependencies([tf.debugging.Assert(
        tf.logical_not(fails_here), ["assertion failed on the last replica"])]):
      mine = tf.cast(repl.replica_id, tf.float32) + 1.0
    return repl.all_sum(mine)

  with pytest.raises(tf.errors.InvalidArgumentError,
                     match="assertion failed on the last replica"):
    _run_guarded(lambda: repl.run(step_fn, args=(tf.constant(True),)))
  for _ in range(2):
    out = repl.run(step_fn, args=(tf.constant(False),))
    np.testing.assert_array_equal(out.numpy(), [n * (n + 1) / 2] * n)


@pytest.mark.parametrize("name", NAMES)
def test_a_global_step_advances_once_a_step(name):
  """DistributionTestBase._test_global_step_update, over several runs and steps=k:
  every replica reads the count of steps, not of replica-steps."""
  repl = catalogue.make(name)
  n = repl.num_replicas
  with repl.context():
    global_step = tf.Variable(  # as TensorFlow's test makes it
        0, dtype=tf.int64, trainable=False,
        aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    plain_step = tf.Variable(0, dtype=tf.int64, trainable=False)
    float_step = tf.Variable(0.0, trainable=False)
    function_step = tf.Variable(0, dtype=tf.int32, trainable=False)

  @tf.function
  def advance_in_function():
    return function_step.assign_add(1)

  def step_fn():
    return {"global": global_step.assign_add(1), "plain": plain_step.assign_add(1),
            "float": float_step.assign_add(1.0), "function": advance_in_function(),
            "read": global_step.read_value()}

  counters = [global_step, plain_step, float_step, function_step]
  done = 0
  for steps in (1, 1, 3, 2):
    out = _numpy(repl.run(step_fn, steps=steps))
    done += steps
    for key, got in out.items():
      np.testing.assert_array_equal(got, [done] * n, err_msg=key)
    for counter in counters:
      assert counter.numpy() == done, counter.name
  repl.assert_replicas_in_sync(counters)


@pytest.mark.parametrize("name", NOT_XLA)
def test_summaries_record_replica_0_once_a_step(name, tmp_path):
  """DistributionTestBase._test_summary_for_replica_zero_only, with the step a
  replicated counter given as the writer's default (the tutorials' pattern)."""
  repl = catalogue.make(name)
  with repl.context():
    global_step = tf.Variable(0, dtype=tf.int64, trainable=False)

  def step_fn():
    global_step.assign_add(1)
    replica = repl.replica_id
    tf.summary.write("a", replica)  # TensorFlow's case: the replica's id
    tf.summary.scalar("scalar", tf.cast(replica, tf.float32) + 10.0)
    return replica

  writer = tf.summary.create_file_writer(str(tmp_path))
  with writer.as_default(step=global_step):
    repl.run(step_fn)
    repl.run(step_fn, steps=3)
  writer.flush()
  steps = [1, 2, 3, 4]
  assert catalogue.summary_events(tmp_path, "a") == [(step, 0) for step in steps]  # the tag as given
  assert catalogue.summary_events(tmp_path, "replica_0/scalar") == [(step, 10.0) for step in steps]


@pytest.mark.parametrize("name", NOT_XLA)
def test_a_summary_in_a_tf_function_in_step_fn_keeps_its_tag(name, tmp_path):
  """As on one device, where a tf.function's body has no name scope of its own."""
  plain_dir, replicated_dir = tmp_path / "plain", tmp_path / "replicated"

  @tf.function
  def record(value):
    tf.summary.scalar("in_function", value)

  plain_step = tf.Variable(0, dtype=tf.int64)

  @tf.function
  def one_device_step():
    plain_step.assign_add(1)
    record(tf.constant(-1.0))

  writer = tf.summary.create_file_writer(str(plain_dir))
  with writer.as_default(step=plain_step):
    one_device_step()
    one_device_step()
  writer.flush()
  assert catalogue.summary_events(plain_dir, "in_function") == [(1, -1.0), (2, -1.0)]

  repl = catalogue.make(name)
  with repl.context():
    global_step = tf.Variable(0, dtype=tf.int64, trainable=False)

  def step_fn():
    global_step.assign_add(1)
    record(tf.cast(repl.replica_id, tf.float32) - 1.0)
    return repl.replica_id

  writer = tf.summary.create_file_writer(str(replicated_dir))
  with writer.as_default(step=global_step):
    repl.run(step_fn, steps=2)
  writer.flush()
  assert catalogue.summary_events(replicated_dir, "replica_0/in_function") == [(1, -1.0), (2, -1.0)]


@pytest.mark.parametrize("name", NAMES)
def test_a_tf_function_in_step_fn_runs_on_each_replicas_values(name):
  """One `tf.function`, defined outside step_fn: each replica's call sees its
  own input, variables' copies and collectives, as the undecorated body would."""
  repl = catalogue.make(name)
  n = repl.num_replicas
  rng = np.random.RandomState(3)
  data = rng.randn(n, 2, 3).astype(np.float32)
  start = rng.randn(3).astype(np.float32)
  with repl.context():
    w = tf.Variable(start)

  @tf.function
  def forward_and_grad(x):
    with tf.GradientTape() as tape:
      y = tf.reduce_sum(tf.tanh(x * w), axis=1)
      loss = tf.reduce_mean(tf.square(y))
    return y, repl.all_mean(tape.gradient(loss, w))

  def step_fn(batch):
    y, grad = forward_and_grad(batch[0])
    w.assign_sub(0.1 * grad)
    return {"y": y, "grad": grad}

  out = _numpy(repl.run(step_fn, _per_replica_input(data)))
  ys = np.tanh(data * start).sum(-1)  # [replica, example]
  # d/dw of mean_r mean_e y^2: (2 / examples) * y * (1 - tanh^2) * x, averaged
  per_replica = [np.mean(2 * ys[r][:, None] * (1 - np.tanh(data[r] * start) ** 2)
                         * data[r], axis=0) for r in range(n)]
  want_grad = np.mean(per_replica, axis=0)
  np.testing.assert_allclose(out["y"], ys, rtol=1e-5, atol=1e-6)
  for r in range(n):
    np.testing.assert_allclose(out["grad"][r], want_grad, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(w.numpy(), start - 0.1 * want_grad, rtol=1e-5, atol=1e-6)
  repl.assert_replicas_in_sync([w])


@pytest.mark.parametrize("name", NAMES)
def test_broadcast_from_every_source_replica(name):
  """`broadcast(value, source_replica=s)` for every s (non-zero ones included):
  every replica gets replica s's value, of each dtype, in nests."""
  repl = catalogue.make(name)
  n = repl.num_replicas
  rng = np.random.RandomState(5)
  values = {"float": rng.randn(n, 2, 3).astype(np.float32),
            "int": rng.randint(-9, 9, [n, 4]).astype(np.int64)}

  def step_fn(batch):
    mine = tf.nest.map_structure(lambda t: t[0], batch)
    return [repl.broadcast(mine, source_replica=s) for s in range(n)]

  out = _numpy(repl.run(step_fn, _per_replica_input(values)))
  for s in range(n):
    for key, got in out[s].items():
      assert got.dtype == values[key].dtype
      np.testing.assert_array_equal(got, np.stack([values[key][s]] * n),
                                    err_msg=f"source {s}, {key}")


@pytest.mark.parametrize("name", NAMES)
def test_all_gather_along_axis_0_and_1(name):
  """Every replica's part, in replica order, along the axis asked."""
  repl = catalogue.make(name)
  n = repl.num_replicas
  rng = np.random.RandomState(9)
  values = {"float": rng.randn(n, 2, 3).astype(np.float32),
            "int": rng.randint(-9, 9, [n, 2, 3]).astype(np.int32)}

  def step_fn(batch):
    mine = tf.nest.map_structure(lambda t: t[0], batch)
    return {"axis0": repl.all_gather(mine, axis=0), "axis1": repl.all_gather(mine, axis=1)}

  out = _numpy(repl.run(step_fn, _per_replica_input(values)))
  for axis in (0, 1):
    for key, got in out[f"axis{axis}"].items():
      want = np.concatenate(list(values[key]), axis=axis)
      assert got.shape == (n,) + want.shape and got.dtype == values[key].dtype
      for r in range(n):
        np.testing.assert_array_equal(got[r], want, err_msg=f"axis {axis}, {key}, {r}")
