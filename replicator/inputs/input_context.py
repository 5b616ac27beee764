"""What `input_fn` is given (`InputContext`), and what marks or pads the datasets it returns."""

import math
from typing import Optional

import numpy as np
import tensorflow as tf


class InputContext:
  """What `input_fn` needs to build this worker's part of the input.

  On a resumed job, replicator skips the `batches_taken` this worker's pipeline
  gave before the checkpoint with `dataset.skip`, which still reads and
  preprocesses each (hours, deep into an ImageNet run). To skip them cheaply,
  before decoding, do it in `input_fn` and return `skipped_by_input_fn(ds)`:

  >>> def input_fn(ctx):
  ...   batch_size = ctx.per_replica_batch_size(256)
  ...   records = tf.data.Dataset.range(10**9)  # e.g. serialized images
  ...   records = records.skip(ctx.batches_taken * batch_size)  # not decoded
  ...   ds = records.map(lambda r: r * 2).batch(batch_size, drop_remainder=True)
  ...   return skipped_by_input_fn(ds)
  >>> ctx = InputContext(num_input_pipelines=1, input_pipeline_id=0,
  ...                    num_replicas_in_sync=4, steps_taken=10)
  >>> ctx.per_replica_batch_size(256)
  64
  >>> ctx.batches_taken  # each step took a batch for each of 4 local replicas
  40
  >>> int(next(iter(input_fn(ctx)))[0])  # the 2,561st record, doubled
  5120

  Args:
    num_input_pipelines: the workers, one pipeline each.
    input_pipeline_id: this worker's index.
    num_replicas_in_sync: replicas over all workers.
    steps_taken: steps run on this input before the checkpoint a job resumed
      from (0 in a new job).
  """

  def __init__(self, num_input_pipelines: int, input_pipeline_id: int,
               num_replicas_in_sync: int, *, steps_taken: int = 0):
    self.num_input_pipelines = num_input_pipelines
    self.input_pipeline_id = input_pipeline_id
    self.num_replicas_in_sync = num_replicas_in_sync
    self._steps_taken = steps_taken
    self._position_read = False
    self._decided = False  # replicator has decided whether it skips

  def per_replica_batch_size(self, global_batch_size: int) -> int:
    """Examples in each replica's batch: `global_batch_size` (over all
    replicas, a positive multiple of their number) over the replicas."""
    if (isinstance(global_batch_size, bool) or
        not isinstance(global_batch_size, (int, np.integer)) or
        global_batch_size < 1):
      raise ValueError(
          f"global_batch_size: expected a positive int (examples per step over "
          f"all {self.num_replicas_in_sync} replicas), got "
          f"{global_batch_size!r}. Pass a multiple of "
          f"{self.num_replicas_in_sync}.")
    if global_batch_size % self.num_replicas_in_sync:
      raise ValueError(
          f"global_batch_size: {global_batch_size} is not divisible by the "
          f"{self.num_replicas_in_sync} replicas; use a multiple of "
          f"{self.num_replicas_in_sync}.")
    return int(global_batch_size) // self.num_replicas_in_sync

  @property
  def steps_taken(self) -> int:
    """Steps run on this input before the checkpoint the job resumed from; read
    it in `input_fn` itself (read later, by a generator say, it raises)."""
    if self._decided:
      raise RuntimeError(
          "ctx.steps_taken / batches_taken: read after input_fn returned (in a "
          "generator or a function the dataset calls later?), when replicator "
          "had already decided whether it skips the batches taken. Read it in "
          "input_fn itself and close over the number.")
    self._position_read = True
    return self._steps_taken

  def __eq__(self, other):
    return isinstance(other, InputContext) and self._fields() == other._fields()

  def __hash__(self):
    return hash(self._fields())

  def _fields(self):
    return (self.num_input_pipelines, self.input_pipeline_id,
            self.num_replicas_in_sync, self._steps_taken)

  @property
  def batches_taken(self) -> int:
    """Per-replica batches this pipeline gave in `steps_taken` steps: one per
    local replica of this job a step (on another topology than the checkpoint's,
    not the same examples: a warning says so)."""
    local_replicas = self.num_replicas_in_sync // self.num_input_pipelines
    return self.steps_taken * local_replicas

  def __repr__(self):
    return (f"InputContext(num_input_pipelines={self.num_input_pipelines}, "
            f"input_pipeline_id={self.input_pipeline_id}, num_replicas_in_sync="
            f"{self.num_replicas_in_sync}, steps_taken={self._steps_taken})")


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
  if not all(s.shape.is_fully_defined() for s in tf.nest.flatten(dataset.element_spec)):
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
  `wrap_optimizer(..., gradient_reduction=ReduceOp.SUM)`. `repl.all_gather`
  concatenates parts of any sizes along its axis, on one worker or several.
  Elements without a batch dimension (every leaf a scalar: one per replica a
  step) are always even, marked or not.
  """
  if not isinstance(dataset, tf.data.Dataset):
    raise TypeError(f"dataset: expected a tf.data.Dataset, got {dataset!r}.")
  setattr(dataset, _UNEVEN_MARK, True)
  return dataset


def allows_uneven_batches(dataset: tf.data.Dataset) -> bool:
  return getattr(dataset, _UNEVEN_MARK, False)


_SKIPPED_MARK = "_replicator_skipped_by_input_fn"


def skipped_by_input_fn(dataset: tf.data.Dataset) -> tf.data.Dataset:
  """Marks a dataset that starts after `ctx.batches_taken`; returns `dataset`.

  Replicator then does not skip the batches a resumed job's checkpoint says
  were taken: `input_fn` did, cheaply (see `InputContext`). `input_fn` must
  read `ctx.batches_taken` (or `steps_taken`) when it returns a marked dataset,
  and mark the dataset when it reads them, so that no batch is skipped twice
  or not at all; `run` raises otherwise. `pad_to_global_batch(num_examples=)`
  pads a whole evaluation set to its steps: skip its padded batches (after it),
  not the examples before it.
  """
  if not isinstance(dataset, tf.data.Dataset):
    raise TypeError(f"dataset: expected a tf.data.Dataset, got {dataset!r}.")
  setattr(dataset, _SKIPPED_MARK, True)
  return dataset


def check_skipped_by_input_fn(dataset: tf.data.Dataset, ctx: InputContext,
                              input_name) -> bool:
  """Whether `input_fn` skipped the taken batches itself; raises if half did."""
  marked = getattr(dataset, _SKIPPED_MARK, False)
  read = ctx._position_read  # pylint: disable=protected-access
  ctx._decided = True  # pylint: disable=protected-access
  if read and not marked:
    raise ValueError(
        f"input_fn: {input_name} read ctx.batches_taken (or steps_taken) but "
        "returned a dataset not marked with replicator.skipped_by_input_fn, so "
        "a resumed job would skip those batches twice (input_fn, then "
        "replicator). If input_fn skips them, return "
        "replicator.skipped_by_input_fn(ds); if not, do not read them.")
  if marked and not read:
    raise ValueError(
        f"input_fn: {input_name} returned replicator.skipped_by_input_fn(ds) "
        "without reading ctx.batches_taken, so a resumed job would start its "
        "input from the beginning. Skip ctx.batches_taken per-replica batches "
        "in input_fn (e.g. records.skip(ctx.batches_taken * batch_size) before "
        "decoding; read it in input_fn itself, not in a generator the dataset "
        "calls later), or return the dataset unmarked and replicator skips them.")
  return marked
