"""Classifier score, Fréchet distance and the metric classifier."""

import json
import os

import numpy as np
import pytest

from examples.gan import metric_classifier
from examples.gan import metrics


def test_classifier_score_of_a_perfect_classifier_on_balanced_classes():
  for num_classes in (2, 10, 1000):
    probs = np.eye(num_classes)[np.arange(5 * num_classes) % num_classes]
    np.testing.assert_allclose(metrics.classifier_score(probs), num_classes,
                               rtol=1e-6)


def test_classifier_score_bounds():
  uniform = np.full([100, 10], 0.1)
  np.testing.assert_allclose(metrics.classifier_score(uniform), 1.0)
  one_class = np.eye(10)[np.zeros(50, int)]  # Confident but no diversity.
  np.testing.assert_allclose(metrics.classifier_score(one_class), 1.0)
  probs = np.random.RandomState(0).dirichlet(np.ones(10), size=200)
  assert 1.0 < metrics.classifier_score(probs) < 10.0


def test_frechet_distance_of_a_set_to_itself_is_zero():
  features = np.random.RandomState(1).normal(size=(500, 16)) @ np.diag(
      np.linspace(0.1, 3, 16))
  stats = metrics.feature_statistics(features)
  assert abs(metrics.frechet_distance(stats, stats)) < 1e-6


def test_frechet_distance_against_closed_form_for_diagonal_gaussians():
  rng = np.random.RandomState(2)
  mu_a, mu_b = rng.normal(size=5), rng.normal(size=5)
  var_a, var_b = rng.uniform(0.5, 2, 5), rng.uniform(0.5, 2, 5)
  expected = np.sum((mu_a - mu_b)**2) + np.sum(
      (np.sqrt(var_a) - np.sqrt(var_b))**2)
  got = metrics.frechet_distance((mu_a, np.diag(var_a)), (mu_b, np.diag(var_b)))
  np.testing.assert_allclose(got, expected, rtol=1e-8)


def test_frechet_distance_against_scipy_for_full_covariances():
  scipy_linalg = pytest.importorskip("scipy.linalg")
  rng = np.random.RandomState(3)
  a, b = rng.normal(size=(300, 6)), rng.normal(size=(300, 6)) * 1.5 + 0.3
  stats_a, stats_b = metrics.feature_statistics(a), metrics.feature_statistics(b)
  sqrt_a = scipy_linalg.sqrtm(stats_a[1]).real
  cross = scipy_linalg.sqrtm(sqrt_a @ stats_b[1] @ sqrt_a).real
  expected = (np.sum((stats_a[0] - stats_b[0])**2) + np.trace(stats_a[1]) +
              np.trace(stats_b[1]) - 2 * np.trace(cross))
  np.testing.assert_allclose(metrics.frechet_distance(stats_a, stats_b),
                             expected, rtol=1e-6)


def _two_class_data(n, rng):
  labels = np.arange(n) % 2
  images = rng.normal(scale=0.1, size=(n, 8, 8, 1)).astype(np.float32)
  images[labels == 1, :4] += 1.0  # Class 1: bright top half.
  return images, labels.astype(np.int32)


def test_classifier_learns_is_cached_and_scores_real_data_well(tmp_path):
  rng = np.random.RandomState(4)
  train_data, test_data = _two_class_data(512, rng), _two_class_data(128, rng)
  classifier = metric_classifier.train_classifier(
      train_data, test_data, 2, epochs=3, batch_size=64,
      cache_dir=str(tmp_path))
  (info,) = tmp_path.glob("*/classifier.json")
  assert json.loads(info.read_text())["test_accuracy"] == 1.0
  restored = metric_classifier.train_classifier(
      train_data, test_data, 2, epochs=3, batch_size=64,
      cache_dir=str(tmp_path))
  np.testing.assert_allclose(
      metric_classifier.predict(restored, test_data[0])[1],
      metric_classifier.predict(classifier, test_data[0])[1], rtol=1e-5)
  scorer = metrics.ClassifierMetrics(classifier, test_data[0])
  real = scorer(test_data[0], test_data[1])
  assert real["frechet_classifier_distance"] < 1e-6
  assert real["class_accuracy"] == 1.0
  np.testing.assert_allclose(real["classifier_score"], 2.0, rtol=0.1)
  collapsed = scorer(test_data[0][test_data[1] == 0])  # Mode collapse.
  assert collapsed["classifier_score"] < 1.2
  assert collapsed["frechet_classifier_distance"] > 0.1


