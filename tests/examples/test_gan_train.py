"""A few replicated training steps of the GAN, and the sweep end to end."""

import json

from absl import flags
from absl.testing import flagsaver
import numpy as np
import pytest
import tensorflow as tf

import replicator
from examples.gan import configs
from examples.gan import data
from examples.gan import sweep
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
  out = repl.run(trainer.discriminator_step, input_fn)
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
  trainer = train.GanTrainer(config, repl, seed=3)
  z, labels = repl.run(lambda: trainer._noise_and_labels(64))  # pylint: disable=protected-access
  assert z.shape == (2, 64, config.z_dim)
  assert np.abs(z[0] - z[1]).min() > 0  # Not one sample repeated per replica.
  assert not np.array_equal(labels[0], labels[1])
  assert set(np.unique(labels)) <= set(range(config.num_classes))
  repl.shutdown()


@pytest.mark.slow
def test_sweep_end_to_end_on_synthetic_data(tmp_path, capsys):
  if "batch_sizes" not in flags.FLAGS:
    sweep.define_flags()  # The example defines its flags only as a script.
  with flagsaver.flagsaver():
    flags.FLAGS([
        "sweep", "--config=small", "--dataset=synthetic", "--ch=2", "--replicator=gpu",
        "--num_generator_steps=2", "--batch_sizes=4", "--seeds=0",
        f"--results_dir={tmp_path}", "--num_eval_samples=40",
        "--num_classifier_examples=256", "--num_real_examples=40",
        f"--cache_dir={tmp_path / 'cache'}", "--evals_per_run=2"])
    sweep.main([])
  results = json.loads((tmp_path / "results.json").read_text())
  assert results["batch_sizes"] == [4]
  assert [r["history"][-1]["step"] for r in results["runs"]] == [2]
  assert [h["step"] for h in results["runs"][0]["history"]] == [1, 2]
  for name in ("results.md", "quality_vs_batch_size.png",
               "quality_vs_steps.png", "samples_by_batch_size.png"):
    assert (tmp_path / name).stat().st_size > 0
  assert str(tmp_path / "results.md") in capsys.readouterr().out


def _record(batch, seed, fcd):
  history = [{"step": s, "frechet_classifier_distance": fcd * (3 - s),
              "classifier_score": 1.0 + s} for s in (1, 2)]
  return {"global_batch_size": batch, "seed": seed, "wall_s": 1.0,
          "history": history}


def test_summary_table_and_plots_show_the_spread_over_seeds(tmp_path):
  records = [_record(16, 0, 9.0), _record(16, 1, 11.0),
             _record(256, 0, 2.0), _record(256, 1, 3.0)]
  summary = sweep.summarize(records)
  fcd = summary["16"]["frechet_classifier_distance"]
  assert fcd["values"] == [9.0, 11.0]
  assert (fcd["mean"], fcd["std"], fcd["min"], fcd["max"]) == (10.0, 1.0, 9.0, 11.0)
  table = sweep.markdown_table(summary, records)
  assert "| 16 | 2 | 10 ± 1 [9, 11] |" in table
  assert table.index("| 16 |") < table.index("| 256 |")
  sweep.plot_quality(summary, records, str(tmp_path))
  sweep.plot_samples({16: np.zeros([4, 8, 8, 1]), 256: np.ones([4, 8, 8, 1])},
                     str(tmp_path), "title")
  for name in ("quality_vs_batch_size.png", "quality_vs_steps.png",
               "samples_by_batch_size.png"):
    assert (tmp_path / name).stat().st_size > 1000
