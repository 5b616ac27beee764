r"""The batch-size sweep of the TF-Replicator paper, at laptop scale.

Trains one SN-GAN per (global batch size, seed) for the same number of
generator steps, evaluates each, and writes under ``--results_dir``:
``results.json``, ``results.md`` (the table), ``quality_vs_batch_size.png``,
``quality_vs_steps.png`` and ``samples_by_batch_size.png``.

  python -m examples.gan.sweep              # `small`: ~20 min on 2 CPU cores

Flags of `examples.gan.train` (``--config``, ``--ch``, ``--n_dis``,
``--num_generator_steps``, ``--dataset``, ...) apply to every run, and
``--log_every`` and ``--checkpoint_every`` when given (default: twice per
evaluation, and at the end). The sweep sets the batch size, seed and work
directory of each run itself: ``--batch_sizes``, ``--seeds`` and
``--results_dir`` replace ``--global_batch_size``, ``--seed`` and ``--workdir``,
which are refused.

A finished run (its ``record.json``) is reused only if it was made with the
same settings; otherwise the sweep stops and names the differences.
"""

import dataclasses
import json
import os
import time
from typing import Any, Dict, List

from absl import app
from absl import flags
from absl import logging
import numpy as np

from examples.gan import data
from examples.gan import metrics
from examples.gan import report
from examples.gan import train

FLAGS = flags.FLAGS


def define_flags():
  """The flags of `examples.gan.train`, and the sweep's own."""
  train.define_flags()
  flags.DEFINE_list("batch_sizes", ["8", "16", "32", "64"], "Global batch sizes.")
  flags.DEFINE_list("seeds", ["0", "1"], "Seeds per batch size.")
  flags.DEFINE_string("results_dir", None,
                      "Default: examples/gan/results/<config>.")
  flags.DEFINE_integer("grid_class", 1, "Class of the sample grids (1: Trouser "
                       "in Fashion-MNIST).")
  flags.DEFINE_integer("evals_per_run", 4, "Evaluations per run (quality vs "
                       "steps), if --eval_every is 0.")


def run_settings(config, data_kwargs: Dict, seed: int, eval_every: int,
                 evaluation: Dict[str, Any], grid_class: int) -> Dict[str, Any]:
  """Everything that determines a run's record, as it reads back from JSON."""
  return json.loads(json.dumps({
      "config": dataclasses.asdict(config), "seed": seed,
      "eval_every": eval_every, "data": data_kwargs, "evaluation": evaluation,
      "grid_class": grid_class}))


def evaluation_settings() -> Dict[str, Any]:
  """The flags that change a run's metrics."""
  return {name: FLAGS[name].value for name in (
      "num_eval_samples", "num_real_examples", "num_classifier_examples",
      "classifier_metrics", "inception_weights")}


def _differences(stored: Dict, requested: Dict, prefix: str = "") -> List[str]:
  differing = []
  for key in sorted(set(stored) | set(requested)):
    old, new = stored.get(key), requested.get(key)
    if isinstance(old, dict) and isinstance(new, dict):
      differing += _differences(old, new, f"{prefix}{key}.")
    elif old != new:
      differing.append(f"{prefix}{key}: {old!r} there, {new!r} now")
  return differing


def load_finished(record_path: str, settings: Dict[str, Any], results_dir: str):
  """The record at `record_path` if it was made with `settings`; None if absent.

  Raises:
    ValueError: the record was made with other settings (or before settings
      were recorded): reusing it would mix runs of different experiments in
      one table under the current flags.
  """
  if not os.path.exists(record_path):
    return None
  with open(record_path) as f:
    record = json.load(f)
  stored = record.get("settings")
  differing = (["the record predates recorded settings"] if stored is None
               else _differences(stored, settings))
  if differing:
    raise ValueError(
        f"results_dir: {results_dir} already holds a finished run "
        f"({record_path}) made with other settings ({'; '.join(differing)}), "
        "so the sweep would mix two experiments in one table. Pass another "
        f"--results_dir, or delete {os.path.join(results_dir, 'runs')} to "
        "train every run again with these flags.")
  return record


def run_one(config, evaluator, data_kwargs, workdir: str, seed: int,
            eval_every: int, *, settings: Dict[str, Any], results_dir: str,
            log_every: int, checkpoint_every: int, grid_class: int) -> Dict:
  """Trains (or reloads) one run on a replicator of its own; returns its record.

  A finished run is reused only if it was made with `settings`
  (`load_finished`). Shutting each run's replicator down when the run ends
  releases its input pipeline at once: tf.data iterators left idle for many
  minutes were slow to tear down (minutes) when a single replicator was shut
  down at the end.
  """
  record_path = os.path.join(workdir, "record.json")
  record = load_finished(record_path, settings, results_dir)
  if record is not None:
    return record
  repl = train.make_replicator(FLAGS.replicator, FLAGS.tpu,
                               FLAGS.num_cpu_devices)
  input_fn = data.make_input_fn(config.dataset, config.global_batch_size,
                                seed=seed, **data_kwargs)
  start = time.time()
  trainer, history = train.train(
      config, repl, workdir=workdir, input_fn=input_fn, seed=seed,
      log_every=log_every, eval_every=eval_every,
      checkpoint_every=checkpoint_every, evaluator=evaluator)
  grid_labels = np.full([64], grid_class)
  np.save(os.path.join(workdir, "grid.npy"), trainer.sample(grid_labels, seed=7))
  repl.shutdown()
  record = {"global_batch_size": config.global_batch_size, "seed": seed,
            "wall_s": time.time() - start, "history": history,
            "settings": settings}
  with open(record_path, "w") as f:
    json.dump(record, f, indent=1)
  return record


