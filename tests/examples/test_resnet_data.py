"""Every input path of examples/resnet on small generated files."""

import gzip
import os
import types

import numpy as np
import pytest
import tensorflow as tf

import imagenet_archives
import replicator
from examples.resnet import checks
from examples.resnet import data
from examples.resnet import imagenet

IMAGE_SIZE = 16


def _ctx(num_pipelines=1, pipeline_id=0, num_replicas=1):
  return replicator.InputContext(num_input_pipelines=num_pipelines,
                                 input_pipeline_id=pipeline_id,
                                 num_replicas_in_sync=num_replicas)


def _image(rng, height, width):
  return rng.integers(0, 256, [height, width, 3], dtype=np.uint8)


def _collect(ds, num_batches=None):
  batches = list(ds.take(num_batches) if num_batches else ds)
  return [np.concatenate([b[i].numpy() for b in batches]) for i in range(len(batches[0]))]


def _example(encoded, label):
  return tf.train.Example(features=tf.train.Features(feature={
      "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[encoded])),
      "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
  })).SerializeToString()


@pytest.fixture(scope="module")
def tfrecord_dir(tmp_path_factory):
  """Two train shards and one validation shard; labels 1..1000 as in the ImageNet set."""
  root = tmp_path_factory.mktemp("tfrecords")
  rng = np.random.default_rng(0)
  labels = {"train-00000-of-00002": [1, 2, 3, 4, 5], "train-00001-of-00002": [6, 7, 8],
            "validation-00000-of-00001": [1, 500, 1000, 7, 9]}
  for name, shard_labels in labels.items():
    with tf.io.TFRecordWriter(str(root / name)) as writer:
      for label in shard_labels:
        jpeg = tf.io.encode_jpeg(_image(rng, 20 + label % 7, 24)).numpy()
        writer.write(_example(jpeg, label))
  return str(root)


def test_tfrecord_labels_shift_to_zero_based(tfrecord_dir):
  input_fn = data.make_input_fn("imagenet_tfrecord", False, 2, tfrecord_dir,
                                image_size=IMAGE_SIZE)
  images, labels, weights = _collect(input_fn(_ctx()))
  real = weights == 1
  assert sorted(labels[real]) == [0, 6, 8, 499, 999]
  assert images.shape[1:] == (IMAGE_SIZE, IMAGE_SIZE, 3)
  assert weights.sum() == 5 and len(weights) == 6  # the last batch of 2 is padded


def test_tfrecord_train_batches(tfrecord_dir):
  input_fn = data.make_input_fn("imagenet_tfrecord", True, 4, tfrecord_dir,
                                image_size=IMAGE_SIZE, shuffle_buffer=8)
  images, labels = _collect(input_fn(_ctx()), num_batches=5)
  assert images.shape == (20, IMAGE_SIZE, IMAGE_SIZE, 3) and images.dtype == np.float32
  assert set(labels) == set(range(8))  # repeats; 1..8 became 0..7
  assert -3 < images.min() < images.max() < 3  # normalised


@pytest.mark.parametrize("split_files", [True, False])
def test_tfrecord_workers_read_disjoint_parts(tfrecord_dir, split_files, tmp_path):
  """Two workers: whole files each when there are enough, else every other example."""
  data_dir = tfrecord_dir
  if not split_files:  # One training file for two workers.
    data_dir = str(tmp_path)
    records = [r.numpy() for r in tf.data.TFRecordDataset(
        sorted(tf.io.gfile.glob(os.path.join(tfrecord_dir, "train-*"))))]
    with tf.io.TFRecordWriter(os.path.join(data_dir, "train-00000-of-00001")) as writer:
      for record in records:
        writer.write(record)
  per_worker = [sorted(int(y) for _, y in imagenet.tfrecord_source(data_dir, True, ctx))
                for ctx in (_ctx(2, 0), _ctx(2, 1))]
  assert not set(per_worker[0]) & set(per_worker[1])
  assert sorted(per_worker[0] + per_worker[1]) == list(range(8))


