"""Every collective against NumPy, for 1, 2 and 4 replicas, nests and dtypes."""

import os

import numpy as np
import pytest
import sonnet as snt
import tensorflow as tf

import catalogue
import replicator
from replicator.collectives import between_workers
from replicator.multiworker import cluster
from replicator.collectives import reductions
from replicator.collectives import gathering
from replicator import mesh as mesh_lib

DTYPES = [np.float32, np.float64, np.int32, np.int64]
# Relative rounding bound of each compression (half an ulp is 2**-8 / 2**-11).
ROUNDING = {replicator.Compression.BF16: 2.0**-7, replicator.Compression.FP16: 2.0**-10}


def per_replica_value(r, dtype, shape=(3, 2)):
  base = np.arange(np.prod(shape)).reshape(shape) - 2
  return (base * (r + 1) + r).astype(dtype)


def run_collective(repl, fn):
  n = repl.num_replicas

  def step_fn():
    r = repl.replica_id
    values = {}
    for dtype in DTYPES:
      table = tf.constant(np.stack([per_replica_value(i, dtype) for i in range(n)]))
      values[np.dtype(dtype).name] = tf.gather(table, r)
    return fn(values)

  return tf.nest.map_structure(lambda t: t.numpy(), repl.run(step_fn))


@pytest.mark.parametrize("name", ["gpu", "multi_gpu_2", "multi_gpu_4", "tpu_engine_2"])
@pytest.mark.parametrize("op", list(replicator.ReduceOp))
def test_all_reduce_matches_numpy(name, op):
  repl = catalogue.make(name)
  n = repl.num_replicas
  numpy_op = {"SUM": np.sum, "MEAN": np.mean, "MAX": np.max, "MIN": np.min}[op.name]

  def fn(values):
    if op is replicator.ReduceOp.MEAN:
      values = {k: v for k, v in values.items() if k.startswith("float")}
    return repl.all_reduce(values, op)

  out = run_collective(repl, fn)
  for key, got in out.items():
    stacked = np.stack([per_replica_value(i, np.dtype(key)) for i in range(n)])
    want = numpy_op(stacked, axis=0).astype(key)
    assert got.shape == (n,) + want.shape
    assert got.dtype == np.dtype(key)
    for r in range(n):
      np.testing.assert_allclose(got[r], want, rtol=1e-6)


@pytest.mark.parametrize("name", ["gpu", "multi_gpu_2", "multi_gpu_4", "tpu_engine_2"])
def test_all_gather_and_broadcast_match_numpy(name):
  repl = catalogue.make(name)
  n = repl.num_replicas
  source = n - 1
  out = run_collective(repl, lambda v: {
      "gather0": repl.all_gather(v, axis=0),
      "gather1": repl.all_gather(v["float32"], axis=1),
      "broadcast": repl.broadcast(v, source_replica=source),
  })
  for key in out["gather0"]:
    parts = [per_replica_value(i, np.dtype(key)) for i in range(n)]
    for r in range(n):
      np.testing.assert_array_equal(out["gather0"][key][r], np.concatenate(parts, 0))
      np.testing.assert_array_equal(out["broadcast"][key][r], parts[source])
  parts = [per_replica_value(i, np.float32) for i in range(n)]
  for r in range(n):
    np.testing.assert_array_equal(out["gather1"][r], np.concatenate(parts, 1))


def _reduce_in_graph(values, options, op=replicator.ReduceOp.SUM, count=("AddN", "AddV2")):
  """The reduction of `values` over 2 replicas, and the ops of types `count` in its graph."""
  devices = ["/device:CPU:0", "/device:CPU:1"]

  @tf.function
  def fn():
    return reductions.all_reduce(
        [[tf.constant(v) for v in replica] for replica in values], op, devices, options)

  graph = fn.get_concrete_function().graph
  return fn(), [o for o in graph.get_operations() if o.type in count]


def test_gradients_are_packed_into_buckets():
  rng = np.random.RandomState(0)
  shapes = [(10,), (4, 5), (3,), (7, 2), (1,)] * 4  # 20 tensors, 84 floats each 5
  values = [[rng.randn(*s).astype(np.float32) for s in shapes] for _ in range(2)]
  values[0].append(np.arange(3, dtype=np.int32))  # a second dtype: its own bucket
  values[1].append(np.arange(3, dtype=np.int32))
  unlimited, adds = _reduce_in_graph(values, replicator.AllReduceOptions())
  assert len(adds) == 2  # one per dtype, not one per tensor
  small, adds_small = _reduce_in_graph(
      values, replicator.AllReduceOptions(pack_bytes=84 * 4))
  assert 2 < len(adds_small) < len(shapes)
  for result in (unlimited, small):
    for r in range(2):
      for got, a, b in zip(result[r], values[0], values[1]):
        np.testing.assert_allclose(got.numpy(), a + b, rtol=1e-6)


