"""ResNet-50 with synchronized batch norm over local worker processes: ours vs MWMS.

A training step of ResNet-50 v1.5 (32x32x3 random images, 10 classes, `--batch`
images per worker, one CPU replica per worker) whose every batch norm takes its
statistics over the global batch, then SGD with momentum on the averaged
gradients:

- ours: the Sonnet model of `examples.resnet.models` with
  `replicator.nn.CrossReplicaBatchNorm`, built lazily in the first step under
  `MultiGpuReplicator`, a wrapped Keras SGD;
- MWMS: what a `tf.distribute` user writes: the same network as a Keras 3
  functional model with `BatchNormalization(synchronized=True)`, model and
  optimizer built under `MultiWorkerMirroredStrategy.scope()`, a `tf.function`
  calling `strategy.run` with `tf.nn.compute_average_loss`.

Both have 23,528,522 trainable parameters (checked), the same layers,
padding and initializer families, and the same moving statistics (a plain
moving average of decay 0.9 each, from 0 and 1: `examples/resnet`'s
`MovingAverage`, Keras' own), but not the same initial values, so the
losses printed differ; they are there to show both sides train. Each round is
one job of worker processes on 127.0.0.1 (`replicator.launch`) in which MWMS
starts each worker's server, the replicator joins it, the two first calls are
timed (ours first in odd rounds, MWMS first in even ones), then their calls
alternate; one step per call on both sides.

With `--statistics per-worker` both sides normalize by each worker's own batch
instead (the large-minibatch recipe's default, and `examples/resnet`'s): ours
`snt.BaseBatchNorm`, whose moving averages the replicator keeps the same on every
worker, MWMS `BatchNormalization(synchronized=False)`. Each worker then also
reports whether every worker's moving averages hold the same bits (a CRC of
their bytes, gathered), on each side. A third side then runs MWMS's own Keras
model under the replicator ("ours, Keras model": built in `repl.context()`,
the optimizer's slots made in the first call), so that the library is also
compared with MWMS on one model: the two models cost different times to trace
and compile.

  python -m benchmarks.runs.bn_step [--workers 2] [--rounds 3] [--iters 15] [--batch 4]
      [--statistics global|per-worker] [--json out.json]

Prints ms per step (worker 0's median call of `--iters`, best of the rounds),
the first call's seconds (ours builds the model inside it, MWMS before it),
and MWMS / ours, best of rounds and round by round.
"""

import argparse
import json
import time
import zlib

from benchmarks.runs import common

VARIANTS = ("ours", "MWMS")
SAME_MODEL = "ours, Keras model"  # MWMS's model under the replicator (per-worker only)
PARAMETERS = 23_528_522  # Sonnet's ResNet-50 v1.5 with 10 classes
# What keeps ours' moving statistics (`models.batch_norm_factory`), in the JSON:
# results without it come from `snt.BatchNorm`'s debiased averages.
MOVING_AVERAGES = "plain"
_CLASSES = 10
_IMAGE = 32


