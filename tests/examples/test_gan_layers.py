"""Spectral normalization, conditional batch norm, the SN-GAN models and loss."""

import numpy as np
import pytest
import tensorflow as tf

from examples.gan import layers
from examples.gan import losses
from examples.gan import models


@pytest.mark.parametrize("shape", [(6, 4), (3, 3, 5, 7), (10, 1)])
def test_spectral_norm_matches_numpy_svd(shape):
  weight = tf.constant(np.random.RandomState(0).normal(size=shape), tf.float32)
  sn = layers.SpectralNorm()
  for _ in range(60):
    normalized = sn(weight, is_training=True)
  matrix = weight.numpy().reshape(-1, shape[-1])
  sigma = np.linalg.svd(matrix, compute_uv=False)[0]
  np.testing.assert_allclose(float(sn.sigma), sigma, rtol=1e-3)
  top = np.linalg.svd(normalized.numpy().reshape(-1, shape[-1]), compute_uv=False)[0]
  np.testing.assert_allclose(top, 1.0, rtol=1e-3)


def test_spectral_norm_u_is_persistent_and_moves_only_when_training():
  sn = layers.SpectralNorm()
  weight = tf.constant(np.random.RandomState(1).normal(size=(5, 4)), tf.float32)
  sn(weight, is_training=False)
  assert not sn.u.trainable and any(v is sn.u for v in sn.variables)
  u0 = sn.u.numpy()
  sn(weight, is_training=False)
  np.testing.assert_array_equal(sn.u.numpy(), u0)
  sn(weight, is_training=True)  # Exactly one power iteration.
  w = weight.numpy()
  v = u0 @ w.T
  v /= np.linalg.norm(v)
  expected = v @ w
  np.testing.assert_allclose(sn.u.numpy(), expected / np.linalg.norm(expected),
                             rtol=1e-5)


def test_spectral_norm_gradient_flows_to_weight_only():
  sn = layers.SpectralNorm()
  weight = tf.Variable(tf.random.normal([4, 3], seed=2))
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(sn(weight, is_training=True))
  assert tape.gradient(loss, weight) is not None


def test_conditional_batch_norm_applies_per_class_scale_and_offset():
  cbn = layers.ConditionalBatchNorm(num_classes=3)
  x = tf.random.normal([6, 2, 2, 4], seed=3)
  labels = tf.constant([0, 1, 2, 0, 1, 2])
  base = cbn(x, labels, is_training=True).numpy()  # gamma=1, beta=0.
  mean = x.numpy().mean(axis=(0, 1, 2))
  var = x.numpy().var(axis=(0, 1, 2))
  np.testing.assert_allclose(base, (x.numpy() - mean) / np.sqrt(var + 1e-5),
                             atol=1e-4)
  cbn.gamma.assign([[1.0] * 4, [2.0] * 4, [1.0] * 4])
  cbn.beta.assign([[0.0] * 4, [0.0] * 4, [5.0] * 4])
  out = cbn(x, labels, is_training=True).numpy()
  np.testing.assert_allclose(out[[0, 3]], base[[0, 3]], atol=1e-5)
  np.testing.assert_allclose(out[[1, 4]], 2 * base[[1, 4]], atol=1e-5)
  np.testing.assert_allclose(out[[2, 5]], base[[2, 5]] + 5, atol=1e-5)


def test_conditional_batch_norm_moving_stats_update_only_in_training():
  cbn = layers.ConditionalBatchNorm(num_classes=2, decay_rate=0.5)
  x = 3.0 + tf.random.normal([8, 2, 2, 3], seed=4)
  labels = tf.zeros([8], tf.int32)
  cbn(x, labels, is_training=True)
  moving_mean = cbn.norm.moving_mean.value.numpy().ravel()
  np.testing.assert_allclose(moving_mean, x.numpy().mean(axis=(0, 1, 2)),
                             rtol=1e-5)  # The EMA is debiased after one step.
  cbn(x + 10, labels, is_training=False)
  np.testing.assert_array_equal(cbn.norm.moving_mean.value.numpy().ravel(),
                                moving_mean)
  assert all(not v.trainable for v in cbn.norm.variables)


