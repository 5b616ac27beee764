"""Every input path of the GAN example, on small data made here."""

import gzip
import sys
import types

import numpy as np
import pytest
import tensorflow as tf

import imagenet_archives
import replicator
from examples import idx
from examples.gan import data


def _write_idx(path, array):
  codes = {np.uint8: 0x08}
  header = bytes([0, 0, codes[array.dtype.type], array.ndim])
  header += b"".join(int(d).to_bytes(4, "big") for d in array.shape)
  with gzip.open(path, "wb") as f:
    f.write(header + array.tobytes())


def _first(dataset, n):
  images, labels = zip(*[(x.numpy(), y.numpy()) for x, y in dataset.take(n)])
  return np.stack(images), np.array(labels)


def test_fashion_mnist_idx_parsing_and_padding(tmp_path):
  rng = np.random.RandomState(0)
  images = rng.randint(0, 256, size=(5, 28, 28)).astype(np.uint8)
  labels = np.array([3, 1, 4, 1, 5], np.uint8)
  _write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", images)
  _write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", labels)
  parsed_images, parsed_labels = data.load_fashion_mnist("test", str(tmp_path))
  np.testing.assert_array_equal(parsed_images, images)
  np.testing.assert_array_equal(parsed_labels, labels)
  x, y = _first(data.make_dataset("fashion_mnist", split="test", resolution=32,
                                  channels=1, data_dir=str(tmp_path)), 5)
  assert x.shape == (5, 32, 32, 1) and x.dtype == np.float32
  np.testing.assert_array_equal(y, labels)
  np.testing.assert_allclose(x[:, 2:30, 2:30, 0], images / 127.5 - 1, atol=1e-6)
  assert np.all(x[:, :2] == -1.0) and np.all(x[:, :, 30:] == -1.0)


def _idx_gz(path, array):
  header = bytes([0, 0, 0x08, array.ndim]) + b"".join(
      int(d).to_bytes(4, "big") for d in array.shape)
  with gzip.open(path, "wb") as f:
    f.write(header + array.astype(np.uint8).tobytes())


def test_read_idx_reads_what_was_written(tmp_path):
  array = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
  _idx_gz(tmp_path / "ok.gz", array)
  np.testing.assert_array_equal(idx.read_idx(str(tmp_path / "ok.gz")), array)


def test_read_idx_rejects_other_files(tmp_path):
  path = tmp_path / "bad.gz"
  with gzip.open(path, "wb") as f:
    f.write(b"\x89PNG not an idx file")
  with pytest.raises(ValueError, match="not an IDX file"):
    idx.read_idx(str(path))


def test_read_idx_names_a_file_cut_short(tmp_path):
  array = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
  _idx_gz(tmp_path / "whole.gz", array)
  whole = (tmp_path / "whole.gz").read_bytes()
  cut = tmp_path / "cut.gz"  # an interrupted copy: the gzip stream ends early
  cut.write_bytes(whole[:len(whole) // 2])
  with pytest.raises(ValueError, match=f"{cut}: the gzip stream is damaged or cut short"):
    idx.read_idx(str(cut))
  short = tmp_path / "short.gz"  # a whole gzip stream of too few bytes
  with gzip.open(short, "wb") as f:
    f.write(gzip.decompress(whole)[:-5])
  with pytest.raises(ValueError, match=r"short.gz: 35 bytes where its header .* needs 40: "
                     "the file is cut short"):
    idx.read_idx(str(short))


def _png(height, width, value):
  image = np.full([height, width, 3], value, np.uint8)
  return tf.io.encode_png(image).numpy()


def test_tfrecord_shards(tmp_path):
  for shard in range(2):
    with tf.io.TFRecordWriter(str(tmp_path / f"train-{shard:05d}")) as writer:
      for i in range(3):
        label = 1 + 3 * shard + i  # 1-based, as in the Cloud TPU ImageNet files.
        feature = {
            "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(
                value=[_png(20, 30, 10 * label)])),
            "image/class/label": tf.train.Feature(
                int64_list=tf.train.Int64List(value=[label])),
        }
        writer.write(tf.train.Example(features=tf.train.Features(
            feature=feature)).SerializeToString())
  x, y = _first(data.make_dataset(
      "tfrecord", data_dir=str(tmp_path / "train-*"), resolution=16,
      channels=3, label_offset=1), 6)
  assert x.shape == (6, 16, 16, 3)
  np.testing.assert_array_equal(y, np.arange(6))
  np.testing.assert_allclose(x[:, 8, 8, 0], (10 * (y + 1)) / 127.5 - 1, atol=1e-4)


