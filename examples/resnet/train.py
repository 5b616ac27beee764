r"""Trains a ResNet with `replicator`: ImageNet on GPUs or TPUs, Fashion-MNIST on a CPU.

Fashion-MNIST on this machine's CPU, split into two logical devices (see README.md):

  python -m examples.resnet.train --dataset=fashion_mnist --model=resnet20 \
      --replicator=multi_gpu --num_cpu_devices=2 --global_batch_size=128 \
      --base_learning_rate=0.2 --epochs=8.5 --warmup_epochs=0.5 --weight_decay=5e-4 \
      --eval_every_epochs=8.5 --eval_batch_size=1000 --eval_flip --log_every_steps=117 \
      --model_dir=/tmp/resnet20_fmnist

Every `--log_every_steps` steps (one compiled call) it logs the last step's loss and
accuracy, the learning rate, images/s and the time per step, and writes them to
TensorBoard under `--model_dir`.
"""

import os
import time
from typing import Optional

from absl import app
from absl import flags
from absl import logging
import tensorflow as tf
from tensorflow.core.framework import summary_pb2

import replicator
from examples.resnet import checks
from examples.resnet import data
from examples.resnet import experiment as experiment_lib
from examples.resnet import models
from examples.resnet import schedule as schedule_lib

FLAGS = flags.FLAGS


def define_flags():
  """Defines the command line, only when run as a script.

  Importing this module (tests, or another example with flags of the same names in
  the same process) then defines no flag.
  """
  # Data.
  flags.DEFINE_enum("dataset", "imagenet_tfrecord", data.DATASETS, "Input source.")
  flags.DEFINE_string("data_dir", None, "TFRecord shards, image folder, TFDS data_dir, "
                      "or the Fashion-MNIST IDX files (default: the Debian package's).")
  flags.DEFINE_string("tfds_manual_dir", None,
                      "imagenet2012 archives for TFDS to prepare.")
  flags.DEFINE_integer("image_size", 224, "Training and evaluation crop (ImageNet).")
  flags.DEFINE_integer("num_classes", 1000, "Classes of imagenet_tfrecord (labels "
                       "1..num_classes in the shards) and of the synthetic dataset.")
  flags.DEFINE_integer("num_train_examples", None, "imagenet_tfrecord, synthetic: "
                       "training images, for the epoch length (default: ImageNet's "
                       "1,281,167).")
  flags.DEFINE_integer("num_eval_examples", None, "imagenet_tfrecord: validation images "
                       "(default: ImageNet's 50,000); every evaluation checks that it "
                       "saw exactly this many.")
  # Model.
  flags.DEFINE_enum("model", "resnet50", list(models.MODELS), "Architecture.")
  flags.DEFINE_bool("cross_replica_bn", False, "Batch-norm statistics over the global "
                    "batch (replicator.nn.CrossReplicaBatchNorm).")
  flags.DEFINE_float("bn_decay", 0.9, "Decay of the batch-norm moving averages.")
  flags.DEFINE_bool("bfloat16", False, "Convolutions in bfloat16 (float32 variables).")
  # Recipe (Goyal et al., 2017).
  flags.DEFINE_integer("global_batch_size", 1024, "Images per step, all replicas.")
  flags.DEFINE_integer("eval_batch_size", None, "Global evaluation batch "
                       "(default: --global_batch_size).")
  flags.DEFINE_float("base_learning_rate", 0.1, "Learning rate per 256 images.")
  flags.DEFINE_float("epochs", 90, "Training length.")
  flags.DEFINE_float("warmup_epochs", 5, "Linear warm-up from zero.")
  flags.DEFINE_enum("lr_decay", "cosine", ["cosine", "step"], "Decay after warm-up.")
  flags.DEFINE_list("step_decay_epochs", ["30", "60", "80"], "Epochs of the 10x drops.")
  flags.DEFINE_float("momentum", 0.9, "Nesterov momentum.")
  flags.DEFINE_float("weight_decay", 1e-4, "L2 on conv and linear kernels only.")
  flags.DEFINE_float("label_smoothing", 0.1, "Label smoothing.")
  # Distribution.
  flags.DEFINE_enum("replicator", "multi_gpu", ["gpu", "multi_gpu", "tpu"],
                    "GpuReplicator, MultiGpuReplicator or TpuReplicator.")
  flags.DEFINE_integer("num_cpu_devices", 1, "With no GPU: split the CPU into this many "
                       "logical devices (replicas for --replicator=multi_gpu).")
  flags.DEFINE_bool("jit_compile", False, "Compile each step, update included, with XLA "
                    "(--replicator=gpu: one XLA computation runs on one device; a TPU "
                    "always compiles).")
  flags.DEFINE_string("tpu", None, "TPU name or address (default: TPU_NAME, "
                      "COLAB_TPU_ADDR, then the local TPU VM).")
  # Bookkeeping.
  flags.DEFINE_string("model_dir", None, "Checkpoints and TensorBoard summaries.")
  flags.DEFINE_integer("log_every_steps", 100, "Steps per compiled call and log line.")
  flags.DEFINE_float("eval_every_epochs", 1, "Evaluation period.")
  flags.DEFINE_bool("eval_flip", False, "Also report accuracy_flip: the mean of the "
                    "softmax of each test image and of its mirror image.")
  flags.DEFINE_float("checkpoint_every_epochs", 1, "Checkpoint period.")
  flags.DEFINE_integer("seed", 0, "Initialisation seed.")