@pytest.mark.parametrize("compression,sum_in_float32", [
    (c, False) for c in replicator.Compression] + [(replicator.Compression.BF16, True)])
@pytest.mark.parametrize("op", [replicator.ReduceOp.SUM, replicator.ReduceOp.MEAN])
def test_large_tensors_come_back_as_aligned_slices_of_the_sum(compression, sum_in_float32, op):
  """A bucket of large tensors is unpacked with slices that start on the 64-byte
  alignment (so they share the sum's buffer), sizes that are not multiples of
  it included, with the same numbers as one tensor at a time."""
  rng = np.random.RandomState(4)
  shapes = [(200, 301), (17,), (3, 33333), (20000,)]  # 90 KB a tensor in bf16
  values = [[rng.randn(*s).astype(np.float32) for s in shapes] for _ in range(2)]
  options = replicator.AllReduceOptions(compression=compression,
                                        sum_in_float32=sum_in_float32)
  result, ops = _reduce_in_graph(values, options, op, count=("Slice", "Split", "SplitV"))
  assert sorted({o.type for o in ops}) == ["Slice"] and len(ops) == 2 * len(shapes)
  wire = compression.value or tf.float32
  for slice_op in ops:
    begin = int(tf.get_static_value(slice_op.inputs[1])[0])
    assert begin * wire.size % 64 == 0
  bound = 1.5 * ROUNDING[compression] if compression in ROUNDING else 1e-6
  divisor = 2 if op is replicator.ReduceOp.MEAN else 1
  for r in range(2):
    for got, a, b in zip(result[r], values[0], values[1]):
      assert got.shape == a.shape and got.dtype == tf.float32
      want = (a.astype(np.float64) + b) / divisor
      np.testing.assert_array_less(np.abs(got.numpy() - want),
                                   bound * (np.abs(a) + np.abs(b)) / divisor + 1e-12)


def test_run_time_sizes_take_one_key_per_padded_size():
  """A collective of a run-time shape travels padded to its size class; a key
  per class. TensorFlow aborts every collective when a key it saw carries
  another shape, so two padded sizes must never share a class."""
  rng = np.random.RandomState(0)
  sizes = np.concatenate([
      np.arange(5000), rng.randint(1, 2**62, 20000),
      [2**k + d for k in range(7, 62) for d in (-1, 0, 1)]]).astype(np.int64)
  padded, classes = (t.numpy() for t in tf.function(between_workers._size_class)(
      tf.constant(sizes)))
  assert np.all(padded >= sizes) and np.all((padded - sizes) * 64 <= sizes)
  assert np.all(padded[sizes < 128] == sizes[sizes < 128])
  assert classes.min() >= 0 and classes.max() < cluster.CollectiveKeys._CLASSES_PER_SLOT
  by_class = {}
  for size_class, size in zip(classes, padded):
    assert by_class.setdefault(size_class, size) == size, (size_class, size)
  assert len(set(padded.tolist())) == len(by_class)  # and one class per size
  # Padded to a size class, a 1-D collective's shape names its key's class.
  padded_again, _ = (t.numpy() for t in tf.function(between_workers._size_class)(
      tf.constant(padded)))
  np.testing.assert_array_equal(padded_again, padded)


@pytest.mark.parametrize("static", [True, False])
def test_gather_across_workers_sends_sizes_only_for_shapes_not_static(static):
  """Parts of a static shape are every worker's (the program check compares
  static shapes): one collective each. Others first exchange their shapes."""
  workers = cluster.CollectiveKeys(num_workers=2, worker_index=0, timeout_s=0)
  spec = tf.TensorSpec([3, 4] if static else [None, 4], tf.float32)

  @tf.function(input_signature=[spec, spec])
  def fn(a, b):
    return gathering.all_gather([[a, b]], 0, ["/device:CPU:0"], keys=workers)

  graph = fn.get_concrete_function().graph
  gathers = [op for op in graph.get_operations() if op.type == "CollectiveGatherV2"]
  assert len(gathers) == (2 if static else 3)
  assert workers.issued == len(gathers)


