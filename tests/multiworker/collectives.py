"""A worker of the multi-worker tests: every collective across workers, saved.

  python -m replicator.launch --workers 2 --devices-per-worker 2 -- \
      python tests/multiworker/collectives.py --out DIR

Replica r (global id) contributes `value(r)`; the test compares what each
worker got with NumPy.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # pylint: disable=g-import-not-at-top
import numpy as np
import tensorflow as tf

import replicator


def value(replica: int, dtype=np.float32) -> np.ndarray:
  """Replica `replica`'s contribution: distinct per replica, negative entries too."""
  base = np.arange(12, dtype=np.float64).reshape(3, 4) - 5
  return (base * (replica + 1) + 0.25 * replica).astype(dtype)


def uneven_batches(worker: int):
  """Worker `worker`'s batches for `uneven_input`: two steps of two replicas."""
  if worker == 0:
    return [[0, 1], [2, 3], [4, 5], [6]]
  return [[100, 101], [102, 103], [104], [105]]


def uneven_input(worker: int):
  def input_fn(ctx):
    del ctx
    batches = uneven_batches(worker)
    ds = tf.data.Dataset.from_tensor_slices(tf.ragged.constant(batches, tf.float32))
    return replicator.allow_uneven_batches(ds.map(lambda b: b))  # dense [None]
  return input_fn


