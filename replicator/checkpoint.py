"""Checkpoints that a crash cannot corrupt, restorable on any topology."""

import json
import logging
import os
import uuid
from typing import Optional

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import trackable_object_graph_pb2

from replicator import base
from replicator import checkpoint_files
from replicator import mesh as mesh_lib
from replicator import optimizers
from replicator.collectives import replica_context
from replicator.inputs import positions

POINTER = "latest.json"

# TensorFlow's checkpoint writer logs "Sharding callback duration: N microseconds" at
# INFO through absl on every write: a line after each save that says nothing to act on.
logging.getLogger("absl").addFilter(
    lambda record: not str(record.msg).startswith("Sharding callback duration"))


class Checkpointer:
  """Saves and restores training state; call it on every worker.

  Only the chief (worker 0 of the replicators' mesh) writes. Each save goes to
  new files, and becomes visible when the pointer file `latest.json` is
  replaced, after its data is written, so a crash during `save` (even of a
  step saved before) leaves the previous checkpoint restorable, on a local
  disk or on object storage (`tf.io.gfile` paths). A replicated variable is
  saved once, so a checkpoint restores on any number of replicas or workers.
  It also keeps how many steps each input of each replicator has taken, and
  each replicator's inputs continue from there (exactly on the same topology
  with a deterministic input_fn; elsewhere the same number of steps is
  skipped, with a warning): create the replicators before `restore_latest`.
  An optimizer saved wrapped (`wrap_optimizer`'s result) restores into the
  optimizer it wraps, and the other way round.

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
    if not isinstance(directory, (str, os.PathLike)) or not os.fspath(directory):
      raise ValueError(
          f"directory: expected a path (str or os.PathLike) to write checkpoints "
          f"to, got {directory!r}.")
    if not trackables:
      raise ValueError(
          "trackables: nothing to save; pass e.g. Checkpointer(dir, "
          "model=model, optimizer=optimizer).")
    if not isinstance(max_to_keep, int) or max_to_keep < 1:
      raise ValueError(f"max_to_keep: expected an int >= 1, got {max_to_keep!r}.")
    self._directory = os.fspath(directory)
    self._max_to_keep = max_to_keep
    self._trackables = trackables
    self._checkpoint = tf.train.Checkpoint(**trackables)
    self._restoring = None  # the tf.train.Checkpoint of the last restore

  @property
  def directory(self) -> str:
    """Where the checkpoints and the pointer file `latest.json` are."""
    return self._directory

  def _read_pointer(self) -> Optional[dict]:
    """The pointer file's contents (None if absent); raises if they are not a pointer."""
    path = os.path.join(self._directory, POINTER)
    if not tf.io.gfile.exists(path):
      return None
    with tf.io.gfile.GFile(path, "rb") as f:
      raw = f.read()
    try:
      pointer = json.loads(raw)
    except ValueError as e:  # also bytes that are not UTF-8
      raise self._corrupt(path, f"not JSON ({e}): {raw[:80]!r}") from None
    if not isinstance(pointer, dict):
      raise self._corrupt(path, f"a {type(pointer).__name__}, not a JSON object")
    for key in ("step", "checkpoint"):
      if key not in pointer:
        raise self._corrupt(path, f"no {key!r} key (it has {sorted(pointer)})")
    step, name = pointer["step"], pointer["checkpoint"]
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
      raise self._corrupt(path, f"'step': {step!r}, not an int >= 0")
    if not isinstance(name, str) or _step_of(name) is None:
      raise self._corrupt(path, f"'checkpoint': {name!r}, not a name ckpt-<step>-<id>")
    kept = pointer.get("all", [])
    if not isinstance(kept, list) or not all(_step_of(n) is not None for n in kept):
      raise self._corrupt(path, f"'all': {kept!r}, not a list of names ckpt-<step>-<id>")
    return pointer

  def _corrupt(self, path: str, found: str) -> ValueError:
    return checkpoint_files.pointer_unreadable(self._directory, path, found, POINTER)

  @property
  def latest_step(self) -> Optional[int]:
    """The step of the newest complete checkpoint (None if none), without restoring."""
    _check_outside_steps("latest_step", "read checkpointer.latest_step between repl.run "
                         "calls, outside step_fn and any tf.function")
    pointer = self._read_pointer()
    return None if pointer is None else int(pointer["step"])

  def save(self, step: int) -> Optional[str]:
    """Writes a checkpoint for `step` (chief only); returns its path or None.

    Pass the number of steps completed (`step + 1` after the step with index
    `step`): `restore_latest()` returns it. On several workers every worker
    returns once the chief's checkpoint is visible, so a `restore_latest` right
    after finds it on every worker.
    """
    _check_outside_steps("save", "call checkpointer.save(step) between repl.run calls, "
                         "outside step_fn and any tf.function")
    if (isinstance(step, (bool, np.bool_)) or not isinstance(step, (int, np.integer))
        or step < 0):
      raise ValueError(f"step: expected an int >= 0, got {step!r}.")
    # The chief writes: worker 0 of its replicators' cluster. A local replicator
    # (one worker) says nothing about the cluster; without a multi-worker one,
    # TF_CONFIG decides (absent: a one-process job).
    clustered = [r for r in list(base.Replicator.live) if r.num_workers > 1]
    chief = (all(r.is_chief for r in clustered) if clustered
             else mesh_lib.worker_index_in_tf_config() == 0)
    path = self._write(int(step)) if chief else None
    workers = _clustered_replicator()
    if workers is not None:  # a barrier: the chief arrives after its pointer
      workers._across_workers([0], "Add")  # pylint: disable=protected-access
    return path

  def _write(self, step: int) -> str:
    previous = self._read_pointer() or {"all": []}  # a corrupt one fails before writing
    tf.io.gfile.makedirs(self._directory)
    name = f"ckpt-{step}-{uuid.uuid4().hex[:12]}"
    path = self._checkpoint.write(os.path.join(self._directory, name))
    superseded = [p for p in previous.get("all", []) if _step_of(p) == step]
    kept = [p for p in previous.get("all", []) if p not in superseded] + [name]
    pointer = {"step": step, "checkpoint": name, "all": kept[-self._max_to_keep:],
               "replicators": _input_records(self._trackables)}
    # The input positions of the checkpoints kept before it, for a fall-back.
    earlier = previous.get("earlier_replicators")
    earlier = dict(earlier) if isinstance(earlier, dict) else {}
    if "checkpoint" in previous:
      earlier[previous["checkpoint"]] = previous.get("replicators") or []
    pointer["earlier_replicators"] = {n: earlier[n] for n in pointer["all"] if n in earlier}
    temporary = os.path.join(self._directory, f".{POINTER}.tmp-{os.getpid()}")
    with tf.io.gfile.GFile(temporary, "w") as f:
      json.dump(pointer, f)
    tf.io.gfile.rename(temporary, os.path.join(self._directory, POINTER),
                       overwrite=True)
    checkpoint_files.remove_all_but(self._directory, pointer["all"],
                                    superseded + kept[:-self._max_to_keep], POINTER)
    return path

  def restore_latest(self, *, allow_missing=(), fall_back: bool = False) -> Optional[int]:
    """Restores the newest complete checkpoint; returns its step (None if none).

    The step is the number `save` was given, the steps completed:
    `range(restore_latest() or 0, n)` goes on without repeating a step.
    Variables that do not exist yet (modules built on first call, optimizer
    slots) get their values when they are created. A name in the checkpoint
    that was not given to the constructor is skipped with a warning.

    Args:
      allow_missing: names given to the constructor that the checkpoint may
        lack (state added to a script after the checkpoint was written): those
        keep their values, with a warning.
      fall_back: where the newest checkpoint's files do not read whole, restore
        the newest earlier one that does (its inputs' positions too), log that
        it did, and return its step, instead of raising `CheckpointCorrupted`.
        Nothing is deleted.

    Raises:
      CheckpointCorrupted: the newest checkpoint's files do not read whole
        (every tensor is read first; on every worker where any finds so), naming
        the file, what is wrong and the previous checkpoint that reads whole.
      ValueError: a name given to the constructor is not in the checkpoint
        (nor in `allow_missing`), `latest.json` is not a pointer that `save`
        wrote, or (on several workers, raised on every one) the workers do
        not see the same newest checkpoint: the directory is not shared.
      RuntimeError: called inside `step_fn` or a `tf.function`.
    """
    _check_outside_steps("restore_latest", "call checkpointer.restore_latest() before "
                         "the repl.run calls, outside step_fn and any tf.function")
    names = [allow_missing] if isinstance(allow_missing, str) else allow_missing
    if (not isinstance(names, (list, tuple, set, frozenset))
        or not all(isinstance(n, str) for n in names)
        or set(names) - set(self._trackables)):
      raise ValueError(
          f"allow_missing: expected names given to this Checkpointer "
          f"({sorted(self._trackables)}), got {allow_missing!r}.")
    if not isinstance(fall_back, bool):
      raise TypeError(f"fall_back: expected True or False, got {fall_back!r}.")
    try:
      pointer = self._read_pointer()
    except ValueError:  # the others must not wait for this worker in the check
      self._check_workers_agree(_UNREADABLE)
      raise
    self._check_workers_agree(None if pointer is None else int(pointer["step"]))
    if pointer is None:
      return None
    name, step, records = self._restorable(pointer, fall_back)
    path = os.path.join(self._directory, name)
    self._restoring = tf.train.Checkpoint(**self._matched(path, frozenset(names)))
    self._restoring.read(path).expect_partial()  # unbuilt variables come later
    saved = positions.SavedPositions(records or [])
    for repl in _open_replicators():
      repl.resume_inputs(saved)
    return step

  def _restorable(self, pointer: dict, fall_back: bool):
    """`(name, step, input records)` of the checkpoint to restore: the newest
    if its files read whole on every worker; else, with `fall_back`, the newest
    earlier one that does (every worker finding the same); else raises."""
    name, step = pointer["checkpoint"], int(pointer["step"])
    records = pointer.get("replicators")
    if records is None and "inputs" in pointer:  # one record at the top level
      records = [{"inputs": pointer["inputs"], "topology": pointer["topology"]}]
    found = checkpoint_files.damage(os.path.join(self._directory, name))
    workers = _clustered_replicator()
    if workers is not None:  # damaged where any worker finds it so
      (fewest,) = workers._across_workers([-int(found is not None)], "Min")  # pylint: disable=protected-access
      if fewest < 0 and found is None:
        found = (os.path.join(self._directory, name), "another worker could not read "
                 "its files whole")
    if found is None:
      return name, step, records
    previous = checkpoint_files.newest_restorable(self._directory, pointer.get("all", []),
                                                  name)
    self._check_workers_agree(None if previous is None else _step_of(previous),
                              "previous checkpoints that read whole")
    error = checkpoint_files.corrupted(self._directory, name, step, found, previous)
    if not fall_back or previous is None:
      raise error
    records = (pointer.get("earlier_replicators") or {}).get(previous)
    logging.warning("replicator: restore_latest(fall_back=True) restores %s, step %d, "
                    "instead of the newest: %s%s", previous, _step_of(previous), error,
                    "" if records is not None else " The pointer file has no input "
                    "positions for it: inputs start from their beginning.")
    return previous, _step_of(previous), records

  def _check_workers_agree(self, step: Optional[int], what: str = "newest checkpoints"):
    """Raises on every worker unless every worker sees the checkpoint at `step`."""
    workers = _clustered_replicator()
    if workers is None:
      return
    mine = -1 if step is None else step
    low, negated_high = workers._across_workers([mine, -mine], "Min")  # pylint: disable=protected-access
    if low == -negated_high:
      return
    seen = lambda s: ("none" if s == -1 else f"an unreadable {POINTER}"
                      if s == _UNREADABLE else f"step {s}")
    raise ValueError(
        f"directory: the workers see different {what} in "
        f"{self._directory!r} (this worker, {workers.mesh.worker_index}: "
        f"{seen(mine)}; from {seen(low)} to {seen(-negated_high)} across workers), "
        "so they would restore different states. Only the chief writes: give "
        "every worker the same directory on storage they all see (a shared "
        "file system, or object storage such as gs://...).")

  def _matched(self, path: str, allow_missing: frozenset) -> dict:
    """The trackables to restore from `path`, checked against what it holds."""
    reader = tf.train.load_checkpoint(path)
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    saved = {c.local_name: graph.nodes[c.node_id] for c in graph.nodes[0].children}
    absent = set(self._trackables) - set(saved)
    if absent & allow_missing:
      logging.warning(
          "replicator: the checkpoint %s has no %s (allow_missing); they keep "
          "their values.", path, sorted(absent & allow_missing))
    missing = sorted(absent - allow_missing)
    if missing:
      raise ValueError(
          f"trackables: the checkpoint {path} has no {missing}; it holds "
          f"{sorted(saved)}. Pass the names it was saved with, e.g. "
          f"Checkpointer(directory, {', '.join(f'{n}=...' for n in sorted(saved))}); "
          f"restore_latest(allow_missing={missing}) if they were added to the "
          "script after it was written; or save to another directory.")
    unused = sorted(set(saved) - set(self._trackables))
    if unused:
      logging.warning(
          "replicator: the checkpoint %s also holds %s, which nothing restores "
          "(this Checkpointer was given %s).", path, unused, sorted(self._trackables))
    return {name: _as_saved(trackable, saved[name])
            for name, trackable in self._trackables.items() if name in saved}


