"""Input pipelines: every source yields ``(image, label)`` with images in [-1, 1].

Sources, by the ``dataset`` name of a config:

* ``fashion_mnist``: the gzipped IDX files of Debian's ``dataset-fashion-mnist``
  (``/usr/share/datasets/fashion-mnist``), padded from 28x28 to 32x32. Offline.
* ``synthetic``: class-dependent stripes plus noise, generated on the fly.
* ``imagenet2012`` or ``tfds:NAME``: TensorFlow Datasets. ``manual_dir`` holds
  the ImageNet tars for TFDS to prepare once; nothing is downloaded.
* ``tfrecord``: ``tf.train.Example`` shards (``data_dir`` is a glob) with
  ``image/encoded`` and ``image/class/label``, as written by the Cloud TPU
  ImageNet scripts (whose labels start at 1: pass ``label_offset=1``).
* ``folder``: ``data_dir/<class name>/<image>``; classes sorted by name.
"""

import os
from typing import Callable, Optional, Tuple

import numpy as np
import tensorflow as tf

import replicator
from examples import idx

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                         "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")
_IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif")

Decoder = Callable[..., Tuple[tf.Tensor, tf.Tensor]]


def load_fashion_mnist(split: str, data_dir: Optional[str] = None):
  """Returns ``(images uint8 [N, 28, 28], labels int32 [N])``."""
  prefix = {"train": "train", "test": "t10k"}[split]
  data_dir = data_dir or FASHION_MNIST_DIR
  images = idx.read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte.gz"))
  labels = idx.read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte.gz"))
  return images, labels.astype(np.int32)


def _to_unit_range(image: tf.Tensor) -> tf.Tensor:
  return tf.cast(image, tf.float32) / 127.5 - 1.0


def _square_resize(image: tf.Tensor, resolution: int) -> tf.Tensor:
  """Central square crop, then resize (area-preserving when shrinking)."""
  shape = tf.shape(image)
  side = tf.minimum(shape[0], shape[1])
  image = tf.image.crop_to_bounding_box(
      image, (shape[0] - side) // 2, (shape[1] - side) // 2, side, side)
  return tf.image.resize(image, [resolution, resolution], antialias=True)


def _fashion_mnist(split, resolution, channels, data_dir):
  images, labels = load_fashion_mnist(split, data_dir)
  dataset = tf.data.Dataset.from_tensor_slices((images, labels))

  def decode(image, label):
    image = tf.pad(image[..., None], [[2, 2], [2, 2], [0, 0]])  # 28 -> 32.
    image = _to_unit_range(image)
    if resolution != 32:
      image = tf.image.resize(image, [resolution, resolution])
    return tf.tile(image, [1, 1, channels]), label
  return dataset, decode


def _synthetic(resolution, channels, num_classes):
  """Stripes whose angle says the class, so a conditional GAN can learn them."""
  dataset = tf.data.Dataset.range(2**40)

  def decode(index):
    label = tf.cast(index % num_classes, tf.int32)
    angle = np.pi * tf.cast(label, tf.float32) / num_classes
    coords = tf.linspace(-1.0, 1.0, resolution)
    yy, xx = tf.meshgrid(coords, coords, indexing="ij")
    stripes = tf.sin(3 * np.pi * (xx * tf.cos(angle) + yy * tf.sin(angle)))
    noise = 0.1 * tf.random.stateless_normal(
        [resolution, resolution, channels], seed=tf.stack([index, 0]))
    return tf.clip_by_value(stripes[..., None] + noise, -1.0, 1.0), label
  return dataset, decode


def _decode_image(encoded, resolution, channels):
  image = tf.io.decode_image(encoded, channels=channels, expand_animations=False)
  image = tf.image.random_flip_left_right(image)
  return _to_unit_range(_square_resize(image, resolution))


def _tfds(name, split, resolution, channels, data_dir, manual_dir):
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  builder = tfds.builder(name, data_dir=data_dir)
  if manual_dir:
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(manual_dir=manual_dir))
  if name == "imagenet2012" and split == "test":
    split = "validation"  # ImageNet's test labels are not public.
  dataset = builder.as_dataset(split=split, as_supervised=True,
                               shuffle_files=True)

  def decode(image, label):
    image = tf.image.random_flip_left_right(image)
    image = _to_unit_range(_square_resize(image, resolution))
    if image.shape[-1] != channels:
      image = tf.image.rgb_to_grayscale(image) if channels == 1 else tf.tile(
          image, [1, 1, channels])
    return image, tf.cast(label, tf.int32)
  return dataset, decode