@pytest.fixture(scope="module")
def folder_dir(tmp_path_factory):
  """train/ and validation/ with a JPEG and a PNG class; class ids in sorted order."""
  root = tmp_path_factory.mktemp("folder")
  rng = np.random.default_rng(1)
  for split, count in (("train", 3), ("validation", 2)):
    for name, encode, ext in (("b_dog", tf.io.encode_png, "png"),
                              ("a_cat", tf.io.encode_jpeg, "JPEG")):
      os.makedirs(root / split / name)
      for i in range(count):
        (root / split / name / f"{i}.{ext}").write_bytes(
            encode(_image(rng, 18 + i, 30)).numpy())
      (root / split / name / "notes.txt").write_text("not an image")
  return str(root)


def test_image_folder(folder_dir):
  info = data.dataset_info("image_folder", folder_dir, IMAGE_SIZE)
  assert (info.num_classes, info.num_train_examples, info.num_eval_examples) == (2, 6, 4)
  train_fn = data.make_input_fn("image_folder", True, 3, folder_dir, IMAGE_SIZE)
  images, labels = _collect(train_fn(_ctx()), num_batches=4)
  assert images.shape == (12, IMAGE_SIZE, IMAGE_SIZE, 3)
  assert sorted(set(labels)) == [0, 1]
  eval_fn = data.make_input_fn("image_folder", False, 2, folder_dir, IMAGE_SIZE)
  _, labels, weights = _collect(eval_fn(_ctx()))
  assert list(labels) == [0, 0, 1, 1] and weights.sum() == 4


def test_mock_tfds_imagenet(monkeypatch):
  tfds = pytest.importorskip("tensorflow_datasets")
  # The mock serves examples but no metadata: nothing is prepared, no split has a size.
  monkeypatch.setattr(tfds.core.DatasetBuilder, "is_prepared", lambda self: True)
  monkeypatch.setattr(data, "dataset_info", lambda *args, **kwargs: data.DatasetInfo(
      1000, 6, 6, (IMAGE_SIZE, IMAGE_SIZE, 3)))
  with tfds.testing.mock_data(num_examples=6):
    for is_training in (True, False):
      input_fn = data.make_input_fn("imagenet_tfds", is_training, 4, "/nonexistent",
                                    image_size=IMAGE_SIZE)
      batch = next(iter(input_fn(_ctx())))
      assert batch[0].shape == (4, IMAGE_SIZE, IMAGE_SIZE, 3)
      assert batch[1].dtype == tf.int32 and 0 <= batch[1].numpy().min() < 1000


def test_tfds_imagenet_prepared_from_the_archives_in_a_manual_dir(imagenet_manual_dir):
  """--dataset=imagenet_tfds --tfds_manual_dir: TFDS prepares the ILSVRC2012 tars."""
  manual_dir, data_dir = imagenet_manual_dir
  info = data.dataset_info("imagenet_tfds", data_dir, IMAGE_SIZE,
                           tfds_manual_dir=manual_dir)
  assert (info.num_classes, info.num_train_examples, info.num_eval_examples) == (1000, 6, 4)
  train_fn = data.make_input_fn("imagenet_tfds", True, 6, data_dir, IMAGE_SIZE,
                                tfds_manual_dir=manual_dir)
  images, labels = _collect(train_fn(_ctx()), num_batches=1)
  assert images.shape == (6, IMAGE_SIZE, IMAGE_SIZE, 3)
  assert sorted(labels) == sorted(list(imagenet_archives.TRAIN_LABELS.values()) * 3)
  eval_fn = data.make_input_fn("imagenet_tfds", False, 2, data_dir, IMAGE_SIZE,
                               tfds_manual_dir=manual_dir)
  images, labels, weights = _collect(eval_fn(_ctx()))
  assert sorted(labels[weights == 1]) == sorted(imagenet_archives.VALIDATION_LABELS)


def _write_idx(path, array):
  header = bytes([0, 0, 8, array.ndim]) + b"".join(
      int(d).to_bytes(4, "big") for d in array.shape)
  with gzip.open(path, "wb") as f:
    f.write(header + array.astype(np.uint8).tobytes())


def _write_fashion_mnist(directory, num_train, num_test, seed):
  """Random 28x28 images labelled 0, 1, ..., 9, 0, ... in the Debian package's files."""
  rng = np.random.default_rng(seed)
  for prefix, n in (("train", num_train), ("t10k", num_test)):
    _write_idx(directory / f"{prefix}-images-idx3-ubyte.gz",
               rng.integers(0, 256, [n, 28, 28]))
    _write_idx(directory / f"{prefix}-labels-idx1-ubyte.gz", np.arange(n) % 10)