# Train flags whose role the sweep's own flags take: (sweep flag, why).
_REPLACED_FLAGS = {
    "global_batch_size": ("--batch_sizes", "each run's batch size"),
    "seed": ("--seeds", "each run's seed"),
    "workdir": ("--results_dir", "each run's directory, <results_dir>/runs/"),
}


def _int_list(name: str, *, minimum: int, example: str) -> List[int]:
  texts = FLAGS[name].value
  try:
    values = [int(text) for text in texts]
  except ValueError:
    values = []
  if not values or min(values) < minimum:
    raise ValueError(
        f"{name}: expected a comma-separated list of integers >= {minimum}, "
        f"got --{name}={','.join(texts)}; e.g. --{name}={example}.")
  return values


def check_flags(base) -> Dict[str, Any]:
  """Checks the sweep's flags before anything trains; returns the parsed ones.

  Raises:
    ValueError: naming the flag, its value and the fix.
  """
  for name, (replacement, role) in _REPLACED_FLAGS.items():
    if FLAGS[name].value != FLAGS[name].default:
      raise ValueError(
          f"{name}: the sweep sets {role} itself, so --{name}="
          f"{FLAGS[name].value} would be ignored. Use {replacement} instead "
          f"(or run one model with python -m examples.gan.train --{name}=...).")
  train.check_positive(evals_per_run=FLAGS.evals_per_run,
                       log_every=FLAGS.log_every,
                       checkpoint_every=FLAGS.checkpoint_every)
  if FLAGS.eval_every < 0:
    raise ValueError(f"eval_every: must be >= 0 (0: --evals_per_run "
                     f"evaluations), got {FLAGS.eval_every}.")
  if not 0 <= FLAGS.grid_class < base.num_classes:
    raise ValueError(
        f"grid_class: {FLAGS.grid_class} is not a class of {base.dataset} "
        f"({base.num_classes} classes); pass --grid_class between 0 and "
        f"{base.num_classes - 1}.")
  return {"batch_sizes": _int_list("batch_sizes", minimum=1,
                                   example="8,16,32,64"),
          "seeds": _int_list("seeds", minimum=0, example="0,1")}


def main(argv):
  del argv
  sweep_start = time.time()
  base = train.config_from_flags()
  parsed = check_flags(base)
  results_dir = FLAGS.results_dir or os.path.join(
      os.path.dirname(__file__), "results", base.name)
  os.makedirs(results_dir, exist_ok=True)
  batch_sizes, seeds = parsed["batch_sizes"], parsed["seeds"]
  steps = base.num_generator_steps
  eval_every = FLAGS.eval_every or -(-steps // FLAGS.evals_per_run)
  log_every = (FLAGS.log_every if FLAGS["log_every"].present
               else max(1, eval_every // 2))
  checkpoint_every = (FLAGS.checkpoint_every if FLAGS["checkpoint_every"].present
                      else steps)
  data_kwargs = train.data_kwargs_from_flags(base)
  evaluator = metrics.Evaluator(
      base, data_kwargs, cache_dir=FLAGS.cache_dir,
      num_samples=FLAGS.num_eval_samples,
      classifier_metrics=FLAGS.classifier_metrics,
      inception_weights=FLAGS.inception_weights,
      num_real=FLAGS.num_real_examples,
      num_train=FLAGS.num_classifier_examples)
  logging.info("evaluator ready after %.0f s", time.time() - sweep_start)

  records, grids = [], {}
  for batch in batch_sizes:
    for seed in seeds:
      config = base.replace(global_batch_size=batch)
      workdir = os.path.join(results_dir, "runs", f"batch{batch}_seed{seed}")
      settings = run_settings(config, data_kwargs, seed, eval_every,
                              evaluation_settings(), FLAGS.grid_class)
      records.append(run_one(
          config, evaluator, data_kwargs, workdir, seed, eval_every,
          settings=settings, results_dir=results_dir, log_every=log_every,
          checkpoint_every=checkpoint_every, grid_class=FLAGS.grid_class))
      logging.info("batch %d seed %d: %s (%.0f s into the sweep)", batch, seed,
                   records[-1]["history"][-1], time.time() - sweep_start)
    grids[batch] = np.load(os.path.join(results_dir, "runs",
                                        f"batch{batch}_seed{seeds[0]}", "grid.npy"))

  summary = report.summarize(records)
  table = report.markdown_table(summary, records)
  with open(os.path.join(results_dir, "results.json"), "w") as f:
    # The config less its batch size, which is each run's (`batch_sizes`).
    config = {k: v for k, v in dataclasses.asdict(base).items()
              if k != "global_batch_size"}
    json.dump({"config": config, "num_generator_steps": steps,
               "batch_sizes": batch_sizes, "seeds": seeds, "summary": summary,
               "runs": records, "sweep_wall_s": time.time() - sweep_start},
              f, indent=1)
  with open(os.path.join(results_dir, "results.md"), "w") as f:
    f.write(f"# {base.name}: {steps} generator steps, n_dis={base.n_dis}\n\n")
    f.write(table)
  report.plot_quality(summary, records, results_dir)
  class_name = (data.FASHION_MNIST_CLASSES[FLAGS.grid_class]
                if base.dataset == "fashion_mnist" else str(FLAGS.grid_class))
  report.plot_samples(grids, results_dir,
                      f"class {class_name}, same noise, seed {seeds[0]}, {steps} steps")
  print(table)
  print(f"Sweep took {time.time() - sweep_start:.0f} s. Results in {results_dir}:")
  for name in ("results.md", "results.json", "quality_vs_batch_size.png",
               "quality_vs_steps.png", "samples_by_batch_size.png"):
    print("  " + os.path.join(results_dir, name))


if __name__ == "__main__":
  define_flags()
  app.run(main)
