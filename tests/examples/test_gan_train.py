"""A few replicated training steps of the GAN, and the sweep end to end."""

import json
import logging
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import sonnet as snt
import tensorflow as tf

import replicator
from examples.gan import configs
from examples.gan import data
from examples.gan import gan_trainer
from examples.gan import report
from examples.gan import train

_TWO_CPUS = ["/cpu:0", "/cpu:1"]


def _variables(trainer):
  return (trainer.generator.variables + trainer.discriminator.variables +
          (trainer.step,))


@pytest.mark.slow
def test_imagenet128_at_reduced_width_trains_on_two_replicas(tmp_path):
  repl = replicator.MultiGpuReplicator(devices=_TWO_CPUS)
  config = configs.IMAGENET128.replace(
      g_ch=1, d_ch=1, num_classes=7, z_dim=8, global_batch_size=4, n_dis=2,
      num_generator_steps=1, dataset="synthetic")
  input_fn = data.make_input_fn("synthetic", config.global_batch_size,
                                resolution=128, channels=3, num_classes=7)
  trainer, _ = train.train(config, repl, workdir=str(tmp_path),
                           input_fn=input_fn, log_every=1)
  assert int(trainer.step.numpy()) == 1
  repl.assert_replicas_in_sync(_variables(trainer))
  # The generator's batch norm is cross-replica and its moving stats moved.
  bn = trainer.generator.blocks[0].bn1.norm
  assert isinstance(bn, replicator.nn.CrossReplicaBatchNorm)
  assert np.abs(bn.moving_variance.value.numpy() - 1).max() > 1e-3
  out = repl.run(trainer.discriminator_step, input_fn, steps=2)  # compiled: n_dis
  assert out["d_loss"].shape == (2,) and np.all(np.isfinite(out["d_loss"]))
  samples = trainer.sample(np.arange(3))
  assert samples.shape == (3, 128, 128, 3)
  checkpoints = replicator.Checkpointer(str(tmp_path / "checkpoints"),
                                       step=tf.Variable(0, dtype=tf.int64))
  assert checkpoints.latest_step == 1
  assert tf.io.gfile.glob(str(tmp_path / "events.out.tfevents.*"))
  repl.shutdown()


def test_every_replica_draws_different_noise():
  repl = replicator.MultiGpuReplicator(devices=_TWO_CPUS)
  config = configs.SMALL.replace(g_ch=2, d_ch=2, global_batch_size=4)
  trainer = gan_trainer.GanTrainer(config, repl, seed=3)
  z, labels = repl.run(lambda: trainer._noise_and_labels(64))  # pylint: disable=protected-access
  assert z.shape == (2, 64, config.z_dim)
  assert np.abs(z[0] - z[1]).min() > 0  # Not one sample repeated per replica.
  assert not np.array_equal(labels[0], labels[1])
  assert set(np.unique(labels)) <= set(range(config.num_classes))
  repl.shutdown()


ROOT = pathlib.Path(__file__).resolve().parents[2]

# The sweep three times in one process of its own (the suite's process has
# fixed its logical CPUs already): on the default 2 logical CPUs, then again
# (every run reused), then with other settings in the same workdir (refused).
_SWEEP_THRICE = """
import sys
from absl import app
from absl import flags
from examples.gan import sweep

def main(argv):
  del argv
  sweep.main([])
  print("=== again", file=sys.stderr, flush=True)
  sweep.main([])
  print("=== more steps", file=sys.stderr, flush=True)
  flags.FLAGS.num_generator_steps = 3
  try:
    sweep.main([])
  except ValueError as error:
    print(f"ValueError: {error}", file=sys.stderr, flush=True)

sweep.define_flags()
app.run(main)
"""


