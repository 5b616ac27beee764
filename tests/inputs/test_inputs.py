"""pad_to_global_batch: evaluation sees every example once, padding masked out."""

import numpy as np
import pytest
import tensorflow as tf

import catalogue
import replicator


def _examples(n):
  x = np.arange(n * 3, dtype=np.float32).reshape(n, 3) + 1
  y = np.arange(n, dtype=np.int32) % 5
  return x, y


@pytest.mark.parametrize("name", ["gpu", "multi_gpu_2", "multi_gpu_4", "tpu_engine_2"])
@pytest.mark.parametrize("n", [1, 10, 16])
def test_an_evaluation_pass_counts_every_example_once(name, n):
  repl = catalogue.make(name)
  x, y = _examples(n)
  global_batch = 8

  def input_fn(ctx):
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    return replicator.pad_to_global_batch(ds, ctx, global_batch)

  def eval_step(batch):
    (features, labels), mask = batch
    return repl.all_sum({"sum": tf.reduce_sum(mask[:, None] * features),
                         "labels": tf.reduce_sum(mask * tf.cast(labels, tf.float32)),
                         "count": tf.reduce_sum(mask)})

  totals, steps = {"sum": 0.0, "labels": 0.0, "count": 0.0}, 0
  while True:
    try:
      out = repl.run(eval_step, input_fn)
    except replicator.InputExhausted:
      break
    steps += 1
    for key in totals:
      totals[key] += float(out[key][0])
  assert steps == -(-n // global_batch)  # the partial last batch is kept
  assert totals["count"] == n
  np.testing.assert_allclose(totals["sum"], x.sum(), rtol=1e-6)
  assert totals["labels"] == y.sum()


def test_with_num_examples_every_pipeline_runs_the_same_number_of_steps():
  x, y = _examples(10)
  ds = tf.data.Dataset.from_tensor_slices((x, y))
  steps_per_pipeline, counts = [], []
  for pipeline in range(2):  # 2 workers x 2 replicas, global batch 4: 3 steps each
    ctx = replicator.InputContext(num_input_pipelines=2, input_pipeline_id=pipeline,
                                  num_replicas_in_sync=4)
    shard = ds.shard(2, pipeline) if pipeline == 0 else ds.shard(2, 1).take(2)
    batches = list(replicator.pad_to_global_batch(shard, ctx, 4, num_examples=10))
    assert all(features.shape == (1, 3) and mask.shape == (1,)
               for (features, _), mask in batches)
    steps_per_pipeline.append(len(batches) // 2)
    counts.append(sum(float(mask.numpy().sum()) for _, mask in batches))
  assert steps_per_pipeline == [3, 3]
  assert counts == [5, 2]


def test_misuse_gives_clear_errors():
  ds = tf.data.Dataset.from_tensor_slices(_examples(10))
  two = replicator.InputContext(num_input_pipelines=2, input_pipeline_id=0,
                                num_replicas_in_sync=2)
  with pytest.raises(ValueError, match="num_examples: needed with 2 input pipelines"):
    replicator.pad_to_global_batch(ds, two, 4)
  with pytest.raises(ValueError, match="num_examples: 4 examples make 1 steps"):
    replicator.pad_to_global_batch(ds, two, 4, num_examples=4)
  one = replicator.InputContext(num_input_pipelines=1, input_pipeline_id=0,
                                num_replicas_in_sync=2)
  with pytest.raises(ValueError, match="fixed shape"):
    replicator.pad_to_global_batch(ds.batch(3), one, 4)
  with pytest.raises(ValueError, match="global_batch_size: 5"):
    replicator.pad_to_global_batch(ds, one, 5)
  with pytest.raises(TypeError, match="dataset: expected a tf.data.Dataset"):
    replicator.pad_to_global_batch([1, 2], one, 4)


def test_input_contexts_with_the_same_fields_are_equal():
  one = replicator.InputContext(2, 1, 4, steps_taken=3)
  assert one == replicator.InputContext(2, 1, 4, steps_taken=3)
  assert hash(one) == hash(replicator.InputContext(2, 1, 4, steps_taken=3))
  assert one != replicator.InputContext(2, 1, 4)
  assert not one._position_read  # pylint: disable=protected-access
