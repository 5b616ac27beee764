"""Sonnet modules that need the whole global batch."""


from typing import Optional

import sonnet as snt
import tensorflow as tf

from replicator.collectives import replica_context


class CrossReplicaBatchNorm(snt.BatchNorm):
  """`snt.BatchNorm` whose batch statistics cover the global batch.

  Inside a multi-replica step every replica's example count, mean and sum of
  squared deviations from that mean (two passes, like `tf.nn.moments`) are
  gathered in one collective and combined (Chan et al.), so N replicas
  normalize as one device with the whole global batch, per replica batches of
  different sizes (`replicator.allow_uneven_batches`) included. Each replica
  updates its own copy of the moving averages from those global statistics.
  Elsewhere (one replica, outside a step, moving statistics) it is
  `snt.BatchNorm` to the bit, fused kernel included. float16 and bfloat16
  inputs get their statistics in float32, as `tf.nn.moments` does (and
  `snt.BatchNorm`'s fused kernel refuses rank-4 ones).

  The moving statistics are `snt.BatchNorm`'s debiased moving averages of
  `decay_rate` (0.999 by default), or, as `snt.BaseBatchNorm` takes them,
  any `snt.Metric` given as `moving_mean` and `moving_variance` (both, and
  then no `decay_rate`): a plain moving average, say, as Keras'
  `BatchNormalization` keeps.
  """

  def __init__(self, create_scale: bool, create_offset: bool,
               decay_rate: Optional[float] = None, eps: float = 1e-5, scale_init=None,
               offset_init=None, data_format: str = "channels_last",
               name: Optional[str] = None, *,
               moving_mean: Optional[snt.Metric] = None,
               moving_variance: Optional[snt.Metric] = None):
    if moving_mean is None and moving_variance is None:
      super().__init__(create_scale, create_offset,
                       0.999 if decay_rate is None else decay_rate, eps, scale_init,
                       offset_init, data_format, name)
      return
    if decay_rate is not None:
      raise ValueError(
          f"CrossReplicaBatchNorm got decay_rate={decay_rate!r} and moving averages "
          "of its own: `decay_rate` is snt.BatchNorm's averages'; set the decay in "
          "the `moving_mean` and `moving_variance` metrics instead.")
    if moving_mean is None or moving_variance is None:
      given, missing = (("moving_mean", "moving_variance") if moving_variance is None
                        else ("moving_variance", "moving_mean"))
      raise ValueError(
          f"CrossReplicaBatchNorm got `{given}` but no `{missing}`: pass both "
          "metrics, or neither for snt.BatchNorm's moving averages of `decay_rate`.")
    # snt.BatchNorm's own constructor would make (and drop) its averages' counters.
    snt.BaseBatchNorm.__init__(  # pylint: disable=non-parent-init-called
        self, create_scale=create_scale, create_offset=create_offset,
        moving_mean=moving_mean, moving_variance=moving_variance, eps=eps,
        scale_init=scale_init, offset_init=offset_init, data_format=data_format,
        name=name)

  def __call__(self, inputs: tf.Tensor, is_training, test_local_stats=False,
               scale=None, offset=None):
    self._initialize(inputs)
    use_batch_stats = is_training or test_local_stats
    replica = replica_context.current()
    across_replicas = use_batch_stats and replica is not None and replica.num_replicas > 1
    # snt.BatchNorm's own path, fused kernel included (the same bits), unless
    # the statistics are the global batch's, or the fused kernel's unbiased
    # moving variance is due and the kernel refuses the dtype.
    if not (across_replicas or (use_batch_stats and self._unbiased_moving_variance
                                and not self._fused)):
      return super().__call__(inputs, is_training, test_local_stats, scale, offset)
    # Nothing per call is kept on `self`: the replicas are traced in threads
    # that take turns at every collective, so one replica's second call would
    # change what another's first is still using.
    if self._create_scale and scale is not None:
      raise ValueError("Cannot pass `scale` at call time if `create_scale=True`.")
    if self._create_offset and offset is not None:
      raise ValueError("Cannot pass `offset` at call time if `create_offset=True`.")
    scale = self.scale if scale is None else scale
    offset = self.offset if offset is None else offset
    mean, variance, count = self._batch_moments(inputs, across_replicas)
    out = tf.nn.batch_normalization(inputs, mean, variance, offset=offset, scale=scale,
                                    variance_epsilon=self._eps)
    if is_training:
      if self._unbiased_moving_variance:
        variance = variance * tf.cast(count / tf.maximum(count - 1, 1), variance.dtype)
      # Merged like any write of a step: where merges are collectives, at the
      # step's end with every other (one all-reduce for the model). Each
      # replica combines the gathered statistics itself, and another worker's
      # CPU may round that by a bit: the merge keeps the copies identical.
      self.moving_mean.update(mean)
      self.moving_variance.update(variance)
    return out

  @snt.once
  def _initialize(self, inputs: tf.Tensor):
    super()._initialize(inputs)
    # snt.BatchNorm's fused kernel (rank 4, channels last) stores the unbiased
    # variance in its moving average; keep that with statistics of our own. It
    # takes float32 only: snt.BatchNorm fails on bfloat16 images, ours does not.
    self._unbiased_moving_variance = self._fused
    self._fused = self._fused and inputs.dtype == tf.float32

  def _batch_moments(self, inputs, across_replicas: bool):
    """`(mean, variance, count)` of this replica's batch, or of the global batch."""
    wide = tf.float32 if inputs.dtype in (tf.float16, tf.bfloat16) else inputs.dtype
    count = tf.cast(tf.size(inputs) // tf.shape(inputs)[self._channel_index], wide)
    if not across_replicas:
      mean, variance = tf.nn.moments(inputs, self._axis, keepdims=True)
      return mean, variance, count
    # Each replica's count, mean and sum of squared deviations from it travel
    # in one gather, and every replica combines them alike, as Chan et al. do:
    # sums of squares would cancel where the mean is large against the spread.
    # The gradient is written out (`_global_moments_gradient`), where autodiff
    # of the combination would make dozens of small ops a layer.
    x = tf.cast(inputs, wide)
    replica = replica_context.current()

    def forward(x):
      count = tf.cast(tf.size(x) // tf.shape(x)[self._channel_index], wide)
      mean = tf.math.divide_no_nan(tf.reduce_sum(x, self._axis, keepdims=True), count)
      squares = tf.reduce_sum(tf.math.squared_difference(x, mean), self._axis,
                              keepdims=True)
      mine = tf.concat([tf.reshape(count, [1, 1]), tf.reshape(mean, [1, -1]),
                        tf.reshape(squares, [1, -1])], axis=1)
      # [replicas, 1 + 2 x channels]
      every, = replica.all_gather([mine], 0, what="the batch statistics")
      channels = mean.shape.num_elements()
      counts, means, squares = tf.split(every, [1, channels, channels], axis=1)
      total = tf.reduce_sum(counts)
      global_mean = tf.reduce_sum(counts * means, 0) / total
      squares = (tf.reduce_sum(squares, 0)
                 + tf.reduce_sum(counts * tf.math.squared_difference(means, global_mean), 0))
      shape = tf.shape(mean)
      return [tf.reshape(global_mean, shape), tf.reshape(squares / total, shape), total]

    mean, variance, total = replica.with_summed_gradient(
        "the batch statistics", forward, [x], _global_moments_gradient)
    return tf.cast(mean, inputs.dtype), tf.cast(variance, inputs.dtype), total


def _global_moments_gradient(xs, ys, summed_dys):
  """The gradient of the global batch's mean M and variance V at this replica's x.

  Every replica's loss depends on M = sum(x) / N and V = sum((x - M)^2) / N
  over the global batch of N, so x's gradient is (dM + 2 dV (x - M)) / N, with
  dM and dV summed over the replicas (the term of V through M is zero, since
  the deviations from M sum to zero).
  """
  (x,), (mean, _, total), (d_mean, d_variance, _) = xs, ys, summed_dys
  return [(d_mean + 2.0 * d_variance * (x - mean)) / total]
