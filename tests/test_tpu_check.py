"""benchmarks/tpu_check.py, the script a TPU user runs, on its stand-in here."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from benchmarks import tpu_check

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHECKS = ["sonnet_adam", "keras_sgd", "cross_replica_batch_norm", "collectives",
          "input_exhausted", "checkpoint_roundtrip", "replicas_in_sync"]
HANG_GUARD_S = 600  # only to fail a hang: the run takes about 15 s on 2 cores


def test_every_check_passes_on_the_stand_in_with_two_replicas(tmp_path):
  out = tmp_path / "tpu_check.json"
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  run = subprocess.run(
      [sys.executable, "-m", "benchmarks.tpu_check", "--stand_in", "2", "--json", str(out)],
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
