"""The metric classifier: a small convnet trained on the real data, and its cache.

Its class probabilities and penultimate features feed the offline metrics of
`metrics.py` (classifier score, Fréchet classifier distance). It is trained
once per set of data and training settings and cached under a key made of
them (`classifier_cache_dir`); a cache entry is checked on load, and a
classifier near chance accuracy (`near_chance`) is refused, never cached.
"""

import hashlib
import json
import os
import re
import time
from typing import Any, Dict, Optional, Tuple

from absl import logging
import numpy as np
import sonnet as snt
import tensorflow as tf

from examples import common


class Classifier(snt.Module):
  """A small convnet; its penultimate ``features`` feed the Fréchet distance."""

  def __init__(self, num_classes: int, width: int = 16, name=None):
    super().__init__(name=name)
    self.convs = [snt.Conv2D(width * m, 3, stride=s)
                  for m, s in ((1, 2), (2, 1), (2, 2), (4, 1))]
    self.features_layer = snt.Linear(128)
    self.logits_layer = snt.Linear(num_classes)

  def features(self, images: tf.Tensor) -> tf.Tensor:
    h = images
    for conv in self.convs:
      h = tf.nn.relu(conv(h))
    return tf.nn.relu(self.features_layer(snt.flatten(h)))

  def __call__(self, images: tf.Tensor) -> tf.Tensor:
    return self.logits_layer(self.features(images))

  # One function per classifier, traced once per batch shape: a function made
  # at each call was traced again at every evaluation (TensorFlow warned of
  # the retracing).
  @tf.function(autograph=False)
  def probabilities_and_features(self, images: tf.Tensor):
    return tf.nn.softmax(self(images)), self.features(images)


def near_chance(accuracy: float, num_classes: int) -> bool:
  """Whether a test accuracy is too close to guessing for the metrics to mean anything.

  Below twice chance, or chance + 0.1 when that is lower (two classes: 0.6;
  ten: 0.2; a thousand: 0.002). The Fashion-MNIST classifier reaches ~0.87.

  >>> near_chance(0.15, 10), near_chance(0.87, 10), near_chance(0.01, 1000)
  (True, False, False)
  """
  chance = 1.0 / num_classes
  return accuracy < min(2 * chance, chance + 0.1)


