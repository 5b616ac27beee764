"""The sweep's summary over seeds, its Markdown table and its figures.

`summarize` reduces the runs' records (`sweep.run_one`) to the final metrics
per batch size, and to each run's mean over its last `mean_of_last`
evaluations (a figure that one noisy evaluation does not decide);
`markdown_table` writes them as ``results.md``'s table, the last evaluation's
columns first, then the real images seen and the means of the last
evaluations; `plot_quality` and `plot_samples` draw
``quality_vs_batch_size.png``, ``quality_vs_steps.png``,
``quality_vs_real_images.png``, ``quality_last_vs_mean.png`` and
``samples_by_batch_size.png`` from the figures of `quality_figures`,
`real_images_figure`, `last_vs_mean_figure` and `samples_figure`, which tests
inspect.

Real images seen: every discriminator step takes one global batch of real
images and there are n_dis of them per generator step (`train.train`), so
after s generator steps the discriminator has seen s x n_dis x global batch.
"""

import os
from typing import Dict, List, Optional

import numpy as np


METRIC_NAMES = {
    "frechet_classifier_distance": "Fréchet classifier distance (lower is better)",
    "classifier_score": "classifier score (higher is better)",
    "class_accuracy": "samples classified as their class",
    "frechet_inception_distance": "Fréchet Inception Distance (lower is better)",
    "inception_score": "Inception Score (higher is better)",
}


def n_dis_of(record: Dict, default: Optional[int] = None) -> int:
  """The discriminator steps per generator step of a run's record."""
  config = (record.get("settings") or {}).get("config") or {}
  n_dis = config.get("n_dis", default)
  if n_dis is None:
    raise ValueError("the record names no n_dis (settings.config.n_dis): pass "
                     "n_dis to count the real images seen.")
  return int(n_dis)


def real_images_seen(record: Dict, step: int, n_dis: Optional[int] = None) -> int:
  """Real images the discriminator has seen after `step` generator steps."""
  return int(step) * n_dis_of(record, n_dis) * int(record["global_batch_size"])


def _stats(values) -> Dict:
  values = np.array(values)
  return dict(mean=float(values.mean()), std=float(values.std()),
              min=float(values.min()), max=float(values.max()))


def summarize(records: List[Dict], *, mean_of_last: int = 3,
              n_dis: Optional[int] = None) -> Dict:
  """Per batch size: mean, std, min, max over seeds of the final metrics.

  Also, under ``"mean_of_last"``, the same over seeds of each run's mean over
  its last `mean_of_last` evaluations (``"evaluations"`` says how many were
  averaged: fewer if a run had fewer), and ``"real_images_seen"`` per run at
  its last step (`n_dis` when the records' settings lack it).
  """
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
        entry[name].update(_stats(entry[name]["values"]))
  for batch, entry in summary.items():
    runs = [r for r in records if str(r["global_batch_size"]) == batch]
    last = [r["history"][-mean_of_last:] for r in runs]
    means = {"evaluations": min(len(h) for h in last)}
    for name in METRIC_NAMES:
      if name in entry:
        values = [float(np.mean([h[name] for h in hist])) for hist in last]
        means[name] = {"values": values, **_stats(values)}
    entry["mean_of_last"] = means
    try:
      seen = {real_images_seen(r, r["history"][-1]["step"], n_dis) for r in runs}
    except ValueError:
      seen = set()
    if len(seen) == 1:
      entry["real_images_seen"] = seen.pop()
  return summary


def _cell(m: Dict) -> str:
  return f"{m['mean']:.3g} ± {m['std']:.2g} [{m['min']:.3g}, {m['max']:.3g}]"


