"""CrossReplicaBatchNorm on N replicas equals snt.BatchNorm on the whole batch."""

import numpy as np
import pytest
import sonnet as snt
import tensorflow as tf

import catalogue
import replicator
from replicator.collectives import reductions


@pytest.mark.parametrize("name", sorted(catalogue.REPLICATORS))
def test_cross_replica_batch_norm_equals_batch_norm_on_the_global_batch(name):
  repl = catalogue.make(name)
  n = repl.num_replicas
  rng = np.random.RandomState(0)
  data = (rng.randn(n * 6, 4, 4, 3) * [1.0, 2.0, 5.0] + [0.0, 1.0, -3.0]).astype(np.float32)
  with repl.context():
    cross = replicator.nn.CrossReplicaBatchNorm(True, True, decay_rate=0.5)
  reference = snt.BatchNorm(True, True, decay_rate=0.5)

  def input_fn(ctx):
    return tf.data.Dataset.from_tensor_slices(data).batch(6, drop_remainder=True)

  def step_fn(x):
    return cross(x, is_training=True)

  for _ in range(2):
    out = repl.run(step_fn, input_fn).numpy()
    repl.reset_input(input_fn)
    want = reference(tf.constant(data), is_training=True).numpy()
  np.testing.assert_allclose(out.reshape(want.shape), want, atol=2e-5)
  for ours, theirs in ((cross.moving_mean.value, reference.moving_mean.value),
                       (cross.moving_variance.value, reference.moving_variance.value)):
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-5, atol=1e-6)
  repl.assert_replicas_in_sync(cross.variables)
  test_out = repl.run(lambda x: cross(x, is_training=False), input_fn).numpy()
  np.testing.assert_allclose(
      test_out.reshape(want.shape),
      reference(tf.constant(data), is_training=False).numpy(), atol=2e-5)


@pytest.mark.parametrize("rank", [2, 4])  # 4: snt.BatchNorm's fused kernel
def test_cross_replica_batch_norm_on_one_replica_is_snt_batch_norm_to_the_bit(rank):
  rng = np.random.RandomState(0)
  data = tf.constant((rng.randn(8, 5, 5, 3) * 3 + 1).astype(np.float32))
  data = data if rank == 4 else tf.reshape(data, [200, 3])
  repl = catalogue.make("gpu")
  with repl.context():
    in_replicator = replicator.nn.CrossReplicaBatchNorm(True, True, decay_rate=0.5)
  alone = replicator.nn.CrossReplicaBatchNorm(True, True, decay_rate=0.5)
  reference = snt.BatchNorm(True, True, decay_rate=0.5)
  for is_training in (True, True, False):
    want = reference(data, is_training=is_training).numpy()
    np.testing.assert_array_equal(alone(data, is_training=is_training).numpy(), want)
    got = repl.run(lambda: in_replicator(data, is_training=is_training))  # pylint: disable=cell-var-from-loop
    np.testing.assert_array_equal(got.numpy()[0], want)
  for module in (alone, in_replicator):
    np.testing.assert_array_equal(module.moving_variance.value.numpy(),
                                  reference.moving_variance.value.numpy())
  repl.shutdown()


