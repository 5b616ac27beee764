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


METRIC_NAMES = {
    "frechet_classifier_distance": "Fréchet classifier distance (lower is better)",
    "classifier_score": "classifier score (higher is better)",
    "class_accuracy": "samples classified as their class",
    "frechet_inception_distance": "Fréchet Inception Distance (lower is better)",
    "inception_score": "Inception Score (higher is better)",
}


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


def summarize(records: List[Dict]) -> Dict:
  """Final metrics per batch size: mean, std, min, max over seeds."""
  summary = {}
  for record in records:
    final = record["history"][-1]
    entry = summary.setdefault(str(record["global_batch_size"]), {"seeds": []})
    entry["seeds"].append(record["seed"])
    for name in METRIC_NAMES:
      if name in final:
        entry.setdefault(name, {"values": []})["values"].append(final[name])
  for entry in summary.values():
    for name in METRIC_NAMES:
      if name in entry:
        values = np.array(entry[name]["values"])
        entry[name].update(mean=float(values.mean()), std=float(values.std()),
                           min=float(values.min()), max=float(values.max()))
  return summary


def markdown_table(summary: Dict, records: List[Dict]) -> str:
  names = [n for n in METRIC_NAMES if n in next(iter(summary.values()))]
  header = ["global batch", "seeds", *(METRIC_NAMES[n] for n in names),
            "train+eval time per run (s)"]
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for batch, entry in sorted(summary.items(), key=lambda kv: int(kv[0])):
    cells = [batch, str(len(entry["seeds"]))]
    for name in names:
      m = entry[name]
      cells.append(f"{m['mean']:.3g} ± {m['std']:.2g} "
                   f"[{m['min']:.3g}, {m['max']:.3g}]")
    wall = np.mean([r["wall_s"] for r in records
                    if str(r["global_batch_size"]) == batch])
    cells.append(f"{wall:.0f}")
    lines.append("| " + " | ".join(cells) + " |")
  lines.append("\nmean ± std [min, max] over seeds, after the same number of "
               "generator steps.")
  return "\n".join(lines) + "\n"


def plot_quality(summary: Dict, records: List[Dict], results_dir: str):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  names = [n for n in METRIC_NAMES if n in next(iter(summary.values()))]
  batches = sorted(int(b) for b in summary)

  fig, axes = plt.subplots(1, len(names), figsize=(4.5 * len(names), 3.6))
  for ax, name in zip(np.atleast_1d(axes), names):
    stats = [summary[str(b)][name] for b in batches]
    means = np.array([s["mean"] for s in stats])
    spread = np.array([[m - s["min"] for m, s in zip(means, stats)],
                       [s["max"] - m for m, s in zip(means, stats)]])
    ax.errorbar(batches, means, yerr=spread, marker="o", capsize=4)
    for b, s in zip(batches, stats):
      ax.scatter([b] * len(s["values"]), s["values"], color="gray", s=10, zorder=3)
    ax.set_xscale("log", base=2)
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set_xlabel("global batch size")
    ax.set_title(METRIC_NAMES[name], fontsize=9)
    ax.grid(alpha=0.3)
  fig.suptitle("Sample quality vs batch size (equal generator steps; bars: "
               "min-max over seeds, dots: seeds)", fontsize=9)
  fig.tight_layout()
  fig.savefig(os.path.join(results_dir, "quality_vs_batch_size.png"), dpi=110)
  plt.close(fig)

  fig, axes = plt.subplots(1, len(names), figsize=(4.5 * len(names), 3.6))
  for ax, name in zip(np.atleast_1d(axes), names):
    for b in batches:
      runs = [r["history"] for r in records if r["global_batch_size"] == b]
      steps = [h["step"] for h in runs[0]]
      values = np.array([[h[name] for h in run] for run in runs])
      line, = ax.plot(steps, values.mean(0), marker=".", label=f"batch {b}")
      ax.fill_between(steps, values.min(0), values.max(0),
                      color=line.get_color(), alpha=0.2)
    ax.set_xlabel("generator steps")
    ax.set_title(METRIC_NAMES[name], fontsize=9)
    ax.grid(alpha=0.3)
  np.atleast_1d(axes)[0].legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(os.path.join(results_dir, "quality_vs_steps.png"), dpi=110)
  plt.close(fig)


def plot_samples(grids: Dict[int, np.ndarray], results_dir: str, title: str):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(1, len(grids), figsize=(2.6 * len(grids), 2.9))
  for ax, (batch, images) in zip(np.atleast_1d(axes), sorted(grids.items())):
    n = int(np.sqrt(len(images)))
    h, w, c = images.shape[1:]
    tiled = images[:n * n].reshape(n, n, h, w, c).transpose(0, 2, 1, 3, 4)
    tiled = (tiled.reshape(n * h, n * w, c) + 1) / 2
    ax.imshow(np.clip(tiled.squeeze(-1) if c == 1 else tiled, 0, 1),
              cmap="gray" if c == 1 else None)
    ax.set_title(f"global batch {batch}", fontsize=9)
    ax.axis("off")
  fig.suptitle(title, fontsize=9)
  fig.tight_layout()
  fig.savefig(os.path.join(results_dir, "samples_by_batch_size.png"), dpi=110)
  plt.close(fig)


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

  summary = summarize(records)
  table = markdown_table(summary, records)
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
  plot_quality(summary, records, results_dir)
  class_name = (data.FASHION_MNIST_CLASSES[FLAGS.grid_class]
                if base.dataset == "fashion_mnist" else str(FLAGS.grid_class))
  plot_samples(grids, results_dir,
               f"class {class_name}, same noise, seed {seeds[0]}, {steps} steps")
  print(table)
  print(f"Sweep took {time.time() - sweep_start:.0f} s. Results in {results_dir}:")
  for name in ("results.md", "results.json", "quality_vs_batch_size.png",
               "quality_vs_steps.png", "samples_by_batch_size.png"):
    print("  " + os.path.join(results_dir, name))


if __name__ == "__main__":
  define_flags()
  app.run(main)
