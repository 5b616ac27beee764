"""SIGINT and SIGTERM during `run(steps=k)`: the loop ends between two steps."""

import json
import os
import queue
import signal
import subprocess
import sys
import threading

import pytest
import tensorflow as tf

import catalogue

# Interrupted in a call of 10**7 steps; prints what a KeyboardInterrupt left.
_SCRIPT = r'''
import json, os, sys, threading, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import replicator
replicator.testing.configure_logical_cpus(2)
import tensorflow as tf


def input_fn(ctx):  # step s takes 2s on replica 0 and 2s + 1 on replica 1
  return tf.data.Dataset.range(10**9).batch(ctx.per_replica_batch_size(2),
                                            drop_remainder=True)


def trainer():
  repl = replicator.MultiGpuReplicator()
  with repl.context():
    counter = tf.Variable(0, dtype=tf.int64)
    last = tf.Variable(-1.0, dtype=tf.float64)

  def step_fn(batch):
    counter.assign_add(1)
    last.assign(tf.cast(repl.all_max(batch)[0], tf.float64))
  return repl, counter, last, step_fn


def announce():  # once the long call's own steps have begun
  while counter.replicas[0].numpy() <= 2:
    time.sleep(0.01)
  print("started", flush=True)


repl, counter, last, step_fn = trainer()
repl.run(step_fn, input_fn, steps=2)  # compiled before the call that is interrupted
threading.Thread(target=announce, daemon=True).start()
try:
  repl.run(step_fn, input_fn, steps=10**7)
  print("finished", flush=True)
except KeyboardInterrupt:
  completed = repl._steps_completed
  report = {"completed": completed, "counter": int(counter.numpy()),
            "last": float(last.numpy()),
            "positions": list(repl.input_positions().values())}
  replicator.Checkpointer(sys.argv[1], counter=counter, last=last).save(step=completed)
  repl.shutdown()
  repl, counter, last, step_fn = trainer()
  replicator.Checkpointer(sys.argv[1], counter=counter, last=last).restore_latest()
  report["restored"] = int(counter.numpy())
  repl.run(step_fn, input_fn, steps=1)
  report["then_counter"], report["then_last"] = int(counter.numpy()), float(last.numpy())
  print(json.dumps(report), flush=True)
'''


def _env_importing_this_checkout():
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  path = os.environ.get("PYTHONPATH")
  return {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else "")}


def _lines(stream, lines: queue.Queue):
  for line in iter(stream.readline, ""):
    lines.put(line)
  lines.put(None)


def _until_started(lines: queue.Queue, worker: str = "") -> list:
  """The lines up to the first that says `{worker}started`."""
  log = []
  while not log or not log[-1].startswith(f"{worker}started"):
    log.append(lines.get(timeout=180))  # a guard against a hang only
    assert log[-1] is not None, "".join(log[:-1])
  return log


