"""The checks `train.py` runs: flags, batch sizes and input at start-up, and the
number of images each evaluation saw."""

from typing import Optional

import replicator


def check_flags(global_batch_size: int, eval_batch_size, epochs: float,
                warmup_epochs: float, eval_every_epochs: float,
                checkpoint_every_epochs: float, log_every: int):
  """Raises on flag values that would train wrongly or not at all, before any work."""
  fixes = {"global_batch_size": "e.g. --global_batch_size=1024",
           "eval_batch_size": "or leave it out to use --global_batch_size",
           "epochs": "e.g. --epochs=90",
           "eval_every_epochs": "e.g. --eval_every_epochs=1; to evaluate once, at the "
                                "end, pass --eval_every_epochs equal to --epochs",
           "checkpoint_every_epochs": "e.g. --checkpoint_every_epochs=1",
           "log_every": "e.g. --log_every=100"}
  values = dict(global_batch_size=global_batch_size, eval_batch_size=eval_batch_size,
                epochs=epochs, eval_every_epochs=eval_every_epochs,
                checkpoint_every_epochs=checkpoint_every_epochs,
                log_every=log_every)
  for name, value in values.items():
    # `not > 0` also rejects NaN. A zero period used to mean "every step", silently.
    if value is not None and not value > 0:
      raise ValueError(f"--{name}: must be positive, got {value}; {fixes[name]}.")
  if not 0 <= warmup_epochs < epochs:
    raise ValueError(f"--warmup_epochs: must be at least 0 and shorter than --epochs="
                     f"{epochs}, got {warmup_epochs}; e.g. --warmup_epochs=5 (0: none).")


def check_batches(global_batch_size: int, eval_batch_size: int, epochs: float,
                  num_replicas: int, num_train_examples: int, dataset: str) -> int:
  """Raises where the batches do not fit the replicas or the data; steps per epoch."""
  for name, batch in (("global_batch_size", global_batch_size),
                      ("eval_batch_size", eval_batch_size)):
    if batch % num_replicas:
      raise ValueError(
          f"--{name}: {batch} images do not split evenly over {num_replicas} "
          f"replicas; pass a multiple of {num_replicas}, e.g. "
          f"--{name}={max(1, batch // num_replicas) * num_replicas}.")
  steps_per_epoch = num_train_examples // global_batch_size
  if steps_per_epoch == 0:
    raise ValueError(
        f"--global_batch_size: {global_batch_size} is more than the "
        f"{num_train_examples} training images of --dataset={dataset}, so an epoch "
        f"has no step; pass at most {num_train_examples}.")
  if round(epochs * steps_per_epoch) < 1:
    raise ValueError(
        f"--epochs: {epochs} epochs of {steps_per_epoch} steps round to no step; pass "
        f"at least {0.5 / steps_per_epoch:.2g}.")
  return steps_per_epoch


def input_context(repl) -> replicator.InputContext:
  """The context `repl` gives this worker's `input_fn`."""
  return replicator.InputContext(num_input_pipelines=repl.num_workers,
                                 input_pipeline_id=repl.mesh.worker_index,
                                 num_replicas_in_sync=repl.num_replicas)


def check_input(repl, input_fn):
  """Builds this worker's dataset and reads its first batch.

  A missing file, a batch that does not split over the replicas or an image that
  does not decode then stops the run at start-up, not at the first evaluation
  (an epoch or more into training).
  """
  next(iter(input_fn(input_context(repl))))


def check_eval_count(count: float, num_eval_examples: Optional[int]):
  """Raises unless the evaluation saw every image of the declared evaluation set once."""
  if num_eval_examples is not None and round(count) != num_eval_examples:
    raise ValueError(
        f"--num_eval_examples: the evaluation saw {count:.0f} images, but the "
        f"evaluation set should have {num_eval_examples} (the flag, else the size the "
        "dataset reports), so its accuracy is not over that set. Pass the number of "
        "images in the validation data as --num_eval_examples (imagenet_tfrecord), "
        "or check --data_dir.")
