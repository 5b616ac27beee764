"""Input pipelines: ImageNet (TFDS, TFRecords, image folder), Fashion-MNIST, synthetic.

`make_input_fn` returns the `input_fn(ctx)` that `replicator` calls once per worker;
each worker reads its own `1 / ctx.num_input_pipelines` of the data (whole files where
there are enough of them, else every n-th example) and batches per replica.

Training elements are `(images, labels)`. Evaluation elements are
`(images, labels, weights)` from `replicator.pad_to_global_batch`: the last step is
padded with zero-weight examples so that every replica gets a batch and no test image
is dropped; with several workers every worker runs ceil(eval examples / global batch)
steps.
"""

import dataclasses
import gzip
import os
from typing import Callable, Optional, Tuple

import numpy as np
import tensorflow as tf

import replicator

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
_FASHION_MNIST_MEAN, _FASHION_MNIST_STD = 0.2860, 0.3530
_IMAGENET_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
_IMAGENET_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)
# Evaluation resizes the shorter side to image_size / 0.875 (256 for 224), then crops.
_EVAL_CROP_FRACTION = 0.875
_IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".JPEG", ".JPG", ".PNG")


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
  num_classes: int
  num_train_examples: int
  num_eval_examples: int
  image_shape: Tuple[int, int, int]


# ---------------------------------------------------------------------------
# Sources: each returns an unbatched dataset of (image, label) for one pipeline.
# An image is uint8 [H, W, C] or an encoded string (JPEG/PNG), decoded later.


def read_idx(path: str) -> np.ndarray:
  """Reads a (gzipped) IDX file, the format of MNIST and Fashion-MNIST."""
  with tf.io.gfile.GFile(path, "rb") as f:
    data = f.read()
  if path.endswith(".gz"):
    data = gzip.decompress(data)
  ndim = data[3]
  shape = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
  return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(shape)


def load_fashion_mnist(data_dir: str, is_training: bool):
  prefix = "train" if is_training else "t10k"
  images = read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte.gz"))
  labels = read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte.gz"))
  return images[..., None], labels.astype(np.int32)


def _shard(ds: tf.data.Dataset, ctx) -> tf.data.Dataset:
  if ctx.num_input_pipelines == 1:
    return ds
  return ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)


def _files_dataset(files, ctx, is_training):
  """Whole files per worker when there are enough of them, else examples (later)."""
  files = sorted(files)
  if not files:
    raise ValueError("no input files found")
  ds = tf.data.Dataset.from_tensor_slices(files)
  per_file = len(files) >= ctx.num_input_pipelines
  if per_file:
    ds = _shard(ds, ctx)
    if is_training:  # Not before sharding by example: every worker needs one order.
      ds = ds.shuffle(len(files), reshuffle_each_iteration=True)
  return ds, per_file


def tfrecord_source(data_dir: str, is_training: bool, ctx) -> tf.data.Dataset:
  """ImageNet TFRecord shards (`train-*`, `validation-*`), labels 1..1000 -> 0..999."""
  pattern = os.path.join(data_dir, "train-*" if is_training else "validation-*")
  files, per_file = _files_dataset(tf.io.gfile.glob(pattern), ctx, is_training)
  # Sharding by example needs the same order on every worker.
  ds = files.interleave(tf.data.TFRecordDataset, cycle_length=16,
                        num_parallel_calls=tf.data.AUTOTUNE, deterministic=not per_file)
  if not per_file:
    ds = _shard(ds, ctx)
  features = {"image/encoded": tf.io.FixedLenFeature([], tf.string),
              "image/class/label": tf.io.FixedLenFeature([], tf.int64)}

  def parse(record):
    example = tf.io.parse_single_example(record, features)
    return example["image/encoded"], tf.cast(example["image/class/label"] - 1, tf.int32)
  return ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE)


# tf.io.gfile rather than os: the data may live in Cloud Storage (gs://), as on TPUs.
def image_folder_classes(data_dir: str):
  train_dir = os.path.join(data_dir, "train")
  return sorted(name.rstrip("/") for name in tf.io.gfile.listdir(train_dir)
                if tf.io.gfile.isdir(os.path.join(train_dir, name)))


def _image_files(directory: str):
  return sorted(name for name in tf.io.gfile.listdir(directory)
                if name.endswith(_IMAGE_EXTENSIONS))