def test_resumed_imagenet_training_input_starts_a_fresh_shuffle(folder_dir):
  """Unseeded shuffles cannot be replayed: no decoding of a billion batches to drop."""
  train_fn = data.make_input_fn("image_folder", True, 3, folder_dir, IMAGE_SIZE)
  ctx = replicator.InputContext(1, 0, 1, steps_taken=10**9)
  ds = train_fn(ctx)
  assert replicator.inputs.input_context.check_skipped_by_input_fn(ds, ctx, "train_fn")
  images, _ = _collect(ds, num_batches=1)
  assert images.shape == (3, IMAGE_SIZE, IMAGE_SIZE, 3)


def test_fashion_mnist_from_idx_files(tmp_path):
  _write_fashion_mnist(tmp_path, num_train=12, num_test=5, seed=2)
  images, labels = data.load_fashion_mnist(str(tmp_path), is_training=False)
  assert images.shape == (5, 28, 28, 1) and list(labels) == [0, 1, 2, 3, 4]
  # Two replicas on one worker: the padded last step gives each replica a batch.
  eval_fn = data.make_input_fn("fashion_mnist", False, 4, str(tmp_path))
  batches = list(eval_fn(_ctx(num_replicas=2)))
  assert len(batches) % 2 == 0
  _, labels, weights = _collect(eval_fn(_ctx(num_replicas=2)))
  assert sorted(labels[weights == 1]) == [0, 1, 2, 3, 4]
  train_fn = data.make_input_fn("fashion_mnist", True, 4, str(tmp_path))
  images, labels = _collect(train_fn(_ctx(num_replicas=2)), num_batches=6)
  assert images.shape == (12, 28, 28, 1) and sorted(labels) == sorted(np.arange(12) % 10)


def test_keras_baseline_reads_the_same_fashion_mnist(tmp_path):
  """The plain Keras reference takes train.py's pipelines on one device."""
  from examples.resnet import keras_baseline  # pylint: disable=g-import-not-at-top
  _write_fashion_mnist(tmp_path, num_train=8, num_test=5, seed=3)
  train_ds, test_ds = keras_baseline.datasets(4, data_dir=str(tmp_path))
  images, one_hot = next(iter(train_ds))
  assert images.shape == (4, 28, 28, 1) and one_hot.shape == (4, 10)
  batches = list(test_ds)
  labels = np.concatenate([b[1].numpy().argmax(-1) for b in batches])
  weights = np.concatenate([b[2].numpy() for b in batches])
  assert sorted(labels[weights == 1]) == [0, 1, 2, 3, 4] and weights.sum() == 5


@pytest.mark.skipif(not os.path.exists(data.FASHION_MNIST_DIR),
                    reason="Debian package dataset-fashion-mnist not installed")
def test_fashion_mnist_installed():
  images, labels = data.load_fashion_mnist(data.FASHION_MNIST_DIR, is_training=False)
  assert images.shape == (10_000, 28, 28, 1)
  assert np.bincount(labels).tolist() == [1000] * 10


def test_synthetic():
  train = next(iter(data.make_input_fn("synthetic", True, 8, image_size=IMAGE_SIZE,
                                       num_classes=5)(_ctx(num_replicas=2))))
  assert train[0].shape == (4, IMAGE_SIZE, IMAGE_SIZE, 3) and train[1].numpy().max() < 5
  eval_fn = data.make_input_fn("synthetic", False, 8, image_size=IMAGE_SIZE,
                                num_classes=5)
  _, _, weights = _collect(eval_fn(_ctx()))
  assert weights.sum() == 256


def test_eval_preprocessing_crops_the_center():
  """Resize the shorter side to size / 0.875, then crop the middle square."""
  image = np.zeros([64, 128, 3], np.uint8)
  image[:, 56:72] = 255  # A vertical bar in the middle of the image.
  out = imagenet.preprocess_for_eval(tf.io.encode_png(image), image_size=28).numpy()
  assert out.shape == (28, 28, 3)
  bright = out[14, :, 0] > 0
  # 64 -> 32 px high, so the bar spans 8 px, centred in the 28 px crop.
  assert bright.sum() == 8 and bright[10:18].all()


