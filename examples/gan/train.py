r"""Trains one SN-GAN (projection discriminator) through the replicator API.

The global batch is split over the replicas; every replica draws its own noise
and fake labels from `repl.random_generator`, so the discriminator really sees
`global_batch_size` distinct fakes per step (identical noise on every replica
would shrink the effective batch and void a batch-size study).

  python -m examples.gan.train --config=small --global_batch_size=64 \
      --num_generator_steps=500 --workdir=/tmp/gan

TensorBoard: `tensorboard --logdir=/tmp/gan`.
"""

import json
import os
import time
from typing import Dict, Optional

from absl import app
from absl import flags
from absl import logging
import numpy as np
import sonnet as snt
import tensorflow as tf

from tensorflow.core.framework import summary_pb2

import replicator
from examples.gan import configs
from examples.gan import data
from examples.gan import losses
from examples.gan import metrics
from examples.gan import models

FLAGS = flags.FLAGS


def define_flags():
  """Defines the command line, only when run as a script.

  Importing this module (tests, the sweep, other examples with flags of the
  same names) then defines no flag.
  """
  flags.DEFINE_enum("config", "small", sorted(configs.CONFIGS), "Model and data.")
  flags.DEFINE_integer("global_batch_size", None, "Overrides the config's.")
  flags.DEFINE_integer("num_generator_steps", None, "Overrides the config's.")
  flags.DEFINE_integer("n_dis", None, "D steps per G step; overrides the config's.")
  flags.DEFINE_integer("ch", None, "Sets both g_ch and d_ch (reduced width).")
  flags.DEFINE_bool("cross_replica_bn", None,
                    "Generator batch norm over the global batch (every config: "
                    "on); --nocross_replica_bn normalizes each replica's batch.")
  flags.DEFINE_string("dataset", None, "Overrides the config's: see data.py.")
  flags.DEFINE_string("data_dir", None,
                      "TFDS data_dir, TFRecord glob or image folder.")
  flags.DEFINE_string("manual_dir", None, "TFDS manual_dir (ImageNet tars).")
  flags.DEFINE_integer("label_offset", 0, "Subtracted from TFRecord labels.")
  flags.DEFINE_enum("replicator", "multi_gpu",
                    ["multi_gpu", "gpu", "tpu", "tpu_emulated"],
                    "tpu_emulated: TPU semantics (XLA, static shapes) on the CPU.")
  flags.DEFINE_string("tpu", None, "TPU name or address (TpuReplicator's `tpu`).")
  flags.DEFINE_integer("num_cpu_devices", 0,
                       "Split the CPU into this many logical devices.")
  flags.DEFINE_integer("seed", 0, "Seeds weights, noise and data order.")
  flags.DEFINE_string("workdir", "/tmp/replicator_gan", "Checkpoints, summaries, metrics.")
  flags.DEFINE_integer("log_every", 50, "Generator steps between logs.")
  flags.DEFINE_integer("eval_every", 0,
                       "Generator steps between evaluations (0: at the end).")
  flags.DEFINE_integer("checkpoint_every", 1000, "Generator steps between checkpoints.")
  flags.DEFINE_integer("num_eval_samples", 2000, "Samples per evaluation.")
  flags.DEFINE_integer("num_classifier_examples", 60_000,
                       "Real training images for the metric classifier.")
  flags.DEFINE_integer("num_real_examples", 10_000,
                       "Real test images for the reference statistics.")
  flags.DEFINE_bool("classifier_metrics", True,
                    "Classifier score and Fréchet classifier distance.")
  flags.DEFINE_string("cache_dir", os.path.expanduser("~/.cache/replicator_gan"),
                      "Where the metric classifier is cached.")
  flags.DEFINE_string("inception_weights", None,
                      "Keras InceptionV3 weights file (with the top): adds "
                      "Inception Score and Fréchet Inception Distance.")


def _plugin(name: str) -> summary_pb2.SummaryMetadata:
  return summary_pb2.SummaryMetadata(
      plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name=name))


