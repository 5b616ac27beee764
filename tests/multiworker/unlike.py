"""A worker of the multi-worker tests: synchronized batch norm between workers.

  (2 workers of one replica each, TF_CONFIG set: test_multiworker starts them)

A `CrossReplicaBatchNorm`'s moving averages, which each worker combines from
the gathered statistics itself (another CPU may round that by a bit), are
merged at the step's end, in one all-reduce. Prints what the test compares
with NumPy: the all-reduces traced (their tensor counts) and the moving mean.
"""

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf

import replicator
from replicator.collectives import reductions

STEPS, BATCH, CHANNELS, DECAY = 3, 8, 4, 0.5


def data(worker: int) -> np.ndarray:
  """Worker `worker`'s batches, one per step, the workers' means apart."""
  rng = np.random.RandomState(worker)
  return (rng.randn(STEPS * BATCH, CHANNELS) + 3 * worker).astype(np.float32)


def main():
  worker = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
  repl = replicator.MultiGpuReplicator()
  merges = []
  real = reductions.all_reduce
  reductions.all_reduce = lambda values, *a, **k: (
      merges.append(len(values[0])), real(values, *a, **k))[1]
  with repl.context():
    bn = replicator.nn.CrossReplicaBatchNorm(False, False, decay_rate=DECAY)
  input_fn = lambda ctx: tf.data.Dataset.from_tensor_slices(data(worker)).batch(BATCH)
  repl.run(lambda x: bn(x, is_training=True), input_fn, steps=STEPS)
  mean = bn.moving_mean.average.numpy()
  print(f"UNLIKE {json.dumps(merges)} "
        f"{mean.tobytes().hex()} {json.dumps(mean.ravel().tolist())}", flush=True)
  repl.shutdown()


if __name__ == "__main__":
  main()