def test_buckets_cross_workers_last_layer_first():
  """Collectives between workers run in the order they are built, so the first
  bucket must hold the last tensors (the first gradients the backward pass
  produces) for the transfer to overlap it."""
  sizes = [40, 30, 20, 10, 5]  # float32 tensors, first layer first
  workers = cluster.CollectiveKeys(num_workers=2, worker_index=0, timeout_s=0)

  @tf.function
  def fn():
    values = [[tf.constant(np.ones(n, np.float32), name=f"layer{i}")
               for i, n in enumerate(sizes)]]
    return reductions.all_reduce(
        values, replicator.ReduceOp.SUM, ["/device:CPU:0"],
        replicator.AllReduceOptions(pack_bytes=30 * 4), num_replicas=2, keys=workers)

  graph = fn.get_concrete_function().graph
  reduce_ops = [op for op in graph.get_operations() if op.type == "CollectiveReduceV2"]

  def layers_feeding(op):
    seen, stack, layers = set(), [op], set()
    while stack:
      node = stack.pop()
      if node.name.startswith("layer"):
        layers.add(int(node.name[len("layer"):]))
      for tensor in node.inputs:
        if tensor.op not in seen and tensor.op.type != "CollectiveReduceV2":
          seen.add(tensor.op)
          stack.append(tensor.op)
    return layers

  # Built (and so sent) in this order: {10, 5}, {20}, {30}, {40} floats.
  assert [layers_feeding(op) for op in reduce_ops] == [{3, 4}, {2}, {1}, {0}]


def _five_buckets_between_two_workers(in_flight, crowded=False):
  """The graph of a sum of 5 one-tensor buckets between 2 workers (traced only)."""
  workers = cluster.CollectiveKeys(num_workers=2, worker_index=0, timeout_s=0)
  workers.crowded = crowded

  @tf.function
  def fn():
    values = [[tf.constant(np.ones(10, np.float32)) for _ in range(5)]]
    return reductions.all_reduce(
        values, replicator.ReduceOp.SUM, ["/device:CPU:0"],
        replicator.AllReduceOptions(pack_bytes=40, buckets_in_flight=in_flight),
        num_replicas=2, keys=workers)

  return fn.get_concrete_function().graph


@pytest.mark.parametrize("in_flight", [1, 2, 3])
def test_buckets_in_flight_wait_only_for_their_lane(in_flight):
  """With k buckets in flight, bucket i's collective waits for bucket i - k
  only (same ordering token); with 1 every collective waits for the previous
  one, as tf.function orders collectives without tokens."""
  graph = _five_buckets_between_two_workers(in_flight)
  reduce_ops = [op for op in graph.get_operations() if op.type == "CollectiveReduceV2"]
  assert len(reduce_ops) == 5
  for i, op in enumerate(reduce_ops):
    waits_for = [reduce_ops.index(c) for c in op.control_inputs if c in reduce_ops]
    assert waits_for == ([i - in_flight] if i >= in_flight else []), (i, waits_for)
    tokens = [t.op for t in op.inputs if t.dtype == tf.resource]
    assert len(tokens) == (0 if in_flight == 1 else 1)
    if in_flight > 1 and i >= in_flight:
      assert tokens == [t.op for t in reduce_ops[i - in_flight].inputs
                        if t.dtype == tf.resource]


@pytest.mark.parametrize("num_workers,local,compression,divided_first", [
    (2, 1, "NONE", False), (3, 1, "NONE", False), (2, 1, "BF16", False),
    (4, 1, "BF16", False), (3, 1, "BF16", False),
    (2, 1, "FP16", True),  # divided before the sum, which could overflow
    (2, 2, "NONE", False), (2, 2, "BF16", False),
    (2, 2, "FP16", True),
    (1, 2, "NONE", False),  # one worker: no ring; the replicas' sum divided once
])
def test_a_mean_is_divided_once_after_the_sum_or_float16_before_it(
    num_workers, local, compression, divided_first):
  """The ring only sums (its final op is the identity); the sum is divided
  once, after the collective, for all local replicas (before it is handed to
  each). A float16 mean divides each replica's bucket before the sum."""
  workers = cluster.CollectiveKeys(num_workers=num_workers, worker_index=0, timeout_s=0)
  devices = ["/device:CPU:0"] * local

  @tf.function
  def fn():
    values = [[tf.constant(np.ones(10, np.float32)) for _ in range(3)]
              for _ in range(local)]
    return reductions.all_reduce(
        values, replicator.ReduceOp.MEAN, devices, replicator.AllReduceOptions(
            compression=replicator.Compression[compression]),
        num_replicas=local * num_workers, keys=workers)

  graph = fn.get_concrete_function().graph
  reduce_ops = [op for op in graph.get_operations() if op.type == "CollectiveReduceV2"]
  assert [op.get_attr("final_op") for op in reduce_ops] == (
      [] if num_workers == 1 else [b"Id"])
  divisions = [op for op in graph.get_operations() if op.type in ("RealDiv", "Div")]
  assert len(divisions) == (local if divided_first else 1), divisions
  sums = {op.name for op in graph.get_operations()
          if op.type in ("AddN", "CollectiveReduceV2")}
  for division in divisions:  # before a sum, or after every one
    feeds_a_sum = any(c.name in sums for c in division.outputs[0].consumers())
    assert feeds_a_sum == divided_first, division


