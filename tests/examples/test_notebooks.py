"""The Colab TPU notebooks: valid nbformat 4, and every code cell runs on a CPU.

Each notebook reads REPLICATOR_NOTEBOOK_SMOKE=1 in an early cell and then runs
with tiny settings on `TpuReplicator` emulated on 2 CPU devices, writing to
REPLICATOR_NOTEBOOK_WORKDIR. The test runs its code cells in order, in one
fresh Python process (as one kernel would), without Jupyter or nbformat.
"""

import json
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOKS = {
    "gan": ROOT / "examples" / "gan" / "colab_tpu.ipynb",
    "resnet": ROOT / "examples" / "resnet" / "colab_tpu.ipynb",
}
FASHION_MNIST = pathlib.Path("/usr/share/datasets/fashion-mnist")

# Runs the cells (JSON in argv[1]) in one namespace, as a kernel would, each
# compiled under its own name so that a traceback names the cell.
_KERNEL = """
import json
import sys

namespace = {"__name__": "__main__"}
for name, source in json.loads(sys.argv[1]):
  print(f"=== cell {name}", flush=True)
  exec(compile(source, f"<cell {name}>", "exec"), namespace)
"""


def _load(name):
  with open(NOTEBOOKS[name], encoding="utf-8") as f:
    return json.load(f)


def _code_cells(notebook):
  return [(cell["id"], "".join(cell["source"])) for cell in notebook["cells"]
          if cell["cell_type"] == "code"]


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_notebook_is_nbformat_4_for_colab_with_clean_cells(name):
  notebook = _load(name)
  assert notebook["nbformat"] == 4 and notebook["nbformat_minor"] >= 5
  metadata = notebook["metadata"]
  assert metadata["kernelspec"]["name"] == "python3"
  assert metadata["kernelspec"]["display_name"]
  assert metadata["accelerator"] == "TPU"
  assert isinstance(metadata["colab"], dict)
  ids = [cell["id"] for cell in notebook["cells"]]
  assert len(set(ids)) == len(ids)
  assert all(re.fullmatch(r"[A-Za-z0-9_-]{1,64}", cell_id) for cell_id in ids)
  for cell in notebook["cells"]:
    assert cell["cell_type"] in ("markdown", "code"), cell["id"]
    assert isinstance(cell["metadata"], dict)
    source = cell["source"]
    assert isinstance(source, list) and source, cell["id"]
    assert all(isinstance(line, str) for line in source)
    # Jupyter's own layout: one line per item, the last without its newline.
    assert all(line.endswith("\n") for line in source[:-1]), cell["id"]
    assert "\n" not in source[-1], cell["id"]
    if cell["cell_type"] == "code":
      # Committed without outputs, and plain Python: no shell escapes or magics.
      assert cell["outputs"] == [] and cell["execution_count"] is None, cell["id"]
      assert not [line for line in source if line.lstrip().startswith(("!", "%"))]
      compile("".join(source), cell["id"], "exec")
  first = "".join(notebook["cells"][0]["source"])
  assert notebook["cells"][0]["cell_type"] == "markdown"
  assert "has not run this notebook on a real TPU" in first
  # The smoke switch is read before anything is installed or run.
  code = _code_cells(notebook)
  assert 'os.environ.get("REPLICATOR_NOTEBOOK_SMOKE") == "1"' in code[0][1]
  assert "colab_tpu.py" not in json.dumps(notebook)


