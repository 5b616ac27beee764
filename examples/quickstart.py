"""The README's research script, runnable: an MLP on Fashion-MNIST.

  python -m examples.quickstart --replicator=multi_gpu --steps=200

The same script runs on one device (`gpu`), every local device (`multi_gpu`;
on a CPU-only machine `--cpu_replicas` splits the CPU into logical devices) or
with TPU semantics emulated on the CPU (`tpu_emulated`), and the loss curve is
the same up to float rounding. Data: the Debian `dataset-fashion-mnist`
package, or random images with `--data=synthetic`.
"""

import os

from absl import app
from absl import flags
import numpy as np
import sonnet as snt
import tensorflow as tf

import replicator
from examples import idx

FLAGS = flags.FLAGS


def define_flags():
  """Defined only when run as a script, so tests can import this module."""
  flags.DEFINE_enum("replicator", "multi_gpu", ["gpu", "multi_gpu", "tpu_emulated"],
                    "Which replicator to train with.")
  flags.DEFINE_integer("cpu_replicas", 2, "Logical CPU devices when there is no GPU.")
  flags.DEFINE_integer("steps", 200, "Training steps.")
  flags.DEFINE_integer("global_batch", 256, "Global batch size.")
  flags.DEFINE_enum("data", "fashion_mnist", ["fashion_mnist", "synthetic"], "Input data.")
  flags.DEFINE_string("data_dir", "/usr/share/datasets/fashion-mnist", "IDX files.")


def load_fashion_mnist(data_dir):
  """Training images (N, 784) in [0, 1] and labels, from the gzipped IDX files."""
  images = idx.read_idx(os.path.join(data_dir, "train-images-idx3-ubyte.gz")).reshape(-1, 784)
  labels = idx.read_idx(os.path.join(data_dir, "train-labels-idx1-ubyte.gz"))
  return images.astype(np.float32) / 255.0, labels.astype(np.int32)


def synthetic(num_examples=4096, seed=0):
  rng = np.random.RandomState(seed)
  images = rng.rand(num_examples, 784).astype(np.float32)
  labels = (images[:, :10].argmax(1)).astype(np.int32)
  return images, labels


def make_replicator(name, cpu_replicas):
  if name == "gpu":
    return replicator.GpuReplicator()
  if name == "tpu_emulated":
    return replicator.TpuReplicator(num_tpu_cores_per_worker=cpu_replicas,
                                    emulate_on_cpu=True)
  return replicator.MultiGpuReplicator()


def train(repl, images, labels, steps, global_batch, seed=0):
  """Trains an MLP; returns the per-step mean loss over the global batch."""
  with repl.context():
    model = snt.nets.MLP([256, 10], w_init=snt.initializers.VarianceScaling(seed=seed))
    optimizer = repl.wrap_optimizer(snt.optimizers.Adam(1e-3))

  def input_fn(ctx):
    ds = tf.data.Dataset.from_tensor_slices((images, labels))
    ds = ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id).repeat()
    return ds.batch(ctx.per_replica_batch_size(global_batch), drop_remainder=True)

  def step_fn(batch):
    x, y = batch
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, model(x)))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply(grads, model.trainable_variables)  # averaged over replicas
    return {"loss": loss, "mean_loss": repl.all_mean(loss)}

  curve = []
  for _ in range(steps):
    out = repl.run(step_fn, input_fn)
    curve.append(float(out["mean_loss"][0]))
  return curve


def main(argv):
  del argv
  if not tf.config.list_physical_devices("GPU"):
    replicator.testing.configure_logical_cpus(FLAGS.cpu_replicas)
  if FLAGS.data == "synthetic":
    images, labels = synthetic()
  else:
    images, labels = load_fashion_mnist(FLAGS.data_dir)
  repl = make_replicator(FLAGS.replicator, FLAGS.cpu_replicas)
  print(f"{repl}: global batch {FLAGS.global_batch}")
  curve = train(repl, images, labels, FLAGS.steps, FLAGS.global_batch)
  for step in range(0, FLAGS.steps, max(1, FLAGS.steps // 10)):
    print(f"step {step:5d}  loss {curve[step]:.4f}")
  print(f"final loss {curve[-1]:.4f}")
  repl.shutdown()


if __name__ == "__main__":
  define_flags()
  app.run(main)
