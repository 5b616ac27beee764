"""Input pipelines: ImageNet (TFDS, TFRecords, image folder), Fashion-MNIST, synthetic.

`make_input_fn` returns the `input_fn(ctx)` that `replicator` calls once per worker;
each worker reads its own `1 / ctx.num_input_pipelines` of the data (`sharding.py`
says how) and batches per replica. The ImageNet readers and preprocessing are in
`imagenet.py`.

Training elements are `(images, labels)`. Evaluation elements are
`(images, labels, weights)` from `replicator.pad_to_global_batch`: the last step is
padded with zero-weight examples so that every replica gets a batch and no test image
is dropped. The sum of the weights over all workers is the number of images
evaluated; `train.py` checks it against the declared size of the evaluation set.
"""

import dataclasses
import os
from typing import Callable, Optional, Tuple

from absl import logging
import numpy as np
import tensorflow as tf

import replicator
from examples import idx
from examples.resnet import imagenet
from examples.resnet import sharding

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
_FASHION_MNIST_MEAN, _FASHION_MNIST_STD = 0.2860, 0.3530


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
  num_classes: int
  num_train_examples: int
  num_eval_examples: int
  image_shape: Tuple[int, int, int]


# ---------------------------------------------------------------------------
# Fashion-MNIST: arrays in memory, augmented a batch at a time.


def load_fashion_mnist(data_dir: str, is_training: bool):
  prefix = "train" if is_training else "t10k"
  paths = [os.path.join(data_dir, f"{prefix}-{kind}-idx{ndim}-ubyte.gz")
           for kind, ndim in (("images", 3), ("labels", 1))]
  missing = [p for p in paths if not tf.io.gfile.exists(p)]
  if missing:
    raise ValueError(
        f"--data_dir: --dataset=fashion_mnist found no {', '.join(missing)}; pass the "
        "directory of the gzipped IDX files (train-images-idx3-ubyte.gz, ..., "
        f"t10k-labels-idx1-ubyte.gz), or install them under {FASHION_MNIST_DIR} "
        "(apt-get install dataset-fashion-mnist).")
  images, labels = idx.read_idx(paths[0]), idx.read_idx(paths[1])
  return images[..., None], labels.astype(np.int32)


def _normalize_small(images):
  return (tf.cast(images, tf.float32) / 255.0 - _FASHION_MNIST_MEAN) / _FASHION_MNIST_STD


def _random_flip_batch(images):
  flip = tf.random.uniform([tf.shape(images)[0], 1, 1, 1]) < 0.5
  return tf.where(flip, tf.reverse(images, axis=[2]), images)


# ---------------------------------------------------------------------------
# The input_fn and the dataset sizes.


