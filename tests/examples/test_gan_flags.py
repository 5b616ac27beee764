"""The GAN scripts' flags are checked before anything trains; sweep records match."""

import doctest
import json
import os
import shutil
import subprocess

from absl import flags
from absl.testing import flagsaver
import pytest

import replicator
from examples import common
from examples.gan import configs
from examples.gan import gan_trainer
from examples.gan import metric_classifier
from examples.gan import metrics
from examples.gan import sweep
from examples.gan import train

FLAGS = flags.FLAGS


@pytest.fixture(name="parse")
def _parse(monkeypatch):
  """Parses a command line; building a replicator or an evaluator then fails the test."""
  if "batch_sizes" not in FLAGS:
    sweep.define_flags()  # The example defines its flags only as a script.

  def trained(*args, **kwargs):
    raise AssertionError("got as far as training")

  monkeypatch.setattr(common, "make_replicator", trained)
  monkeypatch.setattr(train.metrics, "Evaluator", trained)
  with flagsaver.flagsaver():
    yield lambda *argv: FLAGS(["prog", "--dataset=synthetic",
                               "--noclassifier_metrics", *argv])


@pytest.mark.parametrize("argv, message", [
    (["--n_dis=0"], r"n_dis: must be a positive integer, got 0\. Pass --n_dis="),
    (["--global_batch_size=0"], r"global_batch_size: .* got 0"),
    (["--global_batch_size=-4"], r"global_batch_size: .* got -4"),
    (["--log_every=0"], r"log_every: .* got 0\. Pass --log_every=N"),
    (["--checkpoint_every=0"], r"checkpoint_every: .* got 0"),
    (["--ch=0"], r"ch: .* got 0\. Pass --ch=N"),
    (["--num_generator_steps=0"], r"num_generator_steps: .* got 0"),
])
def test_train_refuses_bad_flags_before_training(parse, argv, message):
  parse(*argv)
  with pytest.raises(ValueError, match=message):
    train.main([])


@pytest.mark.parametrize("argv, message", [
    (["--evals_per_run=0"], r"evals_per_run: .* got 0"),
    (["--num_generator_steps=0"], r"num_generator_steps: .* got 0"),
    (["--n_dis=-1"], r"n_dis: .* got -1"),
    (["--grid_class=10"], r"grid_class: 10 is not a class of synthetic \(10 "
     r"classes\); pass --grid_class between 0 and 9"),
    (["--grid_class=-1"], r"grid_class: -1 is not a class"),
    (["--batch_sizes=4,x"], r"batch_sizes: .* got --batch_sizes=4,x; e\.g\."),
    (["--batch_sizes=0"], r"batch_sizes: expected .* integers >= 1"),
    (["--seeds=-1"], r"seeds: expected .* integers >= 0"),
    (["--global_batch_size=32"], r"global_batch_size: the sweep sets each run's "
     r"batch size itself, so --global_batch_size=32 would be ignored\. Use "
     r"--batch_sizes"),
    (["--seed=3"], r"seed: .* --seed=3 would be ignored\. Use --seeds"),
    ([], r"classifier_metrics: the sweep compares runs by their metrics, and "
     r"--noclassifier_metrics without --inception_weights leaves none"),
])
def test_sweep_refuses_bad_or_ignored_flags_before_training(
    parse, tmp_path, argv, message):
  parse(f"--workdir={tmp_path}", *argv)
  with pytest.raises(ValueError, match=message):
    sweep.main([])


def test_sweep_takes_the_common_flags_and_a_git_ignored_workdir(parse, tmp_path):
  # --workdir, --replicator and --cpu_replicas are the sweep's own (the names
  # every example shares): it gets as far as making the replicator.
  parse(f"--workdir={tmp_path}", "--classifier_metrics", "--replicator=gpu",
        "--cpu_replicas=3")
  with pytest.raises(AssertionError, match="got as far as training"):
    sweep.main([])
  assert "num_cpu_devices" not in FLAGS and "results_dir" not in FLAGS
  root = train.REPO_ROOT
  assert sweep.default_workdir("small") == os.path.join(root, "results", "gan", "small")
  config = configs.SMALL
  assert train.default_workdir(config, 0) == os.path.join(
      root, "results", "gan", "train", "small_batch64_seed0")
  if shutil.which("git") is None or not os.path.isdir(os.path.join(root, ".git")):
    pytest.skip("not a git checkout")
  for path in (sweep.default_workdir("small"), train.default_workdir(config, 0)):
    # README line 1 must leave `git status` clean: the results are ignored.
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", os.path.join(path, "runs", "x", "record.json")],
        cwd=root, check=False)
    assert ignored.returncode == 0, f"{path} is not git-ignored"


