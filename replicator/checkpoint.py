"""Checkpoints that a crash cannot corrupt, restorable on any topology."""

import json
import os
from typing import List, Optional

import tensorflow as tf

from replicator import base
from replicator import mesh as mesh_lib

POINTER = "latest.json"


class Checkpointer:
  """Saves and restores training state; call it on every worker.

  Only the chief (worker 0) writes. A checkpoint becomes visible when the
  pointer file `latest.json` is replaced, after its data is written, so a
  crash during `save` leaves the previous checkpoint restorable, on a local
  disk or on object storage (`tf.io.gfile` paths). A replicated variable is
  saved once, so a checkpoint restores on any number of replicas or workers.
  It also keeps how many steps each input of the process's replicator (the
  newest one not shut down, when a process has several) has
  taken; on restore the inputs continue from there (exactly on the same
  topology with a deterministic input_fn; on another topology the same number
  of steps is skipped, with a warning).

  >>> import tempfile
  >>> counter = tf.Variable(3)
  >>> ckpt = Checkpointer(tempfile.mkdtemp(), counter=counter)
  >>> path = ckpt.save(step=10)
  >>> _ = counter.assign(0)
  >>> ckpt.restore_latest()
  10
  >>> int(counter)
  3

  Args:
    directory: where checkpoints go (created if needed).
    max_to_keep: older checkpoints beyond this many are deleted.
    **trackables: what to save: modules, optimizers, variables.
  """

  def __init__(self, directory: str, *, max_to_keep: int = 3, **trackables):
    if not trackables:
      raise ValueError(
          "trackables: nothing to save; pass e.g. Checkpointer(dir, "
          "model=model, optimizer=optimizer).")
    if not isinstance(max_to_keep, int) or max_to_keep < 1:
      raise ValueError(f"max_to_keep: expected an int >= 1, got {max_to_keep!r}.")
    self._directory = directory
    self._max_to_keep = max_to_keep
    self._checkpoint = tf.train.Checkpoint(**trackables)
    self._is_chief = mesh_lib.worker_index_in_tf_config() == 0

  @property
  def directory(self) -> str:
    return self._directory

  def _read_pointer(self) -> Optional[dict]:
    path = os.path.join(self._directory, POINTER)
    if not tf.io.gfile.exists(path):
      return None
    with tf.io.gfile.GFile(path) as f:
      return json.load(f)

  @property
  def latest_step(self) -> Optional[int]:
    pointer = self._read_pointer()
    return None if pointer is None else int(pointer["step"])

  def save(self, step: int) -> Optional[str]:
    """Writes a checkpoint for `step` (chief only); returns its path or None."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
      raise ValueError(f"step: expected an int >= 0, got {step!r}.")
    if not self._is_chief:
      return None
    tf.io.gfile.makedirs(self._directory)
    path = self._checkpoint.write(os.path.join(self._directory, f"ckpt-{step}"))
    previous = self._read_pointer() or {"all": []}
    kept: List[str] = [p for p in previous.get("all", [])
                       if p != os.path.basename(path)] + [os.path.basename(path)]
    pointer = {"step": step, "checkpoint": os.path.basename(path),
               "all": kept[-self._max_to_keep:], **_input_state()}
    temporary = os.path.join(self._directory, f".{POINTER}.tmp-{os.getpid()}")
    with tf.io.gfile.GFile(temporary, "w") as f:
      json.dump(pointer, f)
    tf.io.gfile.rename(temporary, os.path.join(self._directory, POINTER),
                       overwrite=True)
    for old in kept[:-self._max_to_keep]:
      for file in tf.io.gfile.glob(os.path.join(self._directory, old + ".*")):
        tf.io.gfile.remove(file)
    return path

  def restore_latest(self) -> Optional[int]:
    """Restores the newest complete checkpoint; returns its step (None if none).

    Variables that do not exist yet (modules built on first call, optimizer
    slots) get their values when they are created.
    """
    pointer = self._read_pointer()
    if pointer is None:
      return None
    path = os.path.join(self._directory, pointer["checkpoint"])
    self._checkpoint.read(path).expect_partial()
    repl = base.Replicator.newest()
    if "inputs" in pointer and repl is not None:
      repl.resume_inputs(pointer["inputs"], pointer["topology"])
    return int(pointer["step"])


def _input_state() -> dict:
  """The input positions of this process's newest replicator, if any."""
  repl = base.Replicator.newest()
  if repl is None:
    return {}
  return {"inputs": repl.input_positions(),
          "topology": [repl.num_workers, repl.num_local_replicas]}
