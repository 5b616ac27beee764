"""What a checkpoint keeps of the inputs: their names and positions.

A resumed script, in a new process with new `input_fn` objects, finds an input
by its function's qualified name and the simple constants it closes over
(`make_input("train")` and `make_input("eval")` differ); each replicator's
positions are one record, claimed by the first replicator that starts an input
the record names.
"""

import hashlib
import logging
from typing import List, Optional, Sequence

_SIMPLE = (str, int, float, bool, type(None))
_LONGEST_NAME = 100  # longer constants are named by a digest


def _is_simple(value) -> bool:
  if isinstance(value, tuple):
    return all(_is_simple(v) for v in value)
  return isinstance(value, _SIMPLE)


def input_name(input_fn) -> str:
  """`input_fn`'s qualified name and the simple constants of its closure.

  >>> def make_input(split, size):
  ...   def input_fn(ctx):
  ...     return (split, size)
  ...   return input_fn
  >>> input_name(make_input("train", 100))
  "make_input.<locals>.input_fn(size=100, split='train')"
  """
  name = getattr(input_fn, "__qualname__", type(input_fn).__name__)
  code, cells = getattr(input_fn, "__code__", None), getattr(input_fn, "__closure__", None)
  if code is None or not cells:
    return name
  constants = []
  for free, cell in zip(code.co_freevars, cells):
    try:
      value = cell.cell_contents
    except ValueError:  # a cell not yet filled
      continue
    if _is_simple(value):
      constants.append(f"{free}={value!r}")
  if not constants:
    return name
  arguments = ", ".join(constants)
  if len(arguments) > _LONGEST_NAME:
    arguments = hashlib.sha1(arguments.encode()).hexdigest()[:16]
  return f"{name}({arguments})"


class SavedPositions:
  """The input positions of a checkpoint: one record per replicator, each
  `{"topology": [workers, replicas per worker], "inputs": {name: steps}}`."""

  def __init__(self, records: Sequence[dict]):
    self._unclaimed: List[dict] = [r for r in records if r.get("inputs")]

  def claim(self, name: str, topology: Sequence[int]) -> Optional[dict]:
    record = next((r for r in self._unclaimed if name in r["inputs"]), None)
    if record is None:
      return None
    self._unclaimed.remove(record)
    if tuple(record["topology"]) != tuple(topology):
      logging.warning(
          "replicator: the checkpoint was written by %s workers x %s replicas "
          "and is restored on %s x %s; each input skips the %s steps already "
          "taken, which is not exactly the same examples.", record["topology"][0],
          record["topology"][1], topology[0], topology[1], record["inputs"])
    return record