def test_wide_preset_sets_the_papers_batch_range_unless_flags_are_given(
    parse, tmp_path):
  # The default sweep is the `small` preset; `wide` is the paper's range on the
  # same config, steps and metrics, in results/gan/wide (git-ignored).
  small, wide = sweep.PRESETS["small"], sweep.PRESETS["wide"]
  assert small.batch_sizes == tuple(int(b) for b in FLAGS["batch_sizes"].default)
  assert small.seeds == tuple(int(s) for s in FLAGS["seeds"].default)
  assert wide.batch_sizes == (8, 16, 32, 64, 128, 256, 512)
  assert wide.seeds == (0, 1) and wide.config == small.config == "small"
  parse(f"--workdir={tmp_path}", "--classifier_metrics", "--preset=wide")
  with pytest.raises(AssertionError, match="got as far as training"):
    sweep.main([])
  assert FLAGS.batch_sizes == ["8", "16", "32", "64", "128", "256", "512"]
  assert FLAGS.seeds == ["0", "1"] and FLAGS.config == "small"
  assert train.config_from_flags().num_generator_steps == 500
  # A flag given on the command line wins over the preset's.
  parse(f"--workdir={tmp_path}", "--classifier_metrics", "--preset=wide",
        "--batch_sizes=4", "--seeds=3")
  with pytest.raises(AssertionError, match="got as far as training"):
    sweep.main([])
  assert FLAGS.batch_sizes == ["4"] and FLAGS.seeds == ["3"]
  parse(f"--workdir={tmp_path}", "--mean_of_last=0")
  with pytest.raises(ValueError, match=r"mean_of_last: .* got 0"):
    sweep.main([])
  root = train.REPO_ROOT
  workdir = sweep.default_workdir("wide")
  assert workdir == os.path.join(root, "results", "gan", "wide")
  if shutil.which("git") and os.path.isdir(os.path.join(root, ".git")):
    assert subprocess.run(
        ["git", "check-ignore", "-q", os.path.join(workdir, "runs", "x", "a")],
        cwd=root, check=False).returncode == 0


def test_batch_that_does_not_split_over_the_replicas_says_the_fix():
  repl = replicator.MultiGpuReplicator(devices=["/cpu:0", "/cpu:1", "/cpu:2",
                                                "/cpu:3"])
  config = configs.SMALL.replace(g_ch=1, d_ch=1, global_batch_size=6)
  with pytest.raises(ValueError, match=r"global_batch_size: 6 does not split "
                     r"over 4 replicas\. Pass a --global_batch_size .* multiple "
                     r"of 4"):
    gan_trainer.GanTrainer(config, repl)
  repl.shutdown()


def _settings(config, **changes):
  evaluation = {"num_eval_samples": 40, "num_real_examples": 40,
                "num_classifier_examples": 256, "classifier_metrics": True,
                "inception_weights": None}
  arguments = dict(config=config, data_kwargs={"resolution": 32}, seed=0,
                   eval_every=1, evaluation=evaluation, grid_class=1,
                   num_replicas=1)
  arguments.update(changes)
  return sweep.run_settings(**arguments)


def test_sweep_reuses_only_a_finished_run_made_with_the_same_settings(tmp_path):
  config = configs.SMALL.replace(dataset="synthetic", g_ch=1, d_ch=1,
                                 global_batch_size=4, num_generator_steps=2)
  workdir = tmp_path / "runs" / "batch4_seed0"
  workdir.mkdir(parents=True)
  record = {"global_batch_size": 4, "seed": 0, "wall_s": 1.0,
            "history": [{"step": 2, "frechet_classifier_distance": 7.0}],
            "settings": _settings(config)}
  (workdir / "record.json").write_text(json.dumps(record))

  def run(config, **changes):
    # Raises before training if the record does not match (no replicator,
    # no evaluator: either would fail here).
    return sweep.run_one(config, None, {"resolution": 32}, str(workdir), 0, 1,
                         settings=_settings(config, **changes),
                         workdir=str(tmp_path), log_every=1,
                         checkpoint_every=2, grid_class=1)

  assert run(config) == record
  with pytest.raises(ValueError, match=(
      rf"workdir: {tmp_path} already holds a finished run .*"
      r"config\.num_generator_steps: 2 there, 4 now.*Pass another "
      rf"--workdir, or delete {tmp_path / 'runs'}")):
    run(config.replace(num_generator_steps=4))
  with pytest.raises(ValueError, match=r"config\.n_dis: 2 there, 5 now; "
                     r"config\.num_generator_steps: 2 there, 3 now"):
    run(config.replace(num_generator_steps=3, n_dis=5))
  with pytest.raises(ValueError, match=r"evaluation\.num_eval_samples: 40 "
                     r"there, 2000 now"):
    run(config, evaluation={**_settings(config)["evaluation"],
                            "num_eval_samples": 2000})
  with pytest.raises(ValueError, match=r"grid_class: 1 there, 3 now"):
    run(config, grid_class=3)
  # Each replica draws its own noise: another replica count is another run.
  with pytest.raises(ValueError, match=r"num_replicas: 1 there, 2 now"):
    run(config, num_replicas=2)
  del record["settings"]  # Written before settings were recorded.
  (workdir / "record.json").write_text(json.dumps(record))
  with pytest.raises(ValueError, match=r"the record predates recorded settings"):
    run(config)


@pytest.mark.parametrize("module", [sweep, metric_classifier, metrics])
def test_docstring_examples_run(module):
  failures, tried = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
  assert tried > 0 and failures == 0
