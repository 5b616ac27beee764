r"""Trains a ResNet with `replicator`: ImageNet on GPUs or TPUs, Fashion-MNIST on a CPU.

Fashion-MNIST on this machine's CPU, split into two logical devices (see README.md):

  python -m examples.resnet.train --dataset=fashion_mnist --model=resnet20 \
      --replicator=multi_gpu --cpu_replicas=2 --global_batch_size=128 \
      --base_learning_rate=0.2 --epochs=8.5 --warmup_epochs=0.5 --weight_decay=5e-4 \
      --eval_every_epochs=8.5 --eval_batch_size=1000 --eval_flip --log_every=117 \
      --workdir=/tmp/resnet20_fmnist

The replicator flags (`--replicator`, `--cpu_replicas`, `--tpu`) and the run flags
(`--global_batch_size`, `--workdir`, `--log_every`) are the ones every example shares
(`examples/common.py`). Every `--log_every` steps (one compiled call) it logs
`step n/N`, the epoch, the last step's loss and accuracy, the learning rate, the
training images/s over those steps (the first interval also traces the step, and
says so) and an ETA of the training left; each evaluation logs its accuracy, loss
and image count. With `--workdir`, it writes TensorBoard scalars and checkpoints
there, and the same command resumes from the last checkpoint.
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
from examples import common
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
  # Distribution and bookkeeping: the flags every example shares.
  common.define_replicator_flags()
  common.define_run_flags(
      global_batch_size=1024, workdir=None,
      global_batch_help="Goyal et al.'s recipe: 1024 on 8 GPUs, 4096 on a TPU v3-8.")
  flags.adopt_module_key_flags(common)  # --help lists them with this script's own
  # Recipe (Goyal et al., 2017).
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
  flags.DEFINE_bool("jit_compile", False, "Compile each step, update included, with XLA "
                    "(--replicator=gpu: one XLA computation runs on one device; a TPU "
                    "always compiles).")
  # Bookkeeping (--log_every is also the number of steps in one compiled call).
  flags.DEFINE_float("eval_every_epochs", 1, "Evaluation period.")
  flags.DEFINE_bool("eval_flip", False, "Also report accuracy_flip: the mean of the "
                    "softmax of each test image and of its mirror image.")
  flags.DEFINE_float("checkpoint_every_epochs", 1, "Checkpoint period.")
  flags.DEFINE_integer("seed", 0, "Initialisation seed.")
  # Checked as the command line is parsed, before any work: the default dataset is
  # ImageNet, which no default path can find.
  flags.register_multi_flags_validator(["dataset", "data_dir"], _check_data_dir)
  flags.register_multi_flags_validator(["jit_compile", "replicator"], _check_jit_compile)


# The datasets with no default location, and what --data_dir must hold for each.
DATASETS_NEEDING_DATA_DIR = {
    "imagenet_tfrecord": "the ImageNet TFRecord shards (train-*, validation-*)",
    "image_folder": "train/<class>/<image> and validation/<class>/<image>",
}


def _check_data_dir(values) -> bool:
  if values["data_dir"] or values["dataset"] not in DATASETS_NEEDING_DATA_DIR:
    return True
  default = " (the default)" if values["dataset"] == "imagenet_tfrecord" else ""
  raise flags.ValidationError(
      f"--data_dir: --dataset={values['dataset']}{default} needs "
      f"{DATASETS_NEEDING_DATA_DIR[values['dataset']]}; pass --data_dir=/path/to/it. "
      "Without ImageNet, pass --dataset=fashion_mnist --model=resnet20 (offline: "
      "apt-get install dataset-fashion-mnist puts the files in "
      f"{data.FASHION_MNIST_DIR}, --data_dir's default for it) or "
      "--dataset=synthetic (random images, to measure speed).")


def _jit_compile_error(kind: str) -> Optional[str]:
  if kind == "gpu":
    return None
  return (f"--jit_compile: needs --replicator=gpu, got --replicator={kind}. One XLA "
          "computation runs on one device (and a TPU compiles every step anyway); on "
          "several GPUs leave it off.")


def _check_jit_compile(values) -> bool:
  error = _jit_compile_error(values["replicator"]) if values["jit_compile"] else None
  if error:
    raise flags.ValidationError(error)
  return True


def make_replicator(kind: Optional[str] = None, cpu_replicas: Optional[int] = None,
                    tpu: Optional[str] = None,
                    jit_compile: bool = False) -> replicator.Replicator:
  """`common.make_replicator`, refusing `jit_compile` on all but the gpu replicator.

  The arguments left out come from the flags (--replicator, --cpu_replicas, --tpu).

  `common.make_replicator` also gives each logical CPU device its share of the cores
  (on 2 cores and 2 devices: 1.3x the images/s of TensorFlow's default threading).
  """
  error = _jit_compile_error(kind or FLAGS.replicator) if jit_compile else None
  if error:
    raise ValueError(error)
  kwargs = {"jit_compile": True} if jit_compile else {}
  return common.make_replicator(kind, cpu_replicas, tpu, **kwargs)


def train(experiment: experiment_lib.Experiment, train_input_fn, eval_input_fn,
          global_batch_size: int, steps_per_epoch: int, workdir=None,
          log_every: int = 100, eval_every_epochs: float = 1,
          checkpoint_every_epochs: float = 1, num_eval_examples: Optional[int] = None):
  """Trains to the end of the schedule; returns the last evaluation (or None).

  With `workdir`, resumes from its last checkpoint: a checkpoint holds the number of
  steps completed, the next step to run. The evaluation input is built and its first
  batch read before training, and every evaluation must count `num_eval_examples`
  images (if given).
  """
  repl = experiment.repl
  checks.check_input(repl, eval_input_fn)
  total_steps = experiment.schedule.total_steps
  eval_every = max(1, int(eval_every_epochs * steps_per_epoch))
  checkpoint_every = max(1, int(checkpoint_every_epochs * steps_per_epoch))
  checkpointer = writers = None
  start = 0
  if workdir:
    checkpointer = replicator.Checkpointer(
        os.path.join(workdir, "checkpoints"), model=experiment.model,
        optimizer=experiment.base_optimizer, step=experiment.step)
    restored = checkpointer.restore_latest()
    if restored is not None:
      start = restored
      if int(experiment.step.numpy()) != start:
        raise ValueError(
            f"--workdir: the checkpoint of step {start} in {checkpointer.directory} "
            f"holds a step counter of {int(experiment.step.numpy())}; it was not "
            "written by this script. Pass another --workdir to start afresh.")
      logging.info("restored step %d/%d (epoch %.2f) from %s", start, total_steps,
                   start / steps_per_epoch, checkpointer.directory)
    if repl.is_chief:
      writers = {split: tf.summary.create_file_writer(os.path.join(workdir, split))
                 for split in ("train", "eval")}
  if start >= total_steps:
    logging.info("the run in %s is finished: it holds step %d of %d, so nothing is "
                 "left to do. Pass a larger --epochs to train on, or another --workdir "
                 "to start afresh.", workdir, start, total_steps)
    return None
  # Training time only: evaluations and checkpoints stop this clock, so the images/s
  # of an interval is the training steps' and the ETA is the training left.
  training_s = [0.0]
  progress = common.Progress(total_steps, start=start, items_per_step=global_batch_size,
                             clock=lambda: training_s[0])
  run_start, result = time.perf_counter(), None
  steady_steps, steady_s = 0, 0.0  # after the first call, which also traces the step
  step = start
  while step < total_steps:
    boundary = min(total_steps, (step // eval_every + 1) * eval_every,
                   (step // checkpoint_every + 1) * checkpoint_every)
    num_steps = min(log_every, boundary - step)
    call_start = time.perf_counter()
    try:
      out = repl.run(experiment.train_step, train_input_fn, steps=num_steps)
    except ValueError as error:
      # The model's variables are made, and given their restored values, in the first
      # step: a checkpoint of another model (--model, --num_classes) fails here.
      if step > start or not start:
        raise
      cause = str(error).strip().splitlines()[-1].strip()  # a traced error quotes code
      raise ValueError(
          f"--workdir: the checkpoint of step {start} in {checkpointer.directory} does "
          f"not fit this model ({cause}). Pass the flags that run was started with "
          "(--model, --num_classes, --dataset), or another --workdir to start "
          "afresh.") from error
    metrics = {k: float(v[0]) for k, v in out.items()}
    elapsed_s = time.perf_counter() - call_start
    if step > start:
      steady_steps, steady_s = steady_steps + num_steps, steady_s + elapsed_s
    training_s[0] += elapsed_s
    step += num_steps  # steps completed: what the checkpoint below records
    metrics["images_per_second"] = num_steps * global_batch_size / elapsed_s
    metrics["ms_per_step"] = 1000 * elapsed_s / num_steps
    progress.log(step, epoch=step / steps_per_epoch, loss=metrics["loss"],
                 train_accuracy=metrics["accuracy"], lr=metrics["learning_rate"])
    _write(writers, "train", metrics, step)
    # Saved first: a failing evaluation then costs no training.
    if checkpointer and (step % checkpoint_every == 0 or step == total_steps):
      checkpointer.save(step)
    if step % eval_every == 0 or step == total_steps:
      eval_start = time.perf_counter()
      result = experiment.evaluate(eval_input_fn)
      logging.info("evaluation at step %d/%d (epoch %.2f): accuracy %.4f%s, loss %.4f "
                   "on the %d evaluation images, %.0f s", step, total_steps,
                   step / steps_per_epoch, result["accuracy"],
                   (" (with mirror images %.4f)" % result["accuracy_flip"]
                    if "accuracy_flip" in result else ""),
                   result["loss"], result["count"], time.perf_counter() - eval_start)
      _write(writers, "eval", result, step)
      checks.check_eval_count(result["count"], num_eval_examples)
  logging.info("training done: step %d/%d, %d steps in %.0f s (evaluations and "
               "checkpoints included)%s", step, total_steps, step - start,
               time.perf_counter() - run_start,
               f"; {steady_steps * global_batch_size / steady_s:.0f} training images/s "
               "after the first interval" if steady_steps else "")
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
  common.exit_on_flag_errors(_main)


def _main():
  eval_batch_size = FLAGS.eval_batch_size or FLAGS.global_batch_size
  checks.check_flags(FLAGS.global_batch_size, FLAGS.eval_batch_size, FLAGS.epochs,
                     FLAGS.warmup_epochs, FLAGS.eval_every_epochs,
                     FLAGS.checkpoint_every_epochs, FLAGS.log_every)
  tf.random.set_seed(FLAGS.seed)
  # Before anything starts TensorFlow's runtime (TFDS may): it splits the CPU.
  try:
    repl = make_replicator(jit_compile=FLAGS.jit_compile)
  except RuntimeError as error:  # no TPU reachable, GPUs already started, ...
    raise ValueError(f"--replicator={FLAGS.replicator}: {error}") from error
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
        steps_per_epoch, FLAGS.workdir, FLAGS.log_every,
        FLAGS.eval_every_epochs, FLAGS.checkpoint_every_epochs, info.num_eval_examples)


if __name__ == "__main__":
  define_flags()
  app.run(main)