def markdown_table(summary: Dict, records: List[Dict]) -> str:
  names = [n for n in METRIC_NAMES if n in next(iter(summary.values()))]
  header = ["global batch", "seeds", *(METRIC_NAMES[n] for n in names),
            "train+eval time per run (s)"]
  extra = all("mean_of_last" in e for e in summary.values())
  if extra:
    count = next(iter(summary.values()))["mean_of_last"]["evaluations"]
    header += ["real images seen per run",
               *(f"{METRIC_NAMES[n]}, mean of last {count} evaluations"
                 for n in names)]
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for batch, entry in sorted(summary.items(), key=lambda kv: int(kv[0])):
    cells = [batch, str(len(entry["seeds"]))]
    for name in names:
      m = entry[name]
      cells.append(_cell(m))
    wall = np.mean([r["wall_s"] for r in records
                    if str(r["global_batch_size"]) == batch])
    cells.append(f"{wall:.0f}")
    if extra:
      seen = entry.get("real_images_seen")
      cells.append("?" if seen is None else f"{seen:,}")
      cells += [_cell(entry["mean_of_last"][name]) for name in names]
    lines.append("| " + " | ".join(cells) + " |")
  lines.append("\nmean ± std [min, max] over seeds, after the same number of "
               "generator steps.")
  if extra:
    lines.append(
        f"The first metric columns are each run's last evaluation; the last "
        f"{len(names)} are each run's mean over its last {count} evaluations "
        "(one evaluation is noisy), then mean ± std [min, max] over seeds. Real "
        "images seen: generator steps x n_dis x global batch, the real images "
        "the discriminator took.")
  return "\n".join(lines) + "\n"


DATASET_TITLES = {"fashion_mnist": "Fashion-MNIST", "imagenet2012": "ImageNet",
                  "tfds:cifar10": "CIFAR-10", "synthetic": "synthetic stripes"}
# Each metric's axis label, and which way is better.
AXIS_LABELS = {
    "frechet_classifier_distance": ("Fréchet classifier distance", "lower is better"),
    "classifier_score": ("classifier score", "higher is better"),
    "class_accuracy": ("fraction classified as their class", "higher is better"),
    "frechet_inception_distance": ("Fréchet Inception Distance", "lower is better"),
    "inception_score": ("Inception Score", "higher is better"),
}


def dataset_title(dataset: str) -> str:
  """The name a figure gives a config's dataset (`configs.GanConfig.dataset`)."""
  return DATASET_TITLES.get(dataset, dataset.split(":", 1)[-1])


def _pyplot():
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def _steps_and_classes(records: List[Dict], num_classes: Optional[int]):
  """The runs' generator steps and n_dis, and the class count (None if unknown)."""
  steps = max(r["history"][-1]["step"] for r in records)
  config = (records[0].get("settings") or {}).get("config") or {}
  return steps, config.get("n_dis"), num_classes or config.get("num_classes")


def _means_and_spread(stats):
  """Each batch size's mean over seeds, and the error bars to its min and max."""
  means = np.array([s["mean"] for s in stats])
  spread = np.array([[m - s["min"] for m, s in zip(means, stats)],
                     [s["max"] - m for m, s in zip(means, stats)]])
  return means, spread


def _label_panel(ax, name: str, num_classes: Optional[int]):
  label, better = AXIS_LABELS[name]
  ax.set_ylabel(label)
  ax.set_title(better, fontsize=9)
  ax.grid(alpha=0.3)
  if name == "class_accuracy" and num_classes:
    chance = 1.0 / num_classes
    ax.axhline(chance, color="gray", linestyle="--", linewidth=1,
               label=f"chance ({chance:.2g}, {num_classes} classes)")


def quality_figures(summary: Dict, records: List[Dict], *, dataset: str = "",
                    num_classes: Optional[int] = None):
  """The figures of ``quality_vs_batch_size.png`` and ``quality_vs_steps.png``.

  Every panel has its metric as y label; the titles name the dataset and the
  generator steps; the class-accuracy panels mark chance (1 / `num_classes`,
  read from the records' settings when not given) with a dashed line.
  """
  plt = _pyplot()
  names = [n for n in METRIC_NAMES if n in next(iter(summary.values()))]
  batches = sorted(int(b) for b in summary)
  steps, n_dis, num_classes = _steps_and_classes(records, num_classes)
  about = f"{dataset}: " if dataset else ""
  after = f"{steps} generator steps" + (f" (n_dis={n_dis})" if n_dis else "")
  seeds = sorted({r["seed"] for r in records})

  by_batch, axes = plt.subplots(1, len(names), figsize=(4.8 * len(names), 4.0),
                                squeeze=False)
  for ax, name in zip(axes[0], names):
    stats = [summary[str(b)][name] for b in batches]
    means, spread = _means_and_spread(stats)
    ax.errorbar(batches, means, yerr=spread, marker="o", capsize=4,
                label="mean, min to max over seeds")
    for i, (b, s) in enumerate(zip(batches, stats)):
      ax.scatter([b] * len(s["values"]), s["values"], color="gray", s=10, zorder=3,
                 label="one seed" if i == 0 else None)
    ax.set_xscale("log", base=2)
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set_xlabel("global batch size")
    _label_panel(ax, name, num_classes)
    ax.legend(fontsize=7)
  by_batch.suptitle(f"{about}sample quality vs global batch size after {after}, "
                    f"seeds {', '.join(map(str, seeds))}", fontsize=10)
  by_batch.tight_layout()

  by_steps, axes = plt.subplots(1, len(names), figsize=(4.8 * len(names), 4.0),
                                squeeze=False)
  for ax, name in zip(axes[0], names):
    for b in batches:
      runs = [r["history"] for r in records if r["global_batch_size"] == b]
      run_steps = [h["step"] for h in runs[0]]
      values = np.array([[h[name] for h in run] for run in runs])
      line, = ax.plot(run_steps, values.mean(0), marker=".", label=f"batch {b}")
      ax.fill_between(run_steps, values.min(0), values.max(0),
                      color=line.get_color(), alpha=0.2)
    ax.set_xlabel("generator steps")
    _label_panel(ax, name, num_classes)
    ax.legend(fontsize=7)
  by_steps.suptitle(f"{about}sample quality during training, {after}; line: mean "
                    "over seeds, band: min to max", fontsize=10)
  by_steps.tight_layout()
  return by_batch, by_steps


