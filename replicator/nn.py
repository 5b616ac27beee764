"""Sonnet modules that need the whole global batch."""

import sonnet as snt
import tensorflow as tf

from replicator import context
from replicator import replica_ops
from replicator.collectives import ReduceOp


class CrossReplicaBatchNorm(snt.BatchNorm):
  """`snt.BatchNorm` whose batch statistics cover the global batch.

  Inside a multi-replica step the mean and variance are averaged over all
  replicas (two-pass, like `tf.nn.moments`), so N replicas with batch B each
  normalize exactly as one device with batch N*B; elsewhere it is
  `snt.BatchNorm`. Every replica must have the same per-replica batch size.
  """

  @snt.once
  def _initialize(self, inputs: tf.Tensor):
    super()._initialize(inputs)
    # snt.BatchNorm's fused kernel (rank 4, channels last) stores the unbiased
    # variance in its moving average; keep that, with statistics of our own.
    self._unbiased_moving_variance = self._fused
    self._fused = False

  def _moments(self, inputs, use_batch_stats):
    replica = context.current()
    num_replicas = replica.group.num_replicas if replica else 1
    size = tf.cast(tf.size(inputs) // tf.shape(inputs)[self._channel_index],
                   inputs.dtype)
    self._count = size * num_replicas
    if not use_batch_stats or num_replicas == 1:
      return super()._moments(inputs, use_batch_stats)
    mean = tf.reduce_mean(inputs, self._axis, keepdims=True)
    mean = replica_ops.all_reduce(mean, ReduceOp.MEAN)
    variance = tf.reduce_mean(tf.math.squared_difference(inputs, mean),
                              self._axis, keepdims=True)
    variance = replica_ops.all_reduce(variance, ReduceOp.MEAN)
    return mean, variance

  def _update_statistics(self, mean, variance):
    if self._unbiased_moving_variance:
      variance = variance * self._count / tf.maximum(self._count - 1, 1)
    super()._update_statistics(mean, variance)
