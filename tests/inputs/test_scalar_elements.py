"""Elements of any rank, as tf.distribute feeds replicas: one element each a step.

TensorFlow's own strategy tests feed replicas `Dataset.range(n)` (replica 0
gets 0, replica 1 gets 1, then 2 and 3: `strategy_test_lib`'s
`_test_input_fn_iterable`), and test `run`, `all_reduce` and its gradient on
such per-replica scalars; a researcher passes a per-replica seed or index the
same way. Each case runs on every engine against NumPy or k single steps; on
the fake TPU (`tpu_engine_on_fake_tpu`, which traces and returns zeros) only
the structure, shapes and dtypes are checked.
"""

import numpy as np
import pytest
import sonnet as snt
import tensorflow as tf

import catalogue
import replicator
from replicator import testing

EXECUTED = ["gpu", "multi_gpu_2", "tpu_engine_2"]
ELEMENTS = 12  # a multiple of 1 and 2 replicas


def identity(x):
  return x


def range_input(ctx):
  del ctx
  return tf.data.Dataset.range(ELEMENTS)


def float_input(ctx):
  del ctx
  return tf.data.Dataset.range(ELEMENTS).map(lambda i: tf.cast(i, tf.float32) + 1.0)


@pytest.mark.parametrize("name", EXECUTED)
def test_input_fn_iterable_gives_consecutive_elements_to_consecutive_replicas(name):
  """`_test_input_fn_iterable`: every step's values, then the end, then again
  from the start."""
  repl = catalogue.make(name)
  n = repl.num_replicas
  expected = np.arange(ELEMENTS).reshape(-1, n)  # step i: replica r gets i * n + r
  for _ in range(2):  # and again, after starting the input anew
    for want in expected:
      got = repl.run(identity, range_input)
      assert got.dtype == tf.int64
      np.testing.assert_array_equal(got.numpy(), want)
    with pytest.raises(replicator.InputExhausted) as raised:
      repl.run(identity, range_input)
    assert raised.value.steps_completed == 0 and not raised.value.uneven_batches
    repl.reset_input(range_input)
  repl.shutdown()


@pytest.mark.parametrize("name", EXECUTED)
def test_run_on_per_replica_scalars(name):
  repl = catalogue.make(name)
  n = repl.num_replicas

  def step_fn(x):
    return {"doubled": x * 2.0 + tf.cast(repl.replica_id, tf.float32),
            "id": repl.replica_id}

  values = (np.arange(ELEMENTS, dtype=np.float32) + 1.0).reshape(-1, n)
  for want in values:
    out = repl.run(step_fn, float_input)
    np.testing.assert_allclose(out["doubled"].numpy(), want * 2.0 + np.arange(n))
    np.testing.assert_array_equal(out["id"].numpy(), np.arange(n))
    assert out["doubled"].shape == (n,)
  repl.shutdown()


@pytest.mark.parametrize("name", EXECUTED)
@pytest.mark.parametrize("how", ["GradientTape", "tf.gradients"])
def test_all_sum_and_its_gradient_on_per_replica_scalars(name, how):
  """strategy_test_lib's `_test_all_reduce_sum_gradients`: y = all_sum(x) * c
  on each replica, c its element; dy/dx is the sum of every replica's c (the
  gradient of a sum over replicas sums the replicas' upstream gradients)."""
  repl = catalogue.make(name)
  n = repl.num_replicas

  def step_fn(c):
    x = tf.identity(42.0)
    if how == "tf.gradients":
      y = repl.all_sum(x) * c
      grad = tf.gradients(y, [x])[0]
    else:
      with tf.GradientTape() as tape:
        tape.watch(x)
        y = repl.all_sum(x) * c
      grad = tape.gradient(y, x)
    return {"sum": repl.all_sum(c), "mean": repl.all_mean(c * c), "grad": grad}

  values = (np.arange(ELEMENTS, dtype=np.float32) + 1.0).reshape(-1, n)
  for step_values in values:
    out = repl.run(step_fn, float_input)
    np.testing.assert_allclose(out["sum"].numpy(), np.full(n, step_values.sum()))
    np.testing.assert_allclose(out["mean"].numpy(), np.full(n, np.mean(step_values ** 2)),
                               rtol=1e-6)
    np.testing.assert_allclose(out["grad"].numpy(), np.full(n, step_values.sum()))
  repl.shutdown()


def _scalar_regression(repl):
  """A model trained on per-replica scalars, and its step."""
  with repl.context():
    w = tf.Variable(0.5)
    steps_seen = tf.Variable(0, dtype=tf.int64)
  optimizer = repl.wrap_optimizer(snt.optimizers.SGD(0.01))

  def step_fn(x):
    with tf.GradientTape() as tape:
      loss = tf.square(w * x - (3.0 * x + 1.0))
    optimizer.apply(tape.gradient(loss, [w]), [w])
    steps_seen.assign_add(1)
    return {"loss": repl.all_mean(loss), "x": x}
  return w, steps_seen, step_fn


def _repeated_input(ctx):
  del ctx
  return tf.data.Dataset.range(7).map(lambda i: tf.cast(i, tf.float32) / 7.0).repeat()


