r"""The batch-size sweep of the TF-Replicator paper, at laptop scale.

Trains one SN-GAN per (global batch size, seed) for the same number of
generator steps, evaluates each ``--evals_per_run`` times, and writes under
``--workdir``: ``results.json``, ``results.md`` (the table: each run's last
evaluation, the real images it saw, and its mean over its last
``--mean_of_last`` evaluations), ``quality_vs_batch_size.png``,
``quality_vs_steps.png``, ``quality_vs_real_images.png`` (quality per real
image seen), ``quality_last_vs_mean.png``, ``samples_by_batch_size.png``, and
each run in ``runs/batch<B>_seed<S>/``.

  python -m examples.gan.sweep                 # `small`: about 7 minutes on 2 CPU cores
  python -m examples.gan.sweep --preset=wide   # batch 8 to 512: see README.md

``--preset`` names a sweep (`PRESETS`): ``small`` is the default one (batch 8
to 64), ``wide`` the paper's range (batch 8 to 512, same config, steps and
metrics); flags given explicitly override a preset's.

The work directory defaults to ``results/gan/<preset>`` (with no preset,
``results/gan/<config>``) under the repository root (the directory that holds ``examples/``), whatever the current directory;
git ignores ``/results/``. The committed reference table and figures of the
`small` sweep are in ``examples/gan/reference/small/``: copy a new sweep's
there to update them.

It logs its plan first (runs, replicas, steps, where the results go), then
``run i/N: batch B, seed S``, the run's ``step n/N`` lines with their rate and
ETA, its evaluations, and after each run ``runs done i/N`` with the elapsed
time and an ETA for the runs left.

Flags of `examples.gan.train` (``--config``, ``--ch``, ``--n_dis``,
``--num_generator_steps``, ``--dataset``, ``--replicator``, ``--cpu_replicas``,
...) apply to every run, and ``--log_every`` and ``--checkpoint_every`` when
given (default: a progress line and a checkpoint at each evaluation).
The sweep sets each run's batch size and seed itself: ``--batch_sizes`` and
``--seeds`` replace ``--global_batch_size`` and ``--seed``, which are refused.

A finished run (its ``record.json``) is reused only if it was made with the
same settings (config, replicas, data, evaluation, ...); an interrupted run
resumes from its latest checkpoint, under the same condition. Otherwise the
sweep stops and names the differences.
"""

import dataclasses
import json
import os
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from absl import app
from absl import flags
from absl import logging
import numpy as np

from examples import common
from examples.gan import data
from examples.gan import metrics
from examples.gan import report
from examples.gan import train

FLAGS = flags.FLAGS

# The committed reference results, one folder per config (README's table).
REFERENCE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference")
RESULT_FILES = ("results.md", "results.json", "quality_vs_batch_size.png",
                "quality_vs_steps.png", "quality_vs_real_images.png",
                "quality_last_vs_mean.png", "samples_by_batch_size.png")


@dataclasses.dataclass(frozen=True)
class Preset:
  """A named sweep: the flags it sets unless they are given."""
  config: str
  batch_sizes: Tuple[int, ...]
  seeds: Tuple[int, ...]


# `small` is the default sweep (README's line 1, reference/small/); `wide` is
# the paper's batch range on the same config, steps and metrics
# (reference/wide/).
PRESETS = {
    "small": Preset("small", (8, 16, 32, 64), (0, 1)),
    "wide": Preset("small", (8, 16, 32, 64, 128, 256, 512), (0, 1)),
}


def define_flags():
  """The flags of `examples.gan.train`, and the sweep's own."""
  train.define_flags(sweep=True)
  flags.DEFINE_list("batch_sizes", ["8", "16", "32", "64"], "Global batch sizes.")
  flags.DEFINE_list("seeds", ["0", "1"], "Seeds per batch size.")
  flags.DEFINE_integer("grid_class", 1, "Class of the sample grids (1: Trouser "
                       "in Fashion-MNIST).")
  flags.DEFINE_enum("preset", None, sorted(PRESETS),
                    "A named sweep (PRESETS): small (batch 8-64, the default "
                    "one) or wide (batch 8-512); sets --config, --batch_sizes "
                    "and --seeds unless given, and the default --workdir "
                    "results/gan/<preset>.")
  flags.DEFINE_integer("mean_of_last", 3, "The table and plots also give each "
                       "run's mean over its last this many evaluations.")
  flags.DEFINE_integer("evals_per_run", 10, "Evaluations per run (quality vs "
                       "steps), if --eval_every is 0.")


def default_workdir(name: str) -> str:
  """``results/gan/<name>`` (preset or config) under the repository root, which git ignores."""
  return os.path.join(train.REPO_ROOT, "results", "gan", name)


