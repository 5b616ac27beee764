"""The errors a user of replicator may catch, and how they name a user's function."""

from typing import Optional

import tensorflow as tf


def name_of(fn):
  """How errors name a user's function (its repr when it has no `__name__`)."""
  return getattr(fn, "__name__", fn)


UNEVEN_BATCHES_FIX = (
    "A step runs only when every replica's batch is the same size (the mean "
    "over replicas weights each alike). A dataset batched without "
    "drop_remainder ends with a short batch: batch with drop_remainder=True "
    "for training, or use replicator.pad_to_global_batch for evaluation. If "
    "batch sizes vary on purpose, return replicator.allow_uneven_batches(ds) "
    "from input_fn and weight the loss yourself.")


class InputExhausted(tf.errors.OutOfRangeError):
  """The input ran out: every replica stopped after `steps_completed` steps.

  Attributes:
    steps_completed: steps of this `run` call that ran before the input ended.
    outputs: what `step_fn` returned on the last completed step (None if no
      step ran).
    uneven_batches: it stopped because the next step's batches were not all
      the same size (see `replicator.allow_uneven_batches`).
  """

  def __init__(self, steps_completed: int, outputs=None,
               uneven_batches: bool = False):
    message = (f"The input ran out after {steps_completed} step(s) of this "
               "run() call; call reset_input(input_fn) to start it again.")
    if uneven_batches:
      message = (f"The input stopped after {steps_completed} step(s) of this "
                 "run() call: the next step's batches were not all the same "
                 f"size. {UNEVEN_BATCHES_FIX}")
    super().__init__(None, None, message)
    self.steps_completed = steps_completed
    self.outputs = outputs
    self.uneven_batches = uneven_batches


class WorkerLost(RuntimeError):
  """A worker died or froze; training cannot go on (restart from a checkpoint).

  Attributes:
    worker: index of the lost worker, or None when it could not be told.
    step: steps this worker had completed before the `run` call (or other
      call) in which the loss was detected.
  """

  def __init__(self, worker: Optional[int], step: int, address: str = "",
               detail: str = ""):
    who = f"worker {worker} ({address})" if worker is not None else "a worker"
    super().__init__(
        f"{who} was lost during the call after step {step}"
        f"{': ' + detail if detail else ''}. "
        "Training stops on every worker; restart all workers and resume from "
        "the last checkpoint (replicator.Checkpointer.restore_latest()).")
    self.worker = worker
    self.step = step


class ReplicasDiverged(AssertionError):
  """Raised by `assert_replicas_in_sync` when copies of a variable differ."""


class CheckpointCorrupted(ValueError):
  """A checkpoint's files do not read whole: nothing was restored or deleted.

  Raised by `Checkpointer.restore_latest` for a data file that is truncated or
  missing, bytes changed after they were written (where TensorFlow's checksums
  find them), or an index that does not parse. `restore_latest(fall_back=True)`
  restores `previous` instead, where there is one.

  Attributes:
    checkpoint: the damaged checkpoint's name (`ckpt-<step>-<id>`).
    step: the step it was saved at.
    path: the file that is damaged or missing.
    problem: what is wrong with it.
    previous: the newest earlier checkpoint whose files read whole (None if
      none).
    previous_step: its step (None if none).
  """

  def __init__(self, message: str, *, checkpoint: str, step: int, path: str,
               problem: str, previous: Optional[str] = None,
               previous_step: Optional[int] = None):
    super().__init__(message)
    self.checkpoint = checkpoint
    self.step = step
    self.path = path
    self.problem = problem
    self.previous = previous
    self.previous_step = previous_step
