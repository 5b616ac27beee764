"""The model, optimizer, learning-rate schedule and train and evaluation steps of
`train.py`."""

import sonnet as snt
import tensorflow as tf

import replicator
from examples.resnet import models
from examples.resnet import schedule as schedule_lib


def cross_entropy(logits, labels, label_smoothing: float):
  num_classes = logits.shape[-1]
  targets = tf.one_hot(labels, num_classes) * (1 - label_smoothing)
  targets += label_smoothing / num_classes
  return tf.nn.softmax_cross_entropy_with_logits(targets, logits)


class Experiment:
  """The model, optimizer, schedule and the train and evaluation steps.

  `model_fn(num_classes=, norm_factory=, compute_dtype=)` builds the model, e.g.
  `models.ResNet50`.
  """

  def __init__(self, repl, model_fn, num_classes: int,
               lr_schedule: schedule_lib.LearningRateSchedule, momentum: float = 0.9,
               weight_decay: float = 1e-4, label_smoothing: float = 0.1,
               cross_replica_bn: bool = False, bn_decay: float = 0.9,
               bfloat16: bool = False, eval_flip: bool = False):
    self.repl = repl
    self.eval_flip = eval_flip
    self.schedule = lr_schedule
    self.weight_decay = weight_decay
    self.label_smoothing = label_smoothing
    with repl.context():
      norm_factory = models.batch_norm_factory(bn_decay, cross_replica=cross_replica_bn)
      self.model = model_fn(num_classes=num_classes, norm_factory=norm_factory,
                            compute_dtype=tf.bfloat16 if bfloat16 else tf.float32)
      self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
      self.learning_rate = tf.Variable(0.0, trainable=False, name="learning_rate")
      self.base_optimizer = snt.optimizers.Momentum(self.learning_rate, momentum,
                                                    use_nesterov=True)
      self.optimizer = repl.wrap_optimizer(self.base_optimizer)

  def train_step(self, batch):
    images, labels = batch
    self.learning_rate.assign(self.schedule(self.step))
    with tf.GradientTape() as tape:
      logits = self.model(images, is_training=True)
      xent = tf.reduce_mean(cross_entropy(logits, labels, self.label_smoothing))
      l2 = tf.add_n([tf.nn.l2_loss(w) for w in self.model.weight_decay_variables])
      loss = xent + self.weight_decay * l2
    variables = self.model.trainable_variables
    self.optimizer.apply(tape.gradient(loss, variables), variables)
    self.step.assign_add(1)
    accuracy = tf.reduce_mean(tf.cast(
        tf.equal(tf.argmax(logits, -1, output_type=tf.int32), labels), tf.float32))
    return {"loss": self.repl.all_mean(xent), "accuracy": self.repl.all_mean(accuracy),
            "learning_rate": self.learning_rate.read_value()}

  def eval_step(self, batch):
    images, labels, weights = batch
    logits = self.model(images, is_training=False)

    def num_correct(scores):
      hits = tf.equal(tf.argmax(scores, -1, output_type=tf.int32), labels)
      return tf.reduce_sum(weights * tf.cast(hits, tf.float32))
    xent = cross_entropy(logits, labels, 0.0)
    sums = {"correct": num_correct(logits), "loss": tf.reduce_sum(weights * xent),
            "count": tf.reduce_sum(weights)}
    if self.eval_flip:
      mirrored = self.model(tf.reverse(images, axis=[2]), is_training=False)
      sums["correct_flip"] = num_correct(tf.nn.softmax(logits) + tf.nn.softmax(mirrored))
    return self.repl.all_sum(sums)

  def evaluate(self, eval_input_fn):
    """One pass over the evaluation set: {"accuracy", "loss", "count"}.

    With `eval_flip`, also "accuracy_flip": each image and its mirror image, softmax
    averaged (the test-time counterpart of the training flips).
    """
    totals = {}  # eval_step's sums, over the whole set
    while True:
      try:
        out = self.repl.run(self.eval_step, eval_input_fn)
      except replicator.InputExhausted:
        break
      for key, value in out.items():
        totals[key] = totals.get(key, 0.0) + float(value[0])
    self.repl.reset_input(eval_input_fn)
    count = max(totals.get("count", 0.0), 1.0)
    result = {"accuracy": totals.get("correct", 0.0) / count,
              "loss": totals.get("loss", 0.0) / count, "count": totals.get("count", 0.0)}
    if self.eval_flip:
      result["accuracy_flip"] = totals.get("correct_flip", 0.0) / count
    return result
