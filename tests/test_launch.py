"""`python -m replicator.launch`: its command line, its output, failures and restarts."""

import os
import signal
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import catalogue
import replicator
from replicator import launch

SCRIPTS = os.path.join(os.path.dirname(__file__), "launch_scripts")
FAKE = os.path.join(SCRIPTS, "fake_worker.py")  # no TensorFlow: starts in a moment
# A training worker that checkpoints, and dies on the job's first attempt when told.
TRAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multiworker", "resume.py")
# As in tests/multiworker: a time limit on a subprocess only guards against a
# hang. A launcher with workers that do not use TensorFlow ends in seconds, a
# training job in a minute alone and several times that on a busy machine.
HANG_S = 600
OPTIONS = ("--workers", "--devices-per-worker", "--host", "--log-dir", "--tee",
           "--max-restarts")


def _launch(*options, command=(), script=FAKE):
  """Runs the launcher's command line; returns (exit code, stdout, stderr)."""
  done = subprocess.run(
      [sys.executable, "-m", "replicator.launch", *options, "--", sys.executable, script,
       *command], capture_output=True, text=True, timeout=HANG_S)
  return done.returncode, done.stdout, done.stderr


def _in_order(text, *parts):
  """Asserts that each of `parts` is in `text`, each after the one before."""
  at = 0
  for part in parts:
    found = text.find(part, at)
    assert found >= 0, f"{part!r} not found after position {at} in:\n{text}"
    at = found + len(part)


def test_help_lists_every_option_and_exits_0():
  done = subprocess.run([sys.executable, "-m", "replicator.launch", "--help"],
                        capture_output=True, text=True, timeout=HANG_S)
  assert done.returncode == 0, done.stderr
  assert done.stdout.startswith("usage: python -m replicator.launch --workers N"), done.stdout
  lines = done.stdout.splitlines()
  for option in OPTIONS:  # each listed, with a help text
    listed = [i for i, line in enumerate(lines) if line.strip().startswith(option)]
    assert listed, (option, done.stdout)
    described = lines[listed[0]].strip()[len(option):].split(maxsplit=1)
    assert len(described) > 1 or lines[listed[0] + 1].startswith(" " * 8), (option, done.stdout)
  words = " ".join(done.stdout.split())  # as argparse wraps them
  assert "REPLICATOR_RESTART_COUNT" in words
  assert "TensorFlow's server still listens on every interface of its port" in words


def test_main_is_the_console_scripts_entry_point(monkeypatch, capsys, tmp_path):
  monkeypatch.setattr(sys, "argv", ["/usr/local/bin/replicator-launch"])
  assert launch.main(["--help"]) == 0
  assert capsys.readouterr().out.startswith("usage: replicator-launch --workers N")
  code = launch.main(["--workers", "1", "--", sys.executable, FAKE])
  assert code == 0 and isinstance(code, int)
  assert "[worker 0] worker 0 attempt 0 line 0" in capsys.readouterr().out


@pytest.mark.parametrize("argv, error", [
    ([], "error: give --workers and the worker command after `--`, e.g. "
         "`python -m replicator.launch --workers 2 -- python train.py`."),
    (["--workers", "2"], "error: command: give the worker command after `--`"),
    (["--workers", "2", "--"], "error: command: give the worker command after `--`"),
    (["--workers", "2", "python", "train.py"],
     "error: command: put the worker command after `--`; got 'python train.py' without it"),
    (["--", "python", "train.py"], "error: --workers: required"),
    (["--workers", "2", "--tee", "some", "--", "true"], "argument --tee: invalid choice"),
    (["--workers", "2", "--wrkers", "2", "--", "true"], "unrecognized arguments: --wrkers 2"),
])
def test_a_missing_command_or_option_prints_the_usage_and_an_error(capsys, argv, error):
  assert launch.main(argv) == 2
  captured = capsys.readouterr()
  assert captured.err.startswith("usage: python -m replicator.launch --workers N [options] "
                                 "-- COMMAND"), captured.err
  assert error in captured.err, captured.err
  assert not captured.out  # neither the docstring nor a worker


@pytest.mark.parametrize("options, error", [
    (["--workers", "2", "--max-restarts", "-1"], "--max-restarts: must be >= 0, got -1."),
    (["--workers", "2", "--devices-per-worker", "0"],
     "--devices-per-worker: must be >= 1, got 0;"),
    (["--workers", "2", "--host", "203.0.113.7"], "--host: cannot take a port on "
     "'203.0.113.7'"),
])
def test_a_value_out_of_range_is_one_line_naming_the_option(capsys, options, error):
  assert launch.main([*options, "--", sys.executable, FAKE]) == 2
  err = capsys.readouterr().err
  assert err.startswith(f"python -m replicator.launch: error: {error}"), err
  assert err.count("\n") == 1, err


