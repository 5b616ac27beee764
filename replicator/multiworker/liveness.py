"""Whether the job's other workers are alive, and which one was lost first.

A peer's gRPC server answers health checks (`check_peer`) from its own
threads: a busy worker still answers, a killed one refuses, a frozen or
cut-off one stays silent. The `Heartbeat` checks every peer each second and,
once one is lost, aborts the pending collectives, so a step fails (as
`WorkerLost`) instead of waiting forever.

A survivor that saw the loss leaves too, so a slower survivor may find two
peers down, which no check can tell apart afterwards; two rules keep the order:

- A survivor stays: its process ends no sooner than `linger_s` after its
  verdict (an exit hook waits, unless every other peer is by then the lost one
  or refuses), its server answering. So a worker that left because of another's
  loss went down at least `linger_s` after that one's last answer to anybody.
- A peer that refuses is named only if its first refusal came less than
  `linger_s` after the last answer of every other peer in trouble: by the first
  rule it cannot have left because of one of them. A peer silent for the
  heartbeat's `timeout_s` is named too (a worker that leaves refuses); while
  none qualifies and one is silent, the heartbeat looks again.

So a worker that left because of a loss is never named. Where this worker
did not look for `linger_s` (its process stood still) and finds several peers
refusing, none qualifies, and the verdict says so instead of guessing.
"""

import atexit
import dataclasses
import threading
import time
from typing import Dict, Optional

import tensorflow as tf
from tensorflow.python.eager import context as eager_context

from replicator import mesh as mesh_lib
from replicator.mesh import Mesh

PEER_DOWN = (tf.errors.UnavailableError, tf.errors.FailedPreconditionError,
             tf.errors.DeadlineExceededError)


def check_peer(worker: int, timeout_s: float) -> None:
  """Raises (UnavailableError, DeadlineExceededError...) unless `worker` answers.

  TensorFlow's binding holds the GIL until the answer or the timeout, stopping
  every Python thread of this process that long: keep `timeout_s` short.
  """
  eager_context.context().check_collective_ops_peer_health(
      f"/job:{mesh_lib.JOB}/replica:0/task:{worker}",
      timeout_in_ms=int(timeout_s * 1000))


def unjoined_peers(mesh: Mesh, timeout_s: float, poll_s: float = 0.5) -> list:
  """Waits, at most `timeout_s`, until every other worker's server answers;
  returns those that did not (empty: all joined)."""
  deadline = time.monotonic() + timeout_s
  waiting = [w for w in range(mesh.num_workers) if w != mesh.worker_index]
  while True:
    still = []
    for worker in waiting:
      try:
        # briefly: the check holds the GIL, and the poll comes back for it
        check_peer(worker, max(0.1, min(0.5, deadline - time.monotonic())))
      except PEER_DOWN:
        still.append(worker)
    waiting = still
    if not waiting or time.monotonic() >= deadline:
      return waiting
    time.sleep(poll_s)


@dataclasses.dataclass(frozen=True)
class Loss:
  """A heartbeat's verdict: `worker` was lost (None: which one is unknown)."""
  worker: Optional[int]
  reason: str


@dataclasses.dataclass
class Trouble:
  """A peer's checks that failed since its last answer."""
  since: float  # when the first of them started
  refused_by: Optional[float] = None  # when the first refusal ended: down by then
  refusal: str = ""  # the error of that refusal


def decide(trouble: Dict[int, Trouble], answered: Dict[int, float], now: float, *,
           timeout_s: float, linger_s: float, addresses) -> Optional[Loss]:
  """The verdict on the peers in `trouble` at `now`, or None to look again.

  Among the lost peers that cannot have left because of another peer in
  trouble (see the module's docstring), the one whose trouble began first.

  Args:
    trouble: each peer whose checks failed since its last answer.
    answered: when each peer's last answered check started.
    now: the time of the verdict (`time.monotonic()`).
    timeout_s: how long a silent peer takes to be lost.
    linger_s: how long a survivor stays after its verdict.
    addresses: every worker's address, for the message.
  """
  named = []
  for worker, mine in trouble.items():
    if mine.refused_by is not None:
      others = [answered.get(w) for w in trouble if w != worker]
      if all(last is not None and mine.refused_by - last < linger_s for last in others):
        named.append((mine.since, worker,
                      f"its server refused a health check ({mine.refusal})"))
    elif now - mine.since >= timeout_s:
      named.append((mine.since, worker,
                    f"no answer to health checks for {now - mine.since:.0f} s"))
  if named:
    _, worker, reason = min(named)
    return Loss(worker, reason)
  if trouble and all(t.refused_by is not None for t in trouble.values()):
    down = ", ".join(f"{w} ({addresses[w]})" for w in sorted(trouble))
    return Loss(None, (
        f"workers {down} are down, and this worker did not check them often "
        "enough to tell which went first (its process stood still for more "
        f"than {linger_s:.0f} s, how long a worker that leaves because of "
        "another's loss stays)"))
  return None