def classifier_cache_dir(cache_dir: str, settings: Dict[str, Any]) -> str:
  """``cache_dir/<dataset>_<resolution>_<hash of settings>``.

  Everything that determines the classifier is in ``settings``, so a
  classifier trained on other data (fewer examples, another ``data_dir``,
  channel count, class count or label offset) is never mistaken for this one.
  """
  digest = hashlib.sha256(
      json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
  prefix = re.sub(r"[^A-Za-z0-9]+", "_",
                  f"{settings.get('dataset', 'data')}_{settings.get('resolution', '')}")
  return os.path.join(cache_dir, f"{prefix.strip('_')}_{digest}")


def _jsonable(value):
  """What `value` reads back as from JSON (tuples become lists)."""
  return json.loads(json.dumps(value))


def train_classifier(train_data, test_data, num_classes: int, *,
                     cache_dir: Optional[str] = None,
                     data_settings: Optional[Dict[str, Any]] = None,
                     epochs: int = 1, batch_size: int = 256,
                     learning_rate: float = 2e-3, seed: int = 0) -> Classifier:
  """Trains the metric classifier, or restores it from under ``cache_dir``.

  The cache entry is a subdirectory named by a hash of ``data_settings``
  (where the data came from: dataset, data_dir, channels, ...) and of the
  training settings (example count, image shape, epochs, batch size, learning
  rate, seed); its ``classifier.json`` stores them and is compared on load.
  Sets TensorFlow's global seed to ``seed`` (the weights' initialization).

  Raises:
    ValueError: fewer training examples than one batch (the classifier would
      take no step); a classifier whose test accuracy is near chance
      (`near_chance`), trained now or found in the cache; a cache entry whose
      stored settings or weights do not match these.
  """
  images, labels = train_data
  if len(images) < batch_size:
    raise ValueError(
        f"num_classifier_examples: the metric classifier got {len(images)} "
        f"training images, fewer than one batch ({batch_size}), so it would "
        f"take no training step and its metrics would mean nothing. Pass "
        f"--num_classifier_examples={batch_size} or more (default 60000), or "
        "--noclassifier_metrics.")
  settings = _jsonable({
      **(data_settings or {}), "num_classes": num_classes,
      "num_train": len(images), "image_shape": list(images.shape[1:]),
      "epochs": epochs, "batch_size": batch_size,
      "learning_rate": learning_rate, "seed": seed})
  # Seeded weights: retraining (an emptied cache, another machine) gives the
  # same classifier up to float rounding, so the metrics stay comparable.
  tf.random.set_seed(seed)
  classifier = Classifier(num_classes)
  classifier(tf.zeros([1, *images.shape[1:]]))
  checkpoint = tf.train.Checkpoint(classifier=classifier)
  entry = cache_dir and classifier_cache_dir(cache_dir, settings)
  info_path = entry and os.path.join(entry, "classifier.json")
  if info_path and tf.io.gfile.exists(info_path):
    accuracy = _restore_cached(checkpoint, entry, settings, num_classes)
    logging.info("metric classifier: cached in %s (test accuracy %.3f)", entry,
                 accuracy)
    return classifier

  optimizer = snt.optimizers.Adam(learning_rate)

  @tf.function(autograph=False)
  def train_step(x, y):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
          y, classifier(x)))
    grads = tape.gradient(loss, classifier.trainable_variables)
    optimizer.apply(grads, classifier.trainable_variables)
    return loss

  dataset = tf.data.Dataset.from_tensor_slices((images, labels)).shuffle(
      len(images), seed=seed).batch(batch_size, drop_remainder=True)
  steps_per_epoch = len(images) // batch_size
  total = epochs * steps_per_epoch
  log_every = max(1, steps_per_epoch // 4)
  logging.info("metric classifier: training on %d images, %d epoch(s) of %d "
               "steps (batch %d)%s", len(images), epochs, steps_per_epoch,
               batch_size, f"; cached afterwards in {entry}" if entry else "")
  start = time.monotonic()
  progress = common.Progress(total, items_per_step=batch_size)
  step = 0
  for epoch in range(epochs):
    for x, y in dataset:
      loss = train_step(x, y)
      step += 1
      if step % log_every == 0 or step == total:
        logging.info("metric classifier: epoch %d/%d, %s", epoch + 1, epochs,
                     progress.line(step, loss=float(loss)))
  accuracy = float(np.mean(
      np.argmax(predict(classifier, test_data[0])[0], axis=1) == test_data[1]))
  if near_chance(accuracy, num_classes):  # Not cached: nothing to reuse.
    raise ValueError(
        f"num_classifier_examples: the metric classifier reached test accuracy "
        f"{accuracy:.3f} (chance: {1 / num_classes:.3f}) after {epochs} "
        f"epoch(s) on {len(images)} images, so its classifier score and "
        f"Fréchet distance would not rank samples. Give it more data "
        f"(--num_classifier_examples, default 60000), check that the labels "
        "match the images (--label_offset), or pass --noclassifier_metrics.")
  if info_path:
    checkpoint.write(os.path.join(entry, "classifier"))
    with tf.io.gfile.GFile(info_path, "w") as f:  # Written last: the marker.
      json.dump({"test_accuracy": accuracy, "settings": settings}, f, indent=1)
  logging.info("metric classifier: test accuracy %.3f after %s of training%s",
               accuracy, common.format_duration(time.monotonic() - start),
               f"; cached in {entry}" if entry else "")
  return classifier


def _restore_cached(checkpoint, entry: str, settings: Dict[str, Any],
                    num_classes: int) -> float:
  """Restores a cached classifier after checking what it was trained on.

  Returns its test accuracy.
  """
  with tf.io.gfile.GFile(os.path.join(entry, "classifier.json")) as f:
    info = json.load(f)
  stored = info.get("settings") or {}
  if stored != settings:
    differing = "; ".join(
        f"{k}: {stored.get(k)!r} there, {settings.get(k)!r} here"
        for k in sorted(set(settings) | set(stored))
        if stored.get(k) != settings.get(k))
    raise ValueError(
        f"cache_dir: the cached metric classifier in {entry} was trained with "
        f"other settings ({differing}), so its metrics would not be "
        "comparable. Delete that directory (it is retrained) or pass another "
        "--cache_dir.")
  accuracy = info.get("test_accuracy", 0.0)
  if near_chance(accuracy, num_classes):
    raise ValueError(
        f"cache_dir: the cached metric classifier in {entry} has test accuracy "
        f"{accuracy:.3f} (chance: {1 / num_classes:.3f}): its metrics would "
        "not rank samples. Delete that directory (it is retrained) or pass "
        "another --cache_dir.")
  try:
    checkpoint.read(os.path.join(entry, "classifier")).assert_consumed()
  except (AssertionError, ValueError, tf.errors.OpError) as error:
    first_line = (str(error).splitlines() or [""])[0][:200]
    raise ValueError(
        f"cache_dir: the cached metric classifier in {entry} does not restore "
        f"into this classifier ({type(error).__name__}: "
        f"{first_line}). Delete that directory (it is "
        "retrained) or pass another --cache_dir.") from error
  return accuracy


def predict(classifier: Classifier, images: np.ndarray,
            batch_size: int = 500) -> Tuple[np.ndarray, np.ndarray]:
  """Class probabilities and features of ``images``, in batches."""
  call = classifier.probabilities_and_features
  outputs = [call(tf.constant(images[i:i + batch_size]))
             for i in range(0, len(images), batch_size)]
  return tuple(np.concatenate([o[k].numpy() for o in outputs]) for k in (0, 1))


def classifier_data_settings(config, data_kwargs: Dict,
                             num_train: int) -> Dict[str, Any]:
  """Where the metric classifier's training images come from (its cache key).

  ``num_train`` is the number asked for; `train_classifier` adds the number
  actually loaded.
  """
  return {"dataset": config.dataset, "num_train_requested": num_train,
          **{k: data_kwargs.get(k) for k in (
              "resolution", "channels", "num_classes", "data_dir",
              "manual_dir", "label_offset")}}
