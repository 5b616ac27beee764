"""The launcher's worker processes: started, their lines routed, watched, stopped, restarted.

`replicator.launch` builds each worker's environment; this module runs the job's attempts.
"""

import collections
import os
import signal
import subprocess
import threading
import time
from typing import Callable, List, Optional, Sequence, Tuple

# Each worker's attempt number: 0, then 1 after the first restart, and so on.
RESTART_COUNT_ENV = "REPLICATOR_RESTART_COUNT"
# The lines of a failed worker that reach the terminal when its output did not.
TAIL_LINES = 20
# How often the launcher looks at its workers; a failure stops the others this
# much later at most.
_POLL_S = 0.05
# SIGTERM, then SIGKILL after this long: a script may save or clean up first.
_GRACE_S = 5.0
# How long a worker's output may still arrive after it ended: its pipe stays
# open while a process it started lives on.
_DRAIN_S = 5.0


def log_path(log_dir: str, index: int) -> str:
  return os.path.join(log_dir, f"worker_{index}.log")


class Terminal:
  """Writes whole lines to `out` from several threads, one line at a time."""

  def __init__(self, out):
    self._out = out
    self._lock = threading.Lock()

  def write(self, prefix: str, text: str):
    if not text.endswith("\n"):
      text += "\n"
    with self._lock:
      self._out.write(prefix + text)
      self._out.flush()

  def launcher(self, message: str):
    self.write("[launch] ", message)


def _pump(stream, index: int, terminal: Optional[Terminal], log, tail):
  """Routes worker `index`'s output until it ends: to the terminal if shown, to its log
  file if any, and into `tail` (its last lines)."""
  try:
    for line in iter(stream.readline, b""):
      text = line.decode(errors="replace")
      tail.append(text)
      if log is not None:
        log.write(line)
        log.flush()
      if terminal is not None:
        terminal.write(f"[worker {index}] ", text)
  finally:
    stream.close()
    if log is not None:
      log.close()


class _WorkerGroup:
  """The processes of one attempt of the job."""

  def __init__(self, terminal: Terminal, tee_all: bool, log_dir: Optional[str]):
    self._terminal = terminal
    self._tee_all = tee_all
    self._log_dir = log_dir
    self.processes: List[subprocess.Popen] = []
    self._pumps: List[threading.Thread] = []
    self.tails: List[collections.deque] = []

  def start(self, command: Sequence[str], envs: Sequence[dict], separator: str = ""):
    """Starts a worker per environment; `separator` opens each log file (a restart's
    lines are appended to the earlier attempts'), none truncates it."""
    for index, env in enumerate(envs):
      log = None
      if self._log_dir is not None:
        log = open(log_path(self._log_dir, index), "ab" if separator else "wb")
        if separator:
          log.write(f"[launch] {separator}\n".encode())
          log.flush()
      try:
        p = subprocess.Popen(list(command), env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT)
      except OSError as error:
        if log is not None:
          log.close()
        self.stop()
        raise ValueError(f"command: cannot start {command[0]!r}: {error.strerror}; give "
                         "a program on the PATH or its path.") from error
      self.processes.append(p)
      tail = collections.deque(maxlen=TAIL_LINES)
      self.tails.append(tail)
      pump = threading.Thread(target=_pump, daemon=True, args=(
          p.stdout, index, self._terminal if self._shown(index) else None, log, tail))
      pump.start()
      self._pumps.append(pump)

  def _shown(self, index: int) -> bool:
    """Whether worker `index`'s lines reach the terminal as they come."""
    return self._tee_all or index == 0

  def first_failure(self) -> Optional[Tuple[int, int]]:
    """Waits until every worker succeeded (None) or one failed: (index, returncode)."""
    running = set(range(len(self.processes)))
    while running:
      failed = []
      for index in sorted(running):
        status = self.processes[index].poll()
        if status is None:
          continue
        running.discard(index)
        if status != 0:
          failed.append((index, status))
      if failed:
        # Seen in the same look (a launcher held back by a busy machine), a worker
        # killed by a signal is named before one that exited with an error: the
        # survivors of a lost worker raise WorkerLost, an error, after it died.
        return min(failed, key=lambda failure: (failure[1] > 0, failure[0]))
      time.sleep(_POLL_S)
    return None

  def stop(self):
    """Stops the workers still running (SIGTERM, then SIGKILL) and reaps every one."""
    for p in self.processes:
      if p.poll() is None:
        p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + _GRACE_S
    for p in self.processes:
      while p.poll() is None and time.monotonic() < deadline:
        time.sleep(_POLL_S)
      if p.poll() is None:
        p.kill()
        p.wait()

  def drain(self):
    """Waits for the output the workers printed before they ended."""
    deadline = time.monotonic() + _DRAIN_S
    for pump in self._pumps:
      pump.join(timeout=max(0.0, deadline - time.monotonic()))

  def print_tail(self, index: int):
    """Prints a failed worker's last lines, unless the terminal showed them already."""
    if self._shown(index):
      return
    lines = list(self.tails[index])
    where = (f"; all of them are in {log_path(self._log_dir, index)}"
             if self._log_dir is not None else "")
    if not lines:
      self._terminal.launcher(f"worker {index} printed nothing{where}.")
      return
    self._terminal.launcher(f"the last {len(lines)} line(s) worker {index} printed{where}:")
    for line in lines:
      self._terminal.write(f"[worker {index}] ", line)


