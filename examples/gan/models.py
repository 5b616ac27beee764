"""SN-GAN with a projection discriminator (Miyato & Koyama, 2018), in Sonnet 2.

Architectures follow the authors' public Chainer code (``sngan_projection``):
a ResNet generator with class-conditional batch norm and a ResNet
discriminator with spectral normalization in every layer, global sum pooling
and the projection term ``<embed(y), h>``. Widths are ``ch`` times a
per-block multiplier, so one class covers 32x32 and 128x128.
"""

import math
from typing import Optional, Sequence

import sonnet as snt
import tensorflow as tf

from examples.gan import layers


def _upsample(x: tf.Tensor) -> tf.Tensor:
  """Nearest-neighbour 2x upsampling (a broadcast: cheaper than a resize op)."""
  _, height, width, channels = x.shape
  x = tf.broadcast_to(x[:, :, None, :, None, :],
                      [tf.shape(x)[0], height, 2, width, 2, channels])
  return tf.reshape(x, [-1, 2 * height, 2 * width, channels])


def _downsample(x: tf.Tensor) -> tf.Tensor:
  return tf.nn.avg_pool2d(x, ksize=2, strides=2, padding="VALID")


class GeneratorBlock(snt.Module):
  """CBN-ReLU-up-conv-CBN-ReLU-conv, plus an upsampled 1x1-conv shortcut."""

  def __init__(self, output_channels: int, num_classes: int,
               cross_replica_bn: bool = False, bn_decay_rate: float = 0.9,
               name: Optional[str] = None):
    super().__init__(name=name)
    self._output_channels = output_channels
    self.bn1 = layers.ConditionalBatchNorm(num_classes, cross_replica_bn,
                                           bn_decay_rate)
    self.bn2 = layers.ConditionalBatchNorm(num_classes, cross_replica_bn,
                                           bn_decay_rate)
    gain = layers.glorot_uniform(math.sqrt(2))
    self.conv1 = snt.Conv2D(output_channels, 3, w_init=gain)
    self.conv2 = snt.Conv2D(output_channels, 3, w_init=gain)
    self.shortcut = snt.Conv2D(output_channels, 1,
                               w_init=layers.glorot_uniform())

  def __call__(self, x, labels, is_training, test_local_stats=False):
    h = tf.nn.relu(self.bn1(x, labels, is_training, test_local_stats))
    h = self.conv1(_upsample(h))
    h = tf.nn.relu(self.bn2(h, labels, is_training, test_local_stats))
    h = self.conv2(h)
    return h + self.shortcut(_upsample(x))


class Generator(snt.Module):
  """Maps noise ``z`` and class labels to images in [-1, 1].

  Batch-norm moving averages decay by ``bn_decay_rate`` (0.9, Chainer's
  default, as in the authors' code); samples for evaluation use them.

  >>> g = Generator(ch=4, multipliers=(2, 1), num_classes=3, output_channels=1)
  >>> g(tf.random.normal([2, 16]), tf.constant([0, 2]), is_training=True).shape
  TensorShape([2, 8, 8, 1])
  """

  def __init__(self, ch: int, multipliers: Sequence[int], num_classes: int,
               output_channels: int = 3, bottom_width: int = 4,
               cross_replica_bn: bool = False, bn_decay_rate: float = 0.9,
               name: Optional[str] = None):
    super().__init__(name=name)
    self._bottom_width = bottom_width
    self._input_channels = ch * multipliers[0]
    self.linear = snt.Linear(bottom_width**2 * self._input_channels,
                             w_init=layers.glorot_uniform())
    self.blocks = [
        GeneratorBlock(ch * m, num_classes, cross_replica_bn, bn_decay_rate)
        for m in multipliers[1:]
    ]
    self.final_bn = (
        layers.ConditionalBatchNorm(1, cross_replica_bn, bn_decay_rate,
                                    name="final_bn"))
    self.final_conv = snt.Conv2D(output_channels, 3,
                                 w_init=layers.glorot_uniform())

  def __call__(self, z: tf.Tensor, labels: tf.Tensor, is_training: bool,
               test_local_stats: bool = False) -> tf.Tensor:
    h = tf.reshape(self.linear(z), [-1, self._bottom_width, self._bottom_width,
                                    self._input_channels])
    for block in self.blocks:
      h = block(h, labels, is_training, test_local_stats)
    # The last batch norm is unconditional: one "class" shared by all samples.
    h = self.final_bn(h, tf.zeros_like(labels), is_training, test_local_stats)
    return tf.tanh(self.final_conv(tf.nn.relu(h)))


class DiscriminatorBlock(snt.Module):
  """ReLU-conv-ReLU-conv(-avgpool), plus a 1x1-conv shortcut.

  The first block of the network (``optimized=True``) skips the leading ReLU
  and pools before its shortcut conv, as in the authors' ``OptimizedBlock``.
  """

  def __init__(self, output_channels: int, downsample: bool,
               optimized: bool = False, name: Optional[str] = None):
    super().__init__(name=name)
    self._output_channels = output_channels
    self._downsample = downsample
    self._optimized = optimized
    gain = layers.glorot_uniform(math.sqrt(2))
    self.conv1 = layers.SNConv2D(output_channels, 3, w_init=gain)
    self.conv2 = layers.SNConv2D(output_channels, 3, w_init=gain)
    self.shortcut = layers.SNConv2D(output_channels, 1,
                                    w_init=layers.glorot_uniform())

  def __call__(self, x: tf.Tensor, is_training: bool) -> tf.Tensor:
    h = x if self._optimized else tf.nn.relu(x)
    h = self.conv1(h, is_training)
    h = self.conv2(tf.nn.relu(h), is_training)
    if self._downsample:
      h = _downsample(h)
    if self._optimized:
      return h + self.shortcut(_downsample(x), is_training)
    if self._downsample or x.shape[-1] != self._output_channels:
      shortcut = self.shortcut(x, is_training)
      return h + (_downsample(shortcut) if self._downsample else shortcut)
    return h + x


class Discriminator(snt.Module):
  """Projection discriminator: ``psi(h) + <embed(y), h>``, one logit per image.

  >>> d = Discriminator(ch=4, multipliers=(1, 2), downsample=(True, False),
  ...                   num_classes=3)
  >>> d(tf.zeros([2, 8, 8, 1]), tf.constant([0, 2]), is_training=True).shape
  TensorShape([2])
  """

  def __init__(self, ch: int, multipliers: Sequence[int],
               downsample: Sequence[bool], num_classes: int,
               name: Optional[str] = None):
    super().__init__(name=name)
    self.blocks = [
        DiscriminatorBlock(ch * m, down, optimized=(i == 0))
        for i, (m, down) in enumerate(zip(multipliers, downsample))
    ]
    self.linear = layers.SNLinear(1)
    self.embed = layers.SNEmbed(num_classes, ch * multipliers[-1])

  def __call__(self, images: tf.Tensor, labels: tf.Tensor,
               is_training: bool) -> tf.Tensor:
    h = images
    for block in self.blocks:
      h = block(h, is_training)
    h = tf.reduce_sum(tf.nn.relu(h), axis=[1, 2])  # Global sum pooling.
    unconditional = tf.squeeze(self.linear(h, is_training), axis=-1)
    projection = tf.reduce_sum(self.embed(labels, is_training) * h, axis=-1)
    return unconditional + projection