@pytest.mark.parametrize("name", EXECUTED)
def test_steps_k_with_scalar_inputs_equals_k_single_steps(name):
  k = 5
  repl = catalogue.make(name)
  w_single, seen_single, single = _scalar_regression(repl)
  w_loop, seen_loop, loop = _scalar_regression(repl)
  def make_input(which):  # two inputs, each from its start
    def input_fn(ctx):
      assert which in ("a", "b")  # named apart in checkpoints by it
      return _repeated_input(ctx)
    return input_fn
  input_a, input_b = make_input("a"), make_input("b")
  for _ in range(k):
    want = repl.run(single, input_a)
  got = repl.run(loop, input_b, steps=k)
  np.testing.assert_allclose(float(w_loop), float(w_single), rtol=1e-6)
  assert int(seen_loop) == int(seen_single) == k
  np.testing.assert_array_equal(got["x"].numpy(), want["x"].numpy())
  np.testing.assert_allclose(got["loss"].numpy(), want["loss"].numpy(), rtol=1e-5)
  # and the data ran on from where the k steps left it, in both
  np.testing.assert_array_equal(repl.run(identity, input_b).numpy(),
                                repl.run(identity, input_a).numpy())
  repl.shutdown()


@pytest.mark.parametrize("name", ["multi_gpu_2", "tpu_engine_2"])
def test_scalar_elements_are_always_even(name):
  """A step's scalars are never uneven; `allow_uneven_batches` and a leaf with
  a batch beside a scalar leaf are compared as before; `pad_to_global_batch`
  batches scalar examples."""
  repl = catalogue.make(name)
  n = repl.num_replicas
  odd = lambda ctx: replicator.allow_uneven_batches(tf.data.Dataset.range(2 * n + 1))
  outputs = [repl.run(identity, odd).numpy() for _ in range(2)]
  np.testing.assert_array_equal(np.stack(outputs), np.arange(2 * n).reshape(2, n))
  with pytest.raises(replicator.InputExhausted) as raised:  # one left: out of data
    repl.run(identity, odd)
  assert not raised.value.uneven_batches

  def evaluation(ctx):
    return replicator.pad_to_global_batch(tf.data.Dataset.range(5), ctx, 2 * n)

  def count(batch):
    values, mask = batch
    return repl.all_sum({"sum": tf.reduce_sum(tf.cast(values, tf.float32) * mask),
                         "count": tf.reduce_sum(mask)})

  totals = {"sum": 0.0, "count": 0.0}
  while True:
    try:
      out = repl.run(count, evaluation)
    except replicator.InputExhausted:
      break
    totals = {key: totals[key] + float(out[key][0]) for key in totals}
  assert totals == {"sum": float(np.sum(np.arange(5))), "count": 5.0}
  repl.shutdown()


def test_a_scalar_beside_a_batch_compares_the_batch_multi_gpu_2():
  repl = catalogue.make("multi_gpu_2")
  features = np.arange(14, dtype=np.float32).reshape(7, 2)

  def input_fn(ctx):  # batches of 2, 2, 2 and 1 rows: the second step's are uneven
    del ctx
    rows = tf.data.Dataset.from_tensor_slices(features).batch(2)
    return tf.data.Dataset.zip({"index": tf.data.Dataset.range(4), "rows": rows})

  def step_fn(element):
    return {"index": element["index"], "sum": tf.reduce_sum(element["rows"])}

  out = repl.run(step_fn, input_fn)
  np.testing.assert_array_equal(out["index"].numpy(), [0, 1])
  np.testing.assert_allclose(out["sum"].numpy(), features[:4].reshape(2, 4).sum(1))
  with pytest.raises(replicator.InputExhausted) as raised:
    repl.run(step_fn, input_fn)
  assert raised.value.uneven_batches
  repl.shutdown()


@pytest.mark.parametrize("name", EXECUTED)
def test_a_step_written_for_a_batch_says_to_batch_the_input(name):
  """An element without a batch dimension runs; where step_fn needs one, the
  error it raises on the shape says that input_fn may have forgotten .batch()."""
  repl = catalogue.make(name)
  with repl.context():
    layer = snt.Linear(3, w_init=snt.initializers.Ones())

  def unbatched(ctx):
    del ctx
    features = np.ones([8, 4], np.float32)
    return tf.data.Dataset.from_tensor_slices((features, np.arange(8, dtype=np.int32)))

  def step_fn(example):
    features, label = example
    logits = layer(features)  # wants [batch, 4], gets [4]
    return tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(label, logits))

  with pytest.raises((ValueError, tf.errors.InvalidArgumentError)) as raised:
    repl.run(step_fn, unbatched)
  message = str(raised.value)
  assert "input_fn: unbatched gives each replica one element a step" in message, message
  assert "element's leaf '1' is a scalar" in message, message
  assert "ds.batch(ctx.per_replica_batch_size(GLOBAL_BATCH)" in message, message
  assert "step_fn step_fn expects a batch" in message, message
  repl.shutdown()


def test_scalar_elements_trace_on_the_fake_tpu():
  """Every case above, traced under TensorFlow's real TPUStrategy: what comes
  back has the step's structure, one row per core, and its dtypes."""
  cores = 8
  repl = testing.tpu_engine_on_fake_tpu(cores)
  got = repl.run(identity, range_input)
  assert got.shape == (cores,) and got.dtype == tf.int64

  def step_fn(c):
    x = tf.identity(42.0)
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = repl.all_sum(x) * c
    return {"sum": repl.all_sum(c), "grad": tape.gradient(y, x), "id": repl.replica_id}

  out = repl.run(step_fn, float_input)
  assert sorted(out) == ["grad", "id", "sum"]
  assert {key: (value.shape, value.dtype) for key, value in out.items()} == {
      "grad": ((cores,), tf.float32), "sum": ((cores,), tf.float32),
      "id": ((cores,), tf.int32)}
  w, seen, train = _scalar_regression(repl)
  out = repl.run(train, _repeated_input, steps=3)
  assert {key: (value.shape, value.dtype) for key, value in out.items()} == {
      "loss": ((cores,), tf.float32), "x": ((cores,), tf.float32)}
  assert w.dtype == tf.float32 and w.shape == () and seen.shape == ()
  repl.shutdown()
