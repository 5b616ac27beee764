"""Input pipelines: ImageNet (TFDS, TFRecords, image folder), Fashion-MNIST, synthetic.

`make_input_fn` returns the `input_fn(ctx)` that `replicator` calls once per worker;
each worker reads its own `1 / ctx.num_input_pipelines` of the data and batches per
replica. Training splits whole files between workers where there are enough of them
(else every n-th example); evaluation always takes every n-th example, so that the
workers' shares differ by at most one image (see `_padded_eval`).

Training elements are `(images, labels)`. Evaluation elements are
`(images, labels, weights)` from `replicator.pad_to_global_batch`: the last step is
padded with zero-weight examples so that every replica gets a batch and no test image
is dropped. The sum of the weights over all workers is the number of images
evaluated; `train.py` checks it against the declared size of the evaluation set.
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


def _require_dir(data_dir: Optional[str], dataset: str, expected: str) -> str:
  """`data_dir`, or an error saying what --data_dir should hold."""
  if not data_dir:
    raise ValueError(f"--data_dir: --dataset={dataset} needs {expected}, got "
                     f"{data_dir!r}; pass --data_dir=/path/to/it.")
  if not tf.io.gfile.isdir(data_dir):
    raise ValueError(f"--data_dir: {data_dir!r} is not a directory; --dataset={dataset} "
                     f"needs {expected}.")
  return data_dir


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
  images, labels = read_idx(paths[0]), read_idx(paths[1])
  return images[..., None], labels.astype(np.int32)


def _shard(ds: tf.data.Dataset, ctx) -> tf.data.Dataset:
  if ctx.num_input_pipelines == 1:
    return ds
  return ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)


def _files_dataset(files, ctx, is_training):
  """Whole files per worker when training on enough of them, else examples (later).

  Evaluation always splits by example: whole files would give a worker as many
  as ceil(files / workers) files, more than its fixed number of steps can hold
  (128 ImageNet validation files on 6 workers lost 292 images).
  """
  files = sorted(files)
  ds = tf.data.Dataset.from_tensor_slices(files)
  per_file = is_training and len(files) >= ctx.num_input_pipelines
  if per_file:
    ds = _shard(ds, ctx)
    if is_training:  # Not before sharding by example: every worker needs one order.
      ds = ds.shuffle(len(files), reshuffle_each_iteration=True)
  return ds, per_file


def tfrecord_source(data_dir: str, is_training: bool, ctx,
                    num_classes: Optional[int] = None) -> tf.data.Dataset:
  """ImageNet TFRecord shards (`train-*`, `validation-*`), labels 1..1000 -> 0..999.

  With `num_classes`, a label outside 0..num_classes-1 stops the input with an
  error (a one-hot target of such a label would be all zeros, silently).
  """
  expected = "the ImageNet TFRecord shards (train-*, validation-*)"
  data_dir = _require_dir(data_dir, "imagenet_tfrecord", expected)
  pattern = os.path.join(data_dir, "train-*" if is_training else "validation-*")
  matched = tf.io.gfile.glob(pattern)
  if not matched:
    raise ValueError(f"--data_dir: no file matches {pattern}; --dataset=imagenet_tfrecord "
                     f"needs {expected} directly under --data_dir.")
  files, per_file = _files_dataset(matched, ctx, is_training)
  # Sharding by example needs the same order on every worker. It shards the
  # serialized records, before parsing and decoding: each worker reads every file
  # but decodes only its own images.
  ds = files.interleave(tf.data.TFRecordDataset, cycle_length=16,
                        num_parallel_calls=tf.data.AUTOTUNE, deterministic=not per_file)
  if not per_file:
    ds = _shard(ds, ctx)
  features = {"image/encoded": tf.io.FixedLenFeature([], tf.string),
              "image/class/label": tf.io.FixedLenFeature([], tf.int64)}

  def parse(record):
    example = tf.io.parse_single_example(record, features)
    label = tf.cast(example["image/class/label"] - 1, tf.int32)
    if num_classes is not None:
      check = tf.debugging.Assert(
          tf.logical_and(label >= 0, label < num_classes),
          [f"--num_classes: a TFRecord label (1-based, as in the ImageNet shards) is "
           f"outside 1..{num_classes}; pass the number of classes of --data_dir's "
           "shards. Label (0-based):", label])
      with tf.control_dependencies([check]):
        label = tf.identity(label)
    return example["image/encoded"], label
  return ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE)


def _subdirectories(directory: str):
  """Visible subdirectories: `.ipynb_checkpoints`, `.git` or a NAS's `@eaDir` are no class."""
  names = (name.rstrip("/") for name in tf.io.gfile.listdir(directory))
  return sorted(name for name in names if not name.startswith((".", "@"))
                and tf.io.gfile.isdir(os.path.join(directory, name)))