def _traced_mean_of_ones(devices, compression, **kwargs):
  """The graph of a mean of 3 float32 tensors a replica, one replica a device."""
  @tf.function
  def fn():
    values = []
    for device in devices:
      with tf.device(device):
        values.append([tf.constant(np.ones(10, np.float32)) for _ in range(3)])
    return reductions.all_reduce(
        values, replicator.ReduceOp.MEAN, devices, replicator.AllReduceOptions(
            compression=replicator.Compression[compression]), **kwargs)

  return fn.get_concrete_function().graph


@pytest.mark.parametrize("kind,compression,widened_where", [
    ("CPU", "BF16", ["CPU:0"]),  # once, then handed on (memory the devices share)
    ("GPU", "BF16", ["GPU:0", "GPU:1"]),  # the narrow sum crosses, each GPU widens
    ("GPU", "NONE", []),
])
def test_a_compressed_sum_is_widened_once_on_cpus_and_on_each_gpu(
    kind, compression, widened_where):
  """Traced only (no GPU runs here): where the casts back to float32 sit."""
  workers = cluster.CollectiveKeys(num_workers=2, worker_index=0, timeout_s=0)
  graph = _traced_mean_of_ones([f"/device:{kind}:{i}" for i in range(2)], compression,
                               num_replicas=4, keys=workers)
  widened = sorted(op.device.split("device:")[-1] for op in graph.get_operations()
                   if op.type == "Cast" and op.get_attr("SrcT") == tf.bfloat16)
  assert widened == widened_where


@pytest.mark.parametrize("crowded,in_flight,lanes", [
    (False, None, 2), (True, None, 1), (True, 3, 3), (False, 1, 1)])
def test_a_crowded_host_sends_buckets_one_at_a_time_unless_told(crowded, in_flight, lanes):
  """By default 2 buckets cross side by side, 1 where the host runs more
  workers than it has cores (they would compete for the cores); a number
  given is kept."""
  graph = _five_buckets_between_two_workers(in_flight, crowded)
  tokens = {op.name for op in graph.get_operations() if op.type == "VarHandleOp"}
  assert len(tokens) == (0 if lanes == 1 else lanes)


def test_a_host_is_crowded_with_more_of_the_jobs_workers_than_cores(monkeypatch):
  monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
  addresses = ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3", "10.0.0.2:4"]
  crowded = [cluster.host_is_crowded(mesh_lib.Mesh(["CPU:0"], 4, w, addresses))
             for w in range(4)]
  assert crowded == [True, True, True, False]  # 3 on 2 cores; 1 on 2
  assert not cluster.host_is_crowded(mesh_lib.Mesh(["CPU:0"], 4, 0, addresses[1:] + ["a:5"]))


def test_one_worker_or_one_bucket_has_no_lanes():
  """Nothing to overlap: no tokens, the plain chain."""
  for num_workers, pack_bytes in ((1, 40), (2, 2**20)):
    workers = cluster.CollectiveKeys(num_workers=num_workers, worker_index=0, timeout_s=0)

    @tf.function
    def fn():
      values = [[tf.constant(np.ones(10, np.float32)) for _ in range(3)]]
      return reductions.all_reduce(
          values, replicator.ReduceOp.SUM, ["/device:CPU:0"],
          replicator.AllReduceOptions(pack_bytes=pack_bytes, buckets_in_flight=4),
          num_replicas=2 * num_workers, keys=workers)

    graph = fn.get_concrete_function().graph
    assert not [op for op in graph.get_operations() if op.type == "VarHandleOp"]



