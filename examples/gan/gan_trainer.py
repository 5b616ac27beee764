"""The SN-GAN of one run on a replicator: models, optimizers, replicated steps.

`GanTrainer` builds the generator, the projection discriminator and their
wrapped optimizers in ``repl.context()`` and holds the discriminator,
generator and sampling steps that ``repl.run`` runs; `restore` checkpoints
its state (the noise generator included) and resumes it.
"""

from absl import logging
import numpy as np
import sonnet as snt
import tensorflow as tf

import replicator
from examples.gan import configs
from examples.gan import losses
from examples.gan import models


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
          "number of replicas (--cpu_replicas on a CPU) that divides it.")
    self.per_replica_batch_size = config.global_batch_size // repl.num_replicas
    tf.random.set_seed(seed)
    with repl.context():
      self.generator = models.Generator(
          config.g_ch, config.g_multipliers, config.num_classes,
          config.image_channels, cross_replica_bn=config.cross_replica_bn)
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


def restore(trainer: GanTrainer, directory: str):
  """A Checkpointer of the trainer's state, after restoring the latest checkpoint.

  A checkpoint saved as ``save(n)`` after n generator steps holds
  ``trainer.step == n``; restoring it logs ``restored step n`` and the run goes
  on with step n + 1. The noise generator is saved too, so a resumed run draws
  the noise and fake labels the uninterrupted run would have drawn, not those
  of step 1 again; a checkpoint written before it was saved restores the
  rest, and the noise restarts from the seed (with a warning). A checkpoint
  whose step (the number given to `save`) is not the step counter it holds
  restores with a warning: the run goes on after the counter's step.
  """
  checkpointer = replicator.Checkpointer(
      directory, generator=trainer.generator, discriminator=trainer.discriminator,
      g_optimizer=trainer.g_optimizer.optimizer,
      d_optimizer=trainer.d_optimizer.optimizer, step=trainer.step, rng=trainer.rng)
  restored = checkpointer.restore_latest(allow_missing=["rng"])
  if restored is not None:
    logging.info("restored step %d from %s", restored, directory)
    counter = int(trainer.step.numpy())
    if counter != restored:  # a checkpoint not written by `train.train`
      logging.warning(
          "%s: the checkpoint saved as step %d holds a step counter of %d; the "
          "run goes on after step %d, its counter.", directory, restored,
          counter, counter)
  return checkpointer
