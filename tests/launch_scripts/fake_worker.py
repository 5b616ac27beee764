"""A worker of the launcher's tests without TensorFlow: prints lines, may fail.

  python -m replicator.launch --workers 2 -- python tests/launch_scripts/fake_worker.py \
      --lines 30 --fail_worker 1 --code 3 --record DIR

Each line names the worker (TF_CONFIG's index) and its attempt
(REPLICATOR_RESTART_COUNT): `worker 1 attempt 0 line 7`.
"""

import argparse
import json
import os
import signal
import sys
import time


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--lines", type=int, default=1, help="lines each worker prints")
  parser.add_argument("--fail_worker", type=int, default=-1, help="the worker that fails")
  parser.add_argument("--fail_attempts", default="all",
                      help="comma-separated attempts on which it fails, or `all`")
  parser.add_argument("--code", type=int, default=3,
                      help="its exit code; -9 kills it with SIGKILL")
  parser.add_argument("--record", default=None,
                      help="a directory where each worker leaves attempt<a>_worker<i> "
                      "once its lines are printed; the failing worker waits for all")
  parser.add_argument("--hold", action="store_true",
                      help="print `pid <pid>`, then sleep an hour (until stopped)")
  args = parser.parse_args()
  tf_config = json.loads(os.environ["TF_CONFIG"])
  index = tf_config["task"]["index"]
  attempt = int(os.environ["REPLICATOR_RESTART_COUNT"])
  for k in range(args.lines):
    print(f"worker {index} attempt {attempt} line {k}", flush=True)
  if args.record:  # after the lines: a record says they are printed
    open(os.path.join(args.record, f"attempt{attempt}_worker{index}"), "w").close()
  if args.hold:
    print("pid", os.getpid(), flush=True)
    time.sleep(3600)
  failing = args.fail_attempts == "all" or str(attempt) in args.fail_attempts.split(",")
  if index == args.fail_worker and failing:
    # With --record, the others print their lines first, however late they start.
    others = [os.path.join(args.record, f"attempt{attempt}_worker{w}")
              for w in range(len(tf_config["cluster"]["worker"]))] if args.record else []
    while not all(os.path.exists(path) for path in others):
      time.sleep(0.05)
    if args.code == -9:
      os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(args.code)


if __name__ == "__main__":
  main()
