"""Instance keys: counted, recorded, and given again to a function that stands
for another on other workers (the loop of several steps for the one-step
function), with keys derived from them that do not move the counter."""

import pytest

from replicator.multiworker import cluster

SUM = ("Add", "int64", (8,))
MIN = ("Min", "int64", (2, 3))


def _keys():
  return cluster.CollectiveKeys(num_workers=2, worker_index=0, timeout_s=0)


def test_recorded_lists_the_keys_issued_in_its_block_only():
  keys = _keys()
  keys.next(SUM)
  with keys.recorded() as recorded:
    assert recorded == []  # filled once the block ends
    first, second = keys.next(SUM), keys.next(MIN)
  keys.next(SUM)
  assert recorded == [first, second] == [2, 3]
  assert keys.signatures(1) == [SUM, MIN, SUM]


def test_replaying_gives_the_keys_again_then_derived_ones_that_do_not_count():
  keys = _keys()
  with keys.recorded() as recorded:
    keys.next(SUM)
  keys.next(MIN)  # a later trace: counted
  issued = keys.issued
  with keys.replaying(recorded):
    again = keys.next(SUM)
    derived = [keys.next(MIN), keys.next(SUM)]
  assert again == recorded[0]
  assert keys.issued == issued  # the counter did not move...
  assert keys.next(SUM) == issued + 1  # ...and counts on after the block
  assert len(set(derived)) == 2 and not set(derived) & set(range(1, keys.issued + 1))
  assert all(cluster.CollectiveKeys._DERIVED_KEYS <= k < 2**31 for k in derived)


def test_derived_keys_depend_on_the_replayed_key_not_on_when_the_trace_came():
  """A worker that traces the loop at once and one that traces it after other
  steps' traces (which move its counter) derive the same keys."""
  early, late = _keys(), _keys()
  recorded = {}
  for keys in (early, late):
    with keys.recorded() as recorded[keys]:
      keys.next(SUM)
  for _ in range(5):
    late.next(MIN)
  derived = []
  for keys in (early, late):
    with keys.replaying(recorded[keys]):
      keys.next(SUM)
      derived.append([keys.next(MIN) for _ in range(3)])
  assert derived[0] == derived[1]
  other = _keys()
  other.next(MIN)
  with other.replaying([other.next(SUM)]):
    other.next(SUM)
    assert other.next(MIN) not in derived[0]  # another base, other keys


def test_replaying_refuses_another_signature_leftover_keys_and_too_many_derived():
  keys = _keys()
  recorded = [keys.next(SUM)]
  with pytest.raises(RuntimeError, match=r"collective of \('Min'.*key 1 \(\('Add'"):
    with keys.replaying(recorded):
      keys.next(MIN)
  with pytest.raises(RuntimeError, match=r"keys \[1\] were to be given again"):
    with keys.replaying(recorded):
      pass
  with pytest.raises(RuntimeError, match="no keys left"):
    with keys.replaying(recorded):
      for _ in range(cluster.CollectiveKeys._DERIVED_PER_BASE + 2):
        keys.next(SUM)
  with pytest.raises(ValueError, match="keys: .* cannot be replayed"):
    with keys.replaying([]):
      pass
  assert keys.next(SUM) == 2  # every refusal left the counter as it was
