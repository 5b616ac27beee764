r"""The reference `train.py` is measured against: plain Keras `model.fit` on one device.

The same ResNet-20 (16-32-64, projection shortcuts, zero-initialised last batch-norm
scale, weight decay on kernels only), the same Fashion-MNIST input pipeline and
recipe (Nesterov SGD, linear warm-up then cosine, label smoothing), with no
`replicator` and no `tf.distribute`:

  python -m examples.resnet.keras_baseline --epochs=3

Its flags are train.py's recipe flags (`--global_batch_size`, `--base_learning_rate`,
`--epochs`, `--warmup_epochs`, `--weight_decay`, `--label_smoothing`, `--seed`), with
the values of the README's Fashion-MNIST command as defaults (9 epochs: Keras counts
whole epochs). It prints the test
accuracy and the training images/s of every epoch; the figure to compare is the mean
over the epochs after the first (which also traces the step).
"""

import time

from absl import app
from absl import flags
from absl import logging
import keras
import tensorflow as tf

import replicator
from examples.resnet import data

FLAGS = flags.FLAGS


def define_flags():
  """train.py's recipe flags, defaulting to the README's Fashion-MNIST command."""
  flags.DEFINE_integer("global_batch_size", 128, "Images per step.")
  flags.DEFINE_float("base_learning_rate", 0.2, "Learning rate per 256 images.")
  flags.DEFINE_integer("epochs", 9, "Training length.")
  flags.DEFINE_float("warmup_epochs", 0.5, "Linear warm-up from zero.")
  flags.DEFINE_float("weight_decay", 5e-4, "L2 on conv and dense kernels only.")
  flags.DEFINE_float("label_smoothing", 0.1, "Label smoothing.")
  flags.DEFINE_integer("seed", 0, "Initialisation seed.")
  flags.DEFINE_integer("steps_per_epoch", 0, "Steps per epoch (0: the whole training "
                       "set); fewer to measure images/s in less time.")


def conv(x, channels: int, kernel: int, stride: int, **kwargs):
  """A bias-free convolution padded as `models.Conv2D` pads it.

  Keras' 'same' pads a strided 3x3 convolution of an even input by (0, 1): one
  row and column after only, so each output sees the image one pixel shifted
  against `models.Conv2D`, which pads `kernel - 1` split evenly (1, 1).
  """
  padding = "same"
  if stride > 1:
    total = kernel - 1
    x = keras.layers.ZeroPadding2D(
        ((total // 2, total - total // 2), (total // 2, total - total // 2)))(x)
    padding = "valid"
  return keras.layers.Conv2D(channels, kernel, stride, padding=padding, use_bias=False,
                             **kwargs)(x)


def resnet20(num_classes: int = 10, weight_decay: float = 5e-4, bn_decay: float = 0.9):
  """ResNet-20 in Keras layers, matching `models.ResNet20`."""
  # Keras' l2(c) adds c * sum(w^2); experiment.py adds weight_decay * sum(w^2) / 2.
  reg = keras.regularizers.L2(weight_decay / 2)
  init = keras.initializers.VarianceScaling(2.0, "fan_out", "truncated_normal")

  def conv_bn(x, channels, kernel, stride, relu, zero_scale=False):
    x = conv(x, channels, kernel, stride, kernel_initializer=init,
             kernel_regularizer=reg)
    x = keras.layers.BatchNormalization(
        momentum=bn_decay, epsilon=1e-5,
        gamma_initializer="zeros" if zero_scale else "ones")(x)
    return keras.layers.ReLU()(x) if relu else x

  inputs = keras.Input([28, 28, 1])
  x = conv_bn(inputs, 16, 3, 1, relu=True)
  for stage, channels in enumerate([16, 32, 64]):
    for block in range(3):
      stride = 2 if (stage > 0 and block == 0) else 1
      shortcut = x
      if stride != 1 or x.shape[-1] != channels:
        shortcut = conv_bn(x, channels, 1, stride, relu=False)
      y = conv_bn(x, channels, 3, stride, relu=True)
      y = conv_bn(y, channels, 3, 1, relu=False, zero_scale=True)
      x = keras.layers.ReLU()(keras.layers.Add()([y, shortcut]))
  x = keras.layers.GlobalAveragePooling2D()(x)
  logits = keras.layers.Dense(
      num_classes, kernel_regularizer=reg,
      kernel_initializer=keras.initializers.RandomNormal(stddev=0.01))(x)
  return keras.Model(inputs, logits)


# The input context of a single replica, for `data.make_input_fn`.
ONE_DEVICE = replicator.InputContext(num_input_pipelines=1, input_pipeline_id=0,
                                     num_replicas_in_sync=1)


def datasets(global_batch_size: int, data_dir=None):
  """train.py's Fashion-MNIST pipelines, labels one-hot: (train, test).

  The test batches carry a third component, each image's weight (0 for the padding
  of the last batch), which Keras uses as sample weights.
  """
  def one_hot(x, y, *weights):
    return (x, tf.one_hot(y, 10), *weights)
  make = lambda is_training: data.make_input_fn(
      "fashion_mnist", is_training, global_batch_size, data_dir=data_dir)(ONE_DEVICE)
  return make(True).map(one_hot), make(False).map(one_hot)


class Throughput(keras.callbacks.Callback):
  """Training images/s per epoch, the evaluation at the end of the epoch left out."""

  def __init__(self, images_per_epoch):
    super().__init__()
    self.images_per_epoch = images_per_epoch
    self.images_per_second = []

  def on_epoch_begin(self, epoch, logs=None):
    self._start = time.perf_counter()
    self._stopped = False

  def on_test_begin(self, logs=None):
    if not self._stopped:
      self._stopped = True
      self.images_per_second.append(
          self.images_per_epoch / (time.perf_counter() - self._start))
      logging.info("epoch %d: %.0f images/s", len(self.images_per_second),
                   self.images_per_second[-1])


def main(argv):
  del argv
  keras.utils.set_random_seed(FLAGS.seed)
  batch = FLAGS.global_batch_size
  steps_per_epoch = FLAGS.steps_per_epoch or 60_000 // batch
  train_ds, test_ds = datasets(batch)
  peak = FLAGS.base_learning_rate * batch / 256
  warmup_steps = int(FLAGS.warmup_epochs * steps_per_epoch)
  epochs = FLAGS.epochs
  lr = keras.optimizers.schedules.CosineDecay(
      0.0, epochs * steps_per_epoch - warmup_steps, warmup_target=peak,
      warmup_steps=warmup_steps)
  model = resnet20(weight_decay=FLAGS.weight_decay)
  model.compile(
      optimizer=keras.optimizers.SGD(lr, momentum=0.9, nesterov=True),
      loss=keras.losses.CategoricalCrossentropy(
          from_logits=True, label_smoothing=FLAGS.label_smoothing),
      weighted_metrics=["categorical_accuracy"])
  throughput = Throughput(steps_per_epoch * batch)
  start = time.perf_counter()
  history = model.fit(train_ds, epochs=epochs, steps_per_epoch=steps_per_epoch,
                      validation_data=test_ds, callbacks=[throughput], verbose=2)
  steady = throughput.images_per_second[1:] or throughput.images_per_second
  logging.info("keras baseline: test accuracy %.4f after %d epochs, %.0f s; "
               "%.0f images/s (mean of epochs 2..%d)",
               history.history["val_categorical_accuracy"][-1], epochs,
               time.perf_counter() - start, sum(steady) / len(steady), epochs)


if __name__ == "__main__":
  define_flags()
  app.run(main)
