"""The benchmarks' own arithmetic: what the report's verdicts rest on.

The rendered markdown is read as tables (header and cells), and its figures and
verdicts are checked against the JSON they come from and benchmarks/report/targets.json,
not against the wording around them.
"""

import itertools
import pathlib
import re
import subprocess
import sys

import pytest

from benchmarks.report import render
from benchmarks.report import sections
from benchmarks.report import targets
from benchmarks.runs import scaling

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _tables(markdown):
  """Each table of `markdown` as (header, rows), a row as its list of cells."""
  lines = markdown.splitlines()
  tables = []
  for i, line in enumerate(lines):
    if line.startswith("|") and (i == 0 or not lines[i - 1].startswith("|")):
      block = itertools.takewhile(lambda x: x.startswith("|"), lines[i:])
      cells = [[c.strip() for c in row.strip().strip("|").split("|")] for row in block]
      tables.append((cells[0], cells[2:]))
  return tables


def _verdict(cell):
  """A verdict cell without its emphasis: "met", "missed" or ""."""
  return cell.strip("*")


def _expected(value, t):
  return "met" if targets.met(value, t) else "missed"


def _scaling_target(measure):
  return next(t for t in targets.of("scaling") if t["measure"] == measure)


def _scaling_result(ours8, mwms8, rounds=((1.0,),)):
  best = {"ours, 1 workers": 1000.0, "MWMS, 1 workers": 1010.0,
          "ours, 8 workers": ours8, "MWMS, 8 workers": mwms8}
  each = [dict(best, **{"ours, 8 workers": ours8 * f}) for f in rounds[0]]
  return {"machine": "box (16 cores, test CPU)", "batch_per_worker": 5120, "pack_mb": None,
          "examples_per_s (best of rounds)": best,
          "ours / MWMS (each round)": {
              "1 workers": [1000.0 / 1010.0] * len(each),
              "8 workers": [r["ours, 8 workers"] / mwms8 for r in each]}}


def test_scaling_efficiency_is_total_examples_over_one_worker_on_the_same_cores():
  """8 workers with 2 of the 16 cores each: the ideal total is the 1-worker
  figure, not 8 times it (the scaling target's efficiency)."""
  got = scaling.efficiency(_scaling_result(960.0, 900.0)["examples_per_s (best of rounds)"])
  assert got == pytest.approx({"ours, 1 workers": 1.0, "MWMS, 1 workers": 1.01,
                               "ours, 8 workers": 0.96, "MWMS, 8 workers": 0.9})


@pytest.mark.parametrize("efficiency_met,versus_met", [
    (True, True), (False, True), (True, False)])
def test_scaling_report_judges_8_workers_against_the_target(efficiency_met, versus_met):
  """Each figure just either side of its target in targets.json."""
  assert targets.TARGETS["scaling"]["workers"] == 8  # as _scaling_result has them
  efficiency, versus = _scaling_target("efficiency"), _scaling_target("ours / MWMS")
  ours8 = 1000.0 * (efficiency["at_least"] + (0.01 if efficiency_met else -0.01))
  mwms8 = ours8 / (versus["at_least"] + (0.02 if versus_met else -0.02))
  text = sections.scaling_section(_scaling_result(ours8, mwms8), command="cmd")
  (_, rows), = [(h, rows) for h, rows in _tables(text) if h[:2] == ["target", "measured"]]
  assert [_verdict(row[3]) for row in rows] == [
      "met" if efficiency_met else "missed", "met" if versus_met else "missed"]
  assert [row[1] for row in rows] == [f"{ours8 / 10:.0f}%", f"{ours8 / mwms8:.2f}x"]
  assert [row[2] for row in rows] == [targets.wanted(efficiency), targets.wanted(versus)]
  heading = text.splitlines()[0]
  assert heading.startswith("## ")
  numbers = re.findall(r"\d+(?:\.\d+)?", heading)
  assert "5120" in numbers and f"{scaling.resnet50_images(5120):.1f}" in numbers


def test_resnet50_equivalent_batch():
  """An MLP example: 3 multiply-adds a parameter; a ResNet-50 image: 12.3 G
  over 25.56 M parameters."""
  assert scaling.resnet50_images(481) == pytest.approx(3.0, rel=1e-3)


def test_a_step_rate_row_carries_the_ratio_of_its_json_and_the_files_target():
  ratios = {"MirroredStrategy / replicator, 1 step/call": 1.234,
            "replicator 1 step/call / hand-written in-graph 1 step/call": 1.087,
            "replicator 50 steps/call / plain 50-step loop": 1.0456,
            "replicator 50 steps/call / hand-written in-graph 50-step loop": 0.987,
            "replicator 1 replica 50 steps/call / plain 50-step loop": 1.3,
            "replicator 1 step/call / replicator 50 steps/call": 3.21}
  result = {"replicas": 2, "ratios": ratios,
            "ms_per_step (best of rounds)": {"replicator, 1 step/call": 0.5}}
  (header, rows), = [t for t in _tables(sections.step_rate_section(result, command="cmd"))
                     if t[0][:2] == ["ratio", "measured"]]
  assert len(rows) == len(ratios)
  for key, value in ratios.items():
    row, = [row for row in rows if row[1] == f"{value:.2f}x"]
    t = targets.by_ratio("step_rate", key)
    if t is None:
      assert row[2:] == ["", ""]
    else:
      assert row[2:] == [targets.wanted(t), targets.verdict(value, t)]
      assert _verdict(row[3]) == _expected(value, t)
  # Every step rate target of the file is judged in the table.
  assert {row[2] for row in rows if row[3]} == {
      targets.wanted(t) for t in targets.of("step_rate")}