def _tfrecord(pattern, resolution, channels, label_offset):
  files = tf.io.gfile.glob(pattern)
  if not files:
    raise ValueError(f"No TFRecord files match {pattern!r}.")
  dataset = tf.data.TFRecordDataset(sorted(files))
  spec = {"image/encoded": tf.io.FixedLenFeature([], tf.string),
          "image/class/label": tf.io.FixedLenFeature([], tf.int64)}

  def decode(serialized):
    example = tf.io.parse_single_example(serialized, spec)
    label = tf.cast(example["image/class/label"] - label_offset, tf.int32)
    return _decode_image(example["image/encoded"], resolution, channels), label
  return dataset, decode


def _folder(root, resolution, channels):
  classes = sorted(d for d in tf.io.gfile.listdir(root)
                   if tf.io.gfile.isdir(os.path.join(root, d)))
  paths, labels = [], []
  for label, name in enumerate(classes):
    for filename in sorted(tf.io.gfile.listdir(os.path.join(root, name))):
      if filename.lower().endswith(_IMAGE_EXTENSIONS):
        paths.append(os.path.join(root, name, filename))
        labels.append(label)
  if not paths:
    raise ValueError(f"No images under {root!r}/<class>/.")
  dataset = tf.data.Dataset.from_tensor_slices(
      (paths, np.array(labels, np.int32)))

  def decode(path, label):
    return _decode_image(tf.io.read_file(path), resolution, channels), label
  return dataset, decode


def make_source(dataset: str, *, split: str = "train", resolution: int = 32,
                channels: int = 3, num_classes: int = 10,
                data_dir: Optional[str] = None, manual_dir: Optional[str] = None,
                label_offset: int = 0) -> Tuple[tf.data.Dataset, Decoder]:
  """Returns raw elements and the function that decodes one to (image, label).

  Shuffling raw elements (bytes, uint8) before decoding keeps buffers small.
  """
  if dataset == "fashion_mnist":
    return _fashion_mnist(split, resolution, channels, data_dir)
  if dataset == "synthetic":
    return _synthetic(resolution, channels, num_classes)
  if dataset == "imagenet2012" or dataset.startswith("tfds:"):
    name = dataset.split(":", 1)[-1]
    return _tfds(name, split, resolution, channels, data_dir, manual_dir)
  if dataset == "tfrecord":
    return _tfrecord(data_dir, resolution, channels, label_offset)
  if dataset == "folder":
    return _folder(data_dir, resolution, channels)
  raise ValueError(f"Unknown dataset {dataset!r}: expected fashion_mnist, "
                   "synthetic, imagenet2012, tfds:NAME, tfrecord or folder.")


def make_dataset(dataset: str, *, shuffle_buffer: int = 0, seed: int = 0,
                 repeat: bool = False, num_shards: int = 1, shard_index: int = 0,
                 skip: int = 0, **source_kwargs) -> tf.data.Dataset:
  """An unbatched dataset of ``(image float32 [H, W, C] in [-1, 1], label)``.

  ``skip`` drops that many raw elements, before decoding them.
  """
  raw, decode = make_source(dataset, **source_kwargs)
  if num_shards > 1:
    raw = raw.shard(num_shards, shard_index)
  if shuffle_buffer:
    raw = raw.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
  if repeat:
    raw = raw.repeat()
  if skip:
    raw = raw.skip(skip)
  return raw.map(decode, num_parallel_calls=tf.data.AUTOTUNE)


def make_input_fn(dataset: str, global_batch_size: int, *, seed: int = 0,
                  shuffle_buffer: int = 10_000, **source_kwargs):
  """An ``input_fn`` for ``replicator.run``: per-replica batches, forever.

  A resumed run skips the images its checkpoint's steps took before decoding
  them (replicator's own skip would decode them all); the shuffle is seeded,
  so it continues with the examples the uninterrupted run would have drawn,
  in the same order (TFDS data excepted: TFDS shuffles its files unseeded).
  """
  def input_fn(ctx):
    batch_size = ctx.per_replica_batch_size(global_batch_size)
    ds = make_dataset(
        dataset, shuffle_buffer=shuffle_buffer, seed=seed, repeat=True,
        num_shards=ctx.num_input_pipelines, shard_index=ctx.input_pipeline_id,
        skip=ctx.batches_taken * batch_size, **source_kwargs)
    return replicator.skipped_by_input_fn(
        ds.batch(batch_size, drop_remainder=True).prefetch(2))
  return input_fn


def load_arrays(dataset: str, max_examples: int, **source_kwargs):
  """The first ``max_examples`` examples as NumPy ``(images, labels)``."""
  ds = make_dataset(dataset, **source_kwargs).take(max_examples).batch(1000)
  images, labels = zip(*[(x.numpy(), y.numpy()) for x, y in ds])
  return np.concatenate(images), np.concatenate(labels)
