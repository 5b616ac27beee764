"""ResNets in Sonnet 2: ResNet-50 v1.5 for ImageNet and ResNet-20 for small images.

Both follow the large-batch recipe of Goyal et al. (2017): the last batch-norm scale in
every residual block starts at zero, so each block starts as the identity, and weight
decay reaches only the conv and linear kernels (`weight_decay_variables`), never the
batch-norm parameters or biases.

The modules are traced as written, as Sonnet's and Keras's own layers are: their
Python branches and loops read only Python values, so AutoGraph has nothing to
convert, and converting them anyway costs a step that builds ResNet-50 about a
second of its first trace (`_as_written`). A `norm_factory`'s modules run inside
them as written too: a norm module that branches on a tensor must convert
itself, as `snt.BatchNorm` does.

Variables are float32. With `compute_dtype=tf.bfloat16` the convolutions and the final
linear layer run in bfloat16 on casts of those variables, while batch norm, its moving
statistics and the logits stay in float32.

>>> model = ResNet20(num_classes=10)
>>> model(tf.zeros([2, 28, 28, 1]), is_training=False).shape
TensorShape([2, 10])
"""

from typing import Callable, Optional, Sequence

import sonnet as snt
import tensorflow as tf

import replicator

# `norm_factory(scale_init, name)` returns a module called as `norm(x, is_training)`.
NormFactory = Callable[[Optional[snt.initializers.Initializer], str], snt.Module]

# Python control flow only: traced without AutoGraph (see above).
_as_written = tf.autograph.experimental.do_not_convert

# He et al. (2015) initialisation over the fan-out, as in the reference ResNets.
_CONV_INIT = snt.initializers.VarianceScaling(2.0, "fan_out", "truncated_normal")


class MovingAverage(snt.Metric):
  """A moving average, not debiased: `average += (1 - decay) * (value - average)`.

  Batch norm's moving statistics as the large-batch recipe and Keras'
  `BatchNormalization` keep them: one variable, starting at `initial_value`
  (0 for the mean, 1 for the variance), and one write a step.
  `snt.ExponentialMovingAverage` (`snt.BatchNorm`'s) debiases instead: three
  variables (a step counter, the raw average and the debiased one) and three
  writes a step, which in ResNet-50's 53 batch norms triple the moving
  statistics a step writes, and each write on several replicas is merged. Its
  debiasing matters only in the first ~1 / (1 - decay) steps.

  >>> average = MovingAverage(decay=0.9, initial_value=0.0)
  >>> average.update(tf.constant([10.0]))
  >>> average.value.numpy()
  array([1.], dtype=float32)
  """

  def __init__(self, decay: float, initial_value: float, name: Optional[str] = None):
    super().__init__(name=name)
    if not 0.0 <= decay <= 1.0:
      raise ValueError(f"MovingAverage got decay={decay!r}: it must be in [0, 1] "
                       "(0.9 keeps 90% of the average at each update).")
    self._decay = decay
    self._initial_value = initial_value

  @snt.once
  def initialize(self, value: tf.Tensor):
    self.average = tf.Variable(self._initial(value.shape, value.dtype),
                               trainable=False, name="average")

  def _initial(self, shape, dtype) -> tf.Tensor:
    return tf.fill(shape, tf.constant(self._initial_value, dtype))

  def update(self, value: tf.Tensor):
    self.initialize(value)
    value = tf.cast(value, self.average.dtype)
    self.average.assign_sub((self.average - value) * (1.0 - self._decay))

  @property
  def value(self) -> tf.Tensor:
    return self.average.read_value()

  def reset(self):
    self.average.assign(self._initial(self.average.shape, self.average.dtype))


def batch_norm_factory(decay_rate: float = 0.9, eps: float = 1e-5,
                       cross_replica: bool = False) -> NormFactory:
  """Returns a factory of batch norms with `MovingAverage` statistics of `decay_rate`.

  `snt.BaseBatchNorm` (each replica normalizes by its own batch; `snt.BatchNorm`
  but for the moving averages), or `replicator.nn.CrossReplicaBatchNorm`, whose
  statistics cover the global batch: worth it when the per-replica batch is small
  (under ~32 images).
  """

  def factory(scale_init, name):
    with tf.name_scope(name):  # where snt.BatchNorm makes its averages
      averages = dict(
          moving_mean=MovingAverage(decay_rate, 0.0, name="moving_mean"),
          moving_variance=MovingAverage(decay_rate, 1.0, name="moving_variance"))
    module_cls = (replicator.nn.CrossReplicaBatchNorm if cross_replica
                  else snt.BaseBatchNorm)
    return module_cls(create_scale=True, create_offset=True, eps=eps,
                      scale_init=scale_init, name=name, **averages)
  return factory