class _Stopped(Exception):
  """The launcher got SIGTERM or SIGHUP (the signal's number is `args[0]`)."""


def _raise_stopped(signum, unused_frame):
  for s in (signal.SIGTERM, signal.SIGHUP):  # a second one must not cut stop() short
    signal.signal(s, signal.SIG_IGN)
  raise _Stopped(signum)


def supervise(command: Sequence[str], make_envs: Callable[[int], List[dict]],
              terminal: Terminal, *, tee_all: bool = False, log_dir: Optional[str] = None,
              max_restarts: int = 0) -> int:
  """Runs the job, restarting it up to `max_restarts` times; returns the exit code.

  `make_envs(restart_count)` gives each worker's environment for an attempt (fresh ports
  each time). A worker that exits with a non-zero code stops the others; then the job
  starts again if restarts are left. A signal to the launcher (SIGINT, SIGTERM,
  SIGHUP) stops the workers and never restarts them.
  """
  handlers = {}
  if threading.current_thread() is threading.main_thread():
    handlers = {s: signal.signal(s, _raise_stopped) for s in (signal.SIGTERM, signal.SIGHUP)}
  group = _WorkerGroup(terminal, tee_all, log_dir)
  try:
    restart, separator = 0, ""
    while True:
      group.start(command, make_envs(restart), separator)
      failure = group.first_failure()
      if failure is None:
        return 0
      index, status = failure
      reason = f"worker {index} exited with code {status}"
      if status < 0:  # killed by signal -status
        try:
          reason += f" (killed by {signal.Signals(-status).name})"
        except ValueError:
          reason += f" (killed by signal {-status})"
      restarting = restart < max_restarts
      if restarting:
        restart += 1
        terminal.launcher(f"{reason}; restarting the job (restart {restart} of {max_restarts})")
        separator = (f"---- restart {restart} of {max_restarts} "
                     f"({RESTART_COUNT_ENV}={restart}) after {reason} ----")
      else:
        used = f" (restarts used: {restart} of {max_restarts})" if max_restarts else ""
        terminal.launcher(f"{reason}; stopping the others{used}.")
      group.stop()
      group.drain()
      group.print_tail(index)
      if not restarting:
        return status if status >= 0 else 128 - status  # as a shell gives it
      group = _WorkerGroup(terminal, tee_all, log_dir)
  except KeyboardInterrupt:
    terminal.launcher("interrupted (SIGINT); stopping the workers.")
    group.stop()
    return 128 + signal.SIGINT
  except _Stopped as stopped:
    signum = stopped.args[0]
    terminal.launcher(f"got signal {signum} ({signal.Signals(signum).name}); "
                      "stopping the workers.")
    group.stop()
    return 128 + signum
  finally:
    for s, handler in handlers.items():
      signal.signal(s, handler)
    group.drain()
