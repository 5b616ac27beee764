"""Classifier score, Fréchet distance and the metric classifier."""

import numpy as np
import pytest

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
  classifier = metrics.train_classifier(train_data, test_data, 2, epochs=3,
                                        batch_size=64, cache_dir=str(tmp_path))
  info = (tmp_path / "classifier.json").read_text()
  assert '"test_accuracy": 1.0' in info
  restored = metrics.train_classifier(train_data, test_data, 2,
                                      cache_dir=str(tmp_path))
  np.testing.assert_allclose(metrics.predict(restored, test_data[0])[1],
                             metrics.predict(classifier, test_data[0])[1],
                             rtol=1e-5)
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
  results = doctest.testmod(metrics, extraglobs={"np": np})
  assert results.attempted > 0 and results.failed == 0
