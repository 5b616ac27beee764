"""Sonnet modules that need the whole global batch."""

import sonnet as snt
import tensorflow as tf

from replicator import context
from replicator import replica_ops
from replicator.reduce_options import ReduceOp


class CrossReplicaBatchNorm(snt.BatchNorm):
  """`snt.BatchNorm` whose batch statistics cover the global batch.

  Inside a multi-replica step every replica's sums, and then its sums of
  squared deviations from the global mean (two passes, like
  `tf.nn.moments`), are summed over replicas with the example counts, so N
  replicas normalize exactly as one device with the whole global batch, per
  replica batches of different sizes (`replicator.allow_uneven_batches`)
  included. Elsewhere (one replica, outside a step, moving statistics) it is
  `snt.BatchNorm` to the bit, fused kernel included. float16 and bfloat16
  inputs get their statistics in float32, as `tf.nn.moments` does (and
  `snt.BatchNorm`'s fused kernel refuses rank-4 ones).
  """

  def __call__(self, inputs: tf.Tensor, is_training, test_local_stats=False,
               scale=None, offset=None):
    self._initialize(inputs)
    replica = context.current()
    across_replicas = ((is_training or test_local_stats) and replica is not None
                       and replica.group.num_replicas > 1)
    # Elsewhere snt.BatchNorm's own path, fused kernel included: the same bits.
    self._fused = self._fusable and not across_replicas
    return super().__call__(inputs, is_training, test_local_stats, scale, offset)

  @snt.once
  def _initialize(self, inputs: tf.Tensor):
    super()._initialize(inputs)
    # snt.BatchNorm's fused kernel (rank 4, channels last) stores the unbiased
    # variance in its moving average; keep that with statistics of our own. It
    # takes float32 only: snt.BatchNorm fails on bfloat16 images, ours does not.
    self._unbiased_moving_variance = self._fused
    self._fusable = self._fused and inputs.dtype == tf.float32

  def _moments(self, inputs, use_batch_stats):
    replica = context.current()
    num_replicas = replica.group.num_replicas if replica else 1
    wide = tf.float32 if inputs.dtype in (tf.float16, tf.bfloat16) else inputs.dtype
    count = tf.cast(tf.size(inputs) // tf.shape(inputs)[self._channel_index], wide)
    if not use_batch_stats or num_replicas == 1:
      self._count = count
      return super()._moments(inputs, use_batch_stats)
    x = tf.cast(inputs, wide)
    total, self._count = replica_ops.all_reduce(
        [tf.reduce_sum(x, self._axis, keepdims=True), count], ReduceOp.SUM)
    mean = total / self._count
    # No stop_gradient on the mean (tf.nn.moments has one): the backward pass
    # must reach this collective before the mean's on every replica.
    squares = tf.reduce_sum(tf.math.squared_difference(x, mean), self._axis,
                            keepdims=True)
    variance = replica_ops.all_reduce(squares, ReduceOp.SUM) / self._count
    return tf.cast(mean, inputs.dtype), tf.cast(variance, inputs.dtype)

  def _update_statistics(self, mean, variance):
    if self._unbiased_moving_variance and not self._fused:  # fused: corrected
      correction = self._count / tf.maximum(self._count - 1, 1)
      variance = variance * tf.cast(correction, variance.dtype)
    super()._update_statistics(mean, variance)
