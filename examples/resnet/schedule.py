"""The large-batch learning-rate recipe of Goyal et al. (2017).

The peak rate scales linearly with the global batch (`base x global_batch / 256`), is
reached by a linear warm-up from zero, and then decays by a cosine to zero or by steps
of 10x at given epochs.

>>> schedule = LearningRateSchedule(base_learning_rate=0.1, global_batch_size=1024,
...                                 steps_per_epoch=100, total_epochs=90,
...                                 warmup_epochs=5, decay="step")
>>> float(schedule.peak_learning_rate)
0.4
>>> [round(float(schedule(s)), 4) for s in (0, 250, 500, 3000, 6000, 8500)]
[0.0, 0.2, 0.4, 0.04, 0.004, 0.0004]
"""

import dataclasses
import math
from typing import Sequence

import tensorflow as tf

REFERENCE_BATCH_SIZE = 256


@dataclasses.dataclass(frozen=True)
class LearningRateSchedule:
  """Learning rate as a function of the global step (a Python int or a tensor).

  Attributes:
    base_learning_rate: the rate for a global batch of 256 images.
    global_batch_size: images per step over all replicas.
    steps_per_epoch: optimizer steps per epoch at that global batch.
    total_epochs: length of training; the cosine reaches zero there.
    warmup_epochs: linear warm-up from 0 to the peak (5 at ImageNet scale).
    decay: "cosine" or "step".
    step_decay_epochs: epochs at which "step" decay divides the rate by 10.
  """
  base_learning_rate: float
  global_batch_size: int
  steps_per_epoch: int
  total_epochs: float
  warmup_epochs: float = 5.0
  decay: str = "cosine"
  step_decay_epochs: Sequence[float] = (30, 60, 80)

  def __post_init__(self):
    if self.decay not in ("cosine", "step"):
      raise ValueError(f"decay must be 'cosine' or 'step', got {self.decay!r}")
    # Zero or negative sizes give a schedule of no steps, or of negative rates.
    for name in ("global_batch_size", "steps_per_epoch", "total_epochs"):
      if not getattr(self, name) > 0:
        raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}.")
    if not self.warmup_epochs >= 0:
      raise ValueError(f"warmup_epochs must be 0 (no warm-up) or more, got "
                       f"{self.warmup_epochs!r}.")
    if self.total_steps < 1:
      raise ValueError(f"total_epochs ({self.total_epochs}) x steps_per_epoch "
                       f"({self.steps_per_epoch}) rounds to no step; train longer.")
    if self.warmup_epochs >= self.total_epochs:
      raise ValueError(f"warmup_epochs ({self.warmup_epochs}) must be shorter than "
                       f"total_epochs ({self.total_epochs})")

  @property
  def peak_learning_rate(self) -> float:
    return self.base_learning_rate * self.global_batch_size / REFERENCE_BATCH_SIZE

  @property
  def warmup_steps(self) -> int:
    return int(round(self.warmup_epochs * self.steps_per_epoch))

  @property
  def total_steps(self) -> int:
    return int(round(self.total_epochs * self.steps_per_epoch))

  def __call__(self, step) -> tf.Tensor:
    step = tf.cast(step, tf.float32)
    peak = self.peak_learning_rate
    warmup = float(self.warmup_steps)
    if self.decay == "cosine":
      progress = (step - warmup) / float(self.total_steps - self.warmup_steps)
      decayed = 0.5 * peak * (1.0 + tf.cos(math.pi * tf.clip_by_value(progress, 0., 1.)))
    else:
      boundaries = [e * self.steps_per_epoch for e in self.step_decay_epochs]
      passed = sum(tf.cast(step >= b, tf.float32) for b in boundaries)
      decayed = peak * tf.pow(0.1, passed)
    if warmup == 0:
      return decayed
    return tf.where(step < warmup, peak * step / warmup, decayed)
