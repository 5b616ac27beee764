"""benchmarks/checks/tpu_check.py, the script a TPU user runs, on its stand-in here."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from benchmarks.checks import tpu_check

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHECKS = ["sonnet_adam", "keras_sgd", "cross_replica_batch_norm", "collectives",
          "input_exhausted", "checkpoint_roundtrip", "replicas_in_sync"]
HANG_GUARD_S = 600  # only to fail a hang: the run takes about 15 s on 2 cores


def test_every_check_passes_on_the_stand_in_with_two_replicas(tmp_path):
  out = tmp_path / "tpu_check.json"
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  run = subprocess.run(
      [sys.executable, "-m", "benchmarks.checks.tpu_check", "--stand_in", "2", "--json", str(out)],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S)
  printed = run.stdout + run.stderr
  assert out.exists(), printed[-4000:]
  report = json.loads(out.read_text())
  results = {r["check"]: r for r in report["results"]}
  assert list(results) == CHECKS, printed[-4000:]
  failed = {name: r["detail"] for name, r in results.items() if not r["ok"]}
  assert not failed, f"{failed}\n{printed[-4000:]}"
  assert run.returncode == 0, printed[-4000:]
  assert report["passed"] == report["total"] == len(CHECKS)
  assert "TpuReplicator(num_replicas=2" in report["replicator"]
  for name in CHECKS:  # one PASS line each, with its largest error
    assert f"PASS {name}: largest error " in run.stdout
  assert f"{len(CHECKS)}/{len(CHECKS)} checks passed" in run.stdout.splitlines()[-1]


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5"])
def test_a_bad_stand_in_count_is_an_argparse_error_naming_the_flag(value, capsys):
  with pytest.raises(SystemExit) as exit_:
    tpu_check.parse_args(["--stand_in", value])
  assert exit_.value.code == 2
  error = capsys.readouterr().err
  assert "argument --stand_in" in error and repr(value) in error


def test_tpu_and_stand_in_together_is_an_argparse_error(capsys):
  with pytest.raises(SystemExit) as exit_:
    tpu_check.parse_args(["--tpu", "my-tpu", "--stand_in", "2"])
  assert exit_.value.code == 2
  assert "--stand_in" in capsys.readouterr().err


# --fake_tpu: every check traced on TensorFlow's TPUStrategy over a fake TPU of
# 8 cores, in this process (the checks' functions, as main runs them).

# What each check runs on the TPU replicator (their `steps`) and the shape of
# what one replica returns from the last, as the check's code defines them.
_SCALAR = [{"path": "", "shape": [], "dtype": "float32"}]
_TRACED_RUNS = {
    "sonnet_adam": ([1, 2], _SCALAR),
    "keras_sgd": ([1, 2], _SCALAR),
    "cross_replica_batch_norm": (
        [1, 2], [{"path": "", "shape": [tpu_check.PER_REPLICA_BATCH, 4, 4, 3],
                  "dtype": "float32"}]),
    "collectives": ([1], None),  # NumPy's, below
    "input_exhausted": ([5], _SCALAR),
    # 2 steps, the step after the save, the step that makes the restored model
    "checkpoint_roundtrip": ([2, 1, 1], _SCALAR),
    "replicas_in_sync": ([2], _SCALAR),
}


def _collectives_per_replica():
  """What one replica returns in `collectives`: NumPy's shapes of its nests."""
  n = tpu_check.FAKE_TPU_CORES
  f, more = np.zeros([2, 3], np.float32), np.zeros([5], np.float32)
  i, b = np.zeros([4], np.int32), np.zeros([6], bool)
  nests = {"replica_id": np.int32(0), "all_sum": {"f": f, "i": i},
           "all_mean": (f, [more]), "all_max": {"f": f, "i": i, "b": b},
           "all_min": {"f": f, "i": i, "b": b},
           "all_gather": {"f": np.zeros([2 * n, 3], np.float32),
                          "i": np.zeros([4 * n], np.int32)},
           "broadcast": {"f": f, "i": i}}
  return tpu_check.describe(nests)


@pytest.fixture(scope="module")
def fake_tpu_setting(tmp_path_factory):
  import replicator  # pylint: disable=import-outside-toplevel
  repl = replicator.testing.tpu_engine_on_fake_tpu(tpu_check.FAKE_TPU_CORES)
  setting = tpu_check.Setting(repl, on_tpu=False, trace_only=True,
                              workdir=str(tmp_path_factory.mktemp("tpu_check")))
  yield setting
  setting.repl.shutdown()


@pytest.mark.parametrize("name", CHECKS)
def test_each_check_traces_on_the_fake_tpu(name, fake_tpu_setting, capsys):
  result = tpu_check.run_check(name, tpu_check.FUNCTIONS[name], fake_tpu_setting)
  printed = capsys.readouterr().out
  assert result["ok"], result["detail"]
  assert printed.startswith(f"TRACED {name}: traced run(steps="), printed
  assert "skipped: " in result["detail"]  # it says what a trace cannot check
  steps, per_replica = _TRACED_RUNS[name]
  if per_replica is None:
    per_replica = _collectives_per_replica()
  runs = result["traced"]["runs"]
  assert [run["steps"] for run in runs] == steps
  n = tpu_check.FAKE_TPU_CORES
  stacked = [dict(leaf, shape=[n] + leaf["shape"]) for leaf in per_replica]
  for run in runs:
    assert run["outputs"] == stacked
  ops = result["traced"]["loop_ops"]
  # One TPU computation per traced loop, its collectives as cross-replica sums.
  assert ops["TPUReplicateMetadata"] == ops["While"] >= 1
  assert ops["CrossReplicaSum"] >= 1
  json.dumps(result)  # main writes it as it is


def test_fake_tpu_main_says_traced_in_its_lines_and_json(tmp_path, monkeypatch, capsys):
  monkeypatch.setattr(tpu_check, "CHECKS", ("collectives",))
  monkeypatch.setattr(tpu_check, "RESULTS", [])
  out = tmp_path / "fake.json"
  assert tpu_check.main(["--fake_tpu", "--json", str(out)]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert "fake TPU" in lines[0] and "traced, not run" in lines[0]
  assert lines[-2].startswith("TRACED collectives: ")
  assert lines[-1].startswith("1/1 checks traced")
  report = json.loads(out.read_text())
  assert report["traced_only"] is True and report["passed"] == report["total"] == 1
  assert "TpuReplicator(num_replicas=8" in report["replicator"]
  [result] = report["results"]
  assert result["traced"]["runs"][0]["outputs"] == [
      dict(leaf, shape=[8] + leaf["shape"]) for leaf in _collectives_per_replica()]


@pytest.mark.parametrize("other", [["--stand_in", "2"], ["--tpu", "my-tpu"]])
def test_fake_tpu_with_another_target_is_an_argparse_error(other, capsys):
  with pytest.raises(SystemExit) as exit_:
    tpu_check.parse_args(["--fake_tpu", *other])
  assert exit_.value.code == 2
  assert "--fake_tpu" in capsys.readouterr().err