def make_input_fn(dataset: str, is_training: bool, global_batch_size: int,
                  data_dir: Optional[str] = None, image_size: int = 224,
                  num_classes: int = 1000, tfds_manual_dir: Optional[str] = None,
                  shuffle_buffer: int = 10_000,
                  num_eval_examples: Optional[int] = None) -> Callable:
  """Returns `input_fn(ctx) -> tf.data.Dataset` of per-replica batches.

  `num_eval_examples` overrides the evaluation set's size where the data does not
  say it (`imagenet_tfrecord`: ImageNet's 50,000); see `dataset_info`.
  """
  if dataset not in DATASETS:
    raise ValueError(f"dataset must be one of {DATASETS}, got {dataset!r}")

  def input_fn(ctx):
    batch_size = ctx.per_replica_batch_size(global_batch_size)
    if dataset == "synthetic" and is_training:
      images, labels = synthetic_arrays(batch_size, image_size, num_classes)
      return tf.data.Dataset.from_tensors((imagenet.normalize(images), labels)).repeat()
    if dataset in ("fashion_mnist", "synthetic"):
      if dataset == "fashion_mnist":
        images, labels = load_fashion_mnist(data_dir or FASHION_MNIST_DIR, is_training)
        normalize = _normalize_small
      else:
        images, labels = synthetic_arrays(256, image_size, num_classes, seed=1)
        normalize = imagenet.normalize
      ds = sharding.shard(tf.data.Dataset.from_tensor_slices((images, labels)), ctx)
      if not is_training:
        return sharding.padded_eval(ds.map(lambda x, y: (normalize(x), y)), ctx,
                                    global_batch_size, len(labels)).prefetch(2)
      # Augmenting whole batches costs a few ops per batch instead of per image.
      ds = ds.shuffle(len(labels)).repeat().batch(batch_size, drop_remainder=True)
      ds = ds.map(lambda x, y: (_random_flip_batch(normalize(x)), y))
      return ds.prefetch(2)

    if dataset == "imagenet_tfds":
      ds = imagenet.tfds_source(data_dir, is_training, ctx, manual_dir=tfds_manual_dir)
    elif dataset == "imagenet_tfrecord":
      ds = imagenet.tfrecord_source(data_dir, is_training, ctx, num_classes)
    else:
      ds = imagenet.image_folder_source(data_dir, is_training, ctx)
    if not is_training:
      ds = ds.map(lambda x, y: (imagenet.preprocess_for_eval(x, image_size), y),
                  num_parallel_calls=tf.data.AUTOTUNE)
      num_examples = dataset_info(dataset, data_dir, image_size, num_classes,
                                  num_eval_examples=num_eval_examples,
                                  tfds_manual_dir=tfds_manual_dir).num_eval_examples
      return sharding.padded_eval(ds, ctx, global_batch_size,
                                  num_examples).prefetch(tf.data.AUTOTUNE)
    ds = ds.shuffle(shuffle_buffer).repeat()
    ds = ds.map(lambda x, y: (imagenet.preprocess_for_train(x, image_size), y),
                num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
    ds = ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
    # The shuffles have no seed, so the batches taken before a checkpoint cannot be
    # replayed: a resumed run starts a fresh shuffle rather than decode
    # ctx.batches_taken batches only to drop them (replicator's own skip: hours, deep
    # into an ImageNet run).
    if ctx.batches_taken:
      logging.info("Resumed after %d batches on this worker: the training input "
                   "starts a fresh shuffle.", ctx.batches_taken)
    return replicator.skipped_by_input_fn(ds)

  # Checkpoints record each input's position under its qualified name: the training
  # and the evaluation input must not share one.
  input_fn.__qualname__ = input_fn.__name__ = (
      f"{dataset}_{'train' if is_training else 'eval'}_input_fn")
  return input_fn


def synthetic_arrays(num_images: int, image_size: int, num_classes: int, seed: int = 0):
  """Fixed random images: training repeats one batch (it measures speed, not learning)."""
  rng = np.random.default_rng(seed)
  return (rng.integers(0, 256, [num_images, image_size, image_size, 3], dtype=np.uint8),
          rng.integers(0, num_classes, [num_images], dtype=np.int32))


DATASETS = ("fashion_mnist", "imagenet_tfds", "imagenet_tfrecord", "image_folder",
            "synthetic")


IMAGENET_TRAIN_EXAMPLES, IMAGENET_EVAL_EXAMPLES = 1_281_167, 50_000


def dataset_info(dataset: str, data_dir: Optional[str] = None, image_size: int = 224,
                 num_classes: int = 1000, num_train_examples: Optional[int] = None,
                 num_eval_examples: Optional[int] = None,
                 tfds_manual_dir: Optional[str] = None) -> DatasetInfo:
  """Class count, split sizes and image shape of a dataset, for the schedule and model.

  Sizes come from the data where it says them (Fashion-MNIST, the image folder's
  files, TFDS's metadata). TFRecord shards do not: they default to ImageNet's
  (1000 classes, 1,281,167 and 50,000 images), which `num_classes`,
  `num_train_examples` and `num_eval_examples` override (as do the synthetic
  dataset's sizes).
  """
  image_shape = (image_size, image_size, 3)
  if dataset in ("imagenet_tfrecord", "synthetic"):
    eval_default = IMAGENET_EVAL_EXAMPLES if dataset == "imagenet_tfrecord" else 256
    if dataset == "synthetic" and num_eval_examples not in (None, eval_default):
      raise ValueError(f"--num_eval_examples: the synthetic evaluation set has "
                       f"{eval_default} images, got {num_eval_examples}; leave it out.")
    return DatasetInfo(num_classes, num_train_examples or IMAGENET_TRAIN_EXAMPLES,
                       num_eval_examples or eval_default, image_shape)
  given = [f"--{name}={value}" for name, value in (
      ("num_train_examples", num_train_examples),
      ("num_eval_examples", num_eval_examples)) if value is not None]
  if given:
    raise ValueError(f"{', '.join(given)}: --dataset={dataset} counts its own "
                     "examples; leave these flags out (they are for imagenet_tfrecord "
                     "and synthetic).")
  if dataset == "fashion_mnist":
    return DatasetInfo(10, 60_000, 10_000, (28, 28, 1))
  if dataset == "image_folder":
    classes = imagenet.image_folder_classes(data_dir)
    count = lambda split: sum(
        len(imagenet.image_files(os.path.join(data_dir, split, c))) for c in classes)
    return DatasetInfo(len(classes), count("train"), count("validation"), image_shape)
  builder = imagenet.tfds_builder(data_dir, tfds_manual_dir)
  return DatasetInfo(builder.info.features["label"].num_classes,
                     builder.info.splits["train"].num_examples,
                     builder.info.splits["validation"].num_examples, image_shape)
