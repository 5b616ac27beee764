"""ResNet-50 training images/s: examples/resnet under GpuReplicator vs plain Keras.

Item 6 of benchmarks/report/targets.json, for the device machine's GPU (GPU build of
TensorFlow, see ../shared/device/README.md):

  python -m benchmarks.runs.resnet50 [--batch 128] [--rounds 3] [--json out.json]

Four variants, alternating within each round in one process, on one device
(the first GPU, else the CPU), each training on one synthetic ImageNet-shaped
batch repeated (no input cost):
- "GpuReplicator fp32": `examples/resnet`'s Sonnet ResNet-50 v1.5 and its
  training step (Nesterov momentum, label smoothing, weight decay), `run(...,
  steps=K)`;
- "GpuReplicator bf16 + XLA": the same with bfloat16 convolutions and
  `GpuReplicator(jit_compile=True)`;
- "Keras fp32": `keras.applications.ResNet50(weights=None)` (v1: stride on the
  1x1, slightly fewer FLOPs than v1.5), SGD with Nesterov momentum,
  `model.fit`;
- "Keras bf16 + XLA": the same under the `mixed_bfloat16` policy, compiled with
  `jit_compile=True`.
Each variant is built where round 1 first needs it, and its first call (trace,
XLA compilation) is untimed; the JSON is written after every timed variant, so
a run cut short keeps what it measured. Prints
images/s (best of rounds) and the ratios to Keras fp32, best of rounds and
round by round. On a CPU, `--image_size 32 --batch 8 --steps 2 --calls 1`
checks that the script runs (the figures mean nothing there).
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # pylint: disable=g-import-not-at-top
import tensorflow as tf

import replicator
from benchmarks.runs import common
from examples.resnet import data
from examples.resnet import experiment as experiment_lib
from examples.resnet import models
from examples.resnet import schedule as schedule_lib

# The fp32 pair first: Keras' bf16 + XLA compiles for minutes (over two on the H200).
VARIANTS = ("GpuReplicator fp32", "Keras fp32", "GpuReplicator bf16 + XLA",
            "Keras bf16 + XLA")
_ONE_DEVICE = replicator.InputContext(num_input_pipelines=1, input_pipeline_id=0,
                                      num_replicas_in_sync=1)


def replicator_variant(bf16_xla: bool, batch: int, image_size: int, steps: int):
  """A `call()` that trains `steps` steps with examples/resnet under GpuReplicator."""
  repl = replicator.GpuReplicator(jit_compile=bf16_xla)
  schedule = schedule_lib.LearningRateSchedule(0.1, batch, steps_per_epoch=1000,
                                               total_epochs=90)
  experiment = experiment_lib.Experiment(repl, models.ResNet50, 1000, schedule,
                                         bfloat16=bf16_xla)
  input_fn = data.make_input_fn("synthetic", True, batch, image_size=image_size)

  def call():
    out = repl.run(experiment.train_step, input_fn, steps=steps)
    return out["loss"][0]
  return call


def keras_variant(bf16_xla: bool, batch: int, image_size: int, steps: int):
  """A `call()` that trains `steps` steps of Keras' ResNet-50 with `model.fit`."""
  keras.mixed_precision.set_global_policy("mixed_bfloat16" if bf16_xla else "float32")
  try:
    model = keras.applications.ResNet50(weights=None, input_shape=(image_size, image_size, 3),
                                        classes=1000)
  finally:
    keras.mixed_precision.set_global_policy("float32")
  model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=False),
                jit_compile=bf16_xla)
  dataset = data.make_input_fn("synthetic", True, batch, image_size=image_size)(_ONE_DEVICE)

  def call():
    history = model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0)
    return history.history["loss"][-1]
  return call


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--batch", type=int, default=128)
  parser.add_argument("--image_size", type=int, default=224)
  parser.add_argument("--steps", type=int, default=20, help="steps per call")
  parser.add_argument("--calls", type=int, default=3, help="timed calls per round")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--variants", default=";".join(VARIANTS),
                      help="';'-separated names from VARIANTS")
  parser.add_argument("--json", default=None)
  args = parser.parse_args()
  names = args.variants.split(";")
  unknown = [n for n in names if n not in VARIANTS]
  if unknown:
    raise SystemExit(f"--variants: unknown {unknown}; choose from {list(VARIANTS)}")
  build = {"GpuReplicator fp32": lambda: replicator_variant(False, *sizes),
           "GpuReplicator bf16 + XLA": lambda: replicator_variant(True, *sizes),
           "Keras fp32": lambda: keras_variant(False, *sizes),
           "Keras bf16 + XLA": lambda: keras_variant(True, *sizes)}
  sizes = (args.batch, args.image_size, args.steps)
  calls = {}
  rounds = []
  for _ in range(args.rounds):
    rounds.append({})
    for name in names:
      if name not in calls:  # built and traced (untimed) where round 1 first needs it
        calls[name] = build[name]()
        float(calls[name]())
      start = time.perf_counter()
      for _ in range(args.calls):
        loss = float(calls[name]())  # fetched: the steps have run
      seconds = time.perf_counter() - start
      rounds[-1][name] = args.calls * args.steps * args.batch / seconds
      print(f"{name}: {rounds[-1][name]:.1f} images/s (loss {loss:.3f})", flush=True)
      if args.json:  # what has run so far, in case the device's time runs out
        common.write_result(_summary(rounds, args), args.json, quiet=True)
  common.write_result(_summary(rounds, args), args.json)


def _summary(rounds, args) -> dict:
  """The JSON result: images/s and the ratios to Keras fp32, best of rounds and each.

  A round cut short (the device's time ran out) counts for the variants it has.
  """
  names = list(dict.fromkeys(name for r in rounds for name in r))
  best = {name: max(r[name] for r in rounds if name in r) for name in names}
  ratios, per_round = {}, {}
  if "Keras fp32" in best:
    for name in names:
      if name != "Keras fp32":
        key = f"{name} / Keras fp32"
        ratios[key] = best[name] / best["Keras fp32"]
        per_round[key] = [r[name] / r["Keras fp32"] for r in rounds
                          if name in r and "Keras fp32" in r]
  devices = tf.config.list_physical_devices("GPU")
  return {"machine": common.machine(),
          "device": (tf.config.experimental.get_device_details(devices[0]).get(
              "device_name", "GPU") if devices else "CPU"),
          "tensorflow": tf.__version__, "batch": args.batch,
          "image_size": args.image_size, "steps_per_call": args.steps,
          "rounds": len(rounds),
          "images_per_second (best of rounds)": best,
          "images_per_second (each round)": rounds,
          "ratios (best of rounds)": ratios, "ratios (each round)": per_round}


if __name__ == "__main__":
  main()