class Heartbeat:
  """Checks every peer's gRPC server; on a loss, aborts pending collectives.

  A killed worker refuses the next check (noticed within `interval_s`); a
  frozen or cut-off one is lost once it has not answered for `timeout_s`.
  Each check waits at most `probe_s`, as `check_peer` holds the GIL.

  Attributes:
    loss: the verdict, once there is one (`Loss`), else None.
  """

  def __init__(self, mesh: Mesh, timeout_s: float, interval_s: float = 1.0,
               probe_s: float = 0.5):
    self._mesh = mesh
    self._peers = [w for w in range(mesh.num_workers) if w != mesh.worker_index]
    self._timeout_s = timeout_s
    self._interval_s = interval_s
    self._probe_s = min(probe_s, timeout_s)
    # Long enough for every other survivor's heartbeat to look at least once
    # more (a look takes up to `probe_s` for each silent peer), with room for
    # a process that the machine's load holds back for a few seconds.
    self.linger_s = 5 * interval_s + self._probe_s * len(self._peers)
    self.loss: Optional[Loss] = None
    self._answered: Dict[int, float] = {}  # peer -> when its last answered check started
    self._trouble: Dict[int, Trouble] = {}
    self._lock = threading.Lock()  # one look at a time: the heartbeat's or `verdict`'s
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._watch, daemon=True,
                                    name="replicator-heartbeat")
    self._thread.start()

  def _watch(self):
    while True:
      with self._lock:
        if self._stop.is_set() or self.loss is not None:
          return
        loss = self._look()
        # Stopped meanwhile: the replicator is closed, and its peers may end.
        if loss is not None and not self._stop.is_set():
          self._conclude(loss)
          return
      if self._stop.wait(self._interval_s):
        return

  def verdict(self) -> Optional[Loss]:
    """Whether a peer is lost, from a look at every peer now (after an error),
    again until a silent one answers or has been silent for `timeout_s`: an
    error of the step itself (every worker failing `check_numerics`) is no loss."""
    while True:
      with self._lock:
        if self.loss is not None:
          return self.loss
        loss = self._look()
        if loss is not None:
          self._conclude(loss)
          return loss
        if not self._trouble:
          return None
      time.sleep(min(self._interval_s, self._probe_s))

  def stop(self):
    self._stop.set()

  def _look(self) -> Optional[Loss]:
    """Checks every peer once, in turn; returns a verdict, if one is due."""
    for worker in self._peers:
      start = time.monotonic()
      try:
        check_peer(worker, self._probe_s)
      except tf.errors.DeadlineExceededError:
        self._trouble.setdefault(worker, Trouble(start))
      except PEER_DOWN as error:
        trouble = self._trouble.setdefault(worker, Trouble(start))
        if trouble.refused_by is None:
          trouble.refused_by = time.monotonic()
          trouble.refusal = type(error).__name__
      else:
        self._answered[worker] = start
        self._trouble.pop(worker, None)
    return decide(self._trouble, self._answered, time.monotonic(),
                  timeout_s=self._timeout_s, linger_s=self.linger_s,
                  addresses=self._mesh.worker_addresses)

  def _conclude(self, loss: Loss):
    self.loss = loss
    who = f"worker {loss.worker}" if loss.worker is not None else "a worker"
    eager_context.context().abort_collective_ops(
        tf.errors.UNAVAILABLE, f"replicator: {who} is lost ({loss.reason})")
    # This process may end as soon as it reports the loss: its server must
    # still answer the other survivors for `linger_s`.
    atexit.register(self._linger, time.monotonic() + self.linger_s)

  def _linger(self, until: float):
    """Waits until `until`, or until no other survivor is left to look: every
    peer refuses or is the lost one (a silent one may be a survivor held back)."""
    while time.monotonic() < until:
      try:
        if all(self._is_gone(worker) for worker in self._peers):
          return
      except Exception:  # pylint: disable=broad-except
        pass  # TensorFlow already shut down: wait out the time
      time.sleep(max(0.0, min(self._interval_s, until - time.monotonic())))

  def _is_gone(self, worker: int) -> bool:
    if self.loss is not None and worker == self.loss.worker:
      return True
    try:
      check_peer(worker, self._probe_s)
    except tf.errors.DeadlineExceededError:
      return False
    except PEER_DOWN:
      return True
    return False
