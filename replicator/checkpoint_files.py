"""A checkpoint's files: their names, cleaning up, and whether they read whole.

TensorFlow finds a damaged checkpoint only while restoring it, naming neither
the checkpoint nor the file (`IndexError: Read less bytes than requested`), and
a variable made after the restore would meet the damage in its first step:
`damage` reads every tensor first, through a reader that touches no variable.
"""

import os
import re
from typing import Optional, Sequence, Tuple

import tensorflow as tf

from replicator import errors

_NAME = re.compile(r"^ckpt-(\d+)(-[0-9a-f]{12})?$")  # suffixed: a unique name
# TensorFlow's checkpoint writer puts the shards of `<prefix>` in this folder,
# `<prefix>_temp/part-<shard>-of-<shards>.*`, then merges them into `<prefix>.*`
# and deletes the folder (python/checkpoint/functional_saver.py).
SHARDS_FOLDER = "_temp"
_DATA_FILE = re.compile(r"[^\s'\"]+\.data-(\d{5})-of-(\d{5})")


def step_of(name: str) -> Optional[int]:
  """The step of a checkpoint named `ckpt-<step>[-<id>]` (None for another name)."""
  match = _NAME.match(name)
  return int(match.group(1)) if match else None


def pointer_unreadable(directory: str, path: str, found: str, pointer: str) -> ValueError:
  """The error of a pointer file that cannot be read, listing what it could point to."""
  names = sorted({os.path.basename(f)[:-len(".index")] for f in tf.io.gfile.glob(
      os.path.join(directory, "ckpt-*.index"))}, key=lambda n: (step_of(n) or 0, n))
  example = names[-1] if names else "ckpt-<step>-<id>"
  return ValueError(
      f"{path}: expected the pointer file {pointer} that Checkpointer.save writes, "
      f"found {found}. Nothing was restored, written or deleted. The checkpoints in "
      f"{directory!r} are {names or 'none'}; restore_latest restores the one "
      f"the pointer names, so repair the file to name one, e.g. {{\"step\": "
      f"{step_of(example) if names else '<step>'}, \"checkpoint\": \"{example}\"}}, "
      f"or delete {pointer} to start over (the next save then deletes the "
      "checkpoints it does not name: move them away first to keep them).")


def remove_all_but(directory: str, kept, dropped, pointer: str):
  """Deletes the `dropped` checkpoints and any other of ours not in `kept`.

  Others of ours (a unique name that no pointer names) are left by a save
  that crashed before its pointer was written: its files, the folder
  `<name>_temp` where TensorFlow writes the shards before merging them, and
  the copy of the pointer file (named `pointer`) that was to replace it.
  """
  for file in tf.io.gfile.glob(os.path.join(directory, "ckpt-*")):
    name = os.path.basename(file).split(".")[0]
    shards = name.endswith(SHARDS_FOLDER)
    name = name[:-len(SHARDS_FOLDER)] if shards else name
    match = _NAME.match(name)  # with a unique id: a save's own, maybe orphaned
    if not (name in dropped or (match and match.group(2) and name not in kept)):
      continue
    if not tf.io.gfile.isdir(file):
      tf.io.gfile.remove(file)
    elif shards:  # TensorFlow's folder only, never another directory
      tf.io.gfile.rmtree(file)
  for file in tf.io.gfile.glob(os.path.join(directory, f".{pointer}.tmp-*")):
    tf.io.gfile.remove(file)  # this save's own copy was renamed before


def damage(prefix: str) -> Optional[Tuple[str, str]]:
  """`(file, what is wrong)` for the checkpoint at `prefix`; None if it reads whole.

  Reads the index and every tensor (each once, then dropped), as a restore
  would, without touching a variable: a truncated or missing data file, bytes
  whose checksum does not match, an index that does not parse.
  """
  index = prefix + ".index"
  if not tf.io.gfile.exists(index):
    return index, "the index file is missing"
  data_files = sorted(tf.io.gfile.glob(prefix + ".data-*-of-*"))
  counts = {int(_DATA_FILE.search(f).group(2)) for f in data_files if _DATA_FILE.search(f)}
  if len(counts) == 1:  # the shards the others' names say exist
    shards = counts.pop()
    expected = (f"{prefix}.data-{i:05d}-of-{shards:05d}" for i in range(shards))
    missing = [f for f in expected if f not in data_files]
    if missing:
      return missing[0], f"this data shard is missing (of {', '.join(missing)})"
  try:
    reader = tf.train.load_checkpoint(prefix)
    keys = sorted(reader.get_variable_to_shape_map())
  except Exception as error:  # pylint: disable=broad-except  (any parse failure)
    named = _DATA_FILE.search(str(error))
    if named or not data_files:
      return (named.group(0) if named else f"{prefix}.data-00000-of-00001",
              f"its data file cannot be opened ({_first_line(error)})")
    return index, f"the index does not parse ({_first_line(error)})"
  for key in keys:
    try:
      reader.get_tensor(key)
    except Exception as error:  # pylint: disable=broad-except  (any read failure)
      named = _DATA_FILE.search(str(error))
      culprit = (named.group(0) if named else " or ".join(data_files)
                 or "its data files (none is there)")
      return culprit, _problem(error, key, culprit)
  return None


def newest_restorable(directory: str, names: Sequence[str], damaged: str) -> Optional[str]:
  """The newest of `names` (a pointer's `all`, oldest first) other than
  `damaged` whose files read whole (`damage`), or None."""
  for name in reversed(list(names)):
    if name != damaged and damage(os.path.join(directory, name)) is None:
      return name
  return None


def corrupted(directory: str, name: str, step: int, found: Tuple[str, str],
              previous: Optional[str]) -> errors.CheckpointCorrupted:
  """The error for checkpoint `name` of `directory`, damaged as `found` says."""
  path, problem = found
  if previous is not None:
    then = (f"The previous checkpoint, {previous} (step {step_of(previous)}), reads "
            f"whole: restore_latest(fall_back=True) restores it (and returns "
            f"{step_of(previous)}), or restore the damaged files from a copy.")
  else:
    then = ("No earlier checkpoint in the directory reads whole: restore the files "
            "from a copy, or move the directory away and start over.")
  return errors.CheckpointCorrupted(
      f"checkpoint: {name} (step {step}) in {directory!r} is damaged: {path}: "
      f"{problem}. Nothing was restored or deleted. {then}",
      checkpoint=name, step=step, path=path, problem=problem, previous=previous,
      previous_step=None if previous is None else step_of(previous))


def _problem(error: Exception, key: str, path: str) -> str:
  text = str(error)  # TensorFlow's reader raises plain OpErrors (patches/error_texts.py)
  if isinstance(error, tf.errors.NotFoundError) or "No such file" in text:
    return f"it is missing ({_first_line(error)})"
  if isinstance(error, IndexError) or "Read less bytes" in text:
    size = (f" at {tf.io.gfile.stat(path).length} bytes"
            if tf.io.gfile.exists(path) else "")
    return (f"it ends{size}, before the tensor {key!r} does (truncated, or still "
            "being copied)")
  if "hecksum" in text or isinstance(error, tf.errors.DataLossError):
    return (f"the tensor {key!r} does not match its checksum (its bytes changed "
            f"after they were written: {_first_line(error)})")
  return f"the tensor {key!r} cannot be read ({_first_line(error)})"


def _first_line(error: Exception) -> str:
  lines = str(error).strip().splitlines()
  return f"{type(error).__name__}: {lines[0][:200] if lines else ''}"
