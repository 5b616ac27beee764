r"""Trains one SN-GAN (projection discriminator) through the replicator API.

The global batch is split over the replicas; every replica draws its own noise
and fake labels from `repl.random_generator`, so the discriminator really sees
`global_batch_size` distinct fakes per step (identical noise on every replica
would shrink the effective batch and void a batch-size study).

  python -m examples.gan.train --config=small --global_batch_size=64 \
      --num_generator_steps=500 --eval_every=100

The replicator flags are those of every example (`examples/common.py`):
``--replicator`` (default multi_gpu), ``--cpu_replicas`` (default 2: on a
machine with no GPU the CPU is split into 2 logical devices), ``--tpu``. The
work directory defaults to ``results/gan/train/<config>_batch<B>_seed<S>``
under the repository root, which git ignores; a run started again there
resumes from its latest checkpoint (``restored step N``), and a finished one
says so and is not trained again. TensorBoard: ``tensorboard --logdir=<workdir>``.
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
from examples import common
from examples.gan import configs
from examples.gan import data
from examples.gan import gan_trainer
from examples.gan import metrics

FLAGS = flags.FLAGS

# The repository root (the directory that holds `examples/`): default work
# directories go under its git-ignored `results/`, whatever the current directory.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
METRICS_FILE = "metrics.json"


def define_flags(*, sweep: bool = False):
  """Defines the command line, only when run as a script.

  Importing this module (tests, the sweep, other examples with flags of the
  same names) then defines no flag. `sweep`: the sweep's defaults and help
  for the flags it shares (its work directory holds every run).
  """
  flags.DEFINE_enum("config", "small", sorted(configs.CONFIGS), "Model and data.")
  common.define_replicator_flags()
  common.define_run_flags(
      global_batch_size=None, workdir=None,
      global_batch_help=("The sweep sets it for each run (--batch_sizes)."
                         if sweep else "Default: the config's (small: 64)."))
  FLAGS["workdir"].help += (
      " Default: results/gan/<config> under the repository root (git-ignored); "
      "each run in runs/batch<B>_seed<S>/." if sweep else
      " Default: results/gan/train/<config>_batch<B>_seed<S> under the "
      "repository root (git-ignored).")
  if sweep:
    FLAGS["log_every"].help += " The sweep: a line at each evaluation unless given."
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
  flags.DEFINE_integer("seed", 0, "Seeds weights, noise and data order.")
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


def _load_history(workdir: str, restored_step: int):
  """The evaluations a restored run made up to its checkpoint's step."""
  path = os.path.join(workdir, METRICS_FILE)
  if not restored_step or not tf.io.gfile.exists(path):
    return []
  with tf.io.gfile.GFile(path) as f:
    return [h for h in json.load(f) if h["step"] <= restored_step]


def _save_history(workdir: str, history):
  tf.io.gfile.makedirs(workdir)
  with tf.io.gfile.GFile(os.path.join(workdir, METRICS_FILE), "w") as f:
    json.dump(history, f, indent=1)


def _metrics_text(results: Dict[str, float]) -> str:
  return ", ".join(f"{k} {v:.4g}" for k, v in results.items()) or "no metrics"