@pytest.mark.slow
def test_inception_metrics_load_a_weights_file_and_score(tmp_path):
  import keras  # pylint: disable=g-import-not-at-top
  path = str(tmp_path / "inception_v3.weights.h5")
  keras.applications.InceptionV3(weights=None).save_weights(path)
  inception = metrics.InceptionMetrics(path)
  rng = np.random.RandomState(5)
  fake = rng.uniform(-1, 1, size=(4, 32, 32, 1)).astype(np.float32)
  results = inception(fake, fake, num_splits=2)
  assert set(results) == {"inception_score", "frechet_inception_distance"}
  assert 1.0 <= results["inception_score"] <= 1000.0
  assert abs(results["frechet_inception_distance"]) < 1e-2


def test_docstring_examples_run():
  import doctest  # pylint: disable=g-import-not-at-top
  for module in (metrics, metric_classifier):
    results = doctest.testmod(module, extraglobs={"np": np})
    assert results.attempted > 0 and results.failed == 0


def _predictions(classifier, images):
  return metric_classifier.predict(classifier, images)[0]


def test_classifier_cache_is_keyed_on_the_training_data(tmp_path):
  # A quick run with few examples must not poison the cache of a later,
  # larger one: the larger one gets its own classifier, the one trained
  # without any cache (the oracle).
  rng = np.random.RandomState(4)
  train_data, test_data = _two_class_data(256, rng), _two_class_data(64, rng)
  few = (train_data[0][:64], train_data[1][:64])
  kwargs = dict(epochs=1, batch_size=64)
  metric_classifier.train_classifier(
      few, test_data, 2, cache_dir=str(tmp_path), **kwargs)
  cached = metric_classifier.train_classifier(
      train_data, test_data, 2, cache_dir=str(tmp_path), **kwargs)
  oracle = metric_classifier.train_classifier(
      train_data, test_data, 2, **kwargs)
  np.testing.assert_allclose(_predictions(cached, test_data[0]),
                             _predictions(oracle, test_data[0]), atol=1e-6)
  entries = sorted(json.loads(p.read_text())["settings"]["num_train"]
                   for p in tmp_path.glob("*/classifier.json"))
  assert entries == [64, 256]
  # The second call for 256 examples restores the cached classifier.
  again = metric_classifier.train_classifier(
      train_data, test_data, 2, cache_dir=str(tmp_path), **kwargs)
  np.testing.assert_array_equal(_predictions(again, test_data[0]),
                                _predictions(cached, test_data[0]))


@pytest.mark.parametrize("change", [
    {"num_train": 200}, {"data_dir": "/other"}, {"channels": 3},
    {"num_classes": 5}, {"label_offset": 1}, {"dataset": "synthetic"},
    {"resolution": 64}, {"manual_dir": "/tars"}])
def test_classifier_cache_dir_changes_with_every_data_setting(change):
  from examples.gan import configs  # pylint: disable=g-import-not-at-top
  kwargs = dict(resolution=32, channels=1, num_classes=10, data_dir=None,
                manual_dir=None, label_offset=0)

  def entry(config, data_kwargs, num_train):
    settings = metric_classifier.classifier_data_settings(
        config, data_kwargs, num_train)
    return metric_classifier.classifier_cache_dir("/cache", settings)

  base = entry(configs.SMALL, kwargs, 60_000)
  changed = dict(change)
  config = configs.SMALL.replace(dataset=changed.pop("dataset", "fashion_mnist"))
  num_train = changed.pop("num_train", 60_000)
  assert entry(config, {**kwargs, **changed}, num_train) != base
  assert entry(configs.SMALL, dict(kwargs), 60_000) == base