def test_benchmarks_name_the_library_default_buckets():
  """RESULTS.md marks "(the default)" and the all-reduce benchmark runs it."""
  from benchmarks.runs import allreduce as bench  # pylint: disable=g-import-not-at-top
  from benchmarks.report import sections  # pylint: disable=g-import-not-at-top
  options = replicator.AllReduceOptions()
  # buckets in flight where a host has a core per worker (else 1)
  default = (options.pack_bytes // 2**20, options.lanes(crowded=False))
  assert options.pack_bytes == default[0] * 2**20
  assert sections.DEFAULT_BUCKETS == default
  named = {f"ours {dtype}, {default[0]}MB buckets, {default[1]} in flight"
           for dtype in ("fp32", "bf16")}
  assert named <= set(bench.VARIANTS)
  assert all(sections.variant_label(v).endswith("(the default)") for v in named)

@pytest.mark.parametrize("compression,bound", list(ROUNDING.items()))
def test_compressed_all_reduce_error_is_bounded(compression, bound):
  rng = np.random.RandomState(1)
  values = [[rng.randn(1000).astype(np.float32)] for _ in range(2)]
  result, _ = _reduce_in_graph(values, replicator.AllReduceOptions(compression=compression))
  exact = values[0][0].astype(np.float64) + values[1][0]
  got = result[0][0].numpy()
  assert got.dtype == np.float32
  scale = np.abs(values[0][0]) + np.abs(values[1][0])
  # Two roundings of the inputs and one of the sum, each within half an ulp.
  assert np.all(np.abs(got - exact) <= 1.5 * bound * scale + 1e-12)
  assert np.max(np.abs(got - exact)) > 0  # it really was compressed


@pytest.mark.parametrize("compression", [
    replicator.Compression.BF16, replicator.Compression.FP16])
def test_compressed_mean_of_a_packed_bucket(compression):
  """Many tensors, one compressed bucket: each comes back in its own shape and
  dtype, within the rounding bound, and the bucket is concatenated narrow."""
  rng = np.random.RandomState(3)
  shapes = [(10,), (4, 5), (3,), (7, 2), (1,)] * 3
  values = [[rng.randn(*s).astype(np.float32) for s in shapes] for _ in range(2)]
  values[0].append(np.arange(3, dtype=np.int32))  # not floating: never compressed
  values[1].append(np.arange(3, dtype=np.int32) * 5)
  options = replicator.AllReduceOptions(compression=compression)
  summed, _ = _reduce_in_graph(values, options)
  averaged, concats = _reduce_in_graph([replica[:-1] for replica in values], options,
                                       replicator.ReduceOp.MEAN, count=("ConcatV2",))
  assert concats and all(op.outputs[0].dtype == compression.value for op in concats)
  bound = ROUNDING[compression]
  for r in range(2):
    for got, a, b in zip(summed[r][:-1], values[0], values[1]):
      assert got.dtype == tf.float32 and got.shape == a.shape
      scale = np.abs(a) + np.abs(b)
      np.testing.assert_array_less(np.abs(got.numpy() - (a.astype(np.float64) + b)),
                                   1.5 * bound * scale + 1e-12)
    for got, a, b in zip(averaged[r], values[0], values[1]):
      scale = (np.abs(a) + np.abs(b)) / 2
      np.testing.assert_array_less(
          np.abs(got.numpy() - (a.astype(np.float64) + b) / 2), 1.5 * bound * scale + 1e-12)
    np.testing.assert_array_equal(summed[r][-1], np.arange(3) * 6)


@pytest.mark.parametrize("compression,bound", list(ROUNDING.items()))
def test_sum_in_float32_rounds_each_value_once_and_never_the_sum(compression, bound):
  rng = np.random.RandomState(2)
  values = [[rng.randn(1000).astype(np.float32)] for _ in range(2)]
  options = replicator.AllReduceOptions(compression=compression, sum_in_float32=True)
  result, _ = _reduce_in_graph(values, options)
  exact = values[0][0].astype(np.float64) + values[1][0]
  got = result[0][0].numpy()
  scale = np.abs(values[0][0]) + np.abs(values[1][0])
  assert np.all(np.abs(got - exact) <= 0.5 * bound * scale + 1e-6 * scale)
  # 256 + 1.5 are both exact in 8 mantissa bits; their sum is not: bfloat16
  # addition gives 258, a float32 sum of the bfloat16 values the exact 257.5.
  pair = [[np.array([256.0], np.float32)], [np.array([1.5], np.float32)]]
  narrow, _ = _reduce_in_graph(
      pair, replicator.AllReduceOptions(compression=replicator.Compression.BF16))
  wide, _ = _reduce_in_graph(pair, replicator.AllReduceOptions(
      compression=replicator.Compression.BF16, sum_in_float32=True))
  assert narrow[0][0].numpy()[0] == 258.0
  assert wide[0][0].numpy()[0] == 257.5


def test_sum_in_float32_without_compression_is_an_error():
  with pytest.raises(ValueError, match="sum_in_float32.*compression"):
    replicator.AllReduceOptions(sum_in_float32=True)


@pytest.mark.parametrize("name", ["multi_gpu_2", "multi_gpu_4", "tpu_engine_2"])
@pytest.mark.parametrize("kind", ["sum", "mean", "max", "gather", "broadcast"])
@pytest.mark.parametrize("how", ["GradientTape", "tf.gradients"])
def test_gradients_flow_through_collectives_as_on_one_device(name, kind, how):
  """mean_r d loss_r / dw equals d/dw of mean_r loss_r computed on one device.

  Both of TensorFlow's ways to differentiate a graph take the collective's
  gradient (a tape's record, and the gradient registered for its op).
  """
  repl = catalogue.make(name)
  n = repl.num_replicas
  rng = np.random.RandomState(3)
  data = rng.randn(n, 5).astype(np.float32)
  weights = rng.randn(n, 5 * n if kind == "gather" else 5).astype(np.float32)
  start = rng.randn(5).astype(np.float32)
  with repl.context():
    w = tf.Variable(start)

  def collective(x):
    return {"sum": repl.all_sum, "mean": repl.all_mean, "max": repl.all_max,
            "gather": repl.all_gather,
            "broadcast": lambda v: repl.broadcast(v, source_replica=n - 1)}[kind](x)

  def step_fn():
    r = repl.replica_id
    if how == "tf.gradients":
      v = tf.identity(w)
      y = collective(tf.tanh(v * tf.gather(data, r)))
      return repl.all_mean(tf.gradients(tf.reduce_sum(y * tf.gather(weights, r)), v)[0])
    with tf.GradientTape() as tape:
      y = collective(tf.tanh(w * tf.gather(data, r)))
      loss = tf.reduce_sum(y * tf.gather(weights, r))
    return repl.all_mean(tape.gradient(loss, w))

  got = repl.run(step_fn).numpy()

  v = tf.Variable(start)
  with tf.GradientTape() as tape:
    xs = [tf.tanh(v * data[r]) for r in range(n)]
    y = {"sum": lambda: tf.add_n(xs), "mean": lambda: tf.add_n(xs) / n,
         "max": lambda: tf.reduce_max(tf.stack(xs), 0),
         "gather": lambda: tf.concat(xs, 0), "broadcast": lambda: xs[n - 1]}[kind]()
    total = tf.reduce_mean(tf.stack([tf.reduce_sum(y * weights[r]) for r in range(n)]))
  want = tape.gradient(total, v).numpy()
  for r in range(n):
    np.testing.assert_allclose(got[r], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["gpu", "multi_gpu_4", "tpu_engine_2"])
def test_scalars_and_booleans(name):
  """all_gather of scalars is a vector; all_max / all_min of booleans are any / all."""
  repl = catalogue.make(name)
  n = repl.num_replicas
  with repl.context():
    w = tf.Variable(2.0)

  def step_fn():
    r = tf.cast(repl.replica_id, tf.float32)
    with tf.GradientTape() as tape:
      gathered = repl.all_gather(w * (r + 1.0))
      loss = tf.reduce_sum(gathered * tf.range(1.0, n + 1.0))
    last = tf.equal(repl.replica_id, n - 1)
    return {"gathered": gathered, "grad": repl.all_mean(tape.gradient(loss, w)),
            "any": repl.all_max(last), "all": repl.all_min(last),
            "all_true": repl.all_min(tf.stack([tf.constant(True), last]))}

  out = repl.run(step_fn)
  ranks = np.arange(1.0, n + 1.0)
  for r in range(n):
    np.testing.assert_allclose(out["gathered"][r], 2.0 * ranks)
    # every replica's loss is sum_r (r+1)^2 w: its gradient, as on one device
    np.testing.assert_allclose(out["grad"][r], np.sum(ranks ** 2))
  np.testing.assert_array_equal(out["any"], [True] * n)
  np.testing.assert_array_equal(out["all"], [n == 1] * n)
  np.testing.assert_array_equal(out["all_true"], [[True, n == 1]] * n)
  assert out["any"].dtype == tf.bool
  with pytest.raises(TypeError, match=r"op: ReduceOp.SUM of booleans; use ReduceOp.MAX"):
    repl.run(lambda: repl.all_sum(tf.constant(True)))
  with pytest.raises(ValueError, match="axis: all_gather of scalars takes axis 0, got 1"):
    repl.run(lambda: repl.all_gather(tf.constant(1.0), axis=1))


@pytest.mark.parametrize("name", ["multi_gpu_2", "multi_gpu_4", "tpu_engine_2"])
@pytest.mark.parametrize("kind", ["max", "min"])
def test_replicas_that_tie_share_the_gradient_of_all_max_and_all_min(name, kind):
  """As tf.reduce_max over the stacked values: the tied replicas split the
  gradient, element by element (each got all of it, N times too much on N)."""
  repl = catalogue.make(name)
  n = repl.num_replicas
  # Element 0 ties on every replica, element 1 on all but the last, element 2 nowhere.
  scales = np.array([[1.0, 2.0, 0.5 * (r + 1)] for r in range(n)], np.float32)
  scales[-1, 1] = -2.0 if kind == "max" else 4.0
  weights = np.random.RandomState(5).randn(n, 3).astype(np.float32)
  with repl.context():
    w = tf.Variable([1.5, 1.0, 2.0])
  collective = repl.all_max if kind == "max" else repl.all_min

  def step_fn():
    r = repl.replica_id
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(collective(w * tf.gather(scales, r)) * tf.gather(weights, r))
    return repl.all_mean(tape.gradient(loss, w))

  got = repl.run(step_fn).numpy()
  v = tf.Variable([1.5, 1.0, 2.0])
  reduce = tf.reduce_max if kind == "max" else tf.reduce_min
  with tf.GradientTape() as tape:
    y = reduce(tf.stack([v * scales[r] for r in range(n)]), 0)
    total = tf.reduce_mean(tf.stack([tf.reduce_sum(y * weights[r]) for r in range(n)]))
  want = tape.gradient(total, v).numpy()
  for r in range(n):
    np.testing.assert_allclose(got[r], want, rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("compression,sum_in_float32,rtol", [
    (replicator.Compression.NONE, False, 2.0**-11),
    (replicator.Compression.FP16, False, 1.5 * 2.0**-11),
    (replicator.Compression.FP16, True, 1.5 * 2.0**-11),
    (replicator.Compression.BF16, False, 1.5 * 2.0**-8)])
def test_a_float16_mean_that_fits_does_not_overflow(dtype, compression, sum_in_float32, rtol):
  """The sum of 4 replicas' float16 values passes 65504 (inf) where their mean does not."""
  if compression is replicator.Compression.NONE and dtype == np.float32:
    pytest.skip("nothing travels in float16")
  repl = catalogue.make("multi_gpu_4")
  values = np.array([[2e4, 3e4, 1e4 * (r + 3), 1.0 + r] for r in range(4)], dtype)
  options = replicator.AllReduceOptions(compression=compression,
                                        sum_in_float32=sum_in_float32)
  got = repl.run(lambda: repl.all_reduce(
      tf.gather(tf.constant(values), repl.replica_id), replicator.ReduceOp.MEAN,
      options=options)).numpy()
  assert got.dtype == dtype
  want = values.astype(np.float64).mean(0)
  for r in range(4):
    np.testing.assert_allclose(got[r], want, rtol=rtol)


def test_a_float16_variable_trained_on_a_large_mean_gradient():
  repl = catalogue.make("multi_gpu_4")
  with repl.context():
    w = tf.Variable(tf.zeros([1], tf.float16))
    optimizer = repl.wrap_optimizer(snt.optimizers.SGD(1e-4))

  def step_fn():
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(w * tf.constant(20000.0, tf.float16))
    optimizer.apply(tape.gradient(loss, [w]), [w])
    return w.read_value()

  np.testing.assert_array_equal(repl.run(step_fn).numpy(), [[-2.0]] * 4)  # not -inf


def test_fp16_compression_range():
  """FP16's error bound holds inside its range only: a sum above 65504 is inf and a
  value below 3e-8 (times N for a mean) is 0. BF16 keeps float32's range."""
  values = [[np.array([40000.0, 1e5, 1e-8, 1e-7, 3e-5], np.float32)] for _ in range(2)]
  fp16 = replicator.AllReduceOptions(compression=replicator.Compression.FP16)
  bf16 = replicator.AllReduceOptions(compression=replicator.Compression.BF16)
  summed = _reduce_in_graph(values, fp16)[0][0][0].numpy()
  averaged = _reduce_in_graph(values, fp16, replicator.ReduceOp.MEAN)[0][0][0].numpy()
  np.testing.assert_array_equal(summed[:3], [np.inf, np.inf, 0.0])
  np.testing.assert_allclose(summed[3:], [2e-7, 6e-5], rtol=0.2)  # subnormal: coarse
  np.testing.assert_array_equal(averaged[:1], [40000.0])  # divided first: fits
  assert averaged[1] == np.inf and averaged[2] == 0.0
  # 1e-7 / 2 rounds to the subnormal 5.96e-8
  np.testing.assert_allclose(averaged[3:], [1e-7, 3e-5], rtol=0.5)
  for op, divisor in ((replicator.ReduceOp.SUM, 1), (replicator.ReduceOp.MEAN, 2)):
    got = _reduce_in_graph(values, bf16, op)[0][0][0].numpy()
    np.testing.assert_allclose(got, 2 * values[0][0] / divisor, rtol=2.0**-7)


def test_wrap_optimizer_warns_once_about_fp16_gradients(caplog):
  from replicator import optimizers  # pylint: disable=g-import-not-at-top
  optimizers._warned_fp16.clear()  # pylint: disable=protected-access
  repl = catalogue.make("multi_gpu_2")
  fp16 = replicator.AllReduceOptions(compression=replicator.Compression.FP16)
  with caplog.at_level("WARNING"):
    for _ in range(2):
      repl.wrap_optimizer(snt.optimizers.SGD(0.1), all_reduce=fp16)
    repl.wrap_optimizer(snt.optimizers.SGD(0.1), all_reduce=replicator.AllReduceOptions(
        compression=replicator.Compression.BF16))
  warnings = [r for r in caplog.records if "Compression.FP16" in r.getMessage()]
  assert len(warnings) == 1 and "65504" in warnings[0].getMessage()


@pytest.mark.parametrize("axis", [0, 1])
def test_all_gather_gradient_with_uneven_batches(axis):
  """Parts of 5, 5, 5 and 1 rows: each replica's gradient is its own part of the
  gathered gradient, as on one device (an equal split failed)."""
  repl = catalogue.make("multi_gpu_4")
  rng = np.random.RandomState(6)
  data = rng.randn(16, 2).astype(np.float32)
  weights = rng.randn(4, 16, 2).astype(np.float32)

  def input_fn(ctx):
    return replicator.allow_uneven_batches(tf.data.Dataset.from_tensor_slices(data).batch(5))

  with repl.context():
    w = tf.Variable([1.0, -2.0])
  along = (lambda t: t) if axis == 0 else tf.transpose

  def step_fn(x):
    with tf.GradientTape() as tape:
      gathered = along(repl.all_gather(along(tf.tanh(x * w)), axis=axis))
      loss = tf.reduce_sum(gathered ** 2 * tf.gather(weights, repl.replica_id))
    return repl.all_sum(tape.gradient(loss, w))

  got = repl.run(step_fn, input_fn).numpy()
  v = tf.Variable([1.0, -2.0])
  with tf.GradientTape() as tape:
    gathered = tf.tanh(data * v)
    total = tf.add_n([tf.reduce_sum(gathered ** 2 * weights[r]) for r in range(4)])
  want = tape.gradient(total, v).numpy()
  for r in range(4):
    np.testing.assert_allclose(got[r], want, rtol=1e-5)


def test_all_gather_gradient_of_static_parts_that_differ_between_replicas():
  """Rows picked by replica_id (2, 3, 2 and 3 of a 10-row table): each
  replica's size is static in its own trace, and differs between them (the
  gradient took replica 0's size for every replica)."""
  repl = catalogue.make("multi_gpu_4")
  table = np.arange(30, dtype=np.float32).reshape(10, 3)
  bounds = [r * 10 // 4 for r in range(5)]

  def step_fn():
    r = repl.replica_id
    x = tf.constant(table)[r * 10 // 4:(r + 1) * 10 // 4]
    with tf.GradientTape() as tape:
      tape.watch(x)
      gathered = repl.all_gather(x)
      # d loss / d gathered: the table (sliced: the build trace, of replica 0
      # alone, sees 4 x 2 rows)
      loss = tf.reduce_sum(gathered * tf.constant(table)[:tf.shape(gathered)[0]])
    grad = tf.reshape(tape.gradient(loss, x), [-1])
    return tf.pad(grad, [[0, 9 - tf.size(grad)]])

  got = repl.run(step_fn).numpy()
  for r in range(4):  # every replica's loss weighs replica r's rows alike
    want = 4 * table[bounds[r]:bounds[r + 1]].ravel()
    np.testing.assert_array_equal(got[r][:want.size], want)


@pytest.mark.parametrize("split,compression,nccl", [
    (False, "NONE", True),
    (False, "BF16", False),  # NcclAllReduce takes no bfloat16: an add_n on GPU:0
    (False, "FP16", True),
    (True, "NONE", False),  # two logical GPUs of one GPU: NCCL refuses them
])
def test_gpus_sum_by_nccl_only_where_nccl_takes_the_dtype_and_the_gpus(
    monkeypatch, split, compression, nccl):
  """Traced only (no GPU runs here). Both refusals were seen on the device
  machine: a TypeError at trace for bfloat16, "NCCL: invalid usage" at run
  time between logical GPUs of one H200."""
  monkeypatch.setattr(reductions, "_gpus_split", lambda: split)
  devices = ["/device:GPU:0", "/device:GPU:1"]
  types = [op.type for op in _traced_mean_of_ones(devices, compression).get_operations()]
  assert ("NcclAllReduce" in types) == nccl
  assert ("AddN" in types) == (not nccl)
  assert reductions._by_nccl(devices) == (not split)  # pylint: disable=protected-access