def write_summaries(writer, step: int, scalars: Dict[str, float],
                    images: Optional[np.ndarray] = None):
  """TensorBoard scalars (and images) through `tf.summary.write`.

  The low-level op needs no `tensorboard` package, which TF-CPU lacks.
  """
  with writer.as_default(step=step):
    for name, value in scalars.items():
      tf.summary.write(name, tf.constant(value, tf.float32),
                       metadata=_plugin("scalars"))
    if images is not None:
      pngs = [tf.io.encode_png(tf.cast((im + 1) * 127.5, tf.uint8))
              for im in images]
      height, width = images.shape[1:3]
      tf.summary.write("samples", tf.stack([str(width), str(height), *pngs]),
                       metadata=_plugin("images"))
  writer.flush()


class GanTrainer:
  """The models, optimizers and the three replicated steps of one run."""

  def __init__(self, config: configs.GanConfig, repl: replicator.Replicator,
               seed: int = 0):
    self.config = config
    self.repl = repl
    if config.global_batch_size % repl.num_replicas:
      raise ValueError(
          f"global_batch_size: {config.global_batch_size} does not split over "
          f"{repl.num_replicas} replicas. Pass a --global_batch_size (sweep: "
          f"--batch_sizes) that is a multiple of {repl.num_replicas}, or a "
          "number of replicas (--num_cpu_devices) that divides it.")
    self.per_replica_batch_size = config.global_batch_size // repl.num_replicas
    tf.random.set_seed(seed)
    # On one replica the batch already is the global batch; `snt.BatchNorm`'s
    # fused kernel then keeps the one-device figures bit for bit (the
    # cross-replica module's unfused statistics round differently).
    cross_replica_bn = config.cross_replica_bn and repl.num_replicas > 1
    with repl.context():
      self.generator = models.Generator(
          config.g_ch, config.g_multipliers, config.num_classes,
          config.image_channels, cross_replica_bn=cross_replica_bn)
      self.discriminator = models.Discriminator(
          config.d_ch, config.d_multipliers, config.d_downsample,
          config.num_classes)
      adam = lambda: snt.optimizers.Adam(config.learning_rate, config.beta1,
                                         config.beta2)
      self.g_optimizer = repl.wrap_optimizer(adam())
      self.d_optimizer = repl.wrap_optimizer(adam())
      self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
      # Creating the model variables eagerly (a call that changes no state)
      # makes the first compiled step markedly faster to build.
      labels = tf.zeros([1], tf.int32)
      self.discriminator(self.generator(
          tf.zeros([1, config.z_dim]), labels, is_training=False),
                         labels, is_training=False)
    self.rng = repl.random_generator(seed)

  def _noise_and_labels(self, batch_size: int):
    z = self.rng.normal([batch_size, self.config.z_dim])
    labels = self.rng.uniform([batch_size], 0, self.config.num_classes,
                              dtype=tf.int32)
    return z, labels

  def discriminator_step(self, batch):
    images, labels = batch
    batch_size = images.shape[0]
    z, fake_labels = self._noise_and_labels(batch_size)
    fakes = self.generator(z, fake_labels, is_training=True)
    with tf.GradientTape() as tape:
      # Real and fake in one call: one power iteration per training call.
      logits = self.discriminator(tf.concat([images, fakes], 0),
                                  tf.concat([labels, fake_labels], 0),
                                  is_training=True)
      loss = losses.discriminator_hinge_loss(logits[:batch_size],
                                             logits[batch_size:])
    variables = self.discriminator.trainable_variables
    self.d_optimizer.apply(tape.gradient(loss, variables), variables)
    return {"d_loss": self.repl.all_mean(loss),
            "d_real": self.repl.all_mean(tf.reduce_mean(logits[:batch_size]))}

  def generator_step(self):
    z, labels = self._noise_and_labels(self.per_replica_batch_size)
    with tf.GradientTape() as tape:
      fakes = self.generator(z, labels, is_training=True)
      loss = losses.generator_hinge_loss(
          self.discriminator(fakes, labels, is_training=True))
    variables = self.generator.trainable_variables
    self.g_optimizer.apply(tape.gradient(loss, variables), variables)
    self.step.assign_add(1)
    return {"g_loss": self.repl.all_mean(loss)}

  def sample_step(self, z, labels):
    """Each replica generates its slice of `z` (moving BN statistics)."""
    n = z.shape[0] // self.repl.num_replicas
    start = self.repl.replica_id * n
    return self.generator(tf.slice(z, [start, 0], [n, -1]),
                          tf.slice(labels, [start], [n]), is_training=False)

  def sample(self, labels: np.ndarray, seed: int = 1234) -> np.ndarray:
    """Images in [-1, 1] for `labels`, from noise fixed by `seed`."""
    z = np.random.RandomState(seed).normal(
        size=[len(labels), self.config.z_dim]).astype(np.float32)
    chunk = self.repl.num_replicas * -(-256 // self.repl.num_replicas)
    pad = -len(labels) % chunk
    z = np.concatenate([z, np.zeros([pad, z.shape[1]], np.float32)])
    labels = np.concatenate([labels, np.zeros([pad], labels.dtype)]).astype(np.int32)
    images = []
    for i in range(0, len(z), chunk):
      out = self.repl.run(self.sample_step, args=(tf.constant(z[i:i + chunk]),
                                                  tf.constant(labels[i:i + chunk])))
      images.append(np.reshape(out.numpy(), [-1, *out.shape[2:]]))
    return np.concatenate(images)[:len(z) - pad]


def train(config: configs.GanConfig, repl: replicator.Replicator, *,
          workdir: str, input_fn, seed: int = 0, log_every: int = 50,
          eval_every: int = 0, checkpoint_every: int = 1000,
          evaluator: Optional[metrics.Evaluator] = None):
  """Runs `config.num_generator_steps` G steps (each after `n_dis` D steps).

  Returns the trainer and its evaluations (one dict each, with its `step`).
  """
  check_positive(log_every=log_every, checkpoint_every=checkpoint_every)
  trainer = GanTrainer(config, repl, seed)
  checkpointer, restorer = restore(trainer, os.path.join(workdir, "checkpoints"))
  writer = tf.summary.create_file_writer(workdir) if repl.is_chief else None
  history, tick, first = [], time.time(), int(trainer.step.numpy())
  last = config.num_generator_steps
  for step in range(first + 1, last + 1):
    d_out = repl.run(trainer.discriminator_step, input_fn, steps=config.n_dis)
    g_out = repl.run(trainer.generator_step)
    scalars = {}
    if step % log_every == 0 or step == last:
      elapsed, tick = time.time() - tick, time.time()
      steps_done = log_every if step % log_every == 0 else step % log_every
      scalars = {k: float(np.mean(v)) for k, v in {**d_out, **g_out}.items()}
      scalars["generator_steps_per_s"] = steps_done / elapsed
      scalars["real_images_per_s"] = (
          steps_done * config.n_dis * config.global_batch_size / elapsed)
      logging.info("step %d: %s", step, ", ".join(
          f"{k}={v:.4g}" for k, v in scalars.items()))
    if evaluator and ((eval_every and step % eval_every == 0) or step == last):
      results = evaluator(trainer)
      scalars.update(results)
      history.append({"step": step, **results})
      logging.info("step %d eval: %s", step, results)
      tick = time.time()  # Throughput excludes evaluation.
    if writer and scalars:
      write_summaries(writer, step, scalars)
    if step % checkpoint_every == 0 or step == last:
      checkpointer.save(step)
  if writer:
    write_summaries(writer, last, {},
                    trainer.sample(np.arange(16) % config.num_classes))
  del restorer  # Kept until here: it restores optimizer slots made on first use.
  return trainer, history


def restore(trainer: GanTrainer, directory: str):
  """A Checkpointer of the trainer's state, after restoring the latest checkpoint.

  The noise generator is saved too, so a resumed run draws the noise and fake
  labels the uninterrupted run would have drawn, not those of step 1 again.
  Returns the Checkpointer and the one that restored (kept alive until the
  optimizer slots it restores are created).
  """
  state = dict(generator=trainer.generator, discriminator=trainer.discriminator,
               g_optimizer=trainer.g_optimizer.optimizer,
               d_optimizer=trainer.d_optimizer.optimizer, step=trainer.step)
  checkpointer = replicator.Checkpointer(directory, rng=trainer.rng, **state)
  try:
    checkpointer.restore_latest()
    return checkpointer, checkpointer
  except ValueError as error:
    # A checkpoint written before the noise generator was saved: the rest of
    # the state restores; the noise restarts from the seed.
    without_rng = replicator.Checkpointer(directory, **state)
    try:
      step = without_rng.restore_latest()
    except ValueError:
      raise error from None
    logging.warning(
        "%s holds no noise generator (written before it was checkpointed): "
        "resumed at step %d with the noise and fake labels drawn again from "
        "seed, as at step 1.", directory, step)
    return checkpointer, without_rng


def check_positive(**values: int):
  """Raises, naming the flag, unless every value is an int > 0."""
  for name, value in values.items():
    if value is None or value <= 0:
      raise ValueError(
          f"{name}: must be a positive integer, got {value!r}. Pass "
          f"--{name}=N with N >= 1 (or leave it out for the default).")


def make_replicator(kind: str, tpu: Optional[str] = None,
                    num_cpu_devices: int = 0) -> replicator.Replicator:
  if num_cpu_devices:
    replicator.testing.configure_logical_cpus(num_cpu_devices)
  if kind == "tpu":
    return replicator.TpuReplicator(tpu=tpu)
  if kind == "tpu_emulated":
    return replicator.TpuReplicator(num_tpu_cores_per_worker=2,
                                    emulate_on_cpu=True)
  if kind == "gpu":
    return replicator.GpuReplicator()
  return replicator.MultiGpuReplicator()


def config_from_flags() -> configs.GanConfig:
  """The config named by --config with the flags' overrides, checked."""
  config = configs.get_config(FLAGS.config)
  sizes = {"global_batch_size": FLAGS.global_batch_size,
           "num_generator_steps": FLAGS.num_generator_steps,
           "n_dis": FLAGS.n_dis, "ch": FLAGS.ch}
  check_positive(**{k: v for k, v in sizes.items() if v is not None})
  overrides = {"global_batch_size": FLAGS.global_batch_size,
               "num_generator_steps": FLAGS.num_generator_steps,
               "n_dis": FLAGS.n_dis, "dataset": FLAGS.dataset,
               "g_ch": FLAGS.ch, "d_ch": FLAGS.ch,
               "cross_replica_bn": FLAGS.cross_replica_bn}
  return config.replace(**{k: v for k, v in overrides.items() if v is not None})


def data_kwargs_from_flags(config: configs.GanConfig) -> Dict:
  return dict(resolution=config.resolution, channels=config.image_channels,
              num_classes=config.num_classes, data_dir=FLAGS.data_dir,
              manual_dir=FLAGS.manual_dir, label_offset=FLAGS.label_offset)


def main(argv):
  del argv
  config = config_from_flags()
  check_positive(log_every=FLAGS.log_every,
                 checkpoint_every=FLAGS.checkpoint_every)
  repl = make_replicator(FLAGS.replicator, FLAGS.tpu, FLAGS.num_cpu_devices)
  logging.info("config %s on %r", config, repl)
  data_kwargs = data_kwargs_from_flags(config)
  evaluator = None
  if FLAGS.classifier_metrics or FLAGS.inception_weights:
    evaluator = metrics.Evaluator(config, data_kwargs, cache_dir=FLAGS.cache_dir,
                          num_samples=FLAGS.num_eval_samples,
                          classifier_metrics=FLAGS.classifier_metrics,
                          inception_weights=FLAGS.inception_weights,
                          num_real=FLAGS.num_real_examples,
                          num_train=FLAGS.num_classifier_examples)
  input_fn = data.make_input_fn(config.dataset, config.global_batch_size,
                                seed=FLAGS.seed, **data_kwargs)
  _, history = train(config, repl, workdir=FLAGS.workdir, input_fn=input_fn,
                  seed=FLAGS.seed, log_every=FLAGS.log_every,
                  eval_every=FLAGS.eval_every,
                  checkpoint_every=FLAGS.checkpoint_every, evaluator=evaluator)
  if repl.is_chief:
    with tf.io.gfile.GFile(os.path.join(FLAGS.workdir, "metrics.json"), "w") as f:
      json.dump(history, f, indent=1)
  repl.shutdown()


if __name__ == "__main__":
  define_flags()
  app.run(main)
