"""The README's research script, runnable: an MLP on Fashion-MNIST.

  python -m examples.quickstart --replicator=multi_gpu --steps=200

The same script runs on one device (`gpu`), every local device (`multi_gpu`;
on a CPU-only machine `--cpu_replicas` splits the CPU into logical devices),
a TPU (`tpu`, `--tpu=NAME`) or the TPU's engine emulated on `--cpu_replicas`
logical CPUs (`tpu_emulated`), and the loss curve is the same up to float
rounding. Its
flags are the examples' shared ones (`examples/common.py`: `--replicator`,
`--cpu_replicas`, `--tpu`, `--global_batch_size`, `--workdir`, `--log_every`)
and `--steps`, `--dataset`, `--data_dir`. Data: the Debian
`dataset-fashion-mnist` package, or random images with `--dataset=synthetic`.

It logs the replicator it made, a progress line every `--log_every` steps
(`step n/N`, the loss, examples/s, an ETA), then the loss curve in one line
(absl's line prefixes left out; 2 logical CPUs of this repository's 2-core VM):

  MultiGpuReplicator: 2 replica(s) on 1 worker(s); this worker's devices: CPU:0, CPU:1
  step 100/200  loss 0.5576  10317 examples/s (first interval, tracing included)  ETA 2s
  step 200/200  loss 0.4349  35540 examples/s
  loss curve, every 20 step(s) from step 1: 2.397 0.8524 0.6674 ... 0.4953
  final loss 0.4349

With `--workdir`, the curve is also written to `<workdir>/loss_curve.json`, to
compare replicators run by run.
"""

import json
import os

from absl import app
from absl import flags
from absl import logging
import numpy as np
import sonnet as snt
import tensorflow as tf

from examples import common
from examples import idx

FLAGS = flags.FLAGS


def define_flags():
  """Defined only when run as a script, so tests can import this module."""
  common.define_replicator_flags()
  common.define_run_flags(global_batch_size=256, workdir=None)
  flags.adopt_module_key_flags(common)  # --help lists them with this script's own
  flags.DEFINE_integer("steps", 200, "Training steps.", lower_bound=1)
  flags.DEFINE_enum("dataset", "fashion_mnist", ["fashion_mnist", "synthetic"],
                    "Input data.")
  flags.DEFINE_string("data_dir", "/usr/share/datasets/fashion-mnist",
                      "--dataset=fashion_mnist: the gzipped IDX files.")


def load_fashion_mnist(data_dir):
  """Training images (N, 784) in [0, 1] and labels, from the gzipped IDX files."""
  for name in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"):
    if not tf.io.gfile.exists(os.path.join(data_dir, name)):
      raise ValueError(
          f"--data_dir: no {name} in {data_dir}; install the data (apt-get install "
          "dataset-fashion-mnist puts it in /usr/share/datasets/fashion-mnist), pass "
          "--data_dir=<the directory of the gzipped IDX files>, or train on random "
          "images with --dataset=synthetic.")
  images = idx.read_idx(os.path.join(data_dir, "train-images-idx3-ubyte.gz")).reshape(-1, 784)
  labels = idx.read_idx(os.path.join(data_dir, "train-labels-idx1-ubyte.gz"))
  return images.astype(np.float32) / 255.0, labels.astype(np.int32)


def synthetic(num_examples=4096, seed=0):
  rng = np.random.RandomState(seed)
  images = rng.rand(num_examples, 784).astype(np.float32)
  labels = (images[:, :10].argmax(1)).astype(np.int32)
  return images, labels


def train(repl, images, labels, steps, global_batch_size, seed=0, log_every=None):
  """Trains an MLP; returns the per-step mean loss over the global batch.

  With `log_every`, logs a progress line every `log_every` steps (and at the end).
  """
  with repl.context():
    model = snt.nets.MLP([256, 10], w_init=snt.initializers.VarianceScaling(seed=seed))
    optimizer = repl.wrap_optimizer(snt.optimizers.Adam(1e-3))

  def input_fn(ctx):
    ds = tf.data.Dataset.from_tensor_slices((images, labels))
    ds = ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id).repeat()
    return ds.batch(ctx.per_replica_batch_size(global_batch_size), drop_remainder=True)

  def step_fn(batch):
    x, y = batch
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, model(x)))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply(grads, model.trainable_variables)  # averaged over replicas
    return {"loss": loss, "mean_loss": repl.all_mean(loss)}

  progress = common.Progress(steps, items_per_step=global_batch_size, items="examples")
  curve = []
  for step in range(steps):
    out = repl.run(step_fn, input_fn)
    curve.append(float(out["mean_loss"][0]))
    if log_every and ((step + 1) % log_every == 0 or step + 1 == steps):
      progress.log(step + 1, loss=curve[-1])
  return curve


def main(argv):
  del argv
  common.exit_on_flag_errors(_main)


def _main():
  if FLAGS.log_every < 1:
    raise ValueError(f"--log_every: must be positive, got {FLAGS.log_every}; e.g. "
                     "--log_every=100.")
  # Before the replicator: a missing file then costs no start-up.
  images, labels = (synthetic() if FLAGS.dataset == "synthetic"
                    else load_fashion_mnist(FLAGS.data_dir))
  try:
    repl = common.make_replicator()
  except RuntimeError as error:  # no TPU reachable, ...
    raise ValueError(f"--replicator={FLAGS.replicator}: {error}") from error
  try:
    batch, replicas = FLAGS.global_batch_size, repl.num_replicas
    if batch < 1 or batch % replicas:
      raise ValueError(f"--global_batch_size: {batch} examples do not split over "
                       f"{replicas} replicas; pass a positive multiple of {replicas}, "
                       f"e.g. --global_batch_size={max(1, batch // replicas) * replicas}.")
    curve = train(repl, images, labels, FLAGS.steps, FLAGS.global_batch_size,
                  log_every=FLAGS.log_every)
  finally:
    repl.shutdown()
  every = max(1, FLAGS.steps // 10)
  logging.info("loss curve, every %d step(s) from step 1: %s", every,
               " ".join(f"{loss:.4g}" for loss in curve[::every]))
  logging.info("final loss %.4f", curve[-1])
  if FLAGS.workdir and repl.is_chief:
    path = os.path.join(FLAGS.workdir, "loss_curve.json")
    tf.io.gfile.makedirs(FLAGS.workdir)
    with tf.io.gfile.GFile(path, "w") as f:
      json.dump({"replicator": FLAGS.replicator, "num_replicas": repl.num_replicas,
                 "global_batch_size": FLAGS.global_batch_size, "loss": curve}, f)
    logging.info("loss curve written to %s", path)


if __name__ == "__main__":
  define_flags()
  app.run(main)