def test_ctrl_c_ends_a_long_call_between_steps_with_its_steps_counted(tmp_path):
  script = tmp_path / "interrupted.py"
  script.write_text(_SCRIPT)
  child = subprocess.Popen([sys.executable, str(script), str(tmp_path / "ckpt")],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=_env_importing_this_checkout(),
                           # (as below: Ctrl-C's default, whatever the suite inherited)
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
  lines = queue.Queue()
  threading.Thread(target=_lines, args=(child.stdout, lines), daemon=True).start()
  try:
    log = _until_started(lines)
    child.send_signal(signal.SIGINT)
    code = child.wait(timeout=300)  # a guard against a hang only
  finally:
    if child.poll() is None:
      child.kill()
  log += list(iter(lines.get, None))
  assert code == 0, "".join(log)
  report = json.loads([line for line in log if line.startswith("{")][-1])
  completed = report["completed"]
  assert 2 < completed < 10**7  # the interrupted call ran some of its steps, not all
  assert report["counter"] == completed  # every step counted ran whole, no other
  assert report["last"] == 2 * completed - 1  # and took the batches counted
  assert report["positions"] == [completed]
  assert report["restored"] == completed
  # The restored input goes on after the steps that ran.
  assert report["then_counter"] == completed + 1
  assert report["then_last"] == 2 * completed + 1


class _Stop(Exception):
  pass


# The loop's paths: no input, a static batch size, one compared at run time.
_INPUTS = {
    "no_input": None,
    "static_batch": lambda ctx: tf.data.Dataset.range(10**9).batch(1, drop_remainder=True),
    "batch_compared": lambda ctx: tf.data.Dataset.range(10**9).batch(1),
}


@pytest.mark.parametrize("inputs", sorted(_INPUTS))
def test_a_handler_that_returns_lets_the_call_go_on(inputs):
  """A SIGTERM handler that only takes note runs before the call ends.

  The first signal's handler returns, so `run` goes on with the steps left
  (as Python retries a system call); the second's raises.
  """
  repl = catalogue.make("multi_gpu_2")
  with repl.context():
    counter = tf.Variable(0, dtype=tf.int64)

  def step_fn(*unused_batch):
    counter.assign_add(1)

  input_fn = _INPUTS[inputs]
  repl.run(step_fn, input_fn, steps=2)
  noted = []

  def handler(unused_signum, unused_frame):
    noted.append(repl._steps_completed)  # pylint: disable=protected-access
    if len(noted) == 2:
      raise _Stop()

  done = threading.Event()
  main = threading.main_thread().ident

  def wait_until(condition) -> bool:  # False once the test is over
    while not done.is_set():
      if condition():
        return True
      done.wait(0.01)
    return False

  def steps_beyond(count) -> bool:
    return counter.replicas[0].numpy() > count

  def signal_twice():
    # The first once the call runs its steps, the second once it went on after
    # the first's handler.
    if wait_until(lambda: steps_beyond(2)):
      signal.pthread_kill(main, signal.SIGTERM)
    if wait_until(lambda: noted and steps_beyond(noted[0] + 2)):
      signal.pthread_kill(main, signal.SIGTERM)

  previous = signal.signal(signal.SIGTERM, handler)
  sender = threading.Thread(target=signal_twice)
  try:
    sender.start()
    with pytest.raises(_Stop):
      repl.run(step_fn, input_fn, steps=10**7)
  finally:
    done.set()
    sender.join(timeout=300)
    signal.signal(signal.SIGTERM, previous)
  assert 2 < noted[0] < noted[1]  # the call went on after the first handler
  completed = repl._steps_completed  # pylint: disable=protected-access
  assert completed == noted[1] == counter.numpy()
  if input_fn is not None:
    assert list(repl.input_positions().values()) == [completed]


# On each of two workers: interrupted in a call of 10**7 steps (`with_input` or
# not), saves a checkpoint with the others and prints what it holds.
_WORKER_SCRIPT = r'''
import json, os, sys, threading, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import replicator
import tensorflow as tf

repl = replicator.MultiGpuReplicator()
with repl.context():
  counter = tf.Variable(0, dtype=tf.int64)


def input_fn(ctx):
  return tf.data.Dataset.range(10**9).batch(1, drop_remainder=True)


def step_fn(*unused_batch):
  counter.assign_add(1)


def announce():  # once the long call's own steps have begun
  while counter.replicas[0].numpy() <= 2:
    time.sleep(0.01)
  print("started", os.getpid(), flush=True)


input_fn = input_fn if sys.argv[2] == "with_input" else None
repl.run(step_fn, input_fn, steps=2)
threading.Thread(target=announce, daemon=True).start()
try:
  repl.run(step_fn, input_fn, steps=10**7)
except KeyboardInterrupt:
  completed = repl._steps_completed
  replicator.Checkpointer(sys.argv[1], counter=counter).save(step=completed)
  print("stopped", json.dumps({"completed": completed, "counter": int(counter.numpy()),
                               "positions": list(repl.input_positions().values())}),
        flush=True)
repl.shutdown()
'''


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["with_input", "without_input"])
def test_ctrl_c_to_one_worker_stops_every_worker_at_the_same_step(tmp_path, mode):
  script = tmp_path / "worker.py"
  script.write_text(_WORKER_SCRIPT)
  launcher = subprocess.Popen(
      [sys.executable, "-m", "replicator.launch", "--workers", "2",
       "--devices-per-worker", "1", "--tee", "all", "--", sys.executable, str(script),
       str(tmp_path / "ckpt"), mode],
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
      env=_env_importing_this_checkout(),
      # A suite started in the background of a shell inherits SIGINT ignored,
      # and so would the workers: Ctrl-C's default, as at a terminal.
      preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
  lines = queue.Queue()
  threading.Thread(target=_lines, args=(launcher.stdout, lines), daemon=True).start()
  try:
    log = _until_started(lines, "[worker 1] ")
    os.kill(int(log[-1].split()[-1]), signal.SIGINT)  # to worker 1 alone
    code = launcher.wait(timeout=600)  # a guard against a hang only
  finally:
    if launcher.poll() is None:
      launcher.terminate()  # it stops its workers
      launcher.wait(timeout=30)
  log += list(iter(lines.get, None))
  assert code == 0, "".join(log)
  reports = {line.split()[1]: json.loads(line.split(" ", 3)[3])
             for line in log if line.split()[2:3] == ["stopped"]}
  assert set(reports) == {"0]", "1]"}, "".join(log)
  assert reports["0]"] == reports["1]"]  # every worker stopped at the same step
  completed = reports["0]"]["completed"]
  assert 2 < completed < 10**7 and reports["0]"]["counter"] == completed
  assert reports["0]"]["positions"] == ([completed] if mode == "with_input" else [])
  pointer = json.loads((tmp_path / "ckpt" / "latest.json").read_text())
  assert pointer["step"] == completed