def test_train_preprocessing_flips_and_crops():
  rng = np.random.default_rng(3)
  image = _image(rng, 40, 60)
  outs = [imagenet.preprocess_for_train(tf.constant(image), IMAGE_SIZE).numpy()
          for _ in range(8)]
  assert all(o.shape == (IMAGE_SIZE, IMAGE_SIZE, 3) for o in outs)
  assert len({o.tobytes() for o in outs}) == 8  # random crops
  jpeg_out = imagenet.preprocess_for_train(tf.io.encode_jpeg(image), IMAGE_SIZE)
  assert jpeg_out.shape == (IMAGE_SIZE, IMAGE_SIZE, 3)


def _write_validation_shards(directory, sizes):
  """validation-* files of `sizes` records, labelled 1, 2, ... in file order."""
  rng = np.random.default_rng(4)
  label = 0
  for index, size in enumerate(sizes):
    name = f"validation-{index:05d}-of-{len(sizes):05d}"
    with tf.io.TFRecordWriter(os.path.join(directory, name)) as writer:
      for _ in range(size):
        label += 1
        writer.write(_example(tf.io.encode_jpeg(_image(rng, 8, 8)).numpy(), label))
  return label


def _eval_over_workers(data_dir, num_workers, per_worker_batch, num_eval_examples):
  """Every worker's (real labels, steps), each worker one replica, as train.py runs them."""
  input_fn = data.make_input_fn("imagenet_tfrecord", False,
                                num_workers * per_worker_batch, data_dir, image_size=8,
                                num_eval_examples=num_eval_examples)
  workers = []
  for worker in range(num_workers):
    _, labels, weights = _collect(input_fn(_ctx(num_workers, worker, num_workers)))
    workers.append((list(labels[weights == 1]), len(labels) // per_worker_batch))
  return workers


def test_multi_worker_eval_sees_every_tfrecord_image_once(tmp_path):
  """Any worker count, any batch: the workers' real examples are the set, once each.

  Files dealt whole to workers overfilled a worker's fixed number of steps (here
  worker 0 of 2 got files 0 and 2, 5 images, room for 4): images went unseen.
  """
  total = _write_validation_shards(str(tmp_path), [3, 1, 2, 2])
  for num_workers, per_worker_batch in ((2, 1), (3, 1), (2, 2), (5, 1)):
    workers = _eval_over_workers(str(tmp_path), num_workers, per_worker_batch, total)
    seen = sorted(label for labels, _ in workers for label in labels)
    assert seen == list(range(total)), (num_workers, per_worker_batch, seen)
    assert len({steps for _, steps in workers}) == 1  # the collectives pair up


def test_eval_count_tells_a_wrong_declared_size(tmp_path):
  """8 images declared as 4 (or 10): the count the train loop checks says so.

  With room for exactly 4 images (2 steps of 2), the count was 4 and 4 images were
  dropped unnoticed.
  """
  total = _write_validation_shards(str(tmp_path), [4, 4])
  for declared in (4, 10):
    workers = _eval_over_workers(str(tmp_path), 2, 1, declared)
    count = sum(len(labels) for labels, _ in workers)
    assert count != declared, declared
    with pytest.raises(ValueError, match=f"--num_eval_examples: the evaluation saw "
                       f"{count} images, but .* should have {declared}"):
      checks.check_eval_count(count, declared)
  workers = _eval_over_workers(str(tmp_path), 2, 1, total)
  checks.check_eval_count(sum(len(labels) for labels, _ in workers), total)


def test_image_folder_skips_hidden_folders(folder_dir, tmp_path):
  """.ipynb_checkpoints or a NAS's @eaDir is no class (it shifted every label by one)."""
  import shutil  # pylint: disable=g-import-not-at-top
  root = tmp_path / "folder"
  shutil.copytree(folder_dir, root)
  for split in ("train", "validation"):
    for hidden in (".ipynb_checkpoints", "@eaDir"):
      os.makedirs(root / split / hidden)
      (root / split / hidden / "0.png").write_bytes(
          tf.io.encode_png(np.zeros([4, 4, 3], np.uint8)).numpy())
  info = data.dataset_info("image_folder", str(root), IMAGE_SIZE)
  assert (info.num_classes, info.num_train_examples, info.num_eval_examples) == (2, 6, 4)
  labels = [int(y) for _, y in imagenet.image_folder_source(str(root), False, _ctx())]
  assert labels == [0, 0, 1, 1]  # a_cat, b_dog


def test_image_folder_with_a_class_missing_from_validation(folder_dir, tmp_path):
  import shutil  # pylint: disable=g-import-not-at-top
  root = tmp_path / "folder"
  shutil.copytree(folder_dir, root)
  shutil.rmtree(root / "validation" / "a_cat")
  with pytest.raises(ValueError, match=r"--data_dir: .*only in train/: \['a_cat'\]"):
    data.dataset_info("image_folder", str(root), IMAGE_SIZE)


@pytest.mark.parametrize("dataset, data_dir, message", [
    ("imagenet_tfrecord", None, "--data_dir: --dataset=imagenet_tfrecord needs the "
     "ImageNet TFRecord shards .*got None"),
    ("imagenet_tfrecord", "EMPTY", "--data_dir: no file matches .*validation-\\*"),
    ("image_folder", None, "--data_dir: --dataset=image_folder needs train/<class>"),
    ("image_folder", "/nonexistent", "--data_dir: '/nonexistent' is not a directory"),
    ("image_folder", "EMPTY", "--data_dir: .*/train is not a directory"),
    ("fashion_mnist", "EMPTY", "--data_dir: --dataset=fashion_mnist found no "
     ".*t10k-images-idx3-ubyte.gz"),
])
def test_missing_data_dir_names_the_flag(dataset, data_dir, message, tmp_path):
  data_dir = str(tmp_path) if data_dir == "EMPTY" else data_dir
  input_fn = data.make_input_fn(dataset, False, 2, data_dir, image_size=IMAGE_SIZE)
  with pytest.raises(ValueError, match=message):
    input_fn(_ctx())


def test_tfrecord_sizes_and_classes_from_flags(tfrecord_dir):
  default = data.dataset_info("imagenet_tfrecord", tfrecord_dir, IMAGE_SIZE)
  assert (default.num_classes, default.num_train_examples,
          default.num_eval_examples) == (1000, 1_281_167, 50_000)
  info = data.dataset_info("imagenet_tfrecord", tfrecord_dir, IMAGE_SIZE, num_classes=10,
                           num_train_examples=8, num_eval_examples=5)
  assert (info.num_classes, info.num_train_examples, info.num_eval_examples) == (10, 8, 5)
  with pytest.raises(ValueError, match="--num_eval_examples=5: --dataset=fashion_mnist "
                     "counts its own"):
    data.dataset_info("fashion_mnist", num_eval_examples=5)
  # The validation shard holds labels up to 1000: 10 classes cannot be right.
  ds = imagenet.tfrecord_source(tfrecord_dir, False, _ctx(), num_classes=10)
  with pytest.raises(tf.errors.InvalidArgumentError, match="--num_classes"):
    list(ds)


def test_tfds_sizes_come_from_the_builder(monkeypatch):
  """Not ImageNet's numbers: the prepared builder's splits and label count."""
  tfds = pytest.importorskip("tensorflow_datasets")

  class Builder:
    info = types.SimpleNamespace(
        splits={"train": types.SimpleNamespace(num_examples=12),
                "validation": types.SimpleNamespace(num_examples=6)},
        features={"label": types.SimpleNamespace(num_classes=7)})
    data_dir = "/data/tfds/imagenet2012/5.1.0"
    prepared = True

    def is_prepared(self):
      return self.prepared
  builder = Builder()
  monkeypatch.setattr(tfds, "builder", lambda name, data_dir: builder)
  info = data.dataset_info("imagenet_tfds", "/data/tfds", IMAGE_SIZE)
  assert (info.num_classes, info.num_train_examples, info.num_eval_examples) == (7, 12, 6)
  builder.prepared = False
  with pytest.raises(ValueError, match="--data_dir: TFDS imagenet2012 is not prepared "
                     "under /data/tfds/imagenet2012/5.1.0.*--tfds_manual_dir"):
    data.dataset_info("imagenet_tfds", "/data/tfds", IMAGE_SIZE)
