"""reduce_scatter against NumPy: values, gradients and errors, on both engines."""

import numpy as np
import pytest
import tensorflow as tf

import catalogue
import replicator
from replicator import testing

SUM, MEAN = replicator.ReduceOp.SUM, replicator.ReduceOp.MEAN
# The in-graph engine at 1, 2 and 4 replicas; the strategy engine (the TPU
# emulator) at 2 and 4.
NAMES = ["gpu", "multi_gpu_2", "multi_gpu_4", "tpu_engine_2", "tpu_engine_4"]


def make(name):
  if name == "tpu_engine_4":
    return testing.tpu_engine_on_cpus(4)
  return catalogue.make(name)


def per_replica_value(r, dtype, rows):
  """Replica r's tensor: [rows, 3], distinct per replica, negative entries too."""
  base = np.arange(rows * 3).reshape(rows, 3) - 5
  return (base * (r + 1) - 2 * r).astype(dtype)


def value_of_each_replica(repl, dtype, rows):
  """This replica's `per_replica_value`, picked by its id inside the step."""
  table = np.stack([per_replica_value(r, dtype, rows) for r in range(repl.num_replicas)])
  return tf.gather(tf.constant(table), repl.replica_id)


def numpy_reduce_scatter(parts, op):
  """Replica r's slice: rows r*k .. (r+1)*k - 1 of the SUM or MEAN of `parts`."""
  stacked = np.stack(parts)
  reduced = stacked.sum(0) if op is SUM else stacked.mean(0)
  return np.split(reduced.astype(stacked.dtype), len(parts), axis=0)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("op", [SUM, MEAN])
