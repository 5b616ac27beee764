"""The central conformance tests at 8 replicas (a TPU host's cores), on the
strategy engine's stand-in.

Every catalogue test runs at 8 too where REPLICATOR_EIGHT_REPLICAS=1 is set
(tests/catalogue.py); the suite runs these, the oracles that a wrong
reduction at 8 replicas would fail first.
"""

import importlib.util
import pathlib

import pytest

import catalogue

_TESTS = pathlib.Path(__file__).resolve().parents[2]
_loaded = {}


def _test(path: str, name: str):
  """The test function `name` of tests/`path` (loaded once, not collected again)."""
  if path not in _loaded:
    spec = importlib.util.spec_from_file_location(
        "eight_" + path.replace("/", "_").removesuffix(".py"), _TESTS / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _loaded[path] = module
  return getattr(_loaded[path], name)


CASES = [
    ("test_equivalence.py", "test_training_matches_one_device", ("sonnet_adam",)),
    ("test_equivalence.py", "test_training_matches_one_device", ("keras_sgd",)),
    ("test_nn.py", "test_cross_replica_batch_norm_equals_batch_norm_on_the_global_batch", ()),
    ("test_strategy_cases.py", "test_all_reduce_of_values_from_the_input", (False,)),
    ("test_strategy_cases.py", "test_gradients_of_collectives_sum_the_upstream_gradients",
     ("GradientTape", False)),
    ("test_strategy_cases.py", "test_all_gather_along_axis_0_and_1", ()),
    ("engines/in_graph/test_run.py", "test_finite_input_stops_every_replica_at_the_same_step", ()),
    ("engines/in_graph/test_run.py", "test_outputs_have_leading_replica_axis_in_id_order", ()),
]


@pytest.mark.parametrize("path,name,args", CASES,
                         ids=[f"{name}{list(args) if args else ''}" for _, name, args in CASES])
def test_at_eight_replicas(path, name, args):
  _test(path, name)(catalogue.EIGHT, *args)
