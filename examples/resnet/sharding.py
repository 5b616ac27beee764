"""How the workers split the data, for `data.py` and `imagenet.py`.

Training splits whole files between workers where there are enough of them (else
every n-th example); evaluation always takes every n-th example, so that the
workers' shares differ by at most one image (see `padded_eval`).
"""

import tensorflow as tf

import replicator


def shard(ds: tf.data.Dataset, ctx) -> tf.data.Dataset:
  if ctx.num_input_pipelines == 1:
    return ds
  return ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)


def files_dataset(files, ctx, is_training):
  """Whole files per worker when training on enough of them, else examples (later).

  Evaluation always splits by example: whole files would give a worker as many
  as ceil(files / workers) files, more than its fixed number of steps can hold
  (128 ImageNet validation files on 6 workers lost 292 images).
  """
  files = sorted(files)
  ds = tf.data.Dataset.from_tensor_slices(files)
  per_file = is_training and len(files) >= ctx.num_input_pipelines
  if per_file:  # (shuffled only here: sharding by example needs one order everywhere)
    ds = shard(ds, ctx).shuffle(len(files), reshuffle_each_iteration=True)
  return ds, per_file


def padded_eval(ds, ctx, global_batch_size, num_examples):
  """`(images, labels, weights)` batches, padding weighted 0 (`pad_to_global_batch`).

  `ds` is this worker's share of `num_examples` examples dealt one by one, so the
  shares differ by at most one. Several workers must run one number of steps,
  fixed in advance: room for num_examples + 1 examples. Every share fits, and if
  `num_examples` understates the data, the images over a worker's room are not
  seen but the weights then sum to more than `num_examples` (each worker fills its
  room, over num_examples + 1 in all), so the count that `train.py` checks cannot
  come out right by chance. It costs one all-padding step when the global batch
  divides `num_examples`.
  """
  if ctx.num_input_pipelines == 1:
    steps_for = None  # one pipeline runs until its own data ends
  else:
    steps_for = num_examples + 1
  padded = replicator.pad_to_global_batch(ds, ctx, global_batch_size, steps_for)
  return padded.map(lambda batch, mask: (*batch, mask))