def _run_smoke(name, tmp_path, **env_vars):
  """Runs the notebook's code cells in smoke mode; returns (stdout, work, seconds)."""
  if not FASHION_MNIST.is_dir():
    pytest.skip(f"no Fashion-MNIST in {FASHION_MNIST} (apt-get install "
                "dataset-fashion-mnist)")
  work, cwd = tmp_path / "work", tmp_path / "cwd"
  work.mkdir()
  cwd.mkdir()
  env = {k: v for k, v in os.environ.items() if k != "REPLICATOR_LOGICAL_CPUS"}
  env.update(CUDA_VISIBLE_DEVICES="", REPLICATOR_NOTEBOOK_SMOKE="1",
             REPLICATOR_NOTEBOOK_WORKDIR=str(work),
             PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
             **env_vars)
  cells = json.dumps(_code_cells(_load(name)))
  start = time.monotonic()
  done = subprocess.run([sys.executable, "-c", _KERNEL, cells], cwd=cwd, env=env,
                        capture_output=True, text=True, timeout=600)
  seconds = time.monotonic() - start
  assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
  assert not list(cwd.iterdir())  # everything went to the work directory
  assert "pip install" not in done.stdout  # the install cell skips itself
  return done.stdout, work, seconds


def _in_order(text, lines):
  positions = [text.find(line) for line in lines]
  assert -1 not in positions, [line for line, p in zip(lines, positions) if p == -1]
  assert positions == sorted(positions), text[-4000:]


# The TPU's engine, emulated on a stand-in strategy over 2 logical CPU devices.
_EMULATED = ("TpuReplicator: 2 replica(s) on 1 worker(s); this worker's devices: "
             "CPU:0, CPU:1")


@pytest.mark.slow
def test_gan_notebook_runs_in_smoke_mode(tmp_path):
  out, work, seconds = _run_smoke("gan", tmp_path)
  print(f"gan notebook, smoke mode: {seconds:.0f} s")
  small = work / "gan_small"
  _in_order(out, [
      f"smoke mode: --replicator=tpu_emulated --cpu_replicas=2; repository {ROOT}; "
      f"results under {work}",
      f"smoke mode: no clone or install; the checkout at {ROOT}",
      _EMULATED, "num_replicas: 2",
      "-m examples.gan.sweep --config=small --replicator=tpu_emulated",
      "plan: preset small, 1 run (batch sizes 4 x seeds 0), 2 replica(s) each, config small on "
      "fashion_mnist, 1 generator steps per run",
      "run 1/1: batch 4, seed 0",
      "| global batch | seeds | Fréchet classifier distance (lower is better) |",
      "| 4 | 1 |",
      f"Results in {small}",
      f"figure: {small / 'quality_vs_batch_size.png'}",
      f"figure: {small / 'quality_vs_real_images.png'}",
      f"figure: {small / 'quality_last_vs_mean.png'}",
      f"figure: {small / 'samples_by_batch_size.png'}",
      "smoke mode: the imagenet128 sweep is skipped",
      f"no imagenet128 results in {work / 'gan_imagenet128'} yet"])
  results = json.loads((small / "results.json").read_text())
  assert results["replicator"] == "tpu_emulated" and results["num_replicas"] == 2
  assert results["batch_sizes"] == [4] and results["num_generator_steps"] == 1
  assert (work / "gan_classifier_cache").is_dir()


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("REPLICATOR_NOTEBOOK_SMOKE_IMAGENET128") != "1",
    reason="about 2 minutes (the Inception path on synthetic data): run with "
    "REPLICATOR_NOTEBOOK_SMOKE_IMAGENET128=1")
def test_gan_notebook_runs_its_imagenet128_cell_on_synthetic_data(tmp_path):
  out, work, seconds = _run_smoke("gan", tmp_path,
                                  REPLICATOR_NOTEBOOK_SMOKE_IMAGENET128="1")
  print(f"gan notebook, smoke mode with imagenet128: {seconds:.0f} s")
  imagenet = work / "gan_imagenet128"
  _in_order(out, [
      "-m examples.gan.sweep --config=small", f"Results in {work / 'gan_small'}",
      "-m examples.gan.sweep --config=imagenet128 --replicator=tpu_emulated",
      "config imagenet128 on synthetic, 1 generator steps per run (n_dis=5)",
      "| global batch | seeds | Fréchet Inception Distance (lower is better) |",
      f"Results in {imagenet}",
      f"figure: {imagenet / 'samples_by_batch_size.png'}"])
  results = json.loads((imagenet / "results.json").read_text())
  assert results["config"]["name"] == "imagenet128"
  assert results["config"]["g_ch"] == 1 and results["config"]["num_classes"] == 1000
  assert set(results["runs"][0]["history"][-1]) == {
      "step", "inception_score", "frechet_inception_distance"}


