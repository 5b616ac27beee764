"""Starts N local workers of a training script, each with its TF_CONFIG.

  python -m replicator.launch --workers 2 [--devices-per-worker 2] [--log-dir DIR]
      [--tee {chief,all}] [--max-restarts N] [--host ADDRESS] -- python train.py ARGS

`replicator-launch` is the same command, installed as a console script. README.md
("Several workers") describes the workers' environment, output, failures and restarts;
`--help` lists the options.

Security: TensorFlow's gRPC collectives are unauthenticated, and TensorFlow's
server listens on every interface of its port (it has no bind-address option);
`--host` only sets the address the workers are told. Run workers on a trusted
network only.
"""

import argparse
import json
import os
import socket
import sys
from typing import List, Optional, Sequence

from replicator.gpu import LOGICAL_CPUS_ENV
from replicator.launch_supervisor import RESTART_COUNT_ENV
from replicator.launch_supervisor import TAIL_LINES
from replicator.launch_supervisor import Terminal
from replicator.launch_supervisor import supervise

TEE_CHOICES = ("chief", "all")


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
                        restart_count: int = 0) -> List[dict]:
  """Each worker's environment: `TF_CONFIG` on fresh ports, and the attempt's number."""
  try:
    ports = free_ports(num_workers, host)
  except OSError as error:
    raise ValueError(f"--host: cannot take a port on {host!r} ({error.strerror or error}); "
                     "give an address of this machine, such as 127.0.0.1.") from error
  addresses = [f"{host}:{port}" for port in ports]
  envs = []
  for index in range(num_workers):
    env = dict(os.environ)
    env["TF_CONFIG"] = json.dumps({"cluster": {"worker": addresses},
                                   "task": {"type": "worker", "index": index}})
    env[RESTART_COUNT_ENV] = str(restart_count)
    if devices_per_worker:
      env[LOGICAL_CPUS_ENV] = str(devices_per_worker)
    env.setdefault("PYTHONUNBUFFERED", "1")
    envs.append(env)
  return envs


def launch(command: Sequence[str], num_workers: int, host: str = "127.0.0.1",
           devices_per_worker: Optional[int] = None, out=None, *,
           log_dir: Optional[str] = None, tee: str = "chief", max_restarts: int = 0) -> int:
  """Runs `command` as `num_workers` workers; returns the launcher's exit code.

  `out` (sys.stdout by default) gets the lines shown on the terminal. The other
  arguments are the command line's options (`--help`).

  Raises:
    ValueError: an argument is out of range, or the command cannot start.
  """
  if num_workers < 1:
    raise ValueError(f"--workers: must be >= 1, got {num_workers}.")
  if devices_per_worker is not None and devices_per_worker < 1:
    raise ValueError(f"--devices-per-worker: must be >= 1, got {devices_per_worker}; "
                     "leave it out to keep each worker's devices as they are.")
  if max_restarts < 0:
    raise ValueError(f"--max-restarts: must be >= 0, got {max_restarts}.")
  if tee not in TEE_CHOICES:
    raise ValueError(f"--tee: must be one of {', '.join(TEE_CHOICES)}, got {tee!r}.")
  if not command:
    raise ValueError("command: give the worker command after `--`, e.g. "
                     "`--workers 2 -- python train.py`.")
  if log_dir is not None:
    try:
      os.makedirs(log_dir, exist_ok=True)
    except OSError as error:
      raise ValueError(f"--log-dir: cannot create {log_dir!r} ({error.strerror}); give a "
                       "directory this user may write to.") from error
  terminal = Terminal(sys.stdout if out is None else out)
  if tee == "chief" and num_workers > 1:
    kept = (f"; each worker's lines are in {os.path.join(log_dir, 'worker_<i>.log')}"
            if log_dir is not None else "")
    terminal.launcher(f"showing worker 0's lines (--tee all shows every worker's){kept}.")
  return supervise(
      command, lambda restart: worker_environments(num_workers, host, devices_per_worker,
                                                   restart_count=restart),
      terminal, tee_all=tee == "all", log_dir=log_dir, max_restarts=max_restarts)


def _parser(prog: str) -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog=prog,
      usage=f"{prog} --workers N [options] -- COMMAND [ARGS ...]",
      description="Starts N local workers of COMMAND, each with its TF_CONFIG, and "
      "supervises them: one failing stops the others, and the job restarts if asked.",
      epilog=f"Each worker gets TF_CONFIG and {RESTART_COUNT_ENV} (0, then 1 after the "
      "first restart, ...). Exit code: 0 when the last attempt succeeds, else the failed "
      "worker's (128 + N if killed by signal N); 128 + N when the launcher gets signal N.")
  parser.add_argument("--workers", type=int, metavar="N",
                      help="number of worker processes to start (required)")
  parser.add_argument("--devices-per-worker", type=int, metavar="N", default=None,
                      help="split each worker's CPU into N logical devices (CPU-only "
                      "machines; default: leave the devices as they are)")
  parser.add_argument("--host", default="127.0.0.1", metavar="ADDRESS",
                      help="address the workers are told to reach each other at (default "
                      "127.0.0.1); TensorFlow's server still listens on every interface of "
                      "its port, so run on a trusted network")
  parser.add_argument("--log-dir", metavar="DIR", default=None,
                      help="also write each worker's lines to DIR/worker_<i>.log (replaced "
                      "at the start, appended to on restarts)")
  parser.add_argument("--tee", choices=TEE_CHOICES, default="chief",
                      help="whose lines the terminal shows: worker 0's (default) or every "
                      f"worker's; a failed worker's last {TAIL_LINES} lines are always shown")
  parser.add_argument("--max-restarts", type=int, metavar="N", default=0,
                      help="restart the whole job up to N times when a worker fails "
                      "(default 0); the script resumes from its last checkpoint")
  return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
  """The command line (`python -m replicator.launch`, `replicator-launch`); returns the
  exit code: `sys.exit(main())`."""
  argv = list(sys.argv[1:] if argv is None else argv)
  name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
  prog = ("replicator-launch" if name.startswith("replicator-launch")
          else "python -m replicator.launch")
  parser = _parser(prog)
  split = argv.index("--") if "--" in argv else len(argv)
  command = argv[split + 1:]
  example = f"`{prog} --workers 2 -- python train.py`"
  try:  # argparse exits: 0 after --help, 2 after a usage error (both printed)
    args, unknown = parser.parse_known_args(argv[:split])
    if unknown and split == len(argv) and not unknown[0].startswith("-"):
      parser.error(f"command: put the worker command after `--`; got {' '.join(unknown)!r} "
                   f"without it, e.g. {example}.")
    if unknown:
      parser.error(f"unrecognized arguments: {' '.join(unknown)}; see {prog} --help.")
    if args.workers is None and not command:
      parser.error(f"give --workers and the worker command after `--`, e.g. {example}.")
    if args.workers is None:
      parser.error(f"--workers: required; give the number of workers, e.g. {example}.")
    if not command:
      parser.error(f"command: give the worker command after `--`, e.g. {example}.")
  except SystemExit as exit_:
    return exit_.code if isinstance(exit_.code, int) else 0
  try:
    return launch(command, args.workers, args.host, args.devices_per_worker,
                  log_dir=args.log_dir, tee=args.tee, max_restarts=args.max_restarts)
  except ValueError as error:
    print(f"{prog}: error: {error}", file=sys.stderr)
    return 2


if __name__ == "__main__":
  sys.exit(main())
