"""A worker of the multi-worker tests: replicators beside each other and MWMS.

  python -m replicator.launch --workers 2 --devices-per-worker 2 -- \
      python tests/multiworker/side_by_side.py --out DIR [--mwms_first]

Each worker makes two `MultiGpuReplicator`s (float32 and bfloat16 all-reduce)
and a `MultiWorkerMirroredStrategy`, first or last, and calls their collectives
interleaved. Each replicator counts its collectives' instance keys from 1, so
their first collectives share key numbers with other shapes and dtypes; the
test compares every result with NumPy.
"""

import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf

import replicator


def value(replica: int, size: int) -> np.ndarray:
  """Replica `replica`'s contribution: distinct per replica and size."""
  return (np.arange(size, dtype=np.float32) - 2) * (replica + 1) + 0.5 * replica


def mwms_value(worker: int) -> np.ndarray:
  return value(10 + worker, 7)


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--out", required=True)
  parser.add_argument("--mwms_first", action="store_true")
  args = parser.parse_args()
  worker = json.loads(os.environ["TF_CONFIG"])["task"]["index"]

  def make_mwms():
    strategy = tf.distribute.MultiWorkerMirroredStrategy()

    @tf.function
    def step():
      return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce(
          tf.distribute.ReduceOp.SUM, tf.constant(mwms_value(worker))))
    return lambda: strategy.experimental_local_results(step())[0].numpy()

  if args.mwms_first:  # it starts the server; the replicators join it
    replicator.testing.configure_logical_cpus(2)
    mwms = make_mwms()
  plain = replicator.MultiGpuReplicator()
  compressed = replicator.MultiGpuReplicator(all_reduce=replicator.AllReduceOptions(
      compression=replicator.Compression.BF16))
  if not args.mwms_first:
    mwms = make_mwms()
  with plain.context():  # each worker its own values; the chief's are sent
    made = {"big0": tf.Variable(np.full([20000], worker + 0.5)),  # float64, sliced
            "big1": tf.Variable(np.full([30000], worker + 1.5)),
            "ints": tf.Variable(np.arange(3, dtype=np.int32) + worker),
            "flags": tf.Variable([worker == 0, worker == 1]),
            "varying": tf.Variable(value(worker, 4), shape=tf.TensorShape([None]))}

  def plain_step():
    return plain.all_sum(tf.constant(value(0, 5)) * tf.cast(plain.replica_id + 1, tf.float32))

  def compressed_step():  # a dtype and shape of its own, under the same key
    x = tf.constant(value(0, 3)) * tf.cast(compressed.replica_id + 1, tf.float32)
    return compressed.all_reduce([x, tf.cast(compressed.replica_id, tf.int32)])

  out = {}
  for i in range(2):  # interleaved, twice
    out[f"plain{i}"] = plain.run(plain_step).numpy()
    out[f"compressed{i}"], out[f"ids{i}"] = (
        t.numpy() for t in compressed.run(compressed_step))
    out[f"mwms{i}"] = mwms()
  out["replicas"] = np.array([plain.num_replicas, compressed.num_replicas])
  for name, variable in made.items():
    out[f"made_{name}"] = np.stack([copy.numpy() for copy in variable.replicas])
  np.savez(os.path.join(args.out, f"worker{worker}.npz"), **out)
  plain.shutdown()
  compressed.shutdown()


if __name__ == "__main__":
  main()
