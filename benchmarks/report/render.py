"""Writes benchmarks/RESULTS.md from benchmarks/results/*.json and benchmarks/report/targets.json.

  python -m benchmarks.report.render   # as `python -m benchmarks.report --no-run`

Every figure in RESULTS.md comes from a JSON file under benchmarks/results/,
each written by the command shown next to its table (benchmarks/runs/run_all.py runs
those this machine can); every target and verdict from benchmarks/report/targets.json.
Rendering runs nothing, so RESULTS.md can be rewritten at any time from the
results at hand. RESULTS.md is the tables and how to read them; the commentary
(what the figures say, why a miss is what it is) is NOTES.md, written by hand,
which RESULTS.md links to.
"""

import datetime
import json
import os
import platform

from benchmarks.report import other_sections
from benchmarks.report import sections
from benchmarks.report import targets
from benchmarks.runs import run_all

BENCHMARKS = run_all.BENCHMARKS
RESULTS = run_all.RESULTS

# The sections of results this machine makes (run_all.COMMANDS), in RESULTS.md's order.
_HERE_SECTIONS = (
    ("step_rate", sections.step_rate_section), ("allreduce", sections.allreduce_section),
    ("allreduce_lanes", sections.allreduce_section), ("scaling", sections.scaling_section),
    ("scaling_compute", sections.scaling_section), ("gan_step", sections.gan_section),
    ("checkpoint_roundtrip", other_sections.checkpoint_section),
    ("gather_step", other_sections.gather_section),
    ("first_step", other_sections.first_step_section),
    ("bn_step", other_sections.bn_step_section),
    ("bn_step_per_worker", other_sections.bn_step_section))
# The device machine's (run_all.DEVICE_COMMANDS), each shown where its JSON is.
_DEVICE_SECTIONS = (
    ("step_rate_box", sections.step_rate_section),
    ("allreduce_box", sections.allreduce_section),
    ("allreduce_box_lanes", sections.allreduce_section),
    ("allreduce_box_sizes", sections.allreduce_section),
    ("allreduce_box_grpc", sections.allreduce_section),
    ("step_rate_box_threads", sections.step_rate_section),
    ("scaling_box", sections.scaling_section),
    ("scaling_box_compute", sections.scaling_section),
    ("allreduce_box_default", sections.allreduce_section),
    ("bn_step_per_worker_box", other_sections.bn_step_section),
    ("step_rate_gpu", sections.step_rate_section),
    ("gpu_check", other_sections.gpu_check_section))


def load_results(folder: str = RESULTS) -> dict:
  """{name: the JSON of folder/name.json} for every result there."""
  results = {}
  for entry in sorted(os.listdir(folder)) if os.path.isdir(folder) else ():
    if entry.endswith(".json"):
      with open(os.path.join(folder, entry)) as f:
        results[entry[:-len(".json")]] = json.load(f)
  return results


def _fill(t: dict, **values) -> str:
  """The glance table's row for target `t`: its item and its name filled in."""
  return f"{t['item']}. " + t["name"].format(**values)


def allreduce_rows(name: str, r: dict) -> list:
  """The glance table's all-reduce rows of one result: per worker count and
  target, the first of targets.json's `summary_buckets` the run measured."""
  each = r["ratios (each round)"]
  default = sections.default_buckets()
  rows = []
  for workers in sorted({int(key.split(" ")[0]) for key in each}):
    for t in filter(targets.judged, targets.of("allreduce")):
      for buckets in targets.TARGETS["allreduce"]["summary_buckets"]:
        buckets = default if buckets == "default" else buckets
        key = f"{workers} workers: {t['baseline']} / {t['judged_on'].format(buckets=buckets)}"
        if key in each:
          ratio = targets.median(each[key])
          label = "the default" if buckets == default else buckets
          rows.append([_fill(t, workers=workers, label=label, baseline=t["baseline"]),
                       targets.wanted(t, compact=True), targets.shown(ratio, t),
                       f"{sections.where(r)}, `{name}.json`", targets.verdict(ratio, t)])
          break
  return rows


def _step_rate_rows(name: str, r: dict) -> list:
  rows = []
  for t in targets.of("step_rate"):
    value = r["ratios"].get(t["ratio"])
    if value is None:
      continue
    measured = targets.shown(value, t)
    floor = r["ratios"].get(t.get("floor"))
    if floor:
      measured += (f" (the hand-written 2-replica floor: {value / floor:.2f}x; "
                   f"ours {floor:.2f}x the floor)")
    rows.append([_fill(t), targets.wanted(t), measured,
                 f"{sections.where(r)}, `{name}.json`", targets.verdict(value, t)])
  return rows


def _scaling_rows(name: str, r: dict) -> list:
  workers = targets.TARGETS["scaling"]["workers"]
  if f"ours, {workers} workers" not in r["examples_per_s (best of rounds)"]:
    return []
  rows = []
  for t in targets.of("scaling"):
    value = sections.scaling_figure(r, t["measure"], workers)
    rows.append([_fill(t, workers=workers, batch=r["batch_per_worker"]), targets.wanted(t),
                 targets.shown(value, t), f"{sections.where(r)}, `{name}.json`",
                 targets.verdict(value, t)])
  return rows