def _small_discriminator(num_classes=5):
  return models.Discriminator(ch=4, multipliers=(1, 2, 2),
                              downsample=(True, True, False),
                              num_classes=num_classes)


def test_discriminator_output_shape_and_class_dependence():
  disc = _small_discriminator()
  images = tf.random.normal([3, 16, 16, 3], seed=5)
  logits_a = disc(images, tf.constant([0, 1, 2]), is_training=False)
  logits_b = disc(images, tf.constant([4, 1, 3]), is_training=False)
  assert logits_a.shape == (3,)
  assert abs(float(logits_a[0] - logits_b[0])) > 1e-4
  np.testing.assert_allclose(logits_a[1], logits_b[1], rtol=1e-6)


def test_discriminator_label_enters_only_through_the_projection():
  disc = _small_discriminator()
  images = tf.random.normal([2, 16, 16, 3], seed=6)
  labels = tf.constant([0, 3])
  disc(images, labels, is_training=False)
  disc.embed.embeddings.assign(tf.zeros_like(disc.embed.embeddings) + 1e-30)
  # With (almost) zero embeddings the logit is psi(h) for every class.
  np.testing.assert_allclose(disc(images, labels, is_training=False),
                             disc(images, labels[::-1], is_training=False),
                             atol=1e-5)


def test_generator_shapes_range_and_class_conditioning():
  gen = models.Generator(ch=4, multipliers=(4, 2, 1), num_classes=3,
                         output_channels=3)
  z = tf.random.normal([4, 8], seed=7)
  images = gen(z, tf.constant([0, 1, 2, 0]), is_training=True)
  assert images.shape == (4, 16, 16, 3)
  assert float(tf.reduce_max(tf.abs(images))) <= 1.0
  gen.blocks[0].bn1.beta.assign(tf.random.normal([3, 16], seed=8))
  a = gen(z, tf.constant([0, 0, 0, 0]), is_training=False, test_local_stats=True)
  b = gen(z, tf.constant([1, 1, 1, 1]), is_training=False, test_local_stats=True)
  assert float(tf.reduce_max(tf.abs(a - b))) > 1e-4


def test_generator_and_discriminator_work_at_128x128_with_imagenet_widths():
  from examples.gan import configs
  config = configs.IMAGENET128
  gen = models.Generator(2, config.g_multipliers, 10, bottom_width=4)
  disc = models.Discriminator(2, config.d_multipliers, config.d_downsample, 10)
  images = gen(tf.random.normal([2, 16]), tf.constant([1, 2]), is_training=True)
  assert images.shape == (2, 128, 128, 3)
  assert disc(images, tf.constant([1, 2]), is_training=True).shape == (2,)


def test_hinge_losses_against_numpy():
  rng = np.random.RandomState(9)
  real, fake = rng.normal(size=7).astype(np.float32), rng.normal(size=7).astype(np.float32)
  expected_d = np.maximum(0, 1 - real).mean() + np.maximum(0, 1 + fake).mean()
  np.testing.assert_allclose(losses.discriminator_hinge_loss(real, fake),
                             expected_d, rtol=1e-6)
  np.testing.assert_allclose(losses.generator_hinge_loss(fake), -fake.mean(),
                             rtol=1e-6)
  # Confident, correct logits cost the discriminator nothing.
  assert float(losses.discriminator_hinge_loss(
      tf.constant([1.5, 3.0]), tf.constant([-1.0, -2.0]))) == 0.0


@pytest.mark.parametrize("module", [layers, losses, models])
def test_docstring_examples_run(module):
  import doctest  # pylint: disable=g-import-not-at-top
  results = doctest.testmod(module, extraglobs={"tf": tf, "np": np})
  assert results.attempted > 0 and results.failed == 0
