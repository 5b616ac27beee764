r"""Trains one SN-GAN (projection discriminator) through the replicator API.

The global batch is split over the replicas; every replica draws its own noise
and fake labels from `repl.random_generator`, so the discriminator really sees
`global_batch_size` distinct fakes per step (identical noise on every replica
would shrink the effective batch and void a batch-size study).

  python -m examples.gan.train --config=small --global_batch_size=64 \
      --num_generator_steps=500 --workdir=/tmp/gan

TensorBoard: `tensorboard --logdir=/tmp/gan`.
"""

import json
import os
import time
from typing import Dict, Optional

from absl import app
from absl import flags
from absl import logging
import numpy as np
import tensorflow as tf

from tensorflow.core.framework import summary_pb2

import replicator
from examples.gan import configs
from examples.gan import data
from examples.gan import gan_trainer
from examples.gan import metrics

FLAGS = flags.FLAGS


def define_flags():
  """Defines the command line, only when run as a script.

  Importing this module (tests, the sweep, other examples with flags of the
  same names) then defines no flag.
  """
  flags.DEFINE_enum("config", "small", sorted(configs.CONFIGS), "Model and data.")
  flags.DEFINE_integer("global_batch_size", None, "Overrides the config's.")
  flags.DEFINE_integer("num_generator_steps", None, "Overrides the config's.")
  flags.DEFINE_integer("n_dis", None, "D steps per G step; overrides the config's.")
  flags.DEFINE_integer("ch", None, "Sets both g_ch and d_ch (reduced width).")
  flags.DEFINE_bool("cross_replica_bn", None,
                    "Generator batch norm over the global batch (every config: "
                    "on); --nocross_replica_bn normalizes each replica's batch.")
  flags.DEFINE_string("dataset", None, "Overrides the config's: see data.py.")
  flags.DEFINE_string("data_dir", None,
                      "TFDS data_dir, TFRecord glob or image folder.")
  flags.DEFINE_string("manual_dir", None, "TFDS manual_dir (ImageNet tars).")
  flags.DEFINE_integer("label_offset", 0, "Subtracted from TFRecord labels.")
  flags.DEFINE_enum("replicator", "multi_gpu",
                    ["multi_gpu", "gpu", "tpu", "tpu_emulated"],
                    "tpu_emulated: TPU semantics (XLA, static shapes) on the CPU.")
  flags.DEFINE_string("tpu", None, "TPU name or address (TpuReplicator's `tpu`).")
  flags.DEFINE_integer("num_cpu_devices", 0,
                       "Split the CPU into this many logical devices.")
  flags.DEFINE_integer("seed", 0, "Seeds weights, noise and data order.")
  flags.DEFINE_string("workdir", "/tmp/replicator_gan", "Checkpoints, summaries, metrics.")
  flags.DEFINE_integer("log_every", 50, "Generator steps between logs.")
  flags.DEFINE_integer("eval_every", 0,
                       "Generator steps between evaluations (0: at the end).")
  flags.DEFINE_integer("checkpoint_every", 1000, "Generator steps between checkpoints.")
  flags.DEFINE_integer("num_eval_samples", 2000, "Samples per evaluation.")
  flags.DEFINE_integer("num_classifier_examples", 60_000,
                       "Real training images for the metric classifier.")
  flags.DEFINE_integer("num_real_examples", 10_000,
                       "Real test images for the reference statistics.")
  flags.DEFINE_bool("classifier_metrics", True,
                    "Classifier score and Fréchet classifier distance.")
  flags.DEFINE_string("cache_dir", os.path.expanduser("~/.cache/replicator_gan"),
                      "Where the metric classifier is cached.")
  flags.DEFINE_string("inception_weights", None,
                      "Keras InceptionV3 weights file (with the top): adds "
                      "Inception Score and Fréchet Inception Distance.")


def _plugin(name: str) -> summary_pb2.SummaryMetadata:
  return summary_pb2.SummaryMetadata(
      plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name=name))


def write_summaries(writer, step: int, scalars: Dict[str, float],
                    images: Optional[np.ndarray] = None):
  """TensorBoard scalars (and images) through `tf.summary.write`.

  The low-level op needs no `tensorboard` package, which TF-CPU lacks.
  """
  with writer.as_default(step=step):
    for name, value in scalars.items():
      tf.summary.write(name, tf.constant(value, tf.float32),
                       metadata=_plugin("scalars"))
    if images is not None:
      pngs = [tf.io.encode_png(tf.cast((im + 1) * 127.5, tf.uint8))
              for im in images]
      height, width = images.shape[1:3]
      tf.summary.write("samples", tf.stack([str(width), str(height), *pngs]),
                       metadata=_plugin("images"))
  writer.flush()


