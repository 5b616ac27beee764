"""The package's imports point one way (STYLE.md); examples use the public API."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]

# A module may import only modules of a lower layer.
LAYERS = {
    "_tf_check": 0, "mesh": 0, "autograph_rules": 0, "same_values": 0,
    "between_workers": 1, "cluster": 1, "packing": 1, "reduce_options": 1,
    "collectives": 2,
    "context": 3, "gathering": 3, "peers": 3, "variable_registry": 3,
    "variables": 4, "replica_ops": 4, "inputs": 4, "resume": 4,
    "randomness": 5, "nested_functions": 5, "optimizers": 5,
    "step_args": 5, "step_errors": 5, "step_fetch": 5,
    "input_streams": 5, "divergence": 5, "variable_creation": 5,
    "steps": 6, "keras_compat": 6,
    "base": 7,
    "testing": 7,
    "gpu": 8, "tpu": 8, "nn": 8, "checkpoint": 8,
    "launch": 9,
    "__init__": 10,
}


def _imports(path):
  tree = ast.parse(path.read_text())
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module:
      if node.module == "replicator":
        yield from (alias.name for alias in node.names)
      elif node.module.startswith("replicator."):
        yield node.module.split(".")[1]
    elif isinstance(node, ast.Import):
      for alias in node.names:
        if alias.name.startswith("replicator."):
          yield alias.name.split(".")[1]


def test_every_module_has_a_layer():
  modules = {p.stem for p in (ROOT / "replicator").glob("*.py")}
  assert modules == set(LAYERS)


def test_imports_point_down_the_layers():
  for path in (ROOT / "replicator").glob("*.py"):
    for imported in _imports(path):
      assert LAYERS[imported] < LAYERS[path.stem], (
          f"replicator/{path.name} imports replicator.{imported}, a module of "
          "the same or a higher layer")


def test_examples_and_benchmarks_use_only_the_public_api():
  public = {"nn", "testing", "launch"}
  for folder in ("examples", "benchmarks"):
    for path in (ROOT / folder).rglob("*.py"):
      for imported in _imports(path):
        assert imported in public or imported[0].isupper(), (
            f"{path.relative_to(ROOT)} imports replicator.{imported}; use the "
            "public API (import replicator)")
