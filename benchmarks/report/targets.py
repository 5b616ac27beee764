"""The targets of benchmarks/report/targets.json, and how a figure is judged by one.

The numbers and the baselines they divide by live in that file alone, so that
a target changes as data: every verdict column of RESULTS.md and its glance
table go through the functions here.
"""

import fnmatch
import json
import os

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "targets.json")


def load(path: str = PATH) -> dict:
  with open(path) as f:
    return json.load(f)


TARGETS = load()


def of(benchmark: str) -> list:
  """The entries of `benchmark` (targets and references), in the file's order."""
  return TARGETS[benchmark]["targets"]


def summary(benchmark: str) -> list:
  """The results of `benchmark` that the glance table judges."""
  return TARGETS[benchmark]["summary"]


def by_ratio(benchmark: str, ratio: str):
  """The entry of `benchmark` for the result's ratio named `ratio`, or None."""
  return next((t for t in of(benchmark) if t.get("ratio") == ratio), None)


def for_variant(variant: str):
  """The all-reduce entry that judges `variant` (its baseline and target, or a
  reference such as a bound), or None for a variant that is not judged."""
  return next((t for t in of("allreduce")
               if any(fnmatch.fnmatchcase(variant, p) for p in t["variants"])), None)


def judged(t: dict) -> bool:
  """Whether `t` is a target (else a reference, shown and never judged)."""
  return "at_least" in t or "at_most" in t


def median(values):
  """The middle value (the upper one of an even count), as the verdicts take it:
  a round that ran in a worse job moves it less than it moves a mean."""
  return sorted(values)[len(values) // 2]


def met(value: float, t: dict) -> bool:
  return value >= t["at_least"] if "at_least" in t else value <= t["at_most"]


def verdict(value: float, t: dict) -> str:
  return "met" if met(value, t) else "**missed**"


def shown(value: float, t: dict) -> str:
  """A measured figure in `t`'s unit, with a digit more where the rounded one
  would read as the other verdict (0.995x against ">= 1.0x" is not 1.00x)."""
  scale, digits, unit = (100, 0, "%") if t.get("unit") == "%" else (1, 2, "x")
  text = f"{scale * value:.{digits}f}"
  while judged(t) and digits < 6 and met(float(text) / scale, t) != met(value, t):
    digits += 1
    text = f"{scale * value:.{digits}f}"
  return text + unit


def wanted(t: dict, compact: bool = False) -> str:
  """`t`'s target as a table shows it: ">= 1.5x", "<= 1.1x", ">= 95%"; compact
  drops a whole number's ".0" (">= 1x")."""
  bound = t.get("at_least", t.get("at_most"))
  sign = ">=" if "at_least" in t else "<="
  if t.get("unit") == "%":
    return f"{sign} {100 * bound:.0f}%"
  return f"{sign} {bound:g}x" if compact else f"{sign} {bound}x"


def columns(value: float, t) -> list:
  """The target and verdict cells of a row measured `value` against entry `t`
  (two empty cells where nothing judges the row)."""
  if t is None:
    return ["", ""]
  if not judged(t):
    return [f"({t['reference']})", ""]
  return [wanted(t), verdict(value, t)]