def _as_saved(trackable, node):
  """`trackable`, or what matches `node` when an optimizer was saved (un)wrapped.

  `wrap_optimizer`'s result keeps the optimizer it wraps as its child `_base`.
  """
  children = {c.local_name for c in node.children}
  wrapped = isinstance(trackable, optimizers.ReplicatedOptimizer)
  if wrapped and children and "_base" not in children:
    return trackable.optimizer  # saved unwrapped: its own state only
  if not wrapped and "_base" in children and _is_optimizer(trackable):
    wrapper = tf.Module()
    wrapper._base = trackable  # pylint: disable=protected-access
    return wrapper
  return trackable


def _is_optimizer(trackable) -> bool:
  try:
    optimizers._kind(trackable)  # pylint: disable=protected-access
  except TypeError:
    return False
  return True


_step_of = checkpoint_files.step_of
_UNREADABLE = -2  # the step a worker reports when its pointer file is corrupt


def _check_outside_steps(method: str, fix: str):
  """Raises inside step_fn or a tf.function: there the pointer would be written
  while the step is traced, and the traced write of the data would then replace
  that checkpoint's files at every step."""
  if replica_context.current() is not None or tf.inside_function():
    raise RuntimeError(
        f"{method}: called inside step_fn or a tf.function, where it would run once "
        "while the step is traced instead of when the step runs. Checkpointer reads "
        f"and writes files from plain Python: {fix}.")