def train(config: configs.GanConfig, repl: replicator.Replicator, *,
          workdir: str, input_fn, seed: int = 0, log_every: int = 100,
          eval_every: int = 0, checkpoint_every: int = 1000,
          evaluator: Optional[metrics.Evaluator] = None):
  """Runs `config.num_generator_steps` G steps (each after `n_dis` D steps).

  Resumes from the latest checkpoint in `workdir` (logging ``restored step
  N``: N steps are done, the next is N + 1); a run whose checkpoint is at the
  last step logs that it is finished and trains nothing. Logs ``step n/N``
  every `log_every` steps with the losses, real images/s over the last
  interval (evaluations and checkpoints excluded) and an ETA. Evaluations go
  to `workdir`/metrics.json as they are made, so a resumed run keeps them.

  Returns the trainer and its evaluations (one dict each, with its `step`).
  """
  check_positive(log_every=log_every, checkpoint_every=checkpoint_every)
  trainer = gan_trainer.GanTrainer(config, repl, seed)
  checkpointer = gan_trainer.restore(trainer, os.path.join(workdir, "checkpoints"))
  writer = tf.summary.create_file_writer(workdir) if repl.is_chief else None
  first, last = int(trainer.step.numpy()), config.num_generator_steps
  if first > last:
    raise ValueError(
        f"num_generator_steps: the checkpoint in {workdir} is at step {first}, "
        f"past the {last} steps asked for, so this run cannot be its first "
        f"{last} steps. Pass --num_generator_steps={first} or more, or another "
        "--workdir.")
  history = _load_history(workdir, first)
  if first == last:
    logging.info("finished at step %d/%d (checkpoint in %s): nothing to train, "
                 "reusing it", first, last, workdir)
  else:
    logging.info(
        "training steps %d-%d of %d: n_dis=%d, global batch %d = %d replica(s) "
        "x %d; a line every %d steps; workdir %s", first + 1, last, last,
        config.n_dis, config.global_batch_size, repl.num_replicas,
        trainer.per_replica_batch_size, log_every, workdir)
  # The progress clock leaves out evaluations and checkpoints: the rate and
  # ETA are those of training, and an evaluation logs its own duration.
  excluded = [0.0]
  clock = lambda: time.monotonic() - excluded[0]
  progress = common.Progress(
      last, start=first, items_per_step=config.n_dis * config.global_batch_size,
      items="real images", clock=clock)
  since, tick = first, clock()
  for step in range(first + 1, last + 1):
    d_out = repl.run(trainer.discriminator_step, input_fn, steps=config.n_dis)
    g_out = repl.run(trainer.generator_step)
    scalars = {}
    if step % log_every == 0 or step == last:
      losses = {k: float(np.mean(v)) for k, v in {**d_out, **g_out}.items()}
      now = clock()
      elapsed = max(now - tick, 1e-9)
      scalars = dict(losses)
      scalars["generator_steps_per_s"] = (step - since) / elapsed
      scalars["real_images_per_s"] = (
          (step - since) * config.n_dis * config.global_batch_size / elapsed)
      since, tick = step, now
      if repl.is_chief:
        progress.log(step, **{k: losses[k] for k in ("d_loss", "g_loss")})
    paused = time.monotonic()
    if evaluator and ((eval_every and step % eval_every == 0) or step == last):
      results = evaluator(trainer)
      scalars.update(results)
      history.append({"step": step, **results})
      if repl.is_chief:
        _save_history(workdir, history)
      logging.info("step %d/%d evaluated in %.1f s: %s", step, last,
                   time.monotonic() - paused, _metrics_text(results))
    if writer and scalars:
      write_summaries(writer, step, scalars)
    if step % checkpoint_every == 0 or step == last:
      checkpointer.save(step)
    excluded[0] += time.monotonic() - paused
  if evaluator and not any(h["step"] == last for h in history):
    # A run finished before its evaluations were kept in metrics.json.
    results = evaluator(trainer)
    history.append({"step": last, **results})
    if repl.is_chief:
      _save_history(workdir, history)
    logging.info("step %d/%d evaluated: %s", last, last, _metrics_text(results))
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


def default_workdir(config: configs.GanConfig, seed: int) -> str:
  return os.path.join(REPO_ROOT, "results", "gan", "train",
                      f"{config.name}_batch{config.global_batch_size}_seed{seed}")


def main(argv):
  del argv
  config = config_from_flags()
  check_positive(log_every=FLAGS.log_every,
                 checkpoint_every=FLAGS.checkpoint_every)
  workdir = FLAGS.workdir or default_workdir(config, FLAGS.seed)
  repl = common.make_replicator()  # before any TensorFlow op: it may split the CPU
  logging.info("config %s", config)
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
  start = time.monotonic()
  _, history = train(config, repl, workdir=workdir, input_fn=input_fn,
                     seed=FLAGS.seed, log_every=FLAGS.log_every,
                     eval_every=FLAGS.eval_every,
                     checkpoint_every=FLAGS.checkpoint_every, evaluator=evaluator)
  repl.shutdown()
  took = common.format_duration(time.monotonic() - start)
  if history:
    final = {k: v for k, v in history[-1].items() if k != "step"}
    logging.info("done in %s; step %d: %s. Checkpoints, TensorBoard events and "
                 "%s in %s", took, history[-1]["step"], _metrics_text(final),
                 METRICS_FILE, workdir)
  else:
    logging.info("done in %s (no evaluation). Checkpoints and TensorBoard "
                 "events in %s", took, workdir)

if __name__ == "__main__":
  define_flags()
  app.run(main)