class Conv2D(snt.Module):
  """A bias-free convolution with float32 weights that runs in the input's dtype.

  A strided convolution pads explicitly by `kernel_size - 1` split evenly (as the
  reference TPU ResNet does), so the output does not depend on the input size parity.
  """

  def __init__(self, output_channels: int, kernel_size: int, stride: int = 1,
               name: Optional[str] = None):
    super().__init__(name=name)
    self.output_channels = output_channels
    self.kernel_size = kernel_size
    self.stride = stride

  @snt.once
  def _initialize(self, inputs: tf.Tensor):
    shape = [self.kernel_size, self.kernel_size, inputs.shape[-1], self.output_channels]
    self.w = tf.Variable(_CONV_INIT(shape, tf.float32), name="w")

  @_as_written
  def __call__(self, inputs: tf.Tensor) -> tf.Tensor:
    self._initialize(inputs)
    padding = "SAME"
    if self.stride > 1:
      total = self.kernel_size - 1
      inputs = tf.pad(inputs, [[0, 0], [total // 2, total - total // 2],
                               [total // 2, total - total // 2], [0, 0]])
      padding = "VALID"
    return tf.nn.conv2d(inputs, tf.cast(self.w, inputs.dtype), self.stride, padding)


class _ConvNorm(snt.Module):
  """Conv, then batch norm in float32, then (optionally) ReLU."""

  def __init__(self, channels, kernel_size, stride, norm_factory, relu,
               zero_init_scale=False, name=None):
    super().__init__(name=name)
    self.conv = Conv2D(channels, kernel_size, stride, name="conv")
    scale_init = snt.initializers.Zeros() if zero_init_scale else None
    self.norm = norm_factory(scale_init, "bn")
    self.relu = relu

  @_as_written
  def __call__(self, x, is_training):
    y = self.conv(x)
    y = tf.cast(self.norm(tf.cast(y, tf.float32), is_training=is_training), x.dtype)
    return tf.nn.relu(y) if self.relu else y


class BasicBlock(snt.Module):
  """Two 3x3 convs (ResNet-18/34 and the CIFAR ResNets)."""

  expansion = 1

  def __init__(self, channels, stride, project, norm_factory, name=None):
    super().__init__(name=name)
    self.shortcut = None
    if project:
      self.shortcut = _ConvNorm(self.expansion * channels, 1, stride, norm_factory,
                                relu=False, name="shortcut")
    self.layers = self._residual_layers(channels, stride, norm_factory)

  def _residual_layers(self, channels, stride, norm_factory):
    return [_ConvNorm(channels, 3, stride, norm_factory, relu=True, name="a"),
            _ConvNorm(channels, 3, 1, norm_factory, relu=False, zero_init_scale=True,
                      name="b")]

  @_as_written
  def __call__(self, x, is_training):
    shortcut = x if self.shortcut is None else self.shortcut(x, is_training)
    for layer in self.layers:
      x = layer(x, is_training)
    return tf.nn.relu(x + shortcut)


class BottleneckBlock(BasicBlock):
  """1x1 reduce, 3x3 (carrying the stride: v1.5), 1x1 expand by 4."""

  expansion = 4

  def _residual_layers(self, channels, stride, norm_factory):
    return [_ConvNorm(channels, 1, 1, norm_factory, relu=True, name="a"),
            _ConvNorm(channels, 3, stride, norm_factory, relu=True, name="b"),
            _ConvNorm(4 * channels, 1, 1, norm_factory, relu=False,
                      zero_init_scale=True, name="c")]


class ResNet(snt.Module):
  """A ResNet: stem, stages of residual blocks, global average pool, linear logits."""

  def __init__(self, blocks_per_stage: Sequence[int], channels_per_stage: Sequence[int],
               block_cls, num_classes: int, imagenet_stem: bool,
               norm_factory: Optional[NormFactory] = None,
               compute_dtype: tf.DType = tf.float32, name: Optional[str] = None):
    super().__init__(name=name)
    norm_factory = norm_factory or batch_norm_factory()
    self.compute_dtype = compute_dtype
    self.imagenet_stem = imagenet_stem
    if imagenet_stem:
      self.stem = _ConvNorm(64, 7, 2, norm_factory, relu=True, name="stem")
    else:
      self.stem = _ConvNorm(channels_per_stage[0], 3, 1, norm_factory, relu=True,
                            name="stem")
    in_channels = 64 if imagenet_stem else channels_per_stage[0]
    self.blocks = []
    for stage, (num_blocks, channels) in enumerate(
        zip(blocks_per_stage, channels_per_stage)):
      for i in range(num_blocks):
        stride = 2 if (i == 0 and stage > 0) else 1
        out_channels = block_cls.expansion * channels
        self.blocks.append(block_cls(
            channels, stride, project=stride != 1 or in_channels != out_channels,
            norm_factory=norm_factory, name=f"stage{stage + 1}_block{i + 1}"))
        in_channels = out_channels
    # Goyal et al.: the classifier starts small, N(0, 0.01).
    self.logits = snt.Linear(
        num_classes, w_init=snt.initializers.RandomNormal(stddev=0.01), name="logits")

  @_as_written
  def __call__(self, images: tf.Tensor, is_training: bool) -> tf.Tensor:
    x = self.stem(tf.cast(images, self.compute_dtype), is_training)
    if self.imagenet_stem:
      x = tf.nn.max_pool2d(x, 3, 2, "SAME")
    for block in self.blocks:
      x = block(x, is_training)
    features = tf.reduce_mean(tf.cast(x, tf.float32), axis=[1, 2])
    return self.logits(features)

  @property
  def weight_decay_variables(self):
    """Conv and linear kernels only: what weight decay applies to (after a call)."""
    kernels = [m.w for m in self.submodules if isinstance(m, Conv2D)]
    return tuple(kernels) + (self.logits.w,)


def ResNet50(num_classes: int = 1000, **kwargs) -> ResNet:  # pylint: disable=invalid-name
  """ResNet-50 v1.5: 25,557,032 parameters with 1000 classes."""
  return ResNet([3, 4, 6, 3], [64, 128, 256, 512], BottleneckBlock, num_classes,
                imagenet_stem=True, name="resnet50", **kwargs)


def ResNet20(num_classes: int = 10, **kwargs) -> ResNet:  # pylint: disable=invalid-name
  """The CIFAR ResNet-20 of He et al. (16-32-64 channels, 3 blocks a stage)."""
  return ResNet([3, 3, 3], [16, 32, 64], BasicBlock, num_classes,
                imagenet_stem=False, name="resnet20", **kwargs)


MODELS = {"resnet50": ResNet50, "resnet20": ResNet20}