@pytest.mark.slow
def test_sweep_end_to_end_on_synthetic_data(tmp_path):
  argv = [
      "--preset=wide", "--dataset=synthetic", "--ch=2",
      "--num_generator_steps=2", "--batch_sizes=4", "--seeds=0",
      f"--workdir={tmp_path}", "--num_eval_samples=40",
      "--num_classifier_examples=256", "--num_real_examples=40",
      f"--cache_dir={tmp_path / 'cache'}", "--evals_per_run=2"]
  env = {k: v for k, v in os.environ.items() if k != "REPLICATOR_LOGICAL_CPUS"}
  env["CUDA_VISIBLE_DEVICES"] = ""
  done = subprocess.run([sys.executable, "-c", _SWEEP_THRICE, *argv], cwd=ROOT,
                        env=env, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  first, again, more_steps = done.stderr.split("=== ")
  results = json.loads((tmp_path / "results.json").read_text())
  assert results["batch_sizes"] == [4]
  assert [r["history"][-1]["step"] for r in results["runs"]] == [2]
  assert [h["step"] for h in results["runs"][0]["history"]] == [1, 2]
  for name in ("results.md", "quality_vs_batch_size.png",
               "quality_vs_steps.png", "quality_vs_real_images.png",
               "quality_last_vs_mean.png", "samples_by_batch_size.png"):
    assert (tmp_path / name).stat().st_size > 0
  # 2 generator steps x n_dis=2 x batch 4; mean over both evaluations.
  assert results["summary"]["4"]["real_images_seen"] == 16
  assert results["summary"]["4"]["mean_of_last"]["evaluations"] == 2
  assert str(tmp_path / "results.md") in done.stdout
  # The batch size is each run's, not the sweep's.
  assert "global_batch_size" not in results["config"]
  assert results["runs"][0]["settings"]["config"]["global_batch_size"] == 4
  # Which replicator, the plan, each run and its progress, in that order.
  order = ["MultiGpuReplicator: 2 replica(s) on 1 worker(s)",
           "plan: preset wide, 1 run (batch sizes 4 x seeds 0), 2 replica(s) each, config "
           "small on synthetic, 2 generator steps per run (n_dis=2), 2 "
           f"evaluations each of 40 samples; none finished yet; results in {tmp_path}",
           "metric classifier: training on 256 images",
           "run 1/1: batch 4, seed 0",
           "training steps 1-2 of 2: n_dis=2, global batch 4 = 2 replica(s) x 2",
           "step 1/2  d_loss", "(first interval, tracing included)  ETA at most ",
           "step 1/2 evaluated in ", "step 2/2  d_loss", "run 1/1 done in ",
           "runs done 1/1, elapsed "]
  positions = [first.find(line) for line in order]
  assert -1 not in positions, [o for o, p in zip(order, positions) if p == -1]
  assert positions == sorted(positions), first
  assert results["num_replicas"] == 2
  assert results["runs"][0]["settings"]["num_replicas"] == 2
  # Run again: nothing trains, and it says so.
  assert ("plan: preset wide, 1 run (batch sizes 4 x seeds 0), 2 replica(s) each" in again
          and "1 finished earlier, reused" in again)
  assert "run 1/1: batch 4, seed 0: finished at step 2 in an earlier sweep" in again
  assert "training steps" not in again and "metric classifier" not in again
  # The same workdir, another experiment.
  assert "ValueError: workdir: " in more_steps
  assert "num_generator_steps: 2 there, 3 now" in more_steps
  assert "run 1/1" not in more_steps


def _record(batch, seed, fcd):
  history = [{"step": s, "frechet_classifier_distance": fcd * (3 - s),
              "classifier_score": 1.0 + s, "class_accuracy": 0.1 * s}
             for s in (1, 2)]
  return {"global_batch_size": batch, "seed": seed, "wall_s": 1.0,
          "history": history}


def test_summary_table_and_plots_show_the_spread_over_seeds(tmp_path):
  records = [_record(16, 0, 9.0), _record(16, 1, 11.0),
             _record(256, 0, 2.0), _record(256, 1, 3.0)]
  summary = report.summarize(records)
  fcd = summary["16"]["frechet_classifier_distance"]
  assert fcd["values"] == [9.0, 11.0]
  assert (fcd["mean"], fcd["std"], fcd["min"], fcd["max"]) == (10.0, 1.0, 9.0, 11.0)
  table = report.markdown_table(summary, records)
  assert "| 16 | 2 | 10 ± 1 [9, 11] |" in table
  assert table.index("| 16 |") < table.index("| 256 |")
  report.plot_quality(summary, records, str(tmp_path), dataset="Fashion-MNIST",
                      num_classes=10, n_dis=2)
  report.plot_samples({16: np.zeros([4, 8, 8, 1]), 256: np.ones([4, 8, 8, 1])},
                      str(tmp_path), "title")
  for name in ("quality_vs_batch_size.png", "quality_vs_steps.png",
               "quality_vs_real_images.png", "quality_last_vs_mean.png",
               "samples_by_batch_size.png"):
    assert (tmp_path / name).stat().st_size > 1000


def test_plots_label_every_axis_and_mark_chance():
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  records = [_record(16, 0, 9.0), _record(256, 0, 2.0)]
  figures = report.quality_figures(report.summarize(records), records,
                                   dataset="Fashion-MNIST", num_classes=10)
  for figure in figures:
    title = figure._suptitle.get_text()  # pylint: disable=protected-access
    assert "Fashion-MNIST" in title and "2 generator steps" in title, title
    axes = figure.get_axes()
    assert len(axes) == 3
    for ax in axes:
      assert ax.get_ylabel() and ax.get_xlabel(), ax.get_title()
      assert ax.get_legend() is not None, ax.get_ylabel()
    chance = [line for line in axes[2].get_lines()
              if line.get_label().startswith("chance")]
    assert axes[2].get_ylabel() == "fraction classified as their class"
    assert len(chance) == 1 and chance[0].get_linestyle() == "--"
    assert list(chance[0].get_ydata()) == [0.1, 0.1]
    assert any(t.get_text().startswith("chance (0.1, 10 classes)")
               for t in axes[2].get_legend().get_texts())
    assert not any(line.get_label().startswith("chance")
                   for ax in axes[:2] for line in ax.get_lines())
    plt.close(figure)
  # Every sample at least 96 pixels wide: 32x32 images drawn 3x, 2 panels.
  images = np.linspace(-1, 1, 64 * 32 * 32).reshape([64, 32, 32, 1])
  figure = report.samples_figure({8: images, 64: images}, "title")
  width, height = figure.canvas.get_width_height()
  assert width >= 2 * 8 * 96 and height >= 8 * 96
  plt.close(figure)


def test_quality_per_real_image_seen_and_mean_of_last_evaluations():
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  records = [_record(16, 0, 9.0), _record(16, 1, 11.0), _record(256, 0, 2.0)]
  for record in records:
    record["settings"] = {"config": {"n_dis": 2, "num_classes": 10}}
  # Real images seen: generator steps x n_dis x global batch.
  assert report.real_images_seen(records[2], 2) == 2 * 2 * 256
  assert report.real_images_seen(_record(8, 0, 1.0), 3, n_dis=5) == 120
  summary = report.summarize(records, mean_of_last=2)
  last = summary["16"]["mean_of_last"]
  assert last["evaluations"] == 2
  # fcd(s) = f * (3 - s) at s = 1, 2: mean 1.5 f; seeds 9 and 11.
  assert last["frechet_classifier_distance"]["values"] == [13.5, 16.5]
  assert summary["16"]["frechet_classifier_distance"]["mean"] == 10.0  # last eval
  assert summary["16"]["real_images_seen"] == 2 * 2 * 16
  table = report.markdown_table(summary, records)
  header = table.splitlines()[0]
  assert header.index("classifier score (higher is better) |") < header.index(
      "real images seen per run") < header.index(
          "Fréchet classifier distance (lower is better), mean of last 2 "
          "evaluations")
  assert "| 16 | 2 | 10 ± 1 [9, 11] |" in table and "| 64 | 15 ± 1.5 [13.5, 16.5] |" in table
  assert "last evaluation" in table and "mean over its last 2" in table

  figure = report.real_images_figure(summary, records, dataset="Fashion-MNIST")
  axes = figure.get_axes()
  assert len(axes) == 3 and "per real image seen" in figure._suptitle.get_text()  # pylint: disable=protected-access
  for ax in axes:
    assert ax.get_xlabel().startswith("real images seen by the discriminator")
    assert "n_dis=2" in ax.get_xlabel() and ax.get_xscale() == "log"
    curves = {line.get_label(): list(line.get_xdata()) for line in ax.get_lines()
              if line.get_label().startswith("batch")}
    # One curve per batch size, at steps 1 and 2.
    assert curves == {"batch 16": [32, 64], "batch 256": [512, 1024]}
  plt.close(figure)
  figure = report.last_vs_mean_figure(summary, records)
  assert "last 2 evaluations" in figure._suptitle.get_text()  # pylint: disable=protected-access
  labels = [t.get_text() for t in figure.get_axes()[0].get_legend().get_texts()]
  assert any(t.startswith("last evaluation") for t in labels)
  assert any(t.startswith("mean of last 2 evaluations") for t in labels)
  plt.close(figure)


def _generator_step(devices, config, z, labels):
  """The generator's variables before and after one step, with fixed noise.

  Every replica takes its slice of the same global noise and labels, so N
  replicas and one device see the same global batch. Plain SGD: Adam's first
  step, about lr * sign(gradient), would blow float rounding of the
  near-zero gradients (biases before batch norm) up to full steps.
  """
  repl = replicator.MultiGpuReplicator(devices=devices)
  trainer = gan_trainer.GanTrainer(config, repl, seed=5)
  with repl.context():
    trainer.g_optimizer = repl.wrap_optimizer(snt.optimizers.SGD(1.0))

  def noise(per_replica):
    start = repl.replica_id * per_replica
    return (tf.slice(tf.constant(z), [start, 0], [per_replica, -1]),
            tf.slice(tf.constant(labels), [start], [per_replica]))

  trainer._noise_and_labels = noise  # pylint: disable=protected-access
  before = [v.numpy() for v in trainer.generator.trainable_variables]
  repl.run(trainer.generator_step)
  after = [v.numpy() for v in trainer.generator.trainable_variables]
  norm = trainer.generator.blocks[0].bn1.norm
  repl.shutdown()
  return before, after, norm


def _noise(config, size):
  rng = np.random.RandomState(0)
  return (rng.normal(size=(size, config.z_dim)).astype(np.float32),
          rng.randint(0, config.num_classes, size=size).astype(np.int32))


def test_two_replicas_update_the_generator_like_one_device_by_default():
  # The default config's generator batch norm is cross-replica, so splitting
  # the global batch over replicas leaves the update unchanged (per-replica
  # batch norm: 13% off). Oracle: one device on the whole batch. One block
  # each: compiling the step is most of the cost.
  config = configs.SMALL.replace(g_ch=2, d_ch=2, global_batch_size=8,
                                 g_multipliers=(2, 1), d_multipliers=(1, 1),
                                 d_downsample=(True, False))
  one = _generator_step(["/cpu:0"], config, *_noise(config, 8))
  two = _generator_step(_TWO_CPUS, config, *_noise(config, 8))
  assert isinstance(two[2], replicator.nn.CrossReplicaBatchNorm)
  update = lambda run: np.concatenate(
      [(a - b).ravel() for a, b in zip(run[1], run[0])])
  relative = (np.linalg.norm(update(two) - update(one)) /
              np.linalg.norm(update(one)))
  assert relative < 1e-4
  # On one replica the default's batch norm is snt.BatchNorm's to the bit, so
  # README's one-device figures do not depend on --cross_replica_bn.
  plain = _generator_step(["/cpu:0"], config.replace(cross_replica_bn=False),
                          *_noise(config, 8))
  assert type(plain[2]) is snt.BatchNorm  # pylint: disable=unidiomatic-typecheck
  for got, want in zip(one[1], plain[1]):
    np.testing.assert_array_equal(got, want)


def test_resumed_trainer_draws_the_noise_of_the_uninterrupted_run(tmp_path):
  config = configs.SMALL.replace(g_ch=1, d_ch=1, global_batch_size=4)
  repl = replicator.MultiGpuReplicator(devices=_TWO_CPUS)
  trainer = gan_trainer.GanTrainer(config, repl, seed=0)
  checkpointer = gan_trainer.restore(trainer, str(tmp_path))
  first = repl.run(lambda: trainer._noise_and_labels(3))  # pylint: disable=protected-access
  checkpointer.save(1)
  uninterrupted = repl.run(lambda: trainer._noise_and_labels(3))  # pylint: disable=protected-access
  repl.shutdown()

  repl = replicator.MultiGpuReplicator(devices=_TWO_CPUS)
  resumed = gan_trainer.GanTrainer(config, repl, seed=0)
  gan_trainer.restore(resumed, str(tmp_path))
  draw = repl.run(lambda: resumed._noise_and_labels(3))  # pylint: disable=protected-access
  repl.shutdown()
  for got, want, replayed in zip(draw, uninterrupted, first):
    np.testing.assert_array_equal(got, want)
    assert not np.array_equal(got, replayed)


def test_a_resumed_run_goes_on_at_the_step_after_its_checkpoint(tmp_path, caplog):
  # One block each and one device: tracing the steps is most of the cost.
  config = configs.SMALL.replace(dataset="synthetic", g_ch=1, d_ch=1,
                                 global_batch_size=2, g_multipliers=(2, 1),
                                 d_multipliers=(1, 1), d_downsample=(True, False))
  input_fn = data.make_input_fn("synthetic", 2, resolution=8, channels=1,
                                num_classes=10)

  def run(steps):
    """(G steps, G and D optimizer steps) after `steps`, and the evaluated steps."""
    repl = replicator.GpuReplicator()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="absl"):
      trainer, history = train.train(
          config.replace(num_generator_steps=steps), repl, workdir=str(tmp_path),
          input_fn=input_fn, log_every=1, eval_every=1, checkpoint_every=1,
          evaluator=lambda t: {"frechet_classifier_distance": float(t.step.numpy())})
    counts = (int(trainer.step.numpy()), int(trainer.g_optimizer.optimizer.step.numpy()),
              int(trainer.d_optimizer.optimizer.step.numpy()))
    repl.shutdown()
    return counts, [h["step"] for h in history]

  assert run(2) == ((2, 2, 4), [1, 2])
  assert "restored step" not in caplog.text
  assert "training steps 1-2 of 2" in caplog.text
  assert "step 1/2  d_loss" in caplog.text and "(first interval, tracing included)" in caplog.text
  assert "ETA" in caplog.text and "step 1/2 evaluated in" in caplog.text
  # save(2) after 2 steps: the resumed run takes step 3 only, once; its
  # evaluations of steps 1 and 2 come back from metrics.json.
  assert run(3) == ((3, 3, 6), [1, 2, 3])
  assert f"restored step 2 from {tmp_path / 'checkpoints'}" in caplog.text
  assert "training steps 3-3 of 3" in caplog.text and "step 3/3  d_loss" in caplog.text
  assert "step 2/3" not in caplog.text
  # Finished: nothing trains, and it says so.
  assert run(3) == ((3, 3, 6), [1, 2, 3])
  assert "restored step 3" in caplog.text
  assert "finished at step 3/3" in caplog.text and "nothing to train" in caplog.text
  assert "d_loss" not in caplog.text
  with pytest.raises(ValueError, match=r"num_generator_steps: the checkpoint in "
                     r".* is at step 3, past the 2 steps asked for"):
    run(2)