def test_image_folder(tmp_path):
  for name, value in (("dog", 200), ("cat", 50)):
    (tmp_path / name).mkdir()
    for i in range(2):
      (tmp_path / name / f"{i}.png").write_bytes(_png(40, 24, value))
  (tmp_path / "cat" / "notes.txt").write_text("not an image")
  x, y = _first(data.make_dataset("folder", data_dir=str(tmp_path),
                                  resolution=8, channels=1), 10)
  assert x.shape == (4, 8, 8, 1)
  np.testing.assert_array_equal(y, [0, 0, 1, 1])  # cat, cat, dog, dog.
  np.testing.assert_allclose(x[:, 4, 4, 0], np.where(y == 0, 50, 200) / 127.5 - 1,
                             atol=1e-2)


def test_synthetic_data_is_class_dependent_and_in_range():
  x, y = _first(data.make_dataset("synthetic", resolution=16, channels=3,
                                  num_classes=4), 8)
  assert x.shape == (8, 16, 16, 3) and x.min() >= -1 and x.max() <= 1
  np.testing.assert_array_equal(y, [0, 1, 2, 3, 0, 1, 2, 3])
  assert np.abs(x[0] - x[4]).mean() < 0.2 < np.abs(x[0] - x[1]).mean()


def test_mock_tfds_imagenet():
  tfds = pytest.importorskip("tensorflow_datasets")
  with tfds.testing.mock_data(num_examples=4):
    x, y = _first(data.make_dataset("imagenet2012", resolution=16, channels=3), 4)
  assert x.shape == (4, 16, 16, 3) and x.min() >= -1 and x.max() <= 1
  assert y.dtype == np.int32 and np.all((y >= 0) & (y < 1000))


def test_tfds_imagenet_prepared_from_the_archives_in_a_manual_dir(imagenet_manual_dir):
  manual_dir, data_dir = imagenet_manual_dir
  for split, labels in (("train", [0, 0, 0, 1, 1, 1]),
                        ("test", imagenet_archives.VALIDATION_LABELS)):
    x, y = _first(data.make_dataset("imagenet2012", split=split, resolution=8,
                                    channels=3, data_dir=data_dir,
                                    manual_dir=manual_dir), len(labels))
    assert x.shape == (len(labels), 8, 8, 3) and x.min() >= -1 and x.max() <= 1
    assert sorted(y) == sorted(labels)


def test_tfds_path_with_a_fake_builder(monkeypatch):
  calls = {}

  class FakeBuilder:
    def __init__(self, name, data_dir):
      calls["builder"] = (name, data_dir)

    def download_and_prepare(self, download_config):
      calls["manual_dir"] = download_config.manual_dir

    def as_dataset(self, split, as_supervised, shuffle_files):
      calls["split"] = split
      images = np.full([3, 10, 14, 3], 255, np.uint8)
      return tf.data.Dataset.from_tensor_slices((images, np.arange(3)))

  fake = types.SimpleNamespace(
      builder=FakeBuilder,
      download=types.SimpleNamespace(DownloadConfig=types.SimpleNamespace))
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", fake)
  x, y = _first(data.make_dataset("imagenet2012", split="test", resolution=8,
                                  channels=1, data_dir="/d", manual_dir="/m"), 3)
  assert calls == {"builder": ("imagenet2012", "/d"), "manual_dir": "/m",
                   "split": "validation"}
  assert x.shape == (3, 8, 8, 1)
  np.testing.assert_allclose(x, 1.0, atol=1e-3)
  np.testing.assert_array_equal(y, [0, 1, 2])


def test_input_fn_gives_per_replica_batches_of_its_shard():
  input_fn = data.make_input_fn("synthetic", 8, resolution=8, channels=1,
                                num_classes=10, shuffle_buffer=0)
  ctx = replicator.InputContext(num_input_pipelines=2, input_pipeline_id=1,
                                num_replicas_in_sync=4)
  images, labels = next(iter(input_fn(ctx)))
  assert images.shape == (2, 8, 8, 1)
  np.testing.assert_array_equal(labels, [1, 3])  # Every other element.


def test_a_resumed_input_continues_with_the_uninterrupted_run_s_batches():
  """Seeded shuffle, images skipped before decoding: the same batches, cheaply."""
  input_fn = data.make_input_fn("synthetic", 8, resolution=8, channels=1,
                                num_classes=10, shuffle_buffer=64, seed=3)
  # Worker 1 of 2, two replicas each: every step took 2 of its batches.
  fresh = replicator.InputContext(2, 1, 4)
  resumed = replicator.InputContext(2, 1, 4, steps_taken=3)
  want = list(input_fn(fresh).take(8))[6:]
  got = input_fn(resumed)
  assert replicator.inputs.input_context.check_skipped_by_input_fn(got, resumed, "input_fn")
  for (images, labels), (want_images, want_labels) in zip(got.take(2), want):
    np.testing.assert_array_equal(labels, want_labels)
    np.testing.assert_array_equal(images, want_images)


def test_unknown_dataset_is_refused():
  with pytest.raises(ValueError, match="Unknown dataset 'mnist'"):
    data.make_dataset("mnist")
