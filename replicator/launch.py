"""Starts N local workers of a training script, each with its TF_CONFIG.

  python -m replicator.launch --workers 2 [--devices-per-worker 2] -- python train.py ARGS

Workers listen on free ports of 127.0.0.1 (`--host` to change that). Each
line a worker prints is prefixed with `[worker i]`. When a worker fails, the
others are stopped and the launcher exits with the failed worker's code.
Interrupted (Ctrl-C, SIGTERM, SIGHUP), it stops the workers (SIGTERM, then
SIGKILL after 5 s) and exits with 128 + the signal's number.
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import List, Optional, Sequence

from replicator.gpu import LOGICAL_CPUS_ENV


def free_ports(count: int, host: str = "127.0.0.1") -> List[int]:
  sockets = []
  try:
    for _ in range(count):
      s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
      s.bind((host, 0))
      sockets.append(s)
    return [s.getsockname()[1] for s in sockets]
  finally:
    for s in sockets:
      s.close()


def worker_environments(num_workers: int, host: str = "127.0.0.1",
                        devices_per_worker: Optional[int] = None,
                        base_env=None) -> List[dict]:
  addresses = [f"{host}:{port}" for port in free_ports(num_workers, host)]
  envs = []
  for index in range(num_workers):
    env = dict(os.environ if base_env is None else base_env)
    env["TF_CONFIG"] = json.dumps({"cluster": {"worker": addresses},
                                   "task": {"type": "worker", "index": index}})
    if devices_per_worker:
      env[LOGICAL_CPUS_ENV] = str(devices_per_worker)
    env.setdefault("PYTHONUNBUFFERED", "1")
    envs.append(env)
  return envs


def _pump(stream, prefix: str, out):
  for line in iter(stream.readline, b""):
    out.write(prefix + line.decode(errors="replace"))
    out.flush()
  stream.close()


def _stop(processes, grace_s: float = 5.0):
  for p in processes:
    if p.poll() is None:
      p.send_signal(signal.SIGTERM)
  deadline = time.time() + grace_s
  for p in processes:
    while p.poll() is None and time.time() < deadline:
      time.sleep(0.05)
    if p.poll() is None:
      p.kill()
      p.wait()


class _Stopped(Exception):
  """The launcher got SIGTERM or SIGHUP."""

  def __init__(self, signum: int):
    super().__init__(signum)
    self.signum = signum


def _raise_stopped(signum, unused_frame):
  for s in (signal.SIGTERM, signal.SIGHUP):  # a second one must not cut _stop short
    signal.signal(s, signal.SIG_IGN)
  raise _Stopped(signum)


def launch(command: Sequence[str], num_workers: int, host: str = "127.0.0.1",
           devices_per_worker: Optional[int] = None, out=sys.stdout) -> int:
  """Runs `command` as `num_workers` workers; returns the exit code."""
  if num_workers < 1:
    raise ValueError(f"--workers: must be >= 1, got {num_workers}.")
  if not command:
    raise ValueError("command: give the worker command after `--`.")
  envs = worker_environments(num_workers, host, devices_per_worker)
  processes, pumps = [], []
  handlers = {}
  if threading.current_thread() is threading.main_thread():
    handlers = {s: signal.signal(s, _raise_stopped)
                for s in (signal.SIGTERM, signal.SIGHUP)}
  code = 0
  try:
    for index, env in enumerate(envs):
      try:
        p = subprocess.Popen(list(command), env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT)
      except OSError as error:
        _stop(processes)
        raise ValueError(f"command: cannot start {command[0]!r}: {error.strerror}.") from error
      processes.append(p)
      pump = threading.Thread(target=_pump, args=(p.stdout, f"[worker {index}] ", out),
                              daemon=True)
      pump.start()
      pumps.append(pump)
    running = set(range(num_workers))
    while running:
      for index in sorted(running):
        status = processes[index].poll()
        if status is None:
          continue
        running.discard(index)
        if status != 0:
          out.write(f"[launch] worker {index} exited with code {status}; "
                    "stopping the others.\n")
          code = status if status > 0 else 128 - status
          _stop(processes)
          running.clear()
          break
      time.sleep(0.05)
  except KeyboardInterrupt:
    _stop(processes)
    code = 128 + signal.SIGINT
  except _Stopped as stopped:
    out.write(f"[launch] got signal {stopped.signum}; stopping the workers.\n")
    _stop(processes)
    code = 128 + stopped.signum
  finally:
    for s, handler in handlers.items():
      signal.signal(s, handler)
  for pump in pumps:
    pump.join(timeout=5)
  return code


def main(argv=None):
  argv = list(sys.argv[1:] if argv is None else argv)
  if "--" not in argv:
    print(__doc__)
    return 2
  split = argv.index("--")
  parser = argparse.ArgumentParser(prog="python -m replicator.launch")
  parser.add_argument("--workers", type=int, required=True)
  parser.add_argument("--devices-per-worker", type=int, default=None,
                      help="logical CPU devices per worker (CPU-only machines)")
  parser.add_argument("--host", default="127.0.0.1",
                      help="address the workers bind (default: loopback only)")
  args = parser.parse_args(argv[:split])
  try:
    return launch(argv[split + 1:], args.workers, args.host, args.devices_per_worker)
  except ValueError as error:
    print(f"python -m replicator.launch: error: {error}", file=sys.stderr)
    return 2


if __name__ == "__main__":
  sys.exit(main())
