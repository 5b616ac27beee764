"""ImageNet: its three readers (TFDS `imagenet2012`, TFRecord shards, an image folder)
and its preprocessing for training and evaluation."""

import os
from typing import Optional

import numpy as np
import tensorflow as tf

from examples.resnet import sharding

_IMAGENET_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
_IMAGENET_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)
# Evaluation resizes the shorter side to image_size / 0.875 (256 for 224), then crops.
_EVAL_CROP_FRACTION = 0.875
_IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".JPEG", ".JPG", ".PNG")


# ---------------------------------------------------------------------------
# Sources: each returns an unbatched dataset of (image, label) for one pipeline.
# An image is uint8 [H, W, C] or an encoded string (JPEG/PNG), decoded later.


def _require_dir(data_dir: Optional[str], dataset: str, expected: str) -> str:
  """`data_dir`, or an error saying what --data_dir should hold."""
  if not data_dir:
    raise ValueError(f"--data_dir: --dataset={dataset} needs {expected}, got "
                     f"{data_dir!r}; pass --data_dir=/path/to/it.")
  if not tf.io.gfile.isdir(data_dir):
    raise ValueError(f"--data_dir: {data_dir!r} is not a directory; --dataset={dataset} "
                     f"needs {expected}.")
  return data_dir


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
  files, per_file = sharding.files_dataset(matched, ctx, is_training)
  # Sharding by example needs the same order on every worker. It shards the
  # serialized records, before parsing and decoding: each worker reads every file
  # but decodes only its own images.
  ds = files.interleave(tf.data.TFRecordDataset, cycle_length=16,
                        num_parallel_calls=tf.data.AUTOTUNE, deterministic=not per_file)
  if not per_file:
    ds = sharding.shard(ds, ctx)
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


def image_files(directory: str):
  return sorted(name for name in tf.io.gfile.listdir(directory)
                if name.endswith(_IMAGE_EXTENSIONS))


def image_folder_source(data_dir: str, is_training: bool, ctx) -> tf.data.Dataset:
  """`data_dir/{train,validation}/<class name>/<image>`; classes in sorted order."""
  classes = image_folder_classes(data_dir)
  split_dir = os.path.join(data_dir, "train" if is_training else "validation")
  paths, labels = [], []
  for label, name in enumerate(classes):
    for file_name in image_files(os.path.join(split_dir, name)):
      paths.append(os.path.join(split_dir, name, file_name))
      labels.append(label)
  if not paths:
    raise ValueError(f"--data_dir: no image ({', '.join(_IMAGE_EXTENSIONS[:3])}) in the "
                     f"class folders of {split_dir}.")
  ds = sharding.shard(
      tf.data.Dataset.from_tensor_slices((paths, np.int32(labels))), ctx)
  if is_training:
    ds = ds.shuffle(len(paths), reshuffle_each_iteration=True)
  return ds.map(lambda path, label: (tf.io.read_file(path), label),
                num_parallel_calls=tf.data.AUTOTUNE)


def _import_tfds():
  """`tensorflow_datasets`, which only --dataset=imagenet_tfds needs."""
  try:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ValueError(
        "--dataset=imagenet_tfds: needs the tensorflow-datasets package; pip install "
        "tensorflow-datasets (or the examples' extra: pip install -e \".[examples]\"), "
        "or pass --dataset=imagenet_tfrecord or image_folder.") from None
  return tfds


def tfds_builder(data_dir: Optional[str], manual_dir: Optional[str] = None,
                 name: str = "imagenet2012"):
  """The prepared TFDS builder, prepared first from the archives in manual_dir if given."""
  tfds = _import_tfds()
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
  tfds = _import_tfds()
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


def normalize(image):
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
  return normalize(tf.image.random_flip_left_right(crop))


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
  return normalize(image)