def apply_preset() -> Optional[str]:
  """Sets the flags of ``--preset`` that were not given; returns its name."""
  name = FLAGS.preset
  if name is None:
    return None
  preset = PRESETS[name]
  values = {"config": preset.config,
            "batch_sizes": [str(b) for b in preset.batch_sizes],
            "seeds": [str(s) for s in preset.seeds]}
  for flag, value in values.items():
    if not FLAGS[flag].present:
      FLAGS[flag].value = value
  return name


def run_settings(config, data_kwargs: Dict, seed: int, eval_every: int,
                 evaluation: Dict[str, Any], grid_class: int,
                 num_replicas: int) -> Dict[str, Any]:
  """Everything that determines a run's record, as it reads back from JSON.

  The replica count is in it: each replica draws its own noise, so the same
  seed on another number of replicas is another run.
  """
  return json.loads(json.dumps({
      "config": dataclasses.asdict(config), "seed": seed,
      "eval_every": eval_every, "data": data_kwargs, "evaluation": evaluation,
      "grid_class": grid_class, "num_replicas": num_replicas}))


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


def _check_settings(stored: Optional[Dict], settings: Dict[str, Any], path: str,
                    workdir: str, what: str, unrecorded: str):
  """Raises unless `stored` (read from `path`) equals `settings`.

  `unrecorded` is the difference named when nothing is stored.
  """
  differing = [unrecorded] if stored is None else _differences(stored, settings)
  if differing:
    raise ValueError(
        f"workdir: {workdir} already holds {what} ({path}) made with other "
        f"settings ({'; '.join(differing)}), so the sweep would mix two "
        "experiments in one table. Pass another --workdir, or delete "
        f"{os.path.join(workdir, 'runs')} to train every run again with these "
        "flags.")


def load_finished(record_path: str, settings: Dict[str, Any], workdir: str):
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
  _check_settings(record.get("settings"), settings, record_path, workdir,
                  "a finished run", "the record predates recorded settings")
  return record


def check_started(run_dir: str, settings: Dict[str, Any], workdir: str):
  """Raises if `run_dir` holds a started run made with other settings."""
  path = os.path.join(run_dir, "settings.json")
  if os.path.exists(path):
    with open(path) as f:
      _check_settings(json.load(f), settings, path, workdir, "a started run", "")
  elif os.path.isdir(os.path.join(run_dir, "checkpoints")):
    _check_settings(None, settings, run_dir, workdir, "a started run",
                    "its checkpoints predate recorded settings")


def run_one(config, evaluator, data_kwargs, run_dir: str, seed: int,
            eval_every: int, *, settings: Dict[str, Any], workdir: str,
            log_every: int, checkpoint_every: int, grid_class: int,
            repl=None) -> Dict:
  """Trains (or reloads) one run on a replicator of its own; returns its record.

  A finished run is reused only if it was made with `settings`
  (`load_finished`); a started one resumes from its checkpoint on the same
  condition. `repl` (default: `common.make_replicator()`) is shut down when
  the run ends, which releases its input pipeline at once: tf.data iterators
  left idle for many minutes were slow to tear down (minutes) when a single
  replicator was shut down at the end of the sweep.
  """
  record_path = os.path.join(run_dir, "record.json")
  record = load_finished(record_path, settings, workdir)
  if record is not None:
    if repl is not None:
      repl.shutdown()
    return record
  check_started(run_dir, settings, workdir)
  os.makedirs(run_dir, exist_ok=True)
  with open(os.path.join(run_dir, "settings.json"), "w") as f:
    json.dump(settings, f, indent=1)
  repl = repl or common.make_replicator()
  input_fn = data.make_input_fn(config.dataset, config.global_batch_size,
                                seed=seed, **data_kwargs)
  start = time.time()
  trainer, history = train.train(
      config, repl, workdir=run_dir, input_fn=input_fn, seed=seed,
      log_every=log_every, eval_every=eval_every,
      checkpoint_every=checkpoint_every, evaluator=evaluator)
  grid_labels = np.full([64], grid_class)
  np.save(os.path.join(run_dir, "grid.npy"), trainer.sample(grid_labels, seed=7))
  repl.shutdown()
  record = {"global_batch_size": config.global_batch_size, "seed": seed,
            "num_replicas": settings["num_replicas"],
            "wall_s": time.time() - start, "history": history,
            "settings": settings}
  with open(record_path, "w") as f:
    json.dump(record, f, indent=1)
  return record


