"""The sweep's summary over seeds, its Markdown table and its figures.

`summarize` reduces the runs' records (`sweep.run_one`) to the final metrics
per batch size; `markdown_table` writes them as ``results.md``'s table;
`plot_quality` and `plot_samples` draw ``quality_vs_batch_size.png``,
``quality_vs_steps.png`` and ``samples_by_batch_size.png``.
"""

import os
from typing import Dict, List

import numpy as np


METRIC_NAMES = {
    "frechet_classifier_distance": "Fréchet classifier distance (lower is better)",
    "classifier_score": "classifier score (higher is better)",
    "class_accuracy": "samples classified as their class",
    "frechet_inception_distance": "Fréchet Inception Distance (lower is better)",
    "inception_score": "Inception Score (higher is better)",
}


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