# tf.io.gfile rather than os: the data may live in Cloud Storage (gs://), as on TPUs.
def image_folder_classes(data_dir: str):
  """The class names, from train/; validation/ must have the same class folders."""
  expected = "train/<class>/<image> and validation/<class>/<image>"
  data_dir = _require_dir(data_dir, "image_folder", expected)
  split_dirs = [os.path.join(data_dir, split) for split in ("train", "validation")]
  for split_dir in split_dirs:
    if not tf.io.gfile.isdir(split_dir):
      raise ValueError(f"--data_dir: {split_dir} is not a directory; --dataset="
                       f"image_folder needs {expected} under --data_dir.")
  classes, eval_classes = (_subdirectories(d) for d in split_dirs)
  if classes != eval_classes:
    # Labels come from train/'s folders: a mismatch would mislabel or drop images.
    raise ValueError(
        f"--data_dir: {data_dir}'s train/ and validation/ must hold the same class "
        f"folders (labels are their sorted order); only in train/: "
        f"{sorted(set(classes) - set(eval_classes))[:10]}, only in validation/: "
        f"{sorted(set(eval_classes) - set(classes))[:10]}. Add the missing (empty) "
        "folders or remove the extra ones.")
  if not classes:
    raise ValueError(f"--data_dir: no class folder in {split_dirs[0]}; --dataset="
                     f"image_folder needs {expected}.")
  return classes


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
    raise ValueError(f"--data_dir: no image ({', '.join(_IMAGE_EXTENSIONS[:3])}) in the "
                     f"class folders of {split_dir}.")
  ds = _shard(tf.data.Dataset.from_tensor_slices((paths, np.int32(labels))), ctx)
  if is_training:
    ds = ds.shuffle(len(paths), reshuffle_each_iteration=True)
  return ds.map(lambda path, label: (tf.io.read_file(path), label),
                num_parallel_calls=tf.data.AUTOTUNE)


def tfds_builder(data_dir: Optional[str], manual_dir: Optional[str] = None,
                 name: str = "imagenet2012"):
  """The prepared TFDS builder, prepared first from the archives in manual_dir if given."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  builder = tfds.builder(name, data_dir=data_dir)
  if manual_dir:
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(manual_dir=manual_dir))
  elif not builder.is_prepared():
    raise ValueError(
        f"--data_dir: TFDS {name} is not prepared under {builder.data_dir} (--data_dir="
        f"{data_dir!r}); point --data_dir at the TFDS data_dir that holds it, or pass "
        "--tfds_manual_dir with ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar "
        "to prepare it there.")
  return builder


def tfds_source(data_dir: Optional[str], is_training: bool, ctx,
                manual_dir: Optional[str] = None, name: str = "imagenet2012"):
  """TFDS `imagenet2012`, prepared from the manually downloaded archives in manual_dir."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  builder = tfds_builder(data_dir, manual_dir, name)
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
      ds = tfrecord_source(data_dir, is_training, ctx, num_classes)
    else:
      ds = image_folder_source(data_dir, is_training, ctx)
    if not is_training:
      ds = ds.map(lambda x, y: (preprocess_for_eval(x, image_size), y),
                  num_parallel_calls=tf.data.AUTOTUNE)
      num_examples = dataset_info(dataset, data_dir, image_size, num_classes,
                                  num_eval_examples=num_eval_examples,
                                  tfds_manual_dir=tfds_manual_dir).num_eval_examples
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
    classes = image_folder_classes(data_dir)
    count = lambda split: sum(
        len(_image_files(os.path.join(data_dir, split, c))) for c in classes)
    return DatasetInfo(len(classes), count("train"), count("validation"), image_shape)
  builder = tfds_builder(data_dir, tfds_manual_dir)
  return DatasetInfo(builder.info.features["label"].num_classes,
                     builder.info.splits["train"].num_examples,
                     builder.info.splits["validation"].num_examples, image_shape)