def test_the_terminal_shows_the_chiefs_lines_or_with_tee_all_every_workers():
  code, out, _ = _launch("--workers", "2", command=["--lines", "2"])
  assert code == 0, out
  assert out.startswith("[launch] showing worker 0's lines (--tee all shows every "
                        "worker's).\n"), out
  _in_order(out, "[worker 0] worker 0 attempt 0 line 0\n", "[worker 0] worker 0 attempt 0 line 1\n")
  assert "worker 1" not in out, out

  code, out, _ = _launch("--workers", "2", "--tee", "all", command=["--lines", "2"])
  assert code == 0, out
  for w in range(2):
    _in_order(out, f"[worker {w}] worker {w} attempt 0 line 0\n",
              f"[worker {w}] worker {w} attempt 0 line 1\n")
  assert "[launch]" not in out, out


def test_log_dir_keeps_each_workers_own_lines_in_its_file(tmp_path):
  logs = tmp_path / "logs"
  logs.mkdir()
  (logs / "worker_1.log").write_text("an earlier job's line\n")  # replaced
  code, out, _ = _launch("--workers", "3", "--log-dir", str(logs), command=["--lines", "3"])
  assert code == 0, out
  assert sorted(os.listdir(logs)) == ["worker_0.log", "worker_1.log", "worker_2.log"]
  for w in range(3):  # unprefixed, and only its own
    assert (logs / f"worker_{w}.log").read_text() == "".join(
        f"worker {w} attempt 0 line {k}\n" for k in range(3))
  assert f"each worker's lines are in {logs}/worker_<i>.log" in out, out
  assert "[worker 0] worker 0 attempt 0 line 2" in out and "worker 1" not in out, out


@pytest.mark.parametrize("log_dir", [False, True])
def test_a_failed_workers_last_lines_reach_the_terminal_after_its_failure(tmp_path, log_dir):
  logs = ["--log-dir", str(tmp_path)] if log_dir else []
  code, out, _ = _launch("--workers", "2", *logs,
                         command=["--lines", "30", "--fail_worker", "1", "--code", "3"])
  assert code == 3, out
  where = f"; all of them are in {tmp_path}/worker_1.log" if log_dir else ""
  _in_order(out, "[launch] worker 1 exited with code 3; stopping the others.\n",
            f"[launch] the last 20 line(s) worker 1 printed{where}:\n",
            *[f"[worker 1] worker 1 attempt 0 line {k}\n" for k in range(10, 30)])
  for k in range(10):  # only the last 20 lines
    assert f"worker 1 attempt 0 line {k}\n" not in out, out
  if log_dir:
    assert (tmp_path / "worker_1.log").read_text().count("\n") == 30


def test_without_restarts_a_failure_ends_the_job_with_the_workers_code(tmp_path):
  code, out, _ = _launch("--workers", "2", "--max-restarts", "0", command=[
      "--fail_worker", "1", "--code", "5", "--record", str(tmp_path)])
  assert code == 5, out
  assert "[launch] worker 1 exited with code 5; stopping the others.\n" in out, out
  assert "restart" not in out, out
  assert sorted(os.listdir(tmp_path)) == ["attempt0_worker0", "attempt0_worker1"]


def test_a_killed_worker_restarts_the_job_which_then_succeeds(tmp_path):
  logs, record = tmp_path / "logs", tmp_path / "record"
  record.mkdir()
  code, out, _ = _launch(
      "--workers", "2", "--max-restarts", "1", "--log-dir", str(logs),
      command=["--fail_worker", "1", "--fail_attempts", "0", "--code", "-9",
               "--record", str(record)])
  assert code == 0, out
  reason = "worker 1 exited with code -9 (killed by SIGKILL)"
  # The launcher's line comes as soon as it sees the failure, worker 1's last
  # lines once every worker's output is read, then the next attempt's.
  _in_order(out, f"[launch] {reason}; restarting the job (restart 1 of 1)\n",
            "[worker 1] worker 1 attempt 0 line 0\n", "[worker 0] worker 0 attempt 1 line 0\n")
  _in_order(out, "[worker 0] worker 0 attempt 0 line 0\n", "[worker 1] worker 1 attempt 0 line 0\n")
  assert "stopping the others" not in out and "restart 2" not in out, out
  assert sorted(os.listdir(record)) == [f"attempt{a}_worker{w}" for a in (0, 1) for w in (0, 1)]
  for w in range(2):  # each attempt appended, after a line naming it
    assert (logs / f"worker_{w}.log").read_text() == (
        f"worker {w} attempt 0 line 0\n"
        f"[launch] ---- restart 1 of 1 (REPLICATOR_RESTART_COUNT=1) after {reason} ----\n"
        f"worker {w} attempt 1 line 0\n")


