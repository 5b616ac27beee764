"""Sample-quality metrics that need no download, and Inception ones that do.

The offline metrics use a small classifier trained here on the real data (and
cached): the *classifier score* applies the Inception Score formula to its
class probabilities, and the *Fréchet classifier distance* applies the Fréchet
Inception Distance formula to its penultimate features. They rank models the
way the Inception metrics do but their values are not comparable with
published Inception numbers, so they carry their own names.

With ``--inception_weights`` (Keras InceptionV3 weights with the top), true
Inception Score and Fréchet Inception Distance are computed as well. The
classifier itself, and its cache, are in `metric_classifier.py`.
"""

from typing import Dict, Optional, Tuple

import numpy as np
import tensorflow as tf

from examples.gan import data
from examples.gan import metric_classifier


def classifier_score(probs: np.ndarray) -> float:
  """``exp(E_x KL(p(y|x) || p(y)))``: the Inception Score formula, one split.

  >>> round(classifier_score(np.eye(4)), 6)  # Confident, balanced: the class count.
  4.0
  """
  probs = np.asarray(probs, np.float64)
  marginal = probs.mean(axis=0, keepdims=True)
  kl = np.sum(probs * (np.log(probs + 1e-12) - np.log(marginal + 1e-12)), axis=1)
  return float(np.exp(kl.mean()))


def feature_statistics(features: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
  features = np.asarray(features, np.float64)
  return features.mean(axis=0), np.cov(features, rowvar=False)


def _sqrt_psd(matrix: np.ndarray) -> np.ndarray:
  values, vectors = np.linalg.eigh(matrix)
  return (vectors * np.sqrt(np.clip(values, 0, None))) @ vectors.T


def frechet_distance(stats_a, stats_b) -> float:
  """``|mu_a - mu_b|^2 + tr(S_a + S_b - 2 (S_a S_b)^(1/2))`` between Gaussians.

  ``tr((S_a S_b)^(1/2))`` is computed as the trace of the square root of the
  symmetric ``S_a^(1/2) S_b S_a^(1/2)`` (a similar matrix): stable when the
  covariances are singular, as they are with dead ReLU features.

  >>> stats = (np.zeros(2), np.eye(2))
  >>> frechet_distance(stats, (np.ones(2), 4 * np.eye(2)))
  4.0
  """
  (mu_a, cov_a), (mu_b, cov_b) = stats_a, stats_b
  sqrt_a = _sqrt_psd(cov_a)
  cross = np.linalg.eigvalsh(sqrt_a @ cov_b @ sqrt_a)
  trace_sqrt = np.sum(np.sqrt(np.clip(cross, 0, None)))
  distance = (np.sum((mu_a - mu_b)**2) + np.trace(cov_a) + np.trace(cov_b) -
              2 * trace_sqrt)
  return float(max(distance, 0.0))


class InceptionMetrics:
  """True Inception Score and Fréchet Inception Distance (Keras InceptionV3).

  Args:
    weights_path: a Keras InceptionV3 weights file *with the top* (e.g.
      ``inception_v3_weights_tf_dim_ordering_tf_kernels.h5``), already on disk.
  """

  def __init__(self, weights_path: str):
    import keras  # pylint: disable=g-import-not-at-top
    net = keras.applications.InceptionV3(include_top=True, weights=weights_path)
    self._model = keras.Model(
        net.input, [net.get_layer("avg_pool").output, net.output])

  def _run(self, images: np.ndarray, batch_size: int = 50):
    pools, probs = [], []
    for i in range(0, len(images), batch_size):
      x = tf.image.resize(images[i:i + batch_size], [299, 299])
      if x.shape[-1] == 1:
        x = tf.tile(x, [1, 1, 1, 3])
      pool, prob = self._model(x, training=False)  # Inputs in [-1, 1].
      pools.append(np.asarray(pool))
      probs.append(np.asarray(prob))
    return np.concatenate(pools), np.concatenate(probs)

  def __call__(self, fake_images: np.ndarray, real_images: np.ndarray,
               num_splits: int = 10) -> Dict[str, float]:
    fake_pool, fake_probs = self._run(fake_images)
    real_pool, _ = self._run(real_images)
    splits = np.array_split(fake_probs, min(num_splits, len(fake_probs)))
    return {
        "inception_score": float(np.mean([classifier_score(s) for s in splits])),
        "frechet_inception_distance": frechet_distance(
            feature_statistics(fake_pool), feature_statistics(real_pool)),
    }


class ClassifierMetrics:
  """Classifier score and Fréchet classifier distance against real statistics."""

  def __init__(self, classifier: metric_classifier.Classifier,
               real_images: np.ndarray):
    self._classifier = classifier
    probs, features = metric_classifier.predict(classifier, real_images)
    self.real_stats = feature_statistics(features)
    self.real_classifier_score = classifier_score(probs)

  def __call__(self, fake_images: np.ndarray,
               fake_labels: Optional[np.ndarray] = None) -> Dict[str, float]:
    probs, features = metric_classifier.predict(self._classifier,
                                                 fake_images)
    results = {
        "classifier_score": classifier_score(probs),
        "frechet_classifier_distance": frechet_distance(
            feature_statistics(features), self.real_stats),
    }
    if fake_labels is not None:  # How often a sample shows its asked-for class.
      results["class_accuracy"] = float(
          np.mean(np.argmax(probs, axis=1) == fake_labels))
    return results


class Evaluator:
  """Scores a trainer's samples against real test data.

  Classifier metrics, Inception metrics, or both; ``trainer.sample(labels)``
  must return images in [-1, 1].
  """

  def __init__(self, config, data_kwargs: Dict, *,
               cache_dir: Optional[str], num_samples: int = 2000,
               classifier_metrics: bool = True,
               inception_weights: Optional[str] = None,
               num_real: int = 10_000, num_train: int = 60_000):
    self.num_samples = num_samples
    self._num_classes = config.num_classes
    self._classifier_metrics = None
    self._inception = None
    real = data.load_arrays(config.dataset, num_real, split="test",
                            **data_kwargs)
    self.real_images = real[0]
    if classifier_metrics:
      train_data = data.load_arrays(config.dataset, num_train, split="train",
                                    **data_kwargs)
      classifier = metric_classifier.train_classifier(
          train_data, real, config.num_classes, cache_dir=cache_dir,
          data_settings=metric_classifier.classifier_data_settings(
              config, data_kwargs, num_train))
      self._classifier_metrics = ClassifierMetrics(classifier, real[0])
    if inception_weights:
      self._inception = InceptionMetrics(inception_weights)

  def __call__(self, trainer) -> Dict[str, float]:
    labels = np.arange(self.num_samples) % self._num_classes
    samples = trainer.sample(labels)
    results = {}
    if self._classifier_metrics:
      results.update(self._classifier_metrics(samples, labels))
    if self._inception:
      results.update(
          self._inception(samples, self.real_images[:self.num_samples]))
    return results
