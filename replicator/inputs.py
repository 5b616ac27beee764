"""Inputs whose batches are not all full.

A step runs only when every replica has a batch and all are one size, so a
plain `ds.batch(b, drop_remainder=True)` loses the last examples of an
evaluation set: `pad_to_global_batch` pads them instead and says which rows are
real. `allow_uneven_batches` marks a dataset whose batch sizes vary on purpose.
"""

import math
from typing import Optional

import tensorflow as tf

from replicator.context import InputContext


def pad_to_global_batch(dataset: tf.data.Dataset, ctx: InputContext,
                        global_batch_size: int,
                        num_examples: Optional[int] = None) -> tf.data.Dataset:
  """Per-replica batches of `dataset`'s examples, the last step padded.

  >>> def eval_input_fn(ctx):
  ...   ds = examples.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
  ...   return replicator.pad_to_global_batch(ds, ctx, 256)
  >>> def eval_step(batch):
  ...   (images, labels), mask = batch
  ...   correct = tf.cast(tf.argmax(model(images), -1) == labels, tf.float32)
  ...   return repl.all_sum({"correct": tf.reduce_sum(mask * correct),
  ...                        "count": tf.reduce_sum(mask)})

  Args:
    dataset: this input pipeline's examples, unbatched, each component with a
      fixed shape.
    ctx: the `InputContext` given to `input_fn`.
    global_batch_size: examples per step over all replicas.
    num_examples: the number of examples over all input pipelines. Needed with
      several pipelines (workers), so that every one of them runs the same
      number of steps: ceil(num_examples / global_batch_size). Each pipeline
      must then hold at most that many steps' worth of examples (checked
      when the dataset's cardinality is known; extra examples are otherwise
      not seen).

  Returns:
    A dataset of `(batch, mask)`: `batch` has `dataset`'s structure with a
    leading axis of the per-replica batch size; `mask` is float32, 1 for a
    real example and 0 for padding (zeros). Every local replica gets a batch
    on the last step, so `run` raises `InputExhausted` only after every real
    example has been seen.
  """
  if not isinstance(dataset, tf.data.Dataset):
    raise TypeError(f"dataset: expected a tf.data.Dataset of single examples, got "
                    f"{type(dataset).__name__}.")
  if not isinstance(ctx, InputContext):
    raise TypeError(f"ctx: expected the InputContext given to input_fn, got {ctx!r}.")
  per_replica = ctx.per_replica_batch_size(global_batch_size)
  if ctx.num_input_pipelines > 1 and num_examples is None:
    raise ValueError(
        f"num_examples: needed with {ctx.num_input_pipelines} input pipelines, so "
        "that every worker runs the same number of steps; pass the evaluation "
        "set's size, e.g. pad_to_global_batch(ds, ctx, batch, num_examples=50000).")
  specs = tf.nest.flatten(dataset.element_spec)
  unknown = [s for s in specs if not s.shape.is_fully_defined()]
  if unknown:
    raise ValueError(
        f"dataset: every component of an example needs a fixed shape to be padded, "
        f"got {dataset.element_spec}; resize or pad the examples first (and pass "
        "examples, not batches).")
  group = per_replica * (ctx.num_replicas_in_sync // ctx.num_input_pipelines)

  def pad(*batch):
    batch = batch[0] if len(batch) == 1 else batch
    rows = tf.shape(tf.nest.flatten(batch)[0])[0]
    missing = group - rows

    def pad_rows(t):
      return tf.pad(t, [[0, missing]] + [[0, 0]] * (t.shape.rank - 1))
    mask = tf.concat([tf.ones([rows]), tf.zeros([missing])], 0)
    return tf.nest.map_structure(pad_rows, batch), mask

  padded = dataset.batch(group).map(pad)  # full groups; the last one padded
  if num_examples is not None:
    steps = math.ceil(num_examples / global_batch_size)
    known = int(dataset.cardinality())
    if known > steps * group:
      raise ValueError(
          f"num_examples: {num_examples} examples make {steps} steps of "
          f"{global_batch_size}, {steps * group} examples for this pipeline, but "
          f"it holds {known}; pass the size of the whole evaluation set, and "
          "shard it evenly (Dataset.shard).")
    empty = (tf.nest.map_structure(lambda s: tf.zeros([group] + s.shape.as_list(), s.dtype),
                                   dataset.element_spec), tf.zeros([group]))
    padded = padded.concatenate(tf.data.Dataset.from_tensors(empty).repeat()).take(steps)
  return padded.unbatch().batch(per_replica, drop_remainder=True)


_UNEVEN_MARK = "_replicator_allows_uneven_batches"


def allow_uneven_batches(dataset: tf.data.Dataset) -> tf.data.Dataset:
  """Lets steps run on per-replica batches of different sizes; returns `dataset`.

  By default a step runs only when every replica's batch is the same size,
  because the gradient mean over replicas weights every replica's batch
  alike: with a short batch on one replica that is not the step of one
  replica on the whole batch. Return `allow_uneven_batches(ds)` from
  `input_fn` when sizes vary on purpose (batches bucketed by sequence length,
  say) and weight the loss yourself: divide each replica's summed loss by the
  global count, `repl.all_sum(count)`, and reduce gradients with
  `wrap_optimizer(..., gradient_reduction=ReduceOp.SUM)`.
  """
  if not isinstance(dataset, tf.data.Dataset):
    raise TypeError(f"dataset: expected a tf.data.Dataset, got {dataset!r}.")
  setattr(dataset, _UNEVEN_MARK, True)
  return dataset


def allows_uneven_batches(dataset: tf.data.Dataset) -> bool:
  return getattr(dataset, _UNEVEN_MARK, False)