def make_replicator(kind: str, num_cpu_devices: int = 1, tpu=None,
                    jit_compile: bool = False):
  if jit_compile and kind != "gpu":
    raise ValueError(
        f"--jit_compile: needs --replicator=gpu, got --replicator={kind}. One XLA "
        "computation runs on one device (and a TPU compiles every step anyway); on "
        "several GPUs leave it off.")
  if num_cpu_devices > 1 and not tf.config.list_physical_devices("GPU"):
    replicator.testing.configure_logical_cpus(num_cpu_devices)
    # The logical devices share one CPU: each op gets its share of the cores, and
    # the replicas' ops run side by side (on 2 cores and 2 devices: 1.3x the images/s
    # of TensorFlow's default, which lets every op use every core).
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)
    tf.config.threading.set_intra_op_parallelism_threads(
        max(1, cores // num_cpu_devices))
    tf.config.threading.set_inter_op_parallelism_threads(num_cpu_devices)
  if kind == "gpu":
    return replicator.GpuReplicator(jit_compile=jit_compile)
  if kind == "multi_gpu":
    return replicator.MultiGpuReplicator()
  return replicator.TpuReplicator(tpu=tpu)


def make_checkpointer(directory: str, **trackables):
  """`replicator.Checkpointer`, or TensorFlow's manager where the library lacks it."""
  if hasattr(replicator, "Checkpointer"):
    return replicator.Checkpointer(directory, **trackables)
  checkpoint = tf.train.Checkpoint(**trackables)
  manager = tf.train.CheckpointManager(checkpoint, directory, max_to_keep=3)

  class _Checkpointer:
    save = staticmethod(lambda step: manager.save(checkpoint_number=step))
    restore_latest = staticmethod(lambda: manager.restore_or_initialize())
  return _Checkpointer()


def train(experiment: experiment_lib.Experiment, train_input_fn, eval_input_fn,
          global_batch_size: int, steps_per_epoch: int, model_dir=None,
          log_every_steps: int = 100, eval_every_epochs: float = 1,
          checkpoint_every_epochs: float = 1, num_eval_examples: Optional[int] = None):
  """Trains to the end of the schedule; returns the last evaluation (or None).

  The evaluation input is built and its first batch read before training, and every
  evaluation must count `num_eval_examples` images (if given).
  """
  repl = experiment.repl
  checks.check_input(repl, eval_input_fn)
  total_steps = experiment.schedule.total_steps
  eval_every = max(1, int(eval_every_epochs * steps_per_epoch))
  checkpoint_every = max(1, int(checkpoint_every_epochs * steps_per_epoch))
  checkpointer = writers = None
  if model_dir:
    checkpointer = make_checkpointer(
        os.path.join(model_dir, "checkpoints"), model=experiment.model,
        optimizer=experiment.base_optimizer, step=experiment.step)
    checkpointer.restore_latest()
    if repl.is_chief:
      writers = {split: tf.summary.create_file_writer(os.path.join(model_dir, split))
                 for split in ("train", "eval")}
  step = int(experiment.step.numpy())
  start, steady_images, steady_time_s, result = time.perf_counter(), 0, 0.0, None
  traced = False
  while step < total_steps:
    boundary = min(total_steps, (step // eval_every + 1) * eval_every,
                   (step // checkpoint_every + 1) * checkpoint_every)
    num_steps = min(log_every_steps, boundary - step)
    call_start = time.perf_counter()
    out = repl.run(experiment.train_step, train_input_fn, steps=num_steps)
    metrics = {k: float(v[0]) for k, v in out.items()}
    elapsed_s = time.perf_counter() - call_start
    step += num_steps
    metrics["images_per_second"] = num_steps * global_batch_size / elapsed_s
    metrics["ms_per_step"] = 1000 * elapsed_s / num_steps
    if traced:  # The first call also traces and compiles the step: not steady state.
      steady_images += num_steps * global_batch_size
      steady_time_s += elapsed_s
    traced = True
    logging.info("step %d/%d epoch %.2f: loss %.4f, train accuracy %.4f, lr %.4f, "
                 "%.0f images/s, %.1f ms/step", step, total_steps,
                 step / steps_per_epoch, metrics["loss"], metrics["accuracy"],
                 metrics["learning_rate"], metrics["images_per_second"],
                 metrics["ms_per_step"])
    _write(writers, "train", metrics, step)
    # Saved first: a failing evaluation then costs no training.
    if checkpointer and (step % checkpoint_every == 0 or step == total_steps):
      checkpointer.save(step)
    if step % eval_every == 0 or step == total_steps:
      result = experiment.evaluate(eval_input_fn)
      logging.info("eval at step %d (epoch %.2f, %.0f s): accuracy %.4f%s, loss %.4f on "
                   "%d images", step, step / steps_per_epoch, time.perf_counter() - start,
                   result["accuracy"],
                   (" (with mirror images %.4f)" % result["accuracy_flip"]
                    if "accuracy_flip" in result else ""),
                   result["loss"], result["count"])
      _write(writers, "eval", result, step)
      checks.check_eval_count(result["count"], num_eval_examples)
  if steady_time_s:
    logging.info("training done in %.0f s; %.0f images/s after the first call",
                 time.perf_counter() - start, steady_images / steady_time_s)
  return result


# tf.summary.scalar lives in the tensorboard package, which tensorflow-cpu does not pull
# in; these are the same records, readable by TensorBoard's scalar dashboard.
_SCALAR_METADATA = summary_pb2.SummaryMetadata(
    plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"),
    data_class=summary_pb2.DATA_CLASS_SCALAR)


def _write(writers, split, metrics, step):
  if writers:
    with writers[split].as_default(step=step):
      for name, value in metrics.items():
        tf.summary.write(name, tf.constant(value, tf.float32), metadata=_SCALAR_METADATA)


def main(argv):
  del argv
  eval_batch_size = FLAGS.eval_batch_size or FLAGS.global_batch_size
  checks.check_flags(FLAGS.global_batch_size, FLAGS.eval_batch_size, FLAGS.epochs,
                     FLAGS.warmup_epochs, FLAGS.eval_every_epochs,
                     FLAGS.checkpoint_every_epochs, FLAGS.log_every_steps)
  tf.random.set_seed(FLAGS.seed)
  # Before anything starts TensorFlow's runtime (TFDS may): it splits the CPU.
  repl = make_replicator(FLAGS.replicator, FLAGS.num_cpu_devices, FLAGS.tpu,
                         FLAGS.jit_compile)
  try:
    _train_with_flags(repl, eval_batch_size)
  finally:
    repl.shutdown()


def _train_with_flags(repl, eval_batch_size: int):
  info = data.dataset_info(FLAGS.dataset, FLAGS.data_dir, FLAGS.image_size,
                           FLAGS.num_classes, FLAGS.num_train_examples,
                           FLAGS.num_eval_examples, FLAGS.tfds_manual_dir)
  steps_per_epoch = checks.check_batches(
      FLAGS.global_batch_size, eval_batch_size, FLAGS.epochs, repl.num_replicas,
      info.num_train_examples, FLAGS.dataset)
  try:
    step_decay_epochs = [float(e) for e in FLAGS.step_decay_epochs]
  except ValueError:
    raise ValueError(f"--step_decay_epochs: expected epochs separated by commas, got "
                     f"{','.join(FLAGS.step_decay_epochs)}; e.g. 30,60,80.") from None
  lr_schedule = schedule_lib.LearningRateSchedule(
      FLAGS.base_learning_rate, FLAGS.global_batch_size, steps_per_epoch, FLAGS.epochs,
      FLAGS.warmup_epochs, FLAGS.lr_decay, step_decay_epochs)
  logging.info("%d replicas, %s on %s: %d steps of %d images, peak learning rate %.3f",
               repl.num_replicas, FLAGS.model, FLAGS.dataset, lr_schedule.total_steps,
               FLAGS.global_batch_size, lr_schedule.peak_learning_rate)
  experiment = experiment_lib.Experiment(
      repl, models.MODELS[FLAGS.model], info.num_classes, lr_schedule, FLAGS.momentum,
      FLAGS.weight_decay, FLAGS.label_smoothing, FLAGS.cross_replica_bn, FLAGS.bn_decay,
      FLAGS.bfloat16, FLAGS.eval_flip)
  input_args = dict(data_dir=FLAGS.data_dir, image_size=FLAGS.image_size,
                    num_classes=info.num_classes, tfds_manual_dir=FLAGS.tfds_manual_dir,
                    num_eval_examples=FLAGS.num_eval_examples)
  train_input_fn = data.make_input_fn(FLAGS.dataset, True, FLAGS.global_batch_size,
                                      **input_args)
  eval_input_fn = data.make_input_fn(FLAGS.dataset, False, eval_batch_size, **input_args)
  train(experiment, train_input_fn, eval_input_fn, FLAGS.global_batch_size,
        steps_per_epoch, FLAGS.model_dir, FLAGS.log_every_steps,
        FLAGS.eval_every_epochs, FLAGS.checkpoint_every_epochs, info.num_eval_examples)


if __name__ == "__main__":
  define_flags()
  app.run(main)
