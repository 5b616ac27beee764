"""Spectral normalization and class-conditional batch norm, as Sonnet 2 modules.

Spectral normalization follows Miyato et al. (2018): the weight is divided by an
estimate of its largest singular value, refined by one power iteration per
training call. The power-iteration vector ``u`` is a persistent, non-trainable
variable assigned inside the step, so under a replicator its update is averaged
over replicas like batch-norm statistics.
"""

from typing import Optional

import sonnet as snt
import tensorflow as tf


def _l2_normalize(x: tf.Tensor, epsilon: float) -> tf.Tensor:
  return x * tf.math.rsqrt(tf.maximum(tf.reduce_sum(tf.square(x)), epsilon))


def glorot_uniform(gain: float = 1.0) -> snt.initializers.Initializer:
  """Glorot-uniform with a gain, as in the authors' Chainer code."""
  return snt.initializers.VarianceScaling(
      scale=gain**2, mode="fan_avg", distribution="uniform")


class SpectralNorm(snt.Module):
  """Divides a weight by its largest singular value (power-iteration estimate).

  The weight is seen as a matrix ``[prod(shape[:-1]), shape[-1]]``.

  >>> sn = SpectralNorm()
  >>> w = tf.constant([[3.0, 0.0], [0.0, 1.0]])
  >>> for _ in range(5):
  ...   w_bar = sn(w, is_training=True)
  >>> round(float(sn.sigma), 3)
  3.0
  """

  def __init__(self, n_power_iterations: int = 1, epsilon: float = 1e-12,
               name: Optional[str] = None):
    super().__init__(name=name)
    self._n_power_iterations = n_power_iterations
    self._epsilon = epsilon

  @snt.once
  def _initialize(self, weight: tf.Tensor):
    num_outputs = weight.shape[-1]
    self.u = tf.Variable(
        _l2_normalize(tf.random.normal([1, num_outputs], seed=0), self._epsilon),
        trainable=False, name="u")
    # The last estimate, for logging; it is assigned like `u`.
    self.sigma = tf.Variable(1.0, trainable=False, name="sigma")

  def __call__(self, weight: tf.Tensor, is_training: bool) -> tf.Tensor:
    self._initialize(weight)
    w = tf.reshape(weight, [-1, weight.shape[-1]])
    u = tf.stop_gradient(tf.cast(self.u, w.dtype))
    iterations = self._n_power_iterations if is_training else 0
    for _ in range(iterations):
      v = _l2_normalize(tf.matmul(u, w, transpose_b=True), self._epsilon)
      u = _l2_normalize(tf.matmul(v, w), self._epsilon)
    u = tf.stop_gradient(u)
    v = tf.stop_gradient(
        _l2_normalize(tf.matmul(u, w, transpose_b=True), self._epsilon))
    sigma = tf.reduce_sum(tf.matmul(v, w) * u)
    if is_training:
      self.u.assign(u)
      self.sigma.assign(tf.stop_gradient(sigma))
    return weight / sigma


class SNLinear(snt.Module):
  """A linear layer whose weight is spectrally normalized."""

  def __init__(self, output_size: int, with_bias: bool = True,
               w_init: Optional[snt.initializers.Initializer] = None,
               name: Optional[str] = None):
    super().__init__(name=name)
    self._output_size = output_size
    self._with_bias = with_bias
    self._w_init = w_init or glorot_uniform()
    self.spectral_norm = SpectralNorm()

  @snt.once
  def _initialize(self, inputs: tf.Tensor):
    shape = [inputs.shape[-1], self._output_size]
    self.w = tf.Variable(self._w_init(shape, inputs.dtype), name="w")
    if self._with_bias:
      self.b = tf.Variable(tf.zeros([self._output_size], inputs.dtype), name="b")

  def __call__(self, inputs: tf.Tensor, is_training: bool) -> tf.Tensor:
    self._initialize(inputs)
    outputs = tf.matmul(inputs, self.spectral_norm(self.w, is_training))
    return outputs + self.b if self._with_bias else outputs


class SNConv2D(snt.Module):
  """A 2-D convolution (NHWC, SAME padding) with a spectrally normalized kernel."""

  def __init__(self, output_channels: int, kernel_shape: int = 3,
               w_init: Optional[snt.initializers.Initializer] = None,
               name: Optional[str] = None):
    super().__init__(name=name)
    self._output_channels = output_channels
    self._kernel_shape = kernel_shape
    self._w_init = w_init or glorot_uniform()
    self.spectral_norm = SpectralNorm()

  @snt.once
  def _initialize(self, inputs: tf.Tensor):
    k = self._kernel_shape
    shape = [k, k, inputs.shape[-1], self._output_channels]
    self.w = tf.Variable(self._w_init(shape, inputs.dtype), name="w")
    self.b = tf.Variable(
        tf.zeros([self._output_channels], inputs.dtype), name="b")

  def __call__(self, inputs: tf.Tensor, is_training: bool) -> tf.Tensor:
    self._initialize(inputs)
    kernel = self.spectral_norm(self.w, is_training)
    outputs = tf.nn.conv2d(inputs, kernel, strides=1, padding="SAME")
    return outputs + self.b


class SNEmbed(snt.Module):
  """A class embedding ``[num_classes, dim]`` with spectral normalization."""

  def __init__(self, num_classes: int, embed_dim: int,
               name: Optional[str] = None):
    super().__init__(name=name)
    self.embeddings = tf.Variable(
        glorot_uniform()([num_classes, embed_dim], tf.float32), name="embeddings")
    self.spectral_norm = SpectralNorm()

  def __call__(self, labels: tf.Tensor, is_training: bool) -> tf.Tensor:
    table = self.spectral_norm(self.embeddings, is_training)
    return tf.gather(table, labels)


class ConditionalBatchNorm(snt.Module):
  """Batch norm with a per-class scale (gamma) and offset (beta).

  Statistics are over the replica's batch, or over the global batch with
  ``cross_replica=True`` (``replicator.nn.CrossReplicaBatchNorm``). Moving
  averages are non-trainable variables assigned inside the step.

  >>> cbn = ConditionalBatchNorm(num_classes=3)
  >>> x = tf.random.normal([4, 2, 2, 5])
  >>> cbn(x, tf.constant([0, 1, 2, 0]), is_training=True).shape
  TensorShape([4, 2, 2, 5])
  """

  def __init__(self, num_classes: int, cross_replica: bool = False,
               decay_rate: float = 0.999, eps: float = 1e-5,
               name: Optional[str] = None):
    super().__init__(name=name)
    self._num_classes = num_classes
    if cross_replica:
      import replicator  # pylint: disable=g-import-not-at-top
      norm_class = replicator.nn.CrossReplicaBatchNorm
    else:
      norm_class = snt.BatchNorm
    self.norm = norm_class(create_scale=False, create_offset=False,
                           decay_rate=decay_rate, eps=eps)

  @snt.once
  def _initialize(self, inputs: tf.Tensor):
    shape = [self._num_classes, inputs.shape[-1]]
    self.gamma = tf.Variable(tf.ones(shape, inputs.dtype), name="gamma")
    self.beta = tf.Variable(tf.zeros(shape, inputs.dtype), name="beta")

  def __call__(self, inputs: tf.Tensor, labels: tf.Tensor, is_training: bool,
               test_local_stats: bool = False) -> tf.Tensor:
    self._initialize(inputs)
    normed = self.norm(inputs, is_training=is_training,
                       test_local_stats=test_local_stats)
    gamma = tf.gather(self.gamma, labels)[:, None, None, :]
    beta = tf.gather(self.beta, labels)[:, None, None, :]
    return normed * gamma + beta
