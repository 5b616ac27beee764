"""The learning-rate recipe of examples/resnet at chosen steps."""

import math

import numpy as np
import pytest
import tensorflow as tf

from examples.resnet import schedule as schedule_lib


def _imagenet(decay, batch=8192):
  # Goyal et al.: 8k images a step, 1,281,167 images an epoch -> 156 steps an epoch.
  return schedule_lib.LearningRateSchedule(
      base_learning_rate=0.1, global_batch_size=batch, steps_per_epoch=156,
      total_epochs=90, warmup_epochs=5, decay=decay)


def test_peak_scales_linearly_with_global_batch():
  assert _imagenet("cosine", batch=256).peak_learning_rate == pytest.approx(0.1)
  assert _imagenet("cosine", batch=8192).peak_learning_rate == pytest.approx(3.2)


@pytest.mark.parametrize("decay", ["cosine", "step"])
def test_linear_warmup_from_zero(decay):
  schedule = _imagenet(decay)
  assert schedule.warmup_steps == 780
  for step, expected in [(0, 0.0), (195, 0.8), (390, 1.6), (779, 3.2 * 779 / 780),
                         (780, 3.2)]:
    assert float(schedule(step)) == pytest.approx(expected, rel=1e-6, abs=1e-7)


def test_cosine_values():
  schedule = _imagenet("cosine")
  total, warmup = 90 * 156, 780
  assert schedule.total_steps == total
  for step in (780, 1000, 7000, 14000, total - 1, total):
    expected = 0.5 * 3.2 * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))
    assert float(schedule(step)) == pytest.approx(expected, rel=1e-5, abs=1e-6)
  assert float(schedule((total + warmup) // 2)) == pytest.approx(1.6, rel=1e-5)
  assert float(schedule(total + 100)) == pytest.approx(0.0, abs=1e-7)


def test_step_values():
  schedule = _imagenet("step")
  # Drops by 10x at epochs 30, 60 and 80.
  for step, expected in [(30 * 156 - 1, 3.2), (30 * 156, 0.32), (60 * 156 - 1, 0.32),
                         (60 * 156, 0.032), (80 * 156, 0.0032), (90 * 156, 0.0032)]:
    assert float(schedule(step)) == pytest.approx(expected, rel=1e-5)


def test_fashion_mnist_config():
  """The README's Fashion-MNIST run: base 0.2 at batch 128, half an epoch of warm-up."""
  schedule = schedule_lib.LearningRateSchedule(0.2, 128, 468, total_epochs=8.5,
                                               warmup_epochs=0.5)
  assert (schedule.warmup_steps, schedule.total_steps) == (234, 3978)
  values = [float(schedule(s)) for s in (0, 117, 234, (234 + 3978) // 2, 3978)]
  np.testing.assert_allclose(values, [0.0, 0.05, 0.1, 0.05, 0.0], atol=1e-6)


def test_works_on_tensors_inside_tf_function():
  schedule = _imagenet("cosine")
  compiled = tf.function(schedule)
  steps = tf.constant([0, 390, 780], tf.int64)
  np.testing.assert_allclose([float(compiled(s)) for s in steps], [0.0, 1.6, 3.2],
                             rtol=1e-6)


def test_no_warmup_and_errors():
  schedule = schedule_lib.LearningRateSchedule(0.1, 256, 10, 2, warmup_epochs=0)
  assert float(schedule(0)) == pytest.approx(0.1)
  with pytest.raises(ValueError, match="decay"):
    schedule_lib.LearningRateSchedule(0.1, 256, 10, 2, decay="linear")
  with pytest.raises(ValueError, match="warmup_epochs"):
    schedule_lib.LearningRateSchedule(0.1, 256, 10, 2, warmup_epochs=3)


@pytest.mark.parametrize("field, value, message", [
    ("global_batch_size", 0, "global_batch_size must be positive, got 0"),
    ("steps_per_epoch", 0, "steps_per_epoch must be positive, got 0"),
    ("total_epochs", -1, "total_epochs must be positive, got -1"),
    ("warmup_epochs", -0.5, "warmup_epochs must be 0 .* or more, got -0.5"),
    ("total_epochs", 0.01, r"total_epochs \(0.01\) x steps_per_epoch \(10\) rounds to no"),
])
def test_sizes_that_make_no_schedule_raise(field, value, message):
  """Each made a schedule of no steps or of negative rates without a word."""
  args = dict(base_learning_rate=0.1, global_batch_size=256, steps_per_epoch=10,
              total_epochs=2, warmup_epochs=0)
  with pytest.raises(ValueError, match=message):
    schedule_lib.LearningRateSchedule(**{**args, field: value})