_LIBTPU_RELEASES = "https://storage.googleapis.com/libtpu-tf-releases/index.html"


def _install_commands(name, tensorflow_imports, tmp_path, installs_tensorflow=True):
  """The commands the install cell runs on a runtime (not in smoke mode), recorded.

  Its `python -c` check that TensorFlow imports exits 0 if `tensorflow_imports`,
  or once a pip command has installed tensorflow-tpu (if `installs_tensorflow`);
  nothing runs, nothing is downloaded.
  """
  source = dict(_code_cells(_load(name)))["install"]
  commands, installed = [], [tensorflow_imports]

  def run(command, cwd=None, check=True):
    commands.append(list(command))
    if command[1] == "-c":
      return (0 if installed[0] else 1), []
    if "tensorflow-tpu==2.20.*" in command and installs_tensorflow:
      installed[0] = True
    return 0, []

  namespace = {"__name__": "__main__", "SMOKE": False, "REPO": str(ROOT), "REPO_URL": "",
               "WORK": str(tmp_path), "os": os, "sys": sys, "run": run}
  exec(compile(source, f"<cell install of {name}>", "exec"), namespace)  # pylint: disable=exec-used
  return commands, namespace


_REPOSITORY = [sys.executable, "-m", "pip", "install", "-q", "-e", f"{ROOT}[examples]"]


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_install_cell_keeps_a_tensorflow_that_imports(name, tmp_path):
  commands, namespace = _install_commands(name, True, tmp_path)
  check = [sys.executable, "-c", namespace["IMPORT_TENSORFLOW"]]
  assert commands == [check, _REPOSITORY]
  # No pip command names a TensorFlow.
  assert not [command for command in commands if command[1:3] == ["-m", "pip"]
              and any("tensorflow" in arg or "[tf" in arg for arg in command)]


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_install_cell_without_tensorflow_installs_tensorflow_tpu_2_20_then_the_repository(
    name, tmp_path):
  commands, namespace = _install_commands(name, False, tmp_path)
  check = [sys.executable, "-c", namespace["IMPORT_TENSORFLOW"]]
  assert commands == [
      check,
      [sys.executable, "-m", "pip", "install", "-q", "tensorflow-tpu==2.20.*",
       "-f", _LIBTPU_RELEASES],
      check,
      _REPOSITORY]
  # Never an extra that installs a second TensorFlow over tensorflow-tpu.
  assert not [arg for command in commands for arg in command if "[tf" in arg]


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_install_cell_stops_when_tensorflow_tpu_does_not_import(name, tmp_path):
  with pytest.raises(RuntimeError, match="yet `import tensorflow` still fails"):
    _install_commands(name, False, tmp_path, installs_tensorflow=False)


def test_both_notebooks_install_alike():
  gan, resnet = (dict(_code_cells(_load(name)))["install"] for name in ("gan", "resnet"))
  assert gan == resnet


def test_install_cells_check_that_tensorflow_imports_in_a_child_process(tmp_path):
  """The check itself, run: 0 where TensorFlow imports (here), 1 where it fails."""
  _, namespace = _install_commands("gan", True, tmp_path)
  script = namespace["IMPORT_TENSORFLOW"]
  here = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                        cwd=tmp_path, timeout=300)
  assert here.returncode == 0 and "TensorFlow 2." in here.stdout, here.stderr[-2000:]
  broken = tmp_path / "broken"
  (broken / "tensorflow").mkdir(parents=True)
  (broken / "tensorflow" / "__init__.py").write_text("raise ImportError('no libtpu')\n")
  env = {**os.environ, "PYTHONPATH": str(broken)}
  fails = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         cwd=tmp_path, env=env, timeout=300)
  assert fails.returncode == 1 and "import tensorflow fails here" in fails.stderr