@pytest.mark.parametrize("name", ["multi_gpu_2", "tpu_engine_2"])
def test_cross_replica_batch_norm_updates_the_moving_averages_it_is_given(name):
  """`moving_mean` / `moving_variance` metrics (snt.BaseBatchNorm's arguments):
  those objects keep the statistics, as they do in snt.BaseBatchNorm on the
  whole batch; snt.BatchNorm's own averages (decay 0.999) are not made."""
  repl = catalogue.make(name)
  rng = np.random.RandomState(3)
  data = (rng.randn(12, 4, 4, 3) * [1.0, 2.0, 5.0] + [0.0, 1.0, -3.0]).astype(np.float32)
  averages = lambda: dict(moving_mean=snt.ExponentialMovingAverage(0.3),
                          moving_variance=snt.ExponentialMovingAverage(0.3))
  with repl.context():  # (the averages' counters are made here)
    given = averages()
    cross = replicator.nn.CrossReplicaBatchNorm(True, True, **given)
  reference = snt.BaseBatchNorm(True, True, **averages())
  assert cross.moving_mean is given["moving_mean"]
  assert cross.moving_variance is given["moving_variance"]

  def input_fn(ctx):
    return tf.data.Dataset.from_tensor_slices(data).batch(6, drop_remainder=True)

  for _ in range(2):
    repl.run(lambda x: cross(x, is_training=True), input_fn)
    repl.reset_input(input_fn)
    reference(tf.constant(data), is_training=True)
  for ours, theirs in ((cross.moving_mean.value, reference.moving_mean.value),
                       (cross.moving_variance.value, reference.moving_variance.value)):
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-5, atol=1e-6)
  assert len(cross.variables) == len(reference.variables)  # no counters besides
  repl.assert_replicas_in_sync(cross.variables)
  repl.shutdown()


def test_cross_replica_batch_norm_refuses_half_its_moving_averages_or_a_decay_beside():
  average = snt.ExponentialMovingAverage(0.5)
  with pytest.raises(ValueError, match="got `moving_mean` but no `moving_variance`"):
    replicator.nn.CrossReplicaBatchNorm(True, True, moving_mean=average)
  with pytest.raises(ValueError, match="got `moving_variance` but no `moving_mean`"):
    replicator.nn.CrossReplicaBatchNorm(True, True, moving_variance=average)
  with pytest.raises(ValueError, match=r"decay_rate=0\.9 .*set the decay in the"):
    replicator.nn.CrossReplicaBatchNorm(True, True, decay_rate=0.9, moving_mean=average,
                                        moving_variance=snt.ExponentialMovingAverage(0.5))


def test_cross_replica_batch_norm_takes_bfloat16_images_on_one_replica():
  """snt.BatchNorm's fused kernel takes float32 only; ours normalizes bfloat16 too."""
  data = tf.constant((np.random.RandomState(0).randn(8, 5, 5, 3) * 3 + 1).astype(np.float32))
  half = replicator.nn.CrossReplicaBatchNorm(True, True)
  got = half(tf.cast(data, tf.bfloat16), is_training=True)
  want = snt.BatchNorm(True, True)(data, is_training=True)
  assert got.dtype == tf.bfloat16
  np.testing.assert_allclose(tf.cast(got, tf.float32).numpy(), want.numpy(), atol=0.05)