def test_each_replica_gets_its_slice_of_the_reduction(name, op):
  repl = make(name)
  n = repl.num_replicas
  dtypes = [np.float32, np.float64] + ([np.int32] if op is SUM else [])

  def step_fn():
    nest = {np.dtype(d).name: value_of_each_replica(repl, d, 2 * n) for d in dtypes}
    # a list in the nest, of one row per replica
    nest["rows"] = [value_of_each_replica(repl, np.float32, n)]
    return repl.reduce_scatter(nest, op)

  out = repl.run(step_fn)
  for key in [np.dtype(d).name for d in dtypes] + ["rows"]:
    dtype, rows = (np.float32, n) if key == "rows" else (np.dtype(key), 2 * n)
    got = out[key][0] if key == "rows" else out[key]
    want = numpy_reduce_scatter([per_replica_value(r, dtype, rows) for r in range(n)], op)
    assert got.dtype == dtype and got.shape == (n, rows // n, 3)
    for r in range(n):
      if np.issubdtype(dtype, np.integer):
        np.testing.assert_array_equal(got[r], want[r])
      else:
        np.testing.assert_allclose(got[r], want[r], rtol=1e-6)


@pytest.mark.parametrize("name", ["multi_gpu_2", "multi_gpu_4", "tpu_engine_2",
                                  "tpu_engine_4"])
@pytest.mark.parametrize("op", [SUM, MEAN])
@pytest.mark.parametrize("how", ["GradientTape", "tf.gradients"])
def test_the_gradient_is_the_gather_of_every_replicas_upstream_slice(name, op, how):
  """Replica r's loss weighs its slice by c_r; its input's gradient is the
  concatenation of every replica's c_q (the sum of every replica's loss, as
  on one device), divided by N for a MEAN."""
  repl = make(name)
  n = repl.num_replicas
  rows = 2 * n
  rng = np.random.RandomState(5)
  upstream = rng.randn(n, rows // n, 3).astype(np.float32)  # c_r, per replica

  def step_fn():
    x = value_of_each_replica(repl, np.float32, rows)
    c = tf.gather(tf.constant(upstream), repl.replica_id)
    if how == "tf.gradients":
      return tf.gradients(tf.reduce_sum(c * repl.reduce_scatter(x, op)), x)[0]
    with tf.GradientTape() as tape:
      tape.watch(x)
      loss = tf.reduce_sum(c * repl.reduce_scatter(x, op))
    return tape.gradient(loss, x)

  got = repl.run(step_fn).numpy()
  want = np.concatenate(upstream, 0) / (n if op is MEAN else 1)
  for r in range(n):
    np.testing.assert_allclose(got[r], want, rtol=1e-6)


@pytest.mark.parametrize("name", ["multi_gpu_2", "tpu_engine_2"])
def test_integer_slices_are_exact_beyond_float_precision(name):
  """int32 sums beyond 2**24 (where a float32 path would round) and int64
  ones beyond 2**32 (which a TPU's sum carries as 16-bit limbs)."""
  repl = make(name)
  big = {"int32": np.array([[2**29 + 1], [-(2**29) - 3]], np.int32),
         "int64": np.array([[2**40 + 3, 7], [-(2**50) - 7, 2**61]], np.int64)}

  def step_fn():  # replica r adds r + 1
    return repl.reduce_scatter({k: tf.constant(v) + tf.cast(repl.replica_id + 1, v.dtype)
                                for k, v in big.items()})

  got = repl.run(step_fn)
  for key, value in big.items():
    want = 2 * value + 3
    for r in range(2):
      np.testing.assert_array_equal(got[key][r], want[r:r + 1])


@pytest.mark.parametrize("name", ["multi_gpu_4", "tpu_engine_4"])
def test_axis_0_must_divide_by_the_replicas(name):
  repl = make(name)
  with pytest.raises(ValueError, match=r"reduce_scatter: axis 0 of the value \(shape "
                     r"\(6, 2\)\) has 6 rows, not a multiple of the 4 replicas.*"
                     r"pad axis 0 to a multiple of 4"):
    repl.run(lambda: repl.reduce_scatter(tf.zeros([6, 2])))
  with pytest.raises(ValueError, match=r"reduce_scatter: axis 0 of tensor 1 of the 2 in the value "
                     r"\(shape \(2,\)\) has 2 rows, not a multiple of the 4 replicas"):
    repl.run(lambda: repl.reduce_scatter([tf.zeros([8]), tf.zeros([2])]))
  with pytest.raises(ValueError, match=r"reduce_scatter: the value is a scalar.*no axis 0.*"
                     r"all_reduce"):
    repl.run(lambda: repl.reduce_scatter(tf.constant(1.0)))


def test_axis_0_known_only_when_the_step_runs_is_refused():
  repl = make("multi_gpu_2")

  def step_fn():
    x = tf.range(8.0)
    return repl.reduce_scatter(tf.boolean_mask(x, x > 2.0))

  with pytest.raises(ValueError, match=r"reduce_scatter: axis 0 of the value \(shape "
                     r"\(None,\)\) is known only when the step runs.*tf.ensure_shape"):
    repl.run(step_fn)


@pytest.mark.parametrize("name", ["gpu", "multi_gpu_2", "tpu_engine_2"])
def test_ops_other_than_sum_and_mean_and_values_they_cannot_reduce_are_refused(name):
  repl = make(name)
  for op in (replicator.ReduceOp.MAX, replicator.ReduceOp.MIN):
    with pytest.raises(ValueError, match=rf"reduce_scatter: op must be ReduceOp.SUM or "
                       rf"ReduceOp.MEAN, got ReduceOp.{op.name}.*all_{op.name.lower()}"):
      repl.run(lambda op=op: repl.reduce_scatter(tf.zeros([4]), op))
  with pytest.raises(TypeError, match=r"op: expected a replicator.ReduceOp.*got 'sum'"):
    repl.run(lambda: repl.reduce_scatter(tf.zeros([4]), "sum"))
  with pytest.raises(TypeError, match=r"op: ReduceOp.MEAN needs floating values, got int32"):
    repl.run(lambda: repl.reduce_scatter(tf.zeros([4], tf.int32), MEAN))
  with pytest.raises(TypeError, match=r"op: ReduceOp.SUM of booleans"):
    repl.run(lambda: repl.reduce_scatter(tf.zeros([4], tf.bool)))
  with pytest.raises(TypeError, match=r"reduce_scatter: cannot reduce string values"):
    repl.run(lambda: repl.reduce_scatter(tf.constant(["a", "b"])))


def test_reduce_scatter_outside_a_step():
  repl = make("multi_gpu_2")
  with pytest.raises(RuntimeError, match="reduce_scatter is only valid while a step runs"):
    repl.reduce_scatter(tf.zeros([2]))