def test_the_glance_table_has_every_target_of_the_targets_file():
  """From the committed results: each target of targets.json has a row, and
  each row's verdict is its measured figure against its target."""
  (header, rows), = _tables(render.summary_section(render.load_results()))
  assert header == ["target", "wanted", "measured", "where", ""]
  for benchmark in ("step_rate", "allreduce", "scaling", "gan_step", "resnet50",
                    "bn_step_per_worker"):
    for t in filter(targets.judged, targets.of(benchmark)):
      name = re.escape(f"{t['item']}. {t['name']}")
      pattern = re.sub(r"\\\{\w+\\\}", ".+", name)
      mine = [row for row in rows if re.fullmatch(pattern, row[0])]
      assert mine, f"no row for {t}"
      for row in mine:
        assert row[1] in (targets.wanted(t), targets.wanted(t, compact=True))
        figure = float(re.match(r"[\d.]+", row[2]).group())
        value = figure / 100 if t.get("unit") == "%" else figure
        assert _verdict(row[4]) == _expected(value, t), row
        assert row[3].endswith(".json`")


def test_a_figure_is_shown_with_the_digits_its_verdict_needs():
  """Two decimals, or a percent without any, unless rounding would cross the
  target: 0.99502x is not met by ">= 1.0x", so it never shows as 1.00x."""
  at_least_1 = {"at_least": 1.0}
  assert targets.shown(1.08, at_least_1) == "1.08x"
  assert targets.shown(0.99502, at_least_1) == "0.995x"
  assert targets.shown(0.99999, at_least_1) == "0.99999x"
  assert targets.shown(1.0, at_least_1) == "1.00x"
  assert targets.shown(1.004, {"at_most": 1.0}) == "1.004x"
  assert targets.shown(0.9496, {"at_least": 0.95, "unit": "%"}) == "94.96%"
  assert targets.shown(0.97, {"at_least": 0.95, "unit": "%"}) == "97%"
  assert targets.shown(0.99502, {}) == "1.00x"  # a reference, never judged


def test_results_md_is_what_render_writes_from_the_results():
  """RESULTS.md is current: `python -m benchmarks.report --no-run` would write
  it again as it is but for the day."""
  committed = (ROOT / "benchmarks" / "RESULTS.md").read_text()
  date = re.search(r"written (\d{4}-\d{2}-\d{2}) by", committed).group(1)
  rendered = render.render(render.load_results(), date=date)
  assert rendered == committed, "run python -m benchmarks.report --no-run"


def test_a_separate_bf16_run_is_judged_by_the_bf16_target():
  keras = {"Keras fp32": 800.0}
  result = {"device": "GPU", "batch": 8, "image_size": 32, "machine": "m",
            "tensorflow": "2", "command": "cmd",
            "images_per_second (best of rounds)": {"GpuReplicator fp32": 900.0, **keras},
            "images_per_second (each round)": [{"GpuReplicator fp32": 900.0, **keras}],
            "ratios (best of rounds)": {"GpuReplicator fp32 / Keras fp32": 1.125},
            "ratios (each round)": {"GpuReplicator fp32 / Keras fp32": [1.125]}}
  name = "GpuReplicator bf16 + XLA"
  bf16 = {"command": "cmd2", "images_per_second (best of rounds)": {name: 1000.0},
          "images_per_second (each round)": [{name: 1000.0}, {name: 960.0}]}
  (_, rows), = [t for t in _tables(sections.resnet50_section(result, bf16))
                if t[0][0] == "ratio"]
  t = targets.by_ratio("resnet50", f"{name} / Keras fp32")
  row, = [row for row in rows if row[0].startswith(name)]
  assert row[1:4] == ["1.25x", "1.20x - 1.25x", targets.wanted(t)]
  assert _verdict(row[4].split(" (")[0]) == _expected(1.25, t)


def test_the_device_machines_gpu_checks_pass_on_two_logical_cpus():
  """benchmarks/checks/gpu_check.py runs only where a GPU is lent; `--cpu` runs
  its checks (training against one-device oracles, merges at the step's end,
  a bfloat16 sum) here, so the script is known to work before device time is
  spent on it. Its own process: it splits the CPU before TensorFlow starts."""
  done = subprocess.run([sys.executable, "-m", "benchmarks.checks.gpu_check", "--cpu"],
                        cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0 and "failed: none" in done.stdout, (
      done.stdout[-3000:] + done.stderr[-3000:])
  assert done.stdout.count("PASS ") == 8, done.stdout


def test_the_summary_judges_the_default_buckets_by_the_median_of_the_rounds():
  result = {"machine": "box (16 cores, cpu)", "ratios (each round)": {
      "8 workers: best MWMS fp32 / ours bf16, 8MB buckets, 4 in flight": [2.0, 2.0],
      "8 workers: best MWMS fp32 / ours bf16, 16MB buckets, 2 in flight": [1.7, 1.9, 1.75],
      "8 workers: MWMS packed / ours fp32, 8MB buckets, 4 in flight": [0.9, 1.2],
  }}
  rows = render.allreduce_rows("allreduce_box", result)
  assert [row[0].split(":")[0] for row in rows] == [
      "3. all-reduce, fp32, 8 workers (8MB buckets, 4 in flight)",  # no default there
      "3. all-reduce, bf16, 8 workers (the default)"]
  assert [row[2] for row in rows] == ["1.20x", "1.75x"]
  assert [row[4] for row in rows] == ["met", "**missed**"]
  assert rows[1][3] == "16-core box, `allreduce_box.json`"
