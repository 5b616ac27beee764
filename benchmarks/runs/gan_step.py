"""The SN-GAN training step under `GpuReplicator` vs the same step as plain TF.

One discriminator step (on a batch from the input pipeline) and one generator
step, the `small` config's models (examples/gan) at `--batch`. The plain
variant is the same code with no library: a `tf.function` over an iterator,
Sonnet Adam, a `tf.random.Generator`. Both run in one process, alternating
rounds; prints ms per D+G step and the ratio.

  python -m benchmarks.runs.gan_step [--batch 64] [--rounds 5] [--json out.json]
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # pylint: disable=g-import-not-at-top
import sonnet as snt
import tensorflow as tf

import replicator
from benchmarks.runs import common
from examples.gan import configs
from examples.gan import gan_trainer
from examples.gan import losses
from examples.gan import models


def _dataset(config, batch):
  rng = np.random.RandomState(0)
  images = rng.uniform(-1, 1, [512, config.resolution, config.resolution,
                               config.image_channels]).astype(np.float32)
  labels = rng.randint(0, config.num_classes, 512).astype(np.int32)
  return (tf.data.Dataset.from_tensor_slices((images, labels)).repeat()
          .batch(batch, drop_remainder=True).prefetch(16))


def replicator_variant(config):
  repl = replicator.GpuReplicator()
  trainer = gan_trainer.GanTrainer(config, repl)
  input_fn = lambda ctx: _dataset(config, ctx.per_replica_batch_size(config.global_batch_size))

  def call():
    repl.run(trainer.discriminator_step, input_fn)
    return repl.run(trainer.generator_step)["g_loss"][0]
  return call


def plain_variant(config):
  tf.random.set_seed(0)
  generator = models.Generator(config.g_ch, config.g_multipliers, config.num_classes,
                               config.image_channels)
  discriminator = models.Discriminator(config.d_ch, config.d_multipliers,
                                       config.d_downsample, config.num_classes)
  g_opt = snt.optimizers.Adam(config.learning_rate, config.beta1, config.beta2)
  d_opt = snt.optimizers.Adam(config.learning_rate, config.beta1, config.beta2)
  rng = tf.random.Generator.from_seed(0)
  iterator = iter(_dataset(config, config.global_batch_size))
  batch_size = config.global_batch_size

  def noise_and_labels():
    return (rng.normal([batch_size, config.z_dim]),
            rng.uniform([batch_size], 0, config.num_classes, dtype=tf.int32))

  @tf.function
  def d_step(it):
    images, labels = next(it)
    z, fake_labels = noise_and_labels()
    fakes = generator(z, fake_labels, is_training=True)
    with tf.GradientTape() as tape:
      logits = discriminator(tf.concat([images, fakes], 0),
                             tf.concat([labels, fake_labels], 0), is_training=True)
      loss = losses.discriminator_hinge_loss(logits[:batch_size], logits[batch_size:])
    d_opt.apply(tape.gradient(loss, discriminator.trainable_variables),
                discriminator.trainable_variables)
    return {"d_loss": loss, "d_real": tf.reduce_mean(logits[:batch_size])}

  @tf.function
  def g_step():
    z, labels = noise_and_labels()
    with tf.GradientTape() as tape:
      fakes = generator(z, labels, is_training=True)
      loss = losses.generator_hinge_loss(discriminator(fakes, labels, is_training=True))
    g_opt.apply(tape.gradient(loss, generator.trainable_variables),
                generator.trainable_variables)
    return {"g_loss": loss}

  def call():
    d_step(iterator)
    return g_step()["g_loss"]
  return call


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--batch", type=int, default=64)
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--calls", type=int, default=20)
  parser.add_argument("--json", default=None)
  args = parser.parse_args()
  config = configs.SMALL.replace(global_batch_size=args.batch)
  variants = {"GpuReplicator": replicator_variant(config),
              "plain tf.function": plain_variant(config)}
  for fn in variants.values():  # trace both before timing either
    fn()
  best = {name: float("inf") for name in variants}
  for _ in range(args.rounds):
    for name, fn in variants.items():
      best[name] = min(best[name], common.seconds_per_call(fn, args.calls))
  ms = {name: 1e3 * s for name, s in best.items()}
  result = {"machine": common.machine(),
            "tensorflow": tf.__version__, "config": "small", "batch": args.batch,
            "ms_per_D+G_step (best of rounds)": ms,
            "ratios": {"GpuReplicator / plain": ms["GpuReplicator"] / ms["plain tf.function"]}}
  common.write_result(result, args.json)


if __name__ == "__main__":
  main()