def image_folder_source(data_dir: str, is_training: bool, ctx) -> tf.data.Dataset:
  """`data_dir/{train,validation}/<class name>/<image>`; classes in sorted order."""
  classes = image_folder_classes(data_dir)
  split_dir = os.path.join(data_dir, "train" if is_training else "validation")
  paths, labels = [], []
  for label, name in enumerate(classes):
    for file_name in _image_files(os.path.join(split_dir, name)):
      paths.append(os.path.join(split_dir, name, file_name))
      labels.append(label)
  if not paths:
    raise ValueError(f"no images under {split_dir}")
  ds = _shard(tf.data.Dataset.from_tensor_slices((paths, np.int32(labels))), ctx)
  if is_training:
    ds = ds.shuffle(len(paths), reshuffle_each_iteration=True)
  return ds.map(lambda path, label: (tf.io.read_file(path), label),
                num_parallel_calls=tf.data.AUTOTUNE)


def tfds_source(data_dir: Optional[str], is_training: bool, ctx,
                manual_dir: Optional[str] = None, name: str = "imagenet2012"):
  """TFDS `imagenet2012`, prepared from the manually downloaded archives in manual_dir."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  builder = tfds.builder(name, data_dir=data_dir)
  if manual_dir:
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(manual_dir=manual_dir))
  split = "train" if is_training else "validation"
  if ctx.num_input_pipelines > 1:
    split = tfds.even_splits(split, n=ctx.num_input_pipelines)[ctx.input_pipeline_id]
  ds = builder.as_dataset(split=split, shuffle_files=is_training,
                          decoders={"image": tfds.decode.SkipDecoding()})
  return ds.map(lambda ex: (ex["image"], tf.cast(ex["label"], tf.int32)),
                num_parallel_calls=tf.data.AUTOTUNE)


# ---------------------------------------------------------------------------
# ImageNet preprocessing.


def _is_encoded(image):
  return image.dtype == tf.string


def _shape(image):
  if not _is_encoded(image):
    return tf.shape(image)
  return tf.cond(tf.io.is_jpeg(image), lambda: tf.io.extract_jpeg_shape(image),
                 lambda: tf.shape(_decode(image)))


def _decode(image):
  return tf.io.decode_image(image, channels=3, expand_animations=False)


def _decode_and_crop(image, y, x, h, w):
  """Crops before decoding where the format allows it (JPEG), to save the decode."""
  if not _is_encoded(image):
    return image[y:y + h, x:x + w]
  return tf.cond(
      tf.io.is_jpeg(image),
      lambda: tf.io.decode_and_crop_jpeg(image, tf.stack([y, x, h, w]), channels=3),
      lambda: _decode(image)[y:y + h, x:x + w])


def _normalize(image):
  return (tf.cast(image, tf.float32) - _IMAGENET_MEAN) / _IMAGENET_STD


def preprocess_for_train(image, image_size: int) -> tf.Tensor:
  """Random resized crop (8%-100% of the area, aspect 3/4-4/3), resize, random flip."""
  shape = _shape(image)
  begin, size, _ = tf.image.sample_distorted_bounding_box(
      shape, bounding_boxes=tf.zeros([1, 0, 4]), min_object_covered=0.1,
      aspect_ratio_range=(3 / 4, 4 / 3), area_range=(0.08, 1.0), max_attempts=10,
      use_image_if_no_bounding_boxes=True)
  crop = _decode_and_crop(image, begin[0], begin[1], size[0], size[1])
  crop = tf.image.resize(crop, [image_size, image_size], method="bilinear")
  return _normalize(tf.image.random_flip_left_right(crop))


def preprocess_for_eval(image, image_size: int) -> tf.Tensor:
  """Resize the shorter side to image_size / 0.875, then crop the center square."""
  image = _decode(image) if _is_encoded(image) else image
  shape = tf.cast(tf.shape(image)[:2], tf.float32)
  scale = (image_size / _EVAL_CROP_FRACTION) / tf.reduce_min(shape)
  new_shape = tf.cast(tf.round(shape * scale), tf.int32)
  image = tf.image.resize(image, new_shape, method="bilinear")
  top = (new_shape[0] - image_size) // 2
  left = (new_shape[1] - image_size) // 2
  image = tf.ensure_shape(image[top:top + image_size, left:left + image_size],
                          [image_size, image_size, 3])
  return _normalize(image)


# ---------------------------------------------------------------------------
# Batched augmentation for small in-memory images (Fashion-MNIST).


def _normalize_small(images):
  return (tf.cast(images, tf.float32) / 255.0 - _FASHION_MNIST_MEAN) / _FASHION_MNIST_STD


def _random_flip_batch(images):
  flip = tf.random.uniform([tf.shape(images)[0], 1, 1, 1]) < 0.5
  return tf.where(flip, tf.reverse(images, axis=[2]), images)


# ---------------------------------------------------------------------------
# Batching.


def _padded_eval(ds, ctx, global_batch_size, num_examples):
  """`(images, labels, weights)` batches, padding weighted 0 (`pad_to_global_batch`)."""
  if ctx.num_input_pipelines == 1:
    num_examples = None  # one pipeline runs until its own data ends
  padded = replicator.pad_to_global_batch(ds, ctx, global_batch_size, num_examples)
  return padded.map(lambda batch, mask: (*batch, mask))


def make_input_fn(dataset: str, is_training: bool, global_batch_size: int,
                  data_dir: Optional[str] = None, image_size: int = 224,
                  num_classes: int = 1000, tfds_manual_dir: Optional[str] = None,
                  shuffle_buffer: int = 10_000) -> Callable:
  """Returns `input_fn(ctx) -> tf.data.Dataset` of per-replica batches."""
  if dataset not in DATASETS:
    raise ValueError(f"dataset must be one of {DATASETS}, got {dataset!r}")

  def input_fn(ctx):
    batch_size = ctx.per_replica_batch_size(global_batch_size)
    if dataset == "synthetic" and is_training:
      images, labels = synthetic_arrays(batch_size, image_size, num_classes)
      return tf.data.Dataset.from_tensors((_normalize(images), labels)).repeat()
    if dataset in ("fashion_mnist", "synthetic"):
      if dataset == "fashion_mnist":
        images, labels = load_fashion_mnist(data_dir or FASHION_MNIST_DIR, is_training)
        normalize = _normalize_small
      else:
        images, labels = synthetic_arrays(256, image_size, num_classes, seed=1)
        normalize = _normalize
      ds = _shard(tf.data.Dataset.from_tensor_slices((images, labels)), ctx)
      if not is_training:
        return _padded_eval(ds.map(lambda x, y: (normalize(x), y)), ctx,
                            global_batch_size, len(labels)).prefetch(2)
      # Augmenting whole batches costs a few ops per batch instead of per image.
      ds = ds.shuffle(len(labels)).repeat().batch(batch_size, drop_remainder=True)
      ds = ds.map(lambda x, y: (_random_flip_batch(normalize(x)), y))
      return ds.prefetch(2)

    if dataset == "imagenet_tfds":
      ds = tfds_source(data_dir, is_training, ctx, manual_dir=tfds_manual_dir)
    elif dataset == "imagenet_tfrecord":
      ds = tfrecord_source(data_dir, is_training, ctx)
    else:
      ds = image_folder_source(data_dir, is_training, ctx)
    if not is_training:
      ds = ds.map(lambda x, y: (preprocess_for_eval(x, image_size), y),
                  num_parallel_calls=tf.data.AUTOTUNE)
      num_examples = dataset_info(dataset, data_dir, image_size,
                                  num_classes).num_eval_examples
      return _padded_eval(ds, ctx, global_batch_size,
                          num_examples).prefetch(tf.data.AUTOTUNE)
    ds = ds.shuffle(shuffle_buffer).repeat()
    ds = ds.map(lambda x, y: (preprocess_for_train(x, image_size), y),
                num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
    return ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)

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


def dataset_info(dataset: str, data_dir: Optional[str] = None, image_size: int = 224,
                 num_classes: int = 1000) -> DatasetInfo:
  """Class count, split sizes and image shape of a dataset, for the schedule and model."""
  if dataset == "fashion_mnist":
    return DatasetInfo(10, 60_000, 10_000, (28, 28, 1))
  if dataset == "synthetic":
    return DatasetInfo(num_classes, 1_281_167, 256, (image_size, image_size, 3))
  if dataset == "image_folder":
    classes = image_folder_classes(data_dir)
    count = lambda split: sum(
        len(_image_files(os.path.join(data_dir, split, c))) for c in classes)
    return DatasetInfo(len(classes), count("train"), count("validation"),
                       (image_size, image_size, 3))
  return DatasetInfo(1000, 1_281_167, 50_000, (image_size, image_size, 3))