@pytest.mark.parametrize("rank", [2, 4])
def test_a_second_call_in_the_step_leaves_the_first_call_s_global_statistics(rank):
  """Replicas are traced in turns: replica 0's second call (moving statistics)
  ran while replica 1 was inside its first, and changed what it used (the
  count: doubled variance; the fused kernel: an error)."""
  rng = np.random.RandomState(0)
  data = (rng.randn(8, 4, 4, 3) * [1.0, 2.0, 5.0] + [0.0, 1.0, -3.0]).astype(np.float32)
  data[4:] += 3.0  # replicas' own statistics differ from the global batch's
  data = data if rank == 4 else data.reshape(-1, 3)
  repl = catalogue.make("multi_gpu_2")
  with repl.context():
    cross = replicator.nn.CrossReplicaBatchNorm(True, True)

  def step_fn(x):
    with_batch_stats = cross(x, is_training=False, test_local_stats=True)
    cross(x, is_training=False)
    return with_batch_stats

  def input_fn(ctx):
    return tf.data.Dataset.from_tensor_slices(data).batch(len(data) // 2)

  got = repl.run(step_fn, input_fn).numpy().reshape(data.shape)
  want = snt.BatchNorm(True, True)(tf.constant(data), False, test_local_stats=True)
  np.testing.assert_allclose(got, want.numpy(), atol=2e-5)
  repl.shutdown()


@pytest.mark.parametrize("name", ["multi_gpu_2", "multi_gpu_4"])
def test_cross_replica_batch_norm_gradients_equal_the_whole_batch(name):
  repl = catalogue.make(name)
  n = repl.num_replicas
  rng = np.random.RandomState(1)
  data = rng.randn(n * 4, 3).astype(np.float32)
  target = rng.randn(n * 4, 2).astype(np.float32)
  with repl.context():
    linear = snt.Linear(2, w_init=snt.initializers.Constant(0.3))
    cross = replicator.nn.CrossReplicaBatchNorm(True, True)

  def input_fn(ctx):
    return tf.data.Dataset.from_tensor_slices((data, target)).batch(4, drop_remainder=True)

  def step_fn(batch):
    with tf.GradientTape() as tape:
      out = cross(linear(batch[0]), is_training=True)
      loss = tf.reduce_mean((out - batch[1]) ** 2)
    variables = linear.trainable_variables + cross.trainable_variables
    return repl.all_mean(tape.gradient(loss, variables))

  got = [g.numpy()[0] for g in repl.run(step_fn, input_fn)]
  ref_linear = snt.Linear(2, w_init=snt.initializers.Constant(0.3))
  reference = snt.BatchNorm(True, True)
  with tf.GradientTape() as tape:
    out = reference(ref_linear(tf.constant(data)), is_training=True)
    loss = tf.reduce_mean((out - target) ** 2)
  want = tape.gradient(loss, ref_linear.trainable_variables + reference.trainable_variables)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w.numpy(), rtol=1e-4, atol=1e-6)


def test_cross_replica_batch_norm_with_uneven_batches_equals_the_whole_batch():
  """Per-replica batches of 5, 5, 5 and 1 rows: the statistics, outputs and
  gradients are those of snt.BatchNorm on the 16 rows (not a mean over replicas,
  which weighted the lone row like five)."""
  repl = catalogue.make("multi_gpu_4")
  rng = np.random.RandomState(2)
  data = (rng.randn(16, 3) + 1).astype(np.float32)
  data[15] += 10.0  # the short replica's lone row is far away
  target = rng.randn(16, 3).astype(np.float32)

  def input_fn(ctx):
    return replicator.allow_uneven_batches(
        tf.data.Dataset.from_tensor_slices((data, target)).batch(5))

  with repl.context():
    cross = replicator.nn.CrossReplicaBatchNorm(True, True, decay_rate=0.5)

  def step_fn(batch):
    with tf.GradientTape() as tape:
      out = cross(batch[0], is_training=True)
      loss = tf.reduce_sum((out - batch[1]) ** 2)  # summed: the whole batch's sum
    return {"out": repl.all_gather(out), "n": tf.shape(out)[0],
            "grads": repl.all_sum(tape.gradient(loss, cross.trainable_variables))}

  got = repl.run(step_fn, input_fn)
  np.testing.assert_array_equal(got["n"], [5, 5, 5, 1])
  reference = snt.BatchNorm(True, True, decay_rate=0.5)
  with tf.GradientTape() as tape:
    want = reference(tf.constant(data), is_training=True)
    loss = tf.reduce_sum((want - target) ** 2)
  want_grads = tape.gradient(loss, reference.trainable_variables)
  for r in range(4):
    np.testing.assert_allclose(got["out"][r], want.numpy(), atol=2e-5)
  for g, w in zip(got["grads"], want_grads):
    np.testing.assert_allclose(g.numpy()[0], w.numpy(), rtol=1e-4, atol=1e-5)
  for ours, theirs in ((cross.moving_mean.value, reference.moving_mean.value),
                       (cross.moving_variance.value, reference.moving_variance.value)):
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-5)