def real_images_figure(summary: Dict, records: List[Dict], *, dataset: str = "",
                       num_classes: Optional[int] = None,
                       n_dis: Optional[int] = None):
  """The figure of ``quality_vs_real_images.png``: quality per example seen.

  Each metric against the real images the discriminator has seen (generator
  steps x n_dis x global batch; log scale), one curve per batch size (line:
  mean over seeds, band: min to max), so a larger batch that wins only by
  seeing more data shows as curves that lie on one another.
  """
  plt = _pyplot()
  names = [n for n in METRIC_NAMES if n in next(iter(summary.values()))]
  batches = sorted(int(b) for b in summary)
  steps, record_n_dis, num_classes = _steps_and_classes(records, num_classes)
  n_dis = n_dis or record_n_dis
  about = f"{dataset}: " if dataset else ""
  figure, axes = plt.subplots(1, len(names), figsize=(4.8 * len(names), 4.0),
                              squeeze=False)
  for ax, name in zip(axes[0], names):
    for b in batches:
      runs = [r for r in records if r["global_batch_size"] == b]
      seen = [real_images_seen(runs[0], h["step"], n_dis)
              for h in runs[0]["history"]]
      values = np.array([[h[name] for h in r["history"]] for r in runs])
      line, = ax.plot(seen, values.mean(0), marker=".", label=f"batch {b}")
      ax.fill_between(seen, values.min(0), values.max(0),
                      color=line.get_color(), alpha=0.2)
    ax.set_xscale("log")
    ax.set_xlabel("real images seen by the discriminator\n"
                  f"(generator steps x n_dis={n_dis} x global batch)")
    _label_panel(ax, name, num_classes)
    ax.legend(fontsize=7)
  figure.suptitle(f"{about}sample quality per real image seen, up to {steps} "
                  "generator steps; line: mean over seeds, band: min to max",
                  fontsize=10)
  figure.tight_layout()
  return figure


def last_vs_mean_figure(summary: Dict, records: List[Dict], *,
                        dataset: str = "", num_classes: Optional[int] = None):
  """The figure of ``quality_last_vs_mean.png``: last evaluation vs mean of last k.

  Each metric against the global batch size twice: each run's last evaluation
  and each run's mean over its last k evaluations (`summarize`'s
  ``mean_of_last``), each as the mean over seeds with bars from min to max.
  """
  plt = _pyplot()
  names = [n for n in METRIC_NAMES if n in next(iter(summary.values()))]
  batches = sorted(int(b) for b in summary)
  steps, n_dis, num_classes = _steps_and_classes(records, num_classes)
  count = next(iter(summary.values()))["mean_of_last"]["evaluations"]
  about = f"{dataset}: " if dataset else ""
  after = f"{steps} generator steps" + (f" (n_dis={n_dis})" if n_dis else "")
  figure, axes = plt.subplots(1, len(names), figsize=(4.8 * len(names), 4.0),
                              squeeze=False)
  for ax, name in zip(axes[0], names):
    for shift, label, stats in (
        (0.96, "last evaluation", [summary[str(b)][name] for b in batches]),
        (1.04, f"mean of last {count} evaluations",
         [summary[str(b)]["mean_of_last"][name] for b in batches])):
      means, spread = _means_and_spread(stats)
      ax.errorbar(np.array(batches) * shift, means, yerr=spread, marker="o",
                  capsize=4, label=f"{label}: mean, min to max over seeds")
    ax.set_xscale("log", base=2)
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set_xlabel("global batch size")
    _label_panel(ax, name, num_classes)
    ax.legend(fontsize=7)
  figure.suptitle(f"{about}each run's last evaluation vs its mean over the last "
                  f"{count} evaluations, after {after}", fontsize=10)
  figure.tight_layout()
  return figure