def test_when_the_restarts_run_out_the_launcher_exits_with_the_last_failures_code(tmp_path):
  code, out, _ = _launch("--workers", "2", "--max-restarts", "2", "--tee", "all", command=[
      "--fail_worker", "1", "--code", "4", "--record", str(tmp_path)])
  assert code == 4, out
  restarted = [f"[launch] worker 1 exited with code 4; restarting the job (restart {r} of 2)\n"
               for r in (1, 2)]
  _in_order(out, *restarted, "[launch] worker 1 exited with code 4; stopping the others "
            "(restarts used: 2 of 2).\n")
  _in_order(out, *[f"[worker 1] worker 1 attempt {a} line 0\n" for a in range(3)])
  for r in (1, 2):  # an attempt starts after the restart's line
    _in_order(out, restarted[r - 1], f"[worker 0] worker 0 attempt {r} line 0\n")
  assert len(os.listdir(tmp_path)) == 6  # 3 attempts of 2 workers


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_to_the_launcher_stops_the_workers_and_never_restarts(signum):
  launcher = subprocess.Popen(
      [sys.executable, "-m", "replicator.launch", "--workers", "2", "--tee", "all",
       "--max-restarts", "3", "--", sys.executable, FAKE, "--hold"],
      stdout=subprocess.PIPE, text=True,
      # SIGINT raises KeyboardInterrupt, even where this test runs with it ignored.
      preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
  try:
    lines = []
    while len([l for l in lines if " pid " in l]) < 2:
      lines.append(launcher.stdout.readline())
      assert lines[-1], lines  # the launcher ended early
    launcher.send_signal(signum)
    rest, _ = launcher.communicate(timeout=HANG_S)
  finally:
    launcher.kill()
    launcher.wait()
  assert launcher.returncode == 128 + signum, lines + [rest]
  assert "restart" not in rest, rest
  assert "; stopping the workers." in rest, rest
  for line in lines:  # the workers are gone (and reaped by the launcher)
    if " pid " in line:
      with pytest.raises(ProcessLookupError):
        os.kill(int(line.split()[-1]), 0)


def test_launcher_exits_with_the_failing_workers_code_and_stops_the_others(tmp_path):
  script = tmp_path / "fail.py"
  started = tmp_path / "worker0.pid"
  script.write_text(  # worker 1 fails once worker 0 runs (and would sleep an hour)
      "import json, os, pathlib, sys, time\n"
      "index = json.loads(os.environ['TF_CONFIG'])['task']['index']\n"
      "print('hello from', index, flush=True)\n"
      "if index == 1:\n"
      f"    while not os.path.exists({str(started)!r}):\n"
      "        time.sleep(0.05)\n"
      "    sys.exit(3)\n"
      f"pathlib.Path({str(started) + '.tmp'!r}).write_text(str(os.getpid()))\n"
      f"os.rename({str(started) + '.tmp'!r}, {str(started)!r})\n"
      "time.sleep(3600)\n")
  done = subprocess.run(
      [sys.executable, "-m", "replicator.launch", "--workers", "2", "--tee", "all", "--",
       sys.executable, str(script)], capture_output=True, text=True, timeout=HANG_S)
  assert done.returncode == 3
  assert "[worker 1] hello from 1" in done.stdout
  assert "worker 1 exited with code 3" in done.stdout
  with pytest.raises(ProcessLookupError):  # worker 0 stopped (and reaped) by the launcher
    os.kill(int(started.read_text()), 0)


def test_launcher_stops_its_workers_on_sigterm_and_refuses_bad_arguments(tmp_path, capsys):
  script = tmp_path / "sleep.py"
  script.write_text(
      "import json, os, time\n"
      "index = json.loads(os.environ['TF_CONFIG'])['task']['index']\n"
      "print('pid', os.getpid(), flush=True)\n"
      "time.sleep(3600)\n")
  launcher = subprocess.Popen(
      [sys.executable, "-m", "replicator.launch", "--workers", "2", "--tee", "all", "--",
       sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
  pids = [int(launcher.stdout.readline().split()[-1]) for _ in range(2)]
  launcher.send_signal(signal.SIGTERM)
  assert launcher.wait(timeout=HANG_S) == 128 + signal.SIGTERM
  for pid in pids:  # the workers are gone (and reaped by the launcher)
    with pytest.raises(ProcessLookupError):
      os.kill(pid, 0)
  for args in (["--workers", "0", "--", "true"],
               ["--workers", "1", "--", str(tmp_path / "no_such_command")]):
    assert launch.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m replicator.launch: error: "), err
    assert err.count("\n") == 1, err
    assert "--workers: must be >= 1" in err or "no_such_command" in err, err


@pytest.mark.slow
def test_a_job_restarted_after_a_kill_ends_like_an_uninterrupted_one_and_restores_anywhere(
    tmp_path):
  """2 workers of 2 devices train with a checkpoint every 2 steps; worker 1
  kills itself at step 3 of the first attempt; the job restarts, resumes from
  step 2, and ends with the variables and Adam slots of a run that was never
  interrupted. That run's 2 x 2 checkpoint restores on 1 x 1 and 1 x 4."""
  options = ("--workers", "2", "--devices-per-worker", "2", "--max-restarts", "1")
  for run in ("straight", "restarted"):
    (tmp_path / run).mkdir()
  code, out, err = _launch(*options, script=TRAIN, command=[
      "--out", str(tmp_path / "straight"), "--ckpt", str(tmp_path / "ckpt_straight"),
      "--steps", "6"])
  assert code == 0, out + err
  assert "restart" not in out and "attempt 1" not in out, out
  _in_order(out, "[worker 0] attempt 0: starting at step 0\n", "[worker 0] attempt 0: done\n")

  code, out, err = _launch(*options, "--log-dir", str(tmp_path / "logs"), script=TRAIN,
                           command=["--out", str(tmp_path / "restarted"),
                                    "--ckpt", str(tmp_path / "ckpt"), "--die_at", "3",
                                    "--steps", "6"])
  assert code == 0, out + err
  reason = "worker 1 exited with code -9 (killed by SIGKILL)"
  _in_order(out, f"[launch] {reason}; restarting the job (restart 1 of 1)\n",
            "[worker 1] attempt 0: worker 1 kills itself at step 3\n",  # its last lines
            "[worker 0] attempt 1: starting at step 2\n",  # the checkpoint of step 2
            "[worker 0] attempt 1: done\n")
  _in_order(out, "[worker 0] attempt 0: starting at step 0\n",
            "[worker 1] attempt 0: worker 1 kills itself at step 3\n")
  _in_order((tmp_path / "logs" / "worker_1.log").read_text(),
            "attempt 0: starting at step 0\n", "attempt 0: worker 1 kills itself at step 3\n",
            f"[launch] ---- restart 1 of 1 (REPLICATOR_RESTART_COUNT=1) after {reason} ----\n",
            "attempt 1: starting at step 2\n", "attempt 1: done\n")

  straight = dict(np.load(tmp_path / "straight" / "worker0.npz"))  # the chief's
  restarted = dict(np.load(tmp_path / "restarted" / "worker0.npz"))
  assert sorted(restarted) == sorted(straight) and len(straight) > 4
  for key, want in straight.items():
    np.testing.assert_allclose(restarted[key], want, rtol=0, atol=1e-6, err_msg=key)

  # The 2 x 2 checkpoint restores on 1 x 1 and 1 x 4: identical variables and slots.
  for name in ("gpu", "multi_gpu_4"):
    repl = catalogue.make(name)
    with repl.context():
      model = catalogue.mlp()
      optimizer = repl.wrap_optimizer(keras.optimizers.Adam(1e-2))
    checkpointer = replicator.Checkpointer(tmp_path / "ckpt_straight", model=model,
                                           optimizer=optimizer.optimizer)
    assert checkpointer.restore_latest() == 6
    repl.run(lambda x: model(x), args=(tf.zeros([2, 8]),))  # pylint: disable=cell-var-from-loop
    with repl.context():
      optimizer.optimizer.build(model.trainable_variables)
    checkpointer.restore_latest()  # slots made after the first restore
    state = list(model.variables) + list(optimizer.optimizer.variables)
    assert len(state) == len(straight)
    for i, variable in enumerate(state):
      replicated = getattr(variable, "replicas", None) or variable.value.replicas
      for copy in replicated:
        np.testing.assert_array_equal(copy.numpy(), straight[f"s{i}"])
    repl.shutdown()