def _first_loss_rows(name: str, r: dict) -> list:
  """Per worker count: MWMS's time to the first loss (its build and first call)
  over ours (our first call builds the model)."""
  to_loss = r.get("to_first_loss_s (best of rounds)", {})
  rows = []
  for t in targets.of("bn_step_per_worker"):
    for key in sorted(k for k in to_loss if k.rsplit(", ", 1)[0] == "ours"):
      workers = key.rsplit(", ", 1)[1].split()[0]
      value = to_loss[f"MWMS, {workers} workers"] / to_loss[key]
      rows.append([_fill(t, workers=workers), targets.wanted(t), targets.shown(value, t),
                   f"{sections.where(r)}, `{name}.json`", targets.verdict(value, t)])
  return rows


def _ratio_rows(benchmark: str, name: str, r: dict, each_round: bool = False) -> list:
  """Rows of targets on a ratio the result records: once ("ratios") or per
  round ("ratios (each round)", judged by their median)."""
  rows = []
  for t in filter(targets.judged, targets.of(benchmark)):
    if each_round:
      if t["ratio"] not in r["ratios (each round)"]:
        continue
      value = targets.median(r["ratios (each round)"][t["ratio"]])
    else:
      value = r["ratios"][t["ratio"]]
    rows.append([_fill(t), targets.wanted(t, compact=each_round), targets.shown(value, t),
                 f"{sections.where(r)}, `{name}.json`", targets.verdict(value, t)])
  return rows


def summary_section(results: dict) -> str:
  """Every target of targets.json with the figure that judges it, from `results`
  ({name: JSON}); a target whose results are missing has no row."""
  rows = []
  for benchmark, make in (("step_rate", _step_rate_rows), ("allreduce", allreduce_rows),
                          ("scaling", _scaling_rows),
                          ("gan_step", lambda n, r: _ratio_rows("gan_step", n, r)),
                          ("resnet50", lambda n, r: _ratio_rows("resnet50", n, r, True)),
                          ("bn_step_per_worker", _first_loss_rows)):
    for name in targets.summary(benchmark):
      r = results.get(name)
      if r is not None and r.get("device") != "CPU":  # a CPU check of a GPU benchmark
        rows.extend(make(name, r))
  return "\n\n".join([
      "## Targets at a glance",
      "Each target with the figure that judges it (the median of the rounds where a "
      "result has rounds), the machine and the result file; the tables below have the "
      "commands, and [NOTES.md](NOTES.md) says why each miss is what it is.",
      sections.table(rows, ["target", "wanted", "measured", "where", ""])])


def _how_to_read(separate_run: bool) -> str:
  """The short guide above the tables; `separate_run`: whether a table holds a
  figure from a run of its own (it says so)."""
  return "\n".join([
      "## How to read these tables",
      "",
      "- **Ratios, not times.** Every comparison ran ours and the `tf.distribute` (or "
      "plain) equivalent in the same run, their calls alternating"
      + (", but where a table says otherwise (item 6's bf16 + XLA)" if separate_run else "")
      + ": in one process, or in one job whose worker processes both sides share. Absolute "
      "times on these shared machines are noise; the ratios are the result.",
      "- **Verdicts.** Where a result has rounds, its verdict takes the median of the "
      "rounds' ratios. The targets, and the baseline each divides by, are "
      "`benchmarks/report/targets.json`.",
      "- **Machines.** A table whose heading names no machine ran on the machine above; the "
      "device machine's tables (`benchmarks/DEVICE.md`) name it in their heading.",
      "- **Sources.** Each table starts with the command that made it; its figures are "
      "`benchmarks/results/NAME.json`, named in the glance table.",
      "- **Commentary.** What the figures say, why each miss is what it is and what would "
      "close it, and the speed of the examples on a CPU: [NOTES.md](NOTES.md)."])


def render(results: dict, date: str = None) -> str:
  """RESULTS.md's text from `results` ({name: JSON}); `date`: the day it says
  it was written (today by default)."""
  body = []
  machine = None
  for name, section in _HERE_SECTIONS:
    result = results.get(name)
    if result is None:
      body.append(f"## {name}\n\nNot run yet: `{run_all.COMMANDS[name]}`.")
      continue
    machine = machine or result.get("machine")
    body.append(section(result))
  for name, section in _DEVICE_SECTIONS:
    result = results.get(name)
    if result is not None:  # from the device machine (DEVICE.md)
      body.append(section(result, result.get("command", run_all.DEVICE_COMMANDS[name])).replace(
          "\n\n", f" on {result['machine']}\n\n", 1))
  resnet = results.get("resnet50")
  if resnet is not None and resnet.get("device") != "CPU":
    body.append(sections.resnet50_section(resnet, results.get("resnet50_bf16")))
  else:
    body.append(
        "## 6. ResNet-50 on the H100 (GPU build)\n\nNot run: no device machine was "
        "lent to the sessions that wrote these results. **Needs the GPU box**: "
        f"`{run_all.DEVICE_COMMANDS['resnet50']}` there, as benchmarks/DEVICE.md says.")
  header = (
      "# Benchmark results\n\n"
      f"Machine: {machine or platform.node()}; written "
      f"{date or datetime.date.today().isoformat()} by `python -m benchmarks.report`, "
      "from the results under `benchmarks/results/`.")
  separate_run = any("(separate run)" in section for section in body)
  return "\n\n".join([header, _how_to_read(separate_run), summary_section(results),
                       *body]) + "\n"


def write_report(path: str = os.path.join(BENCHMARKS, "RESULTS.md")) -> str:
  """Rewrites RESULTS.md from the results on disk; returns its path."""
  with open(path, "w") as f:
    f.write(render(load_results()))
  return path


if __name__ == "__main__":
  print(write_report())