@pytest.mark.parametrize("name", ["multi_gpu_2", "multi_gpu_4"])
@pytest.mark.parametrize("at_the_end", [True, False], ids=["collectives", "in-graph sums"])
def test_moving_statistics_of_global_batch_statistics_merge_like_any_write(
    name, at_the_end, monkeypatch):
  """The statistics are the global batch's, yet each replica combines the
  gathered ones itself (another worker's CPU may round that by a bit), so the
  moving averages merge like any write of a step: where merges are
  collectives, in the one merge at the step's end; in the graph, each at its
  write. The averages equal snt.BatchNorm's on the whole batch, identical on
  every replica."""
  if at_the_end:
    monkeypatch.setattr(reductions, "merged_by_collectives", lambda devices, workers: True)
  repl = catalogue.make(name)
  n = repl.num_replicas
  rng = np.random.RandomState(3)
  data = (rng.randn(n * 4, 3) * [1.0, 2.0, 5.0] + [0.0, 1.0, -3.0]).astype(np.float32)
  data[:4] += 4.0  # replica 0's own statistics differ from the others'
  with repl.context():
    cross = replicator.nn.CrossReplicaBatchNorm(True, True, decay_rate=0.5)
  reference = snt.BatchNorm(True, True, decay_rate=0.5)
  collectives = []
  collective = replicator.collectives.replica_context.ReplicaGroup.collective

  def counted(group, index, name, flat_values, merge):
    if index == 0:
      collectives.append(name)
    return collective(group, index, name, flat_values, merge)
  monkeypatch.setattr(replicator.collectives.replica_context.ReplicaGroup, "collective", counted)

  def input_fn(ctx):
    return tf.data.Dataset.from_tensor_slices(data).repeat().batch(4)

  def step_fn(x):
    return cross(x, is_training=True)

  for _ in range(3):
    repl.run(step_fn, input_fn)
    reference(tf.constant(data), is_training=True)
  # Traced once: the one gather of every replica's count, mean and squares,
  # then the merges of the averages (their hidden values, counters, averages).
  averages = cross.moving_mean.variables + cross.moving_variance.variables
  assert collectives[0] == "all_gather of the batch statistics"
  writes = sorted(f"an update of variable {v.name}" for v in averages)
  if at_the_end:  # each write meets the others, then one merge of them all
    assert sorted(collectives[1:-1]) == writes
    assert collectives[-1] == "the merge of the variables written in the step"
  else:
    assert sorted(collectives[1:]) == writes
  for ours, theirs in ((cross.moving_mean.value, reference.moving_mean.value),
                       (cross.moving_variance.value, reference.moving_variance.value)):
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-5, atol=1e-6)
  repl.assert_replicas_in_sync(cross.variables)
  repl.shutdown()


@pytest.mark.parametrize("name", ["multi_gpu_2", "multi_gpu_4"])
def test_cross_replica_statistics_do_not_cancel_where_the_mean_is_large(name):
  """A mean of 1e4 against a spread of 1 (and replicas' means apart): float32
  sums of squares would lose the variance (x**2 ~ 1e8, rounded by ~8)."""
  repl = catalogue.make(name)
  n = repl.num_replicas
  rng = np.random.RandomState(4)
  data = (rng.randn(n * 8, 2) + 1e4).astype(np.float32)
  data[:8] += 3.0
  with repl.context():
    cross = replicator.nn.CrossReplicaBatchNorm(True, True, decay_rate=0.0)

  def step_fn(x):
    return cross(x, is_training=True)

  def input_fn(ctx):
    return tf.data.Dataset.from_tensor_slices(data).batch(8)

  out = repl.run(step_fn, input_fn).numpy().reshape(data.shape)
  exact = data.astype(np.float64)
  np.testing.assert_allclose(cross.moving_mean.value.numpy().ravel(), exact.mean(0),
                             rtol=1e-6)
  np.testing.assert_allclose(cross.moving_variance.value.numpy().ravel(),
                             exact.var(0), rtol=1e-3)  # rank 2: not unbiased
  np.testing.assert_allclose(out, (exact - exact.mean(0)) / np.sqrt(exact.var(0) + 1e-5),
                             atol=2e-3)
  repl.shutdown()
