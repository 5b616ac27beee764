"""A worker of the failure tests: the last worker dies (or freezes) at step 5.

With `--how kill_before_first_run` (`freeze_before_first_run`) it dies
(freezes) before the first step, when the variable made eagerly in the context
is yet to get the chief's value. With `--stall_s S` (and `--pids DIR`, where
each worker writes its pid), it first stops worker 1 (SIGSTOP) for S seconds,
as a machine's load may hold a survivor back, while worker 0 reports the loss
and leaves.

A survivor prints `LOST <seconds> <message>` when it raises WorkerLost, with the
seconds that run() took, after `STALL <seconds>`: the longest that a thread
ticking every 10 ms waited for its next tick meanwhile (how long the process's
Python stood still, the heartbeat's checks included). Worker 0 may see the loss
in step 5 or, when worker 1 finished its half of step 4's all-reduce and died
before worker 0 fetched its last chunk, in step 4.
"""

import argparse
import os
import signal
import subprocess
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # pylint: disable=g-import-not-at-top

import replicator


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--how", default="kill", choices=[
      "kill", "freeze", "kill_before_first_run", "freeze_before_first_run"])
  parser.add_argument("--timeout_s", type=float, default=10.0)
  parser.add_argument("--stall_s", type=float, default=0.0)
  parser.add_argument("--pids", default=None)
  args = parser.parse_args()
  repl = replicator.MultiGpuReplicator(
      all_reduce=replicator.AllReduceOptions(timeout_s=args.timeout_s))
  if args.pids:
    mine = os.path.join(args.pids, str(repl.mesh.worker_index))
    with open(mine + ".tmp", "w") as f:
      f.write(str(os.getpid()))
    os.rename(mine + ".tmp", mine)
  with repl.context():
    w = tf.Variable(tf.zeros([4]))

  def step_fn():
    w.assign_add(tf.ones([4]) * tf.cast(repl.replica_id, tf.float32))
    return repl.all_sum(w.read_value())

  stall = [0.0]

  def tick():
    last = time.monotonic()
    while True:
      time.sleep(0.01)
      now = time.monotonic()
      stall[0] = max(stall[0], now - last)
      last = now

  dies_at = 0 if args.how.endswith("before_first_run") else 5
  for step in range(1000):
    if repl.mesh.worker_index == repl.num_workers - 1 and step == dies_at:
      if args.stall_s:
        while not os.path.exists(os.path.join(args.pids, "1")):
          time.sleep(0.01)
        with open(os.path.join(args.pids, "1")) as f:
          stalled = int(f.read())
        os.kill(stalled, signal.SIGSTOP)
        subprocess.Popen(["sh", "-c", f"sleep {args.stall_s}; kill -CONT {stalled}"])
      sig = signal.SIGKILL if args.how.startswith("kill") else signal.SIGSTOP
      print("DYING", flush=True)
      os.kill(os.getpid(), sig)
    if step == dies_at:
      threading.Thread(target=tick, daemon=True).start()
    start = time.time()  # a loss is reported within the step that sees it
    try:
      repl.run(step_fn)
    except replicator.WorkerLost as error:
      print(f"STALL {stall[0]:.2f}", flush=True)
      print(f"LOST {time.time() - start:.2f} {error}", flush=True)
      sys.exit(3)
    if step >= 5:
      time.sleep(0.05)
  print("NOT LOST", flush=True)


if __name__ == "__main__":
  main()