# Train flags whose role the sweep's own flags take: (sweep flag, why).
_REPLACED_FLAGS = {
    "global_batch_size": ("--batch_sizes", "each run's batch size"),
    "seed": ("--seeds", "each run's seed"),
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
                       mean_of_last=FLAGS.mean_of_last,
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
  parsed = {"batch_sizes": _int_list("batch_sizes", minimum=1,
                                     example="8,16,32,64"),
            "seeds": _int_list("seeds", minimum=0, example="0,1")}
  if not FLAGS.classifier_metrics and not FLAGS.inception_weights:
    raise ValueError(
        "classifier_metrics: the sweep compares runs by their metrics, and "
        "--noclassifier_metrics without --inception_weights leaves none. Drop "
        "--noclassifier_metrics, or pass --inception_weights=PATH.")
  return parsed


def estimate_seconds(done: Sequence[Tuple[int, float]],
                     batch_sizes: Sequence[int]) -> Optional[float]:
  """Seconds that runs at `batch_sizes` take, from `done` (batch, seconds) runs.

  A straight line through the runs done, in the batch size (a run's cost grows
  with its batch), once they span two batch sizes; their mean before that;
  None with no run done. No run is predicted faster than the fastest done.

  >>> round(estimate_seconds([(8, 30.0), (16, 40.0)], [32, 64]), 6)  # 60 s + 100 s
  160.0
  """
  if not done:
    return None
  batches, seconds = (np.array(v, float) for v in zip(*done))
  if len(set(batches)) > 1:
    slope, intercept = np.polyfit(batches, seconds, 1)
    predicted = intercept + slope * np.array(batch_sizes, float)
  else:
    predicted = np.full(len(batch_sizes), seconds.mean())
  return float(np.maximum(predicted, seconds.min()).sum())


def _relative(path: str) -> str:
  """`path` relative to the current directory when it lies below it."""
  relative = os.path.relpath(path)
  return path if relative.startswith("..") else relative


def _final_metrics(record: Dict) -> str:
  final = {k: v for k, v in record["history"][-1].items() if k != "step"}
  return ", ".join(f"{k} {v:.3g}" for k, v in final.items())


def _plan(base, batch_sizes, seeds, workdir, data_kwargs, eval_every,
          num_replicas):
  """(batch, seed, run directory, settings, finished record or None) per run.

  Every finished or started run is checked here, so a mismatch stops the
  sweep before anything trains.
  """
  plan = []
  for batch in batch_sizes:
    for seed in seeds:
      config = base.replace(global_batch_size=batch)
      run_dir = os.path.join(workdir, "runs", f"batch{batch}_seed{seed}")
      settings = run_settings(config, data_kwargs, seed, eval_every,
                              evaluation_settings(), FLAGS.grid_class,
                              num_replicas)
      record = load_finished(os.path.join(run_dir, "record.json"), settings,
                             workdir)
      if record is None:
        check_started(run_dir, settings, workdir)
      plan.append((batch, seed, run_dir, settings, record))
  return plan


def main(argv):
  del argv
  sweep_start = time.time()
  preset = apply_preset()
  base = train.config_from_flags()
  parsed = check_flags(base)
  name = preset or base.name
  workdir = os.path.abspath(FLAGS.workdir or default_workdir(name))
  batch_sizes, seeds = parsed["batch_sizes"], parsed["seeds"]
  steps = base.num_generator_steps
  eval_every = FLAGS.eval_every or -(-steps // FLAGS.evals_per_run)
  log_every = FLAGS.log_every if FLAGS["log_every"].present else eval_every
  checkpoint_every = (FLAGS.checkpoint_every if FLAGS["checkpoint_every"].present
                      else eval_every)
  data_kwargs = train.data_kwargs_from_flags(base)
  # Before any TensorFlow op: on a CPU it splits the CPU into --cpu_replicas
  # devices. It trains the first run that needs training.
  repl = common.make_replicator()
  try:
    plan = _plan(base, batch_sizes, seeds, workdir, data_kwargs, eval_every,
                 repl.num_replicas)
  except ValueError:
    repl.shutdown()
    raise
  num_replicas = repl.num_replicas
  finished = sum(record is not None for *_, record in plan)
  num_evals = len(range(eval_every, steps, eval_every)) + 1
  logging.info(
      "plan: %s%d run%s (batch sizes %s x seeds %s), %d replica(s) each, config "
      "%s on %s, %d generator steps per run (n_dis=%d), %d evaluations each of "
      "%d samples; %s; results in %s",
      f"preset {preset}, " if preset else "", len(plan),
      "" if len(plan) == 1 else "s",
      ",".join(map(str, batch_sizes)), ",".join(map(str, seeds)), num_replicas,
      base.name, base.dataset, steps, base.n_dis, num_evals,
      FLAGS.num_eval_samples,
      f"{finished} finished earlier, reused" if finished else "none finished yet",
      workdir)

  evaluator = None
  if finished < len(plan):
    evaluator = metrics.Evaluator(
        base, data_kwargs, cache_dir=FLAGS.cache_dir,
        num_samples=FLAGS.num_eval_samples,
        classifier_metrics=FLAGS.classifier_metrics,
        inception_weights=FLAGS.inception_weights,
        num_real=FLAGS.num_real_examples,
        num_train=FLAGS.num_classifier_examples)
    logging.info("evaluator ready after %s",
                 common.format_duration(time.time() - sweep_start))

  records, grids, trained = [], {}, []
  for i, (batch, seed, run_dir, settings, record) in enumerate(plan, 1):
    config = base.replace(global_batch_size=batch)
    reused = record is not None
    if reused:
      logging.info("run %d/%d: batch %d, seed %d: finished at step %d in an "
                   "earlier sweep (%s), reused: %s", i, len(plan), batch, seed,
                   record["history"][-1]["step"], _relative(run_dir),
                   _final_metrics(record))
    else:
      logging.info("run %d/%d: batch %d, seed %d", i, len(plan), batch, seed)
      run_start = time.time()
      record = run_one(
          config, evaluator, data_kwargs, run_dir, seed, eval_every,
          settings=settings, workdir=workdir, log_every=log_every,
          checkpoint_every=checkpoint_every, grid_class=FLAGS.grid_class,
          repl=repl)
      repl = None  # run_one shut it down; the next run makes its own
      trained.append((batch, time.time() - run_start))
      logging.info("run %d/%d done in %s: %s", i, len(plan),
                   common.format_duration(trained[-1][1]), _final_metrics(record))
    records.append(record)
    if reused and i < len(plan):
      continue  # a reused run took no time: its own line says so
    left = [b for b, _, _, _, r in plan[i:] if r is None]
    eta = estimate_seconds(trained, left)
    logging.info(
        "runs done %d/%d, elapsed %s%s", i, len(plan),
        common.format_duration(time.time() - sweep_start),
        "" if not left else f", ETA {common.format_duration(eta)}"
        if eta is not None else ", ETA after the first run trained here")
  if repl is not None:  # every run was reused
    repl.shutdown()
  for batch in batch_sizes:
    grids[batch] = np.load(os.path.join(workdir, "runs",
                                        f"batch{batch}_seed{seeds[0]}", "grid.npy"))

  summary = report.summarize(records, mean_of_last=FLAGS.mean_of_last,
                             n_dis=base.n_dis)
  table = report.markdown_table(summary, records)
  with open(os.path.join(workdir, "results.json"), "w") as f:
    # The config less its batch size, which is each run's (`batch_sizes`).
    config = {k: v for k, v in dataclasses.asdict(base).items()
              if k != "global_batch_size"}
    json.dump({"config": config, "num_generator_steps": steps,
               "num_replicas": num_replicas, "replicator": FLAGS.replicator,
               "batch_sizes": batch_sizes, "seeds": seeds, "summary": summary,
               "runs": records, "sweep_wall_s": time.time() - sweep_start},
              f, indent=1)
  with open(os.path.join(workdir, "results.md"), "w") as f:
    f.write(f"# {base.name}: {steps} generator steps, n_dis={base.n_dis}, "
            f"{num_replicas} replica(s) ({FLAGS.replicator})\n\n")
    f.write(table)
  dataset = report.dataset_title(base.dataset)
  report.plot_quality(summary, records, workdir, dataset=dataset,
                      num_classes=base.num_classes, n_dis=base.n_dis)
  class_name = (data.FASHION_MNIST_CLASSES[FLAGS.grid_class]
                if base.dataset == "fashion_mnist" else str(FLAGS.grid_class))
  report.plot_samples(
      grids, workdir, f"{dataset}, class {class_name}: 64 samples from the same "
      f"noise, seed {seeds[0]}, after {steps} generator steps")
  print(table)
  print(f"Sweep took {common.format_duration(time.time() - sweep_start)}. "
        f"Results in {_relative(workdir)}:")
  for name in RESULT_FILES:
    print("  " + _relative(os.path.join(workdir, name)))
  print(f"  {_relative(os.path.join(workdir, 'runs'))}/batch<B>_seed<S>/: each run's "
        "checkpoints, TensorBoard events, metrics.json and record.json")
  reference = os.path.join(REFERENCE_DIR, name)
  if os.path.isdir(reference):
    print(f"Committed reference of the {name} sweep (examples/gan/README.md): "
          f"{_relative(reference)}/")


if __name__ == "__main__":
  define_flags()
  app.run(main)