def test_classifier_refuses_fewer_examples_than_one_batch(tmp_path):
  rng = np.random.RandomState(4)
  train_data, test_data = _two_class_data(40, rng), _two_class_data(16, rng)
  with pytest.raises(ValueError, match=r"40 training images, fewer than one "
                     r"batch \(64\).*--num_classifier_examples=64"):
    metric_classifier.train_classifier(
        train_data, test_data, 2, batch_size=64, cache_dir=str(tmp_path))
  assert not list(tmp_path.iterdir())


def test_classifier_near_chance_is_refused_trained_or_cached(tmp_path):
  rng = np.random.RandomState(4)
  blank = (np.zeros([128, 8, 8, 1], np.float32), np.arange(128) % 2)
  with pytest.raises(ValueError, match=r"test accuracy 0\.500 \(chance: 0\.500\)"
                     r".*--num_classifier_examples"):
    # Blank images: one class for all, exactly chance on balanced labels.
    metric_classifier.train_classifier(
        blank, blank, 2, batch_size=64, cache_dir=str(tmp_path))
  assert not list(tmp_path.glob("*/classifier.json"))  # Nothing cached.

  train_data, test_data = _two_class_data(128, rng), _two_class_data(64, rng)
  metric_classifier.train_classifier(
      train_data, test_data, 2, batch_size=64, epochs=3,
      cache_dir=str(tmp_path))
  (info_path,) = tmp_path.glob("*/classifier.json")
  info = json.loads(info_path.read_text())
  assert info["test_accuracy"] == 1.0
  info_path.write_text(json.dumps({**info, "test_accuracy": 0.52}))
  with pytest.raises(ValueError, match=r"cache_dir: .*test accuracy 0\.520.*"
                     r"Delete that directory"):
    metric_classifier.train_classifier(
        train_data, test_data, 2, batch_size=64, epochs=3,
        cache_dir=str(tmp_path))


def test_cached_classifier_for_other_images_is_refused_clearly(tmp_path):
  import shutil  # pylint: disable=g-import-not-at-top
  rng = np.random.RandomState(4)
  gray, test_gray = _two_class_data(128, rng), _two_class_data(64, rng)
  rgb = (np.tile(gray[0], [1, 1, 1, 3]), gray[1])
  metric_classifier.train_classifier(
      gray, test_gray, 2, batch_size=64, epochs=3,
      cache_dir=str(tmp_path / "a"))
  (gray_entry,) = (tmp_path / "a").iterdir()
  settings = json.loads((gray_entry / "classifier.json").read_text())["settings"]
  rgb_entry = metric_classifier.classifier_cache_dir(
      str(tmp_path / "b"), {**settings, "image_shape": [8, 8, 3]})
  shutil.copytree(gray_entry, rgb_entry)  # As if copied by hand.
  with pytest.raises(ValueError, match=r"cache_dir: the cached metric classifier"
                     r" in .*\(image_shape: \[8, 8, 1\] there, \[8, 8, 3\] here"):
    metric_classifier.train_classifier(
        rgb, test_gray, 2, batch_size=64, epochs=3,
        cache_dir=str(tmp_path / "b"))
  # Settings that match but weights that do not: no raw restore error either.
  info = json.loads((gray_entry / "classifier.json").read_text())
  info["settings"]["image_shape"] = [8, 8, 3]
  (tmp_path / "b" / os.path.basename(rgb_entry) / "classifier.json").write_text(
      json.dumps(info))
  with pytest.raises(ValueError, match=r"cache_dir: .* does not restore into "
                     r"this classifier"):
    metric_classifier.train_classifier(
        rgb, test_gray, 2, batch_size=64, epochs=3,
        cache_dir=str(tmp_path / "b"))