def _open_replicators():
  open_ = [r for r in list(base.Replicator.live) if not r._closed]  # pylint: disable=protected-access
  return sorted(open_, key=lambda r: r._created)  # pylint: disable=protected-access


def _clustered_replicator():
  """The newest open replicator spanning several workers, or None."""
  clustered = [r for r in _open_replicators() if r.num_workers > 1]
  return clustered[-1] if clustered else None


def _variables_of(trackable) -> list:
  if isinstance(trackable, tf.Variable):
    return [trackable]
  if isinstance(trackable, tf.Module):  # Sonnet's .variables raises when empty
    return list(tf.Module.variables.fget(trackable))
  return list(getattr(trackable, "variables", None) or ())


def _input_records(trackables: dict) -> list:
  """The input positions and topology of every open replicator that took input:
  those whose variables are saved first, newest first in each, as the first
  record that names an input resumes it (an older replicator may still be open)."""
  saved = {id(getattr(v, "_value", v))  # a Keras 3 variable wraps ours
           for trackable in trackables.values() for v in _variables_of(trackable)}

  def owns_saved(repl):
    return any(id(v) in saved for v in repl._replicated_variables())  # pylint: disable=protected-access

  took_input = [r for r in reversed(_open_replicators()) if r.input_positions()]
  ordered = sorted(took_input, key=lambda r: not owns_saved(r))  # stable
  return [{"topology": [r.num_workers, r.num_local_replicas],
           "inputs": r.input_positions()} for r in ordered]