def keras_resnet50(keras, num_classes: int, synchronized: bool = True):
  """ResNet-50 v1.5 in Keras layers, as `models.ResNet50`; batch norm synchronized or not."""
  layers = keras.layers
  init = keras.initializers.VarianceScaling(2.0, "fan_out", "truncated_normal")

  def conv_bn(x, channels, kernel, stride, relu, zero_scale=False):
    padding = "same"
    if stride > 1:
      # Keras' 'same' would pad a strided conv of an even input (0, k - 1):
      # models.Conv2D splits it evenly, so each output sees the same pixels.
      total = kernel - 1
      x = layers.ZeroPadding2D(((total // 2, total - total // 2),) * 2)(x)
      padding = "valid"
    x = layers.Conv2D(channels, kernel, stride, padding=padding, use_bias=False,
                      kernel_initializer=init)(x)
    x = layers.BatchNormalization(
        synchronized=synchronized, momentum=0.9, epsilon=1e-5,
        gamma_initializer="zeros" if zero_scale else "ones")(x)
    return layers.ReLU()(x) if relu else x

  images = keras.Input([_IMAGE, _IMAGE, 3])
  x = conv_bn(images, 64, 7, 2, relu=True)
  x = layers.MaxPooling2D(3, 2, padding="same")(x)
  in_channels = 64
  for stage, (blocks, channels) in enumerate(zip([3, 4, 6, 3], [64, 128, 256, 512])):
    for i in range(blocks):
      stride = 2 if (i == 0 and stage > 0) else 1
      shortcut = x
      if stride != 1 or in_channels != 4 * channels:
        shortcut = conv_bn(x, 4 * channels, 1, stride, relu=False)
      y = conv_bn(x, channels, 1, 1, relu=True)
      y = conv_bn(y, channels, 3, stride, relu=True)
      y = conv_bn(y, 4 * channels, 1, 1, relu=False, zero_scale=True)
      x = layers.ReLU()(layers.Add()([y, shortcut]))
      in_channels = 4 * channels
  x = layers.GlobalAveragePooling2D()(x)
  logits = layers.Dense(
      num_classes, kernel_initializer=keras.initializers.RandomNormal(stddev=0.01))(x)
  return keras.Model(images, logits)


def worker(ours_first: bool, batch: int, iters: int, threads: int,
           synchronized: bool = True):
  """One worker of the job (TF_CONFIG set by the launcher): ours and MWMS.

  MWMS starts the worker's server and the replicator joins it; the two
  models' first calls are timed one after the other (`ours_first` says which
  goes first), then their calls alternate.
  """
  num_workers = common.start_worker(threads)
  import keras  # pylint: disable=g-import-not-at-top
  import numpy as np
  import tensorflow as tf
  from examples.resnet import models  # pylint: disable=g-import-not-at-top
  rng = np.random.RandomState(0)
  images = rng.rand(batch * 4, _IMAGE, _IMAGE, 3).astype(np.float32)
  labels = rng.randint(0, _CLASSES, batch * 4).astype(np.int32)
  make_ds = lambda: tf.data.Dataset.from_tensor_slices((images, labels)).repeat().batch(
      batch, drop_remainder=True)
  count = lambda variables: sum(int(np.prod(v.shape)) for v in variables)
  # Before TensorFlow runs anything: MWMS starts the server, ours joins it.
  strategy, repl = common.mwms_and_replicator()

  ds = make_ds()
  build_s = {}  # what each side does before its first call, as a user writes it
  start = time.perf_counter()
  with repl.context():  # ours makes the variables in the first call
    model = models.ResNet50(num_classes=_CLASSES, norm_factory=models.batch_norm_factory(
        cross_replica=synchronized))
    optimizer = repl.wrap_optimizer(keras.optimizers.SGD(0.01, momentum=0.9))
  build_s["ours"] = time.perf_counter() - start

  def training_step(net, net_optimizer, **training):
    """Ours: a step_fn of its own for `net` (`training`: how it is told to train)."""
    def step_fn(b):
      x, y = b
      with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            y, net(x, **training)))
      net_optimizer.apply(tape.gradient(loss, net.trainable_variables),
                          net.trainable_variables)
      return loss
    return step_fn

  step_fn = training_step(model, optimizer, is_training=True)
  input_fn = lambda ctx: ds  # one object: a new input_fn would be a new input
  variants = VARIANTS if synchronized else (VARIANTS[0], SAME_MODEL, VARIANTS[1])
  models_of = {"ours": model}
  calls = {"ours": lambda: repl.run(step_fn, input_fn)[0]}
  if not synchronized:  # (Keras' synchronized batch norm needs tf.distribute)
    same_ds = make_ds()
    start = time.perf_counter()
    with repl.context():
      models_of[SAME_MODEL] = keras_resnet50(keras, _CLASSES, synchronized=False)
      same_optimizer = repl.wrap_optimizer(keras.optimizers.SGD(0.01, momentum=0.9))
    build_s[SAME_MODEL] = time.perf_counter() - start

    same_model_step = training_step(models_of[SAME_MODEL], same_optimizer, training=True)
    same_input_fn = lambda ctx: same_ds
    calls[SAME_MODEL] = lambda: repl.run(same_model_step, same_input_fn)[0]

  mwms_ds = make_ds()
  start = time.perf_counter()
  with strategy.scope():  # MWMS needs the variables before its step (eagerly)
    keras_model = keras_resnet50(keras, _CLASSES, synchronized)
    keras_optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
    keras_optimizer.build(keras_model.trainable_variables)
  iterator = iter(strategy.distribute_datasets_from_function(lambda ctx: mwms_ds))
  build_s["MWMS"] = time.perf_counter() - start

  def replica_fn(b):
    x, y = b
    with tf.GradientTape() as tape:
      per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(
          y, keras_model(x, training=True))
      # Over the global batch: Keras sums the gradients over replicas.
      loss = tf.nn.compute_average_loss(per_example,
                                        global_batch_size=batch * num_workers)
    grads = tape.gradient(loss, keras_model.trainable_variables)
    keras_optimizer.apply_gradients(zip(grads, keras_model.trainable_variables))
    return tf.reduce_mean(per_example)

  @tf.function
  def step(it):
    return strategy.experimental_local_results(strategy.run(replica_fn, (next(it),)))[0]

  calls["MWMS"] = lambda: step(iterator)
  models_of["MWMS"] = keras_model
  first_call_s = {}
  for name in (variants if ours_first else variants[::-1]):
    start = time.perf_counter()
    calls[name]().numpy()
    first_call_s[name] = time.perf_counter() - start
  # One more untimed call each: the first one does the tracing (and, ours, the building).
  seconds = common.median_seconds_alternating(calls, iters, warmup=1)
  # (ours builds its Sonnet model in the first call)
  parameters = {name: count(m.trainable_variables) for name, m in models_of.items()}
  losses = {name: float(call()) for name, call in calls.items()}
  # Whether every worker holds the same moving averages, on each side: a CRC of
  # their bytes, gathered over the workers by MWMS.
  averages = {name: ([v for v in m.variables if not v.trainable] if name == "ours"
                     else m.non_trainable_weights) for name, m in models_of.items()}
  crcs = tf.constant([[zlib.crc32(b"".join(v.numpy().tobytes() for v in averages[name]))
                       for name in variants]], tf.int64)
  every = strategy.experimental_local_results(strategy.run(
      lambda: tf.distribute.get_replica_context().all_gather(crcs, axis=0)))[0].numpy()
  same = {name: bool((every[:, i] == every[0, i]).all()) for i, name in enumerate(variants)}
  print("RESULT " + json.dumps(
      {name: {"ms_per_step": 1e3 * seconds[name], "first_call_s": first_call_s[name],
              "build_s": build_s[name], "loss": losses[name],
              "moving_averages_alike": same[name], "parameters": parameters[name]}
       for name in calls}), flush=True)
  repl.shutdown()


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workers", default="2")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--iters", type=int, default=15, help="timed calls per job")
  parser.add_argument("--batch", type=int, default=4, help="images per worker")
  parser.add_argument("--statistics", default="global", choices=["global", "per-worker"],
                      help="batch-norm statistics over the global batch or each worker's")
  parser.add_argument("--json", default=None)
  parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
  parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
  args = parser.parse_args()
  synchronized = args.statistics == "global"
  if args.worker:
    worker(args.worker == "ours first", args.batch, args.iters, args.threads, synchronized)
    return
  counts = [int(w) for w in args.workers.split(",")]
  best, first, to_loss, rounds, losses, parameters, alike = {}, {}, {}, [], {}, {}, {}
  for round_index in range(args.rounds):
    rounds.append({})
    for workers in counts:
      ours_first = round_index % 2 == 0
      results = common.run_job(
          "benchmarks.runs.bn_step",
          ["--worker", "ours first" if ours_first else "MWMS first",
           "--batch", str(args.batch), "--iters", str(args.iters),
           "--statistics", args.statistics],
          workers)
      for variant in results:
        result = results[variant]
        key = f"{variant}, {workers} workers"
        if result["parameters"] != PARAMETERS:
          raise AssertionError(f"{key}: {result['parameters']:,} trainable parameters, "
                               f"expected {PARAMETERS:,} (Sonnet's ResNet-50 v1.5)")
        parameters[variant] = result["parameters"]
        best[key] = min(best.get(key, float("inf")), result["ms_per_step"])
        first[key] = min(first.get(key, float("inf")), result["first_call_s"])
        to_loss[key] = min(to_loss.get(key, float("inf")),
                           result["build_s"] + result["first_call_s"])
        rounds[-1][key] = result["ms_per_step"]
        losses[key] = result["loss"]
        alike[key] = alike.get(key, True) and result["moving_averages_alike"]
        print(f"round {round_index + 1}, {key}: {result['ms_per_step']:.1f} ms/step, "
              f"first call {result['first_call_s']:.1f} s, loss {result['loss']:.4f}",
              flush=True)
  result = {"machine": common.machine(), "batch_per_worker": args.batch,
            "statistics": args.statistics,
            "ours' moving averages": MOVING_AVERAGES,
            "moving averages the same bits on every worker (every round)": alike,
            "image_size": _IMAGE, "iters": args.iters,
            "trainable parameters": parameters,
            "ms_per_step (best of rounds)": best,
            "first_call_s (best of rounds)": first,
            # building the model and optimizer as each side must, then the first call
            "to_first_loss_s (best of rounds)": to_loss,
            "loss of worker 0 after the same steps (last round)": losses,
            "ms_per_step (each round)": rounds,
            **common.mwms_over_ours(best, rounds, counts)}
  common.write_result(result, args.json)


if __name__ == "__main__":
  main()
