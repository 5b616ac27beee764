"""Every example spells the shared flags the same way, with the same meaning.

`examples/common.py` defines them: the replicator flags (--replicator,
--cpu_replicas, --tpu) and the run flags (--global_batch_size, --workdir,
--log_every), whose defaults may differ by example except --log_every's.
"""

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ("examples.quickstart", "examples.gan.train", "examples.gan.sweep",
            "examples.resnet.train")
# Flag -> whether every example has the same default.
SHARED = {"replicator": True, "cpu_replicas": True, "tpu": True, "log_every": True,
          "global_batch_size": False, "workdir": False}
RETIRED = ("num_cpu_devices", "model_dir", "log_every_steps", "global_batch",
           "results_dir")

# Defines each example's flags in the process's FlagValues, records them and deletes
# them again: the examples share flag names, so each needs the names free. One process
# for all of them imports TensorFlow once.
_DUMP = """
import importlib, json, sys
from absl import flags
FLAGS = flags.FLAGS
report = {}
for name in sys.argv[1:]:
  module = importlib.import_module(name)
  before = set(FLAGS)
  module.define_flags()
  defined = sorted(set(FLAGS) - before)
  report[name] = {flag: {"default": FLAGS[flag].default, "type": FLAGS[flag].flag_type(),
                         "enum_values": getattr(FLAGS[flag].parser, "enum_values", None)}
                  for flag in defined}
  for flag in defined:
    delattr(FLAGS, flag)
print(json.dumps(report))
"""


@pytest.fixture(name="defined", scope="module")
def _defined():
  """{example: {flag: {"default", "type", "enum_values"}}} of every example."""
  result = subprocess.run([sys.executable, "-c", _DUMP, *EXAMPLES], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("flag", sorted(SHARED))
def test_every_example_has_the_shared_flag_with_one_meaning(defined, flag):
  missing = [example for example in EXAMPLES if flag not in defined[example]]
  assert not missing, f"--{flag} is not defined by {missing}"
  specs = {example: defined[example][flag] for example in EXAMPLES}
  reference = specs["examples.resnet.train"]
  for example, spec in specs.items():
    assert spec["type"] == reference["type"], (example, spec, reference)
    assert spec["enum_values"] == reference["enum_values"], (example, spec, reference)
    if SHARED[flag]:
      assert spec["default"] == reference["default"], (example, spec, reference)


def test_the_shared_flags_mean_what_common_says(defined):
  resnet = defined["examples.resnet.train"]
  assert resnet["replicator"] == {"default": "multi_gpu", "type": "string enum", "enum_values": [
      "gpu", "multi_gpu", "tpu", "tpu_emulated"]}
  assert resnet["cpu_replicas"]["default"] == 2 and resnet["cpu_replicas"]["type"] == "int"
  assert resnet["tpu"] == {"default": None, "type": "string", "enum_values": None}
  assert resnet["global_batch_size"]["type"] == "int"
  assert resnet["workdir"]["type"] == "string" and resnet["log_every"]["type"] == "int"


@pytest.mark.parametrize("example", EXAMPLES)
def test_no_example_keeps_a_retired_flag_name(defined, example):
  kept = sorted(set(RETIRED) & set(defined[example]))
  assert not kept, f"{example} still defines {kept}"