def train(config: configs.GanConfig, repl: replicator.Replicator, *,
          workdir: str, input_fn, seed: int = 0, log_every: int = 50,
          eval_every: int = 0, checkpoint_every: int = 1000,
          evaluator: Optional[metrics.Evaluator] = None):
  """Runs `config.num_generator_steps` G steps (each after `n_dis` D steps).

  Returns the trainer and its evaluations (one dict each, with its `step`).
  """
  check_positive(log_every=log_every, checkpoint_every=checkpoint_every)
  trainer = gan_trainer.GanTrainer(config, repl, seed)
  checkpointer = gan_trainer.restore(trainer, os.path.join(workdir, "checkpoints"))
  writer = tf.summary.create_file_writer(workdir) if repl.is_chief else None
  history, tick, first = [], time.time(), int(trainer.step.numpy())
  last = config.num_generator_steps
  for step in range(first + 1, last + 1):
    d_out = repl.run(trainer.discriminator_step, input_fn, steps=config.n_dis)
    g_out = repl.run(trainer.generator_step)
    scalars = {}
    if step % log_every == 0 or step == last:
      elapsed, tick = time.time() - tick, time.time()
      steps_done = log_every if step % log_every == 0 else step % log_every
      scalars = {k: float(np.mean(v)) for k, v in {**d_out, **g_out}.items()}
      scalars["generator_steps_per_s"] = steps_done / elapsed
      scalars["real_images_per_s"] = (
          steps_done * config.n_dis * config.global_batch_size / elapsed)
      logging.info("step %d: %s", step, ", ".join(
          f"{k}={v:.4g}" for k, v in scalars.items()))
    if evaluator and ((eval_every and step % eval_every == 0) or step == last):
      results = evaluator(trainer)
      scalars.update(results)
      history.append({"step": step, **results})
      logging.info("step %d eval: %s", step, results)
      tick = time.time()  # Throughput excludes evaluation.
    if writer and scalars:
      write_summaries(writer, step, scalars)
    if step % checkpoint_every == 0 or step == last:
      checkpointer.save(step)
  if writer:
    write_summaries(writer, last, {},
                    trainer.sample(np.arange(16) % config.num_classes))
  return trainer, history


def check_positive(**values: int):
  """Raises, naming the flag, unless every value is an int > 0."""
  for name, value in values.items():
    if value is None or value <= 0:
      raise ValueError(
          f"{name}: must be a positive integer, got {value!r}. Pass "
          f"--{name}=N with N >= 1 (or leave it out for the default).")


def make_replicator(kind: str, tpu: Optional[str] = None,
                    num_cpu_devices: int = 0) -> replicator.Replicator:
  if num_cpu_devices:
    replicator.testing.configure_logical_cpus(num_cpu_devices)
  if kind == "tpu":
    return replicator.TpuReplicator(tpu=tpu)
  if kind == "tpu_emulated":
    return replicator.TpuReplicator(num_tpu_cores_per_worker=2,
                                    emulate_on_cpu=True)
  if kind == "gpu":
    return replicator.GpuReplicator()
  return replicator.MultiGpuReplicator()


def config_from_flags() -> configs.GanConfig:
  """The config named by --config with the flags' overrides, checked."""
  config = configs.get_config(FLAGS.config)
  sizes = {"global_batch_size": FLAGS.global_batch_size,
           "num_generator_steps": FLAGS.num_generator_steps,
           "n_dis": FLAGS.n_dis, "ch": FLAGS.ch}
  check_positive(**{k: v for k, v in sizes.items() if v is not None})
  overrides = {"global_batch_size": FLAGS.global_batch_size,
               "num_generator_steps": FLAGS.num_generator_steps,
               "n_dis": FLAGS.n_dis, "dataset": FLAGS.dataset,
               "g_ch": FLAGS.ch, "d_ch": FLAGS.ch,
               "cross_replica_bn": FLAGS.cross_replica_bn}
  return config.replace(**{k: v for k, v in overrides.items() if v is not None})


def data_kwargs_from_flags(config: configs.GanConfig) -> Dict:
  return dict(resolution=config.resolution, channels=config.image_channels,
              num_classes=config.num_classes, data_dir=FLAGS.data_dir,
              manual_dir=FLAGS.manual_dir, label_offset=FLAGS.label_offset)


def main(argv):
  del argv
  config = config_from_flags()
  check_positive(log_every=FLAGS.log_every,
                 checkpoint_every=FLAGS.checkpoint_every)
  repl = make_replicator(FLAGS.replicator, FLAGS.tpu, FLAGS.num_cpu_devices)
  logging.info("config %s on %r", config, repl)
  data_kwargs = data_kwargs_from_flags(config)
  evaluator = None
  if FLAGS.classifier_metrics or FLAGS.inception_weights:
    evaluator = metrics.Evaluator(config, data_kwargs, cache_dir=FLAGS.cache_dir,
                          num_samples=FLAGS.num_eval_samples,
                          classifier_metrics=FLAGS.classifier_metrics,
                          inception_weights=FLAGS.inception_weights,
                          num_real=FLAGS.num_real_examples,
                          num_train=FLAGS.num_classifier_examples)
  input_fn = data.make_input_fn(config.dataset, config.global_batch_size,
                                seed=FLAGS.seed, **data_kwargs)
  _, history = train(config, repl, workdir=FLAGS.workdir, input_fn=input_fn,
                  seed=FLAGS.seed, log_every=FLAGS.log_every,
                  eval_every=FLAGS.eval_every,
                  checkpoint_every=FLAGS.checkpoint_every, evaluator=evaluator)
  if repl.is_chief:
    with tf.io.gfile.GFile(os.path.join(FLAGS.workdir, "metrics.json"), "w") as f:
      json.dump(history, f, indent=1)
  repl.shutdown()


if __name__ == "__main__":
  define_flags()
  app.run(main)
