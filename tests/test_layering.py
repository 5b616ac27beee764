"""The package's imports point one way (CONTRIBUTING.md, "Layout"); examples use the public API."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "replicator"

# A module may import the modules of its own package (without cycles) and the
# packages and modules of a lower layer, never of its own layer or above.
LAYERS = {
    "_tf_check": 0, "errors": 0, "mesh": 0,
    "collectives": 1,                      # the replica interface; reductions between replicas and workers
    "inputs": 2, "multiworker": 2,         # input pipelines; the job's other workers
    "variables": 3,                        # what both engines share about variables
    "patches": 4,                          # TensorFlow / Keras, replica-aware
    "nn": 5, "optimizers": 5,
    "engines": 5,                          # the in-graph engine and the strategy engine (TPUs)
    "base": 6,                             # `Replicator`, written once
    "gpu": 7, "tpu": 7,
    "launch_supervisor": 7,                # the launcher's processes, below its command line
    "checkpoint_files": 7,                 # a checkpoint's files, below Checkpointer
    "checkpoint": 8, "launch": 8, "testing": 8,  # testing builds a TpuReplicator
    "__init__": 9,
}


def _unit(path: pathlib.Path) -> str:
  """The package (or top-level module) that `path` belongs to."""
  parts = path.relative_to(PACKAGE).with_suffix("").parts
  return parts[0]


def _module(path: pathlib.Path) -> str:
  return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def _imports(path):
  """The `replicator...` modules that `path` imports, dotted."""
  tree = ast.parse(path.read_text())
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module:
      if node.module == "replicator" or node.module.startswith("replicator."):
        for alias in node.names:
          candidate = f"{node.module}.{alias.name}"
          is_module = (ROOT / (candidate.replace(".", "/") + ".py")).exists() or (
              ROOT / candidate.replace(".", "/")).is_dir()
          yield candidate if is_module else node.module
    elif isinstance(node, ast.Import):
      for alias in node.names:
        if alias.name.startswith("replicator."):
          yield alias.name


def _sources():
  return sorted(PACKAGE.rglob("*.py"))


def test_every_package_and_module_has_a_layer():
  assert {_unit(p) if len(p.relative_to(PACKAGE).parts) > 1 else p.stem
          for p in _sources()} == set(LAYERS)


def test_imports_point_down_the_layers():
  for path in _sources():
    if path.name == "__init__.py" and path.parent == PACKAGE:
      continue  # the public API imports from everywhere
    unit = _unit(path) if len(path.relative_to(PACKAGE).parts) > 1 else path.stem
    for imported in _imports(path):
      parts = imported.split(".")
      if len(parts) < 2:
        continue
      target = parts[1]
      if target == unit:
        continue  # within a package: checked for cycles below
      assert LAYERS[target] < LAYERS[unit], (
          f"{path.relative_to(ROOT)} imports {imported}, of the same or a "
          f"higher layer ({target}: {LAYERS[target]}, {unit}: {LAYERS[unit]})")


def test_no_cycles_within_a_package():
  graph = {}
  for path in _sources():
    graph[_module(path)] = {m for m in _imports(path) if m != _module(path)}
  state = {}

  def visit(module, trail):
    if state.get(module) == "done":
      return
    assert state.get(module) != "open", "import cycle: " + " -> ".join(trail + [module])
    state[module] = "open"
    for imported in graph.get(module, ()):
      visit(imported, trail + [module])
    state[module] = "done"

  for module in graph:
    visit(module, [])


def test_no_module_over_400_lines():
  long = {str(p.relative_to(ROOT)): n for p in _sources()
          if (n := len(p.read_text().splitlines())) > 400}
  assert not long, f"split these by what they do: {long}"


def test_tests_mirror_the_packages():
  packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
  folders = {p.name for p in (ROOT / "tests").iterdir()
             if p.is_dir() and any(p.rglob("test_*.py"))}
  assert packages <= folders, f"no tests/<package>/ for {sorted(packages - folders)}"


def test_examples_and_benchmarks_use_only_the_public_api():
  public = {"replicator", "replicator.nn", "replicator.testing", "replicator.launch"}
  for folder in ("examples", "benchmarks"):
    for path in (ROOT / folder).rglob("*.py"):
      for imported in _imports(path):
        assert imported in public, (
            f"{path.relative_to(ROOT)} imports {imported}; use the public API "
            "(import replicator)")
