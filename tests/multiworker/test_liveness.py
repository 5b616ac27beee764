"""Which peer a heartbeat's verdict names, from its records of the checks.

Times are seconds of `time.monotonic()`; survivors stay `LINGER_S` after their
verdict, so one that left because of a loss refused at least that long after
the lost worker's last answer.
"""

from replicator.multiworker import liveness

LINGER_S = 6.0
TIMEOUT_S = 5.0
ADDRESSES = [f"127.0.0.1:{1000 + w}" for w in range(4)]


def _decide(trouble, answered, now):
  return liveness.decide(trouble, answered, now, timeout_s=TIMEOUT_S,
                         linger_s=LINGER_S, addresses=ADDRESSES)


def _refused(since, by):
  return liveness.Trouble(since, refused_by=by, refusal="UnavailableError")


def test_nothing_in_trouble_or_a_peer_silent_for_less_than_timeout_s_is_no_loss():
  assert _decide({}, {1: 9.0, 2: 9.0}, 10.0) is None
  assert _decide({2: liveness.Trouble(6.0)}, {1: 9.0, 2: 5.9}, 10.0) is None


def test_the_lost_worker_is_named_not_the_survivor_that_left_after_it():
  """Worker 2 was killed; worker 0 saw it, stayed LINGER_S, then left."""
  trouble = {2: _refused(5.05, 5.1), 0: _refused(11.5, 12.0)}
  loss = _decide(trouble, {0: 5.0, 2: 4.0}, 12.0)
  assert loss == liveness.Loss(2, "its server refused a health check (UnavailableError)")


def test_a_frozen_worker_is_waited_for_when_a_survivor_left_meanwhile():
  """Worker 2 froze after answering at 3.9; worker 0 named it, stayed, and left
  at 15.5, before this worker (which looked again only from 12) found 2 silent
  for TIMEOUT_S."""
  trouble = {2: liveness.Trouble(12.0), 0: _refused(15.5, 15.6)}
  answered = {0: 15.0, 2: 3.9}
  assert _decide(trouble, answered, 15.6) is None  # 0 may have left because of 2
  loss = _decide(trouble, answered, 17.2)
  assert loss == liveness.Loss(2, "no answer to health checks for 5 s")


def test_a_killed_worker_is_named_while_a_slow_one_has_not_answered_yet():
  trouble = {1: liveness.Trouble(9.0), 2: _refused(9.5, 9.6)}
  assert _decide(trouble, {1: 8.0, 2: 8.1}, 9.6).worker == 2


def test_of_workers_killed_together_the_first_seen_is_named():
  trouble = {1: _refused(9.0, 9.01), 2: _refused(9.02, 9.03)}
  assert _decide(trouble, {1: 8.0, 2: 8.01}, 9.1).worker == 1


def test_a_worker_that_did_not_look_for_linger_s_does_not_guess():
  """Its last look saw both answer at 3; each may have left because of the other."""
  trouble = {0: _refused(10.0, 10.1), 2: _refused(10.2, 10.3)}
  loss = _decide(trouble, {0: 3.0, 2: 3.05}, 10.3)
  assert loss.worker is None
  assert loss.reason.startswith(
      "workers 0 (127.0.0.1:1000), 2 (127.0.0.1:1002) are down, and this worker did "
      "not check them often enough to tell which went first"), loss.reason
  # never answered this heartbeat: no order either
  assert _decide({0: _refused(1.0, 1.1), 2: _refused(1.2, 1.3)}, {}, 1.3).worker is None