def plot_quality(summary: Dict, records: List[Dict], results_dir: str, *,
                 dataset: str = "", num_classes: Optional[int] = None,
                 n_dis: Optional[int] = None):
  """Writes ``quality_vs_batch_size.png`` and ``quality_vs_steps.png``, and
  ``quality_vs_real_images.png`` and ``quality_last_vs_mean.png``."""
  plt = _pyplot()
  figures = quality_figures(summary, records, dataset=dataset,
                            num_classes=num_classes)
  figures += (real_images_figure(summary, records, dataset=dataset,
                                 num_classes=num_classes, n_dis=n_dis),
              last_vs_mean_figure(summary, records, dataset=dataset,
                                  num_classes=num_classes))
  for figure, name in zip(figures, ("quality_vs_batch_size", "quality_vs_steps",
                                    "quality_vs_real_images",
                                    "quality_last_vs_mean")):
    figure.savefig(os.path.join(results_dir, f"{name}.png"), dpi=110)
    plt.close(figure)


# Each generated image is drawn at least this many pixels wide (nearest
# neighbour, a whole number of pixels per image pixel), so each can be judged.
SAMPLE_PIXELS = 96


def tile(images: np.ndarray, gap: int = 1) -> np.ndarray:
  """A square grid of `images` ([N, H, W, C] in [-1, 1]) in [0, 1], gaps mid-gray."""
  n = int(np.sqrt(len(images)))
  h, w, c = images.shape[1:]
  grid = np.full([n * h + (n - 1) * gap, n * w + (n - 1) * gap, c], 0.5)
  for i in range(n * n):
    row, col = divmod(i, n)
    grid[row * (h + gap):row * (h + gap) + h,
         col * (w + gap):col * (w + gap) + w] = (images[i] + 1) / 2
  return np.clip(grid, 0, 1)


def samples_figure(grids: Dict[int, np.ndarray], title: str):
  """One panel of samples per batch size, each image `SAMPLE_PIXELS` wide or more.

  The axes are placed in whole pixels, so at ``dpi=100`` every image pixel
  becomes a block of ``scale x scale`` figure pixels.
  """
  plt = _pyplot()
  items = sorted(grids.items())
  height = items[0][1].shape[1]
  scale = -(-SAMPLE_PIXELS // height)
  tiles = [np.repeat(np.repeat(tile(images), scale, 0), scale, 1)
           for _, images in items]
  side = max(t.shape[0] for t in tiles)
  columns = int(np.ceil(np.sqrt(len(items)))) if len(items) > 3 else len(items)
  rows = -(-len(items) // columns)
  margin, caption, top, dpi = 20, 30, 50, 100
  width = columns * side + (columns + 1) * margin
  total = top + rows * (caption + side + margin)
  fig = plt.figure(figsize=(width / dpi, total / dpi), dpi=dpi)
  for i, ((batch, _), image) in enumerate(zip(items, tiles)):
    row, col = divmod(i, columns)
    left = margin + col * (side + margin)
    upper = top + row * (caption + side + margin) + caption
    ax = fig.add_axes([left / width, 1 - (upper + image.shape[0]) / total,
                       image.shape[1] / width, image.shape[0] / total])
    gray = image.shape[-1] == 1
    ax.imshow(image[..., 0] if gray else image, cmap="gray" if gray else None,
              vmin=0, vmax=1, interpolation="nearest")
    ax.set_title(f"global batch {batch}", fontsize=11)
    ax.axis("off")
  fig.suptitle(title, fontsize=12, y=1 - 12 / total, va="top")
  return fig


def plot_samples(grids: Dict[int, np.ndarray], results_dir: str, title: str):
  """Writes ``samples_by_batch_size.png`` (`samples_figure`)."""
  plt = _pyplot()
  fig = samples_figure(grids, title)
  fig.savefig(os.path.join(results_dir, "samples_by_batch_size.png"),
              dpi=fig.get_dpi())
  plt.close(fig)
