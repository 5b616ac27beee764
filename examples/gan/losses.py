"""The hinge loss of SN-GAN (Lim & Ye, 2017; Miyato et al., 2018)."""

import tensorflow as tf


def discriminator_hinge_loss(real_logits: tf.Tensor,
                             fake_logits: tf.Tensor) -> tf.Tensor:
  """``E[relu(1 - D(x))] + E[relu(1 + D(G(z)))]``, averaged over the batch.

  >>> float(discriminator_hinge_loss(tf.constant([2.0, 0.5]),
  ...                                tf.constant([-2.0, 0.0])))
  0.75
  """
  return (tf.reduce_mean(tf.nn.relu(1.0 - real_logits)) +
          tf.reduce_mean(tf.nn.relu(1.0 + fake_logits)))


def generator_hinge_loss(fake_logits: tf.Tensor) -> tf.Tensor:
  """``-E[D(G(z))]``, averaged over the batch.

  >>> float(generator_hinge_loss(tf.constant([1.0, 3.0])))
  -2.0
  """
  return -tf.reduce_mean(fake_logits)
