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
    self._fused = False  # the fused kernel computes local statistics itself

  def _moments(self, inputs, use_batch_stats):
    replica = context.current()
    if not use_batch_stats or replica is None or replica.group.num_replicas == 1:
      return super()._moments(inputs, use_batch_stats)
    mean = tf.reduce_mean(inputs, self._axis, keepdims=True)
    mean = replica_ops.all_reduce(mean, ReduceOp.MEAN)
    variance = tf.reduce_mean(tf.math.squared_difference(inputs, mean),
                              self._axis, keepdims=True)
    variance = replica_ops.all_reduce(variance, ReduceOp.MEAN)
    return mean, variance
