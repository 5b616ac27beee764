"""Tiny ILSVRC2012 archives, laid out as the ones TFDS `imagenet2012` prepares from."""

import io
import tarfile

import numpy as np
import tensorflow as tf

# Synsets 0 and 1 of TFDS's label list; TFDS's validation labels of the first
# four validation images (its own resource file, the real ImageNet labels).
TRAIN_LABELS = {"n01440764": 0, "n01443537": 1}
VALIDATION_LABELS = [65, 970, 230, 809]
IMAGES_PER_CLASS = 3


def _jpeg(seed):
  rng = np.random.default_rng(seed)
  return tf.io.encode_jpeg(rng.integers(0, 256, [20, 24, 3], dtype=np.uint8)).numpy()


def _add(tar, name, data):
  info = tarfile.TarInfo(name)
  info.size = len(data)
  tar.addfile(info, io.BytesIO(data))


def write(directory):
  """ILSVRC2012_img_train.tar (a tar per class) and ILSVRC2012_img_val.tar."""
  with tarfile.open(directory / "ILSVRC2012_img_train.tar", "w") as train:
    for k, synset in enumerate(TRAIN_LABELS):
      inner = io.BytesIO()
      with tarfile.open(fileobj=inner, mode="w") as images:
        for i in range(IMAGES_PER_CLASS):
          _add(images, f"{synset}_{i}.JPEG", _jpeg(10 * k + i))
      _add(train, f"{synset}.tar", inner.getvalue())
  with tarfile.open(directory / "ILSVRC2012_img_val.tar", "w") as validation:
    for i in range(1, len(VALIDATION_LABELS) + 1):
      _add(validation, f"ILSVRC2012_val_{i:08d}.JPEG", _jpeg(100 + i))
  return str(directory)