SLICE_BOUNDS = [0, 2, 4, 7, 8]  # replica r's rows of SLICED
SLICED = np.arange(24, dtype=np.float32).reshape(8, 3)
UINT64 = np.array([2**63 - 2, 2**63 + 5, 3, 2**64 - 1], np.uint64)  # one per replica


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--out", required=True)
  args = parser.parse_args()
  compressed = replicator.AllReduceOptions(compression=replicator.Compression.BF16)
  wide = replicator.AllReduceOptions(compression=replicator.Compression.BF16,
                                     sum_in_float32=True)
  in_flight = replicator.AllReduceOptions(pack_bytes=48, buckets_in_flight=2)
  bf16_in_flight = replicator.AllReduceOptions(
      pack_bytes=48, buckets_in_flight=2, compression=replicator.Compression.BF16)
  repl = replicator.MultiGpuReplicator()
  n = repl.num_replicas
  table = np.stack([value(r) for r in range(n)])
  int_table = np.stack([value(r, np.int32) for r in range(n)])
  with repl.context():  # state aggregated across workers, not a collective call
    metric = keras.metrics.Mean()
    bank = tf.Variable(tf.zeros([n, 4]))
    # every worker starts from the chief's values, booleans too
    flag = tf.Variable([repl.mesh.worker_index == 0, True])

  def step_fn():
    x = tf.gather(tf.constant(table), repl.replica_id)
    i = tf.gather(tf.constant(int_table), repl.replica_id)
    out = {"sum": repl.all_sum(x), "mean": repl.all_mean(x), "max": repl.all_max(x),
           "min": repl.all_min(i), "int_sum": repl.all_sum(i),
           "gather0": repl.all_gather(x, axis=0), "gather1": repl.all_gather(i, axis=1),
           "broadcast": repl.broadcast(x, source_replica=n - 1),
           "any": repl.all_max(x > 10), "every": repl.all_min(x > -10),
           "bool_broadcast": repl.broadcast(x > 10, source_replica=n - 1),
           "flag": flag.read_value(),
           "replica": repl.replica_id}
    # The compressed paths go through the gradient reduction's packing.
    out["bf16"] = repl.all_reduce([x, 2 * x], options=compressed)
    out["bf16_sum_in_float32"] = repl.all_reduce([x, 2 * x], options=wide)
    out["bf16_sum_in_float32_one"] = repl.all_reduce(x, options=wide)  # not packed
    # One bucket per tensor, two lanes: buckets cross side by side.
    out["in_flight"] = repl.all_reduce([x, 2 * x, 3 * x, -x], options=in_flight)
    out["bf16_in_flight"] = repl.all_reduce([x, 2 * x, 3 * x], options=bf16_in_flight)
    # No collective kernel for 8- and 16-bit integers: they travel as int32.
    small = tf.cast(i, tf.int8)
    out.update({"int8_sum": repl.all_sum(small), "int8_max": repl.all_max(small),
                "uint16_broadcast": repl.broadcast(tf.cast(i + 100, tf.uint16),
                                                   source_replica=n - 1)})
    metric.update_state(x)
    bank.scatter_update(tf.IndexedSlices(x[:1], tf.reshape(repl.replica_id, [1])))
    return out

  def gather_step():
    return repl.all_gather(tf.gather(tf.constant(table), repl.replica_id))

  out = tf.nest.map_structure(lambda t: t.numpy(), repl.run(step_fn))
  # In the loop (steps > 1) the gather's static shape must match its stand-in's.
  out["gather_loop"] = repl.run(gather_step, steps=2).numpy()
  with repl.context():
    w = tf.Variable(1.0)

  def uneven_step(x):  # a loss of the gathered batches, differentiated
    with tf.GradientTape() as tape:
      gathered = repl.all_gather(x * w)
      weights = 1.0 + tf.range(tf.cast(tf.size(gathered), tf.float32))
      loss = tf.reduce_sum(gathered * weights)
    return {"gathered": gathered, "dw": tape.gradient(loss, w),
            "bf16": tf.cast(repl.all_gather(tf.cast(x, tf.bfloat16)), tf.float32),
            "bool": repl.all_gather(x > 100.5)}

  def static_grad_step():  # parts of one static shape: no sizes travel
    x = tf.gather(tf.constant(table), repl.replica_id)
    with tf.GradientTape() as tape:
      gathered = repl.all_gather(x * w)
      weights = 1.0 + tf.range(tf.cast(tf.size(gathered), tf.float32))
      loss = tf.reduce_sum(gathered * tf.reshape(weights, tf.shape(gathered)))
    return tape.gradient(loss, w)

  out["static_dw"] = repl.run(static_grad_step).numpy()

  def reduce_scatter_step():  # value(r) as [4, 3]: one row of the sum per replica
    x = tf.reshape(tf.gather(tf.constant(table), repl.replica_id), [n, -1])
    i = tf.reshape(tf.gather(tf.constant(int_table), repl.replica_id), [n, -1])
    with tf.GradientTape() as tape:
      mine = repl.reduce_scatter(x * w)
      loss = tf.reduce_sum(mine) * tf.cast(repl.replica_id + 1, tf.float32)
    return {"rs_sum": mine, "rs_dw": tape.gradient(loss, w),
            "rs_mean": repl.reduce_scatter(x, replicator.ReduceOp.MEAN),
            "rs_int": repl.reduce_scatter(i)}

  out.update({k: v.numpy() for k, v in repl.run(reduce_scatter_step).items()})

  def sliced_step():  # static parts of 2, 2 rows on worker 0 and 3, 1 on worker 1
    r = int(tf.get_static_value(repl.replica_id))
    x = tf.constant(SLICED)[SLICE_BOUNDS[r]:SLICE_BOUNDS[r + 1]]
    with tf.GradientTape() as tape:
      tape.watch(x)
      gathered = repl.all_gather(x)
      # d loss / d gathered: the table (no constant of its shape: the build
      # trace, of one replica, sees another row count)
      loss = tf.reduce_sum(tf.square(gathered)) / 2
    return gathered, tf.reduce_sum(tape.gradient(loss, x))

  # 2 steps: a loop, whose invariants came from the build trace's shapes
  out["sliced_gathered"], out["sliced_dx"] = (
      t.numpy() for t in repl.run(sliced_step, steps=2))

  def no_kernel_step():  # no collective kernels: unsigned bits travel as signed ints
    u = tf.gather(tf.constant(UINT64), repl.replica_id)
    x = tf.gather(tf.constant(table), repl.replica_id)
    return {"u64_sum": repl.all_sum(u), "u64_max": repl.all_max(u),
            "u64_min": repl.all_min(u), "u64_gather": repl.all_gather(u),
            # nor for complex numbers: their real and imaginary parts travel
            "c64_sum": repl.all_sum(tf.complex(x, -2 * x)),
            "c128_gather": repl.all_gather(tf.cast(tf.complex(x, x + 1), tf.complex128)),
            "u32_gather": repl.all_gather(tf.cast(tf.bitwise.right_shift(
                u, tf.constant(32, tf.uint64)), tf.uint32))}

  out.update({k: v.numpy() for k, v in repl.run(no_kernel_step).items()})
  # 2 steps in one call: sizes change from step to step and differ between
  # workers (a gather that TensorFlow's collective refuses without padding).
  uneven = repl.run(uneven_step, uneven_input(repl.mesh.worker_index), steps=2)
  out.update({f"uneven_{k}": v.numpy() for k, v in uneven.items()})
  # Batch norm over the 4 replicas' rows: global statistics, and moving
  # averages that each replica updates alone (the same bits everywhere).
  with repl.context():
    norm = replicator.nn.CrossReplicaBatchNorm(True, True, decay_rate=0.5)

  def norm_step():
    return norm(tf.gather(tf.constant(table), repl.replica_id), is_training=True)

  out["norm"] = repl.run(norm_step, steps=2).numpy()
  repl.assert_replicas_in_sync(norm.variables)
  out["norm_moving_mean"] = norm.moving_mean.value.numpy()
  out["norm_moving_variance"] = norm.moving_variance.value.numpy()
  # One replica per worker: the ring divides a mean as it reduces it (float32;
  # bfloat16 at a power-of-two count of workers); float16 divides first.
  single = replicator.MultiGpuReplicator(devices=repl.mesh.local_devices[:1])

  def single_step():
    x = tf.gather(tf.constant(table), single.replica_id)  # worker w: value(w)
    mean = replicator.ReduceOp.MEAN
    flat = tf.reshape(x, [-1])
    varying = tf.boolean_mask(flat, flat > -100)  # every element, in a run-time shape
    return {"mean": single.all_mean(x), "sum": single.all_sum(x),
            "f64_mean": single.all_mean(tf.cast(x, tf.float64)),
            "bf16_mean": single.all_reduce([x, 2 * x], mean, options=compressed),
            "fp16_mean": single.all_reduce([x, 2 * x], mean, options=replicator.AllReduceOptions(
                compression=replicator.Compression.FP16)),
            "varying_mean": single.all_mean(varying)}

  out.update({f"single_{k}": v.numpy() if not isinstance(v, list) else [t.numpy() for t in v]
              for k, v in single.run(single_step).items()})
  single.shutdown()
  out["metric"] = metric.result().numpy()
  out["bank"] = bank.numpy()
  flat = {}
  for key, leaf in out.items():
    if isinstance(leaf, list):
      for j, part in enumerate(leaf):
        flat[f"{key}_{j}"] = part
    else:
      flat[key] = leaf
  np.savez(os.path.join(args.out, f"worker{repl.mesh.worker_index}.npz"), **flat)
  repl.shutdown()


if __name__ == "__main__":
  main()