def test_checkpoint_without_the_noise_generator_still_restores(tmp_path, caplog):
  # Written before the noise generator was checkpointed.
  config = configs.SMALL.replace(g_ch=1, d_ch=1, global_batch_size=4)
  repl = replicator.MultiGpuReplicator(devices=["/cpu:0"])
  old = gan_trainer.GanTrainer(config, repl, seed=0)
  old.step.assign(7)
  replicator.Checkpointer(
      str(tmp_path), generator=old.generator, discriminator=old.discriminator,
      g_optimizer=old.g_optimizer.optimizer,
      d_optimizer=old.d_optimizer.optimizer, step=old.step).save(7)
  fresh = gan_trainer.GanTrainer(config, repl, seed=0)
  with caplog.at_level("WARNING"):
    checkpointer = gan_trainer.restore(fresh, str(tmp_path))
  assert int(fresh.step.numpy()) == 7
  assert "has no ['rng']" in caplog.text
  fresh.step.assign(8)
  checkpointer.save(8)  # From now on with the noise generator.
  again = gan_trainer.GanTrainer(config, repl, seed=0)
  caplog.clear()
  with caplog.at_level("WARNING"):
    gan_trainer.restore(again, str(tmp_path))
  assert int(again.step.numpy()) == 8 and "has no" not in caplog.text
  repl.shutdown()
