"""RESULTS.md's sections for the benchmarks that no target judges.

The checkpoint round trip, the all-gather and batch norm steps, the time to the
first step and the GPU paths' checks: each `*_section(r)` turns one result
(benchmarks/results/NAME.json) into markdown, as benchmarks/report/sections.py does for
the benchmarks that benchmarks/report/targets.json judges.
"""

from benchmarks.report import sections
from benchmarks.report import targets

COMMANDS = sections.COMMANDS
table = sections.table


def checkpoint_section(r):
  return "\n\n".join([
      f"## Checkpoint round trip ({r['parameters'] / 1e6:.1f} M parameters + Adam slots, "
      f"{r['checkpoint_MB']} MB)",
      f"`{COMMANDS['checkpoint_roundtrip']}`",
      table([["save (2 replicas)", r["save_s"], r["plain tf.train.Checkpoint write_s"],
              f"{r['ratios']['save: ours / plain']:.2f}x"],
             ["restore (on 1 replica)", r["restore_s (on 1 replica)"],
              r["plain tf.train.Checkpoint read_s"],
              f"{r['ratios']['restore: ours / plain']:.2f}x"]],
            ["", "replicator.Checkpointer, s", "tf.train.Checkpoint, s", "ours / plain"])])


def _mwms_over_ours_table(r):
  each = r["MWMS / ours (each round)"]
  return table([[w, f"{targets.median(each[w]):.2f}x",
                 f"{min(each[w]):.2f}x - {max(each[w]):.2f}x", f"{value:.2f}x"]
                for w, value in r["MWMS / ours (best of rounds)"].items()],
               ["same W", "MWMS / ours, median of the rounds (each within one job)",
                "round by round", "best of rounds"])


_SAME_JOB = ("each round one job per W, in which MWMS and ours share the worker "
             "processes and their calls alternate; ")


def gather_section(r):
  ms = r["ms_per_step (best of rounds)"]
  losses = r.get("loss of worker 0 after the same steps (last round)", {})
  rows = [[k, f"{v:.2f}", f"{losses[k]:.6f}" if k in losses else ""]
          for k, v in ms.items()]
  return "\n\n".join([
      "## All-gather in a training step (contrastive loss over the global batch, "
      f"{r['batch_per_worker']} x {r['dim']} embeddings per worker, differentiated)",
      f"`{COMMANDS['gather_step']}` ({_SAME_JOB}each worker process: cores / W "
      "intra-op threads; "
      "ms: worker 0's median call, 5 steps a call, best of the rounds)",
      table(rows, ["variant", "ms/step", "worker 0's loss after the same steps"]),
      _mwms_over_ours_table(r)])


def bn_step_section(r, command=None):
  ms = r["ms_per_step (best of rounds)"]
  first = r.get("first_call_s (best of rounds)", {})
  # Older results lack these figures; their columns are left out then.
  to_loss = r.get("to_first_loss_s (best of rounds)")
  losses = r.get("loss of worker 0 after the same steps (last round)", {})
  alike = r.get("moving averages the same bits on every worker (every round)")
  rows = [[k, f"{v:.1f}", f"{first[k]:.1f}" if k in first else ""]
          + ([f"{to_loss[k]:.1f}"] if to_loss else [])
          + [f"{losses[k]:.4f}" if k in losses else ""]
          + (["yes" if alike.get(k) else "**no**"] if alike else []) for k, v in ms.items()]
  parameters = ", ".join(f"{k} {v:,}" for k, v in r["trainable parameters"].items())
  synchronized = r.get("statistics", "global") == "global"
  plain = (" and plain moving averages (`examples/resnet`'s `MovingAverage`, as Keras' "
           "own)" if r.get("ours' moving averages") == "plain" else "")
  return "\n\n".join([
      ("## Synchronized batch norm in a training step (ResNet-50 v1.5, " if synchronized else
       "## Per-worker batch norm in a training step (ResNet-50 v1.5, ")
      + f"{r['image_size']}x{r['image_size']}, {r['batch_per_worker']} images per worker, "
      + ("statistics over the global batch)" if synchronized else
         "statistics over each worker's batch, moving averages kept the same everywhere "
         "by ours)"),
      f"`{command or COMMANDS['bn_step' if synchronized else 'bn_step_per_worker']}` "
      f"({_SAME_JOB}"
      "each worker process: cores / W intra-op threads; "
      + ("ours: Sonnet with `CrossReplicaBatchNorm`" + plain + "; MWMS: Keras with "
         "`BatchNormalization(synchronized=True)`; " if synchronized else
         ("ours: Sonnet with `snt.BaseBatchNorm`" + plain if plain else
          "ours: Sonnet with `snt.BatchNorm` (debiased moving averages: a counter, the raw "
          "and the debiased average each)")
         + ", whose moving averages the replicator "
         "averages over the workers where they differ; MWMS: Keras with "
         "`BatchNormalization(synchronized=False)`; "
         + ("ours, Keras model: MWMS's Keras model under the replicator, built in "
            "`repl.context()`, so the library meets MWMS on one model; "
            if any(k.startswith("ours, Keras model") for k in ms) else ""))
      + f"trainable parameters: {parameters}; ms: worker 0's median call of {r['iters']}, "
      "one step a call, best of the rounds; first call: ours builds the model in it, "
      "MWMS before it, timed one after the other, ours first in odd rounds; "
      "the losses differ because the initial values do"
      + ("; the moving averages: whether every worker held the same bits after the "
         "timed calls, in every round (a CRC of their bytes, gathered)" if alike else "")
      + ")",
      table(rows, ["variant", "ms/step", "first call, s"]
            + (["build (MWMS: eagerly, before its step) + first call, s"] if to_loss else [])
            + ["worker 0's loss after the same steps"]
            + (["moving averages the same on every worker"] if alike else [])),
      _mwms_over_ours_table(r)] + ([_first_loss_table(to_loss)] if to_loss else []))


def _first_loss_table(to_loss: dict) -> str:
  """MWMS's time to the first loss over each of ours, per worker count."""
  item_7, = targets.of("bn_step_per_worker")  # shown as the glance table shows it
  rows = []
  for key in to_loss:
    name, workers = key.rsplit(", ", 1)
    if name != "MWMS":
      rows.append([workers, name,
                   targets.shown(to_loss[f"MWMS, {workers}"] / to_loss[key], item_7)])
  return table(rows, ["workers", "ours", "MWMS / ours, to the first loss (best of rounds)"])


def gpu_check_section(r, command=None):
  """The GPU paths' checks against one-device oracles (not a benchmark)."""
  rows = [[row["check"], "pass" if row["ok"] else "**FAIL**", row["detail"]]
          for row in r["results"]]
  # The same checks run at an earlier commit, where the result has them.
  before = next((r[k] for k in r if k.startswith("before ")), None)
  failed_before = [row["check"] for row in before or () if not row["ok"]]
  return "\n\n".join([
      "## The GPU paths against one-device oracles (correctness, not speed)",
      f"`{command or r['command']}` at {r.get('commit', '?')} (benchmarks/checks/gpu_check.py "
      "says what each check trains and compares; TF32 off)",
      table(rows, ["check", "", "largest differences"]),
      *([f"The same checks before {r.get('commit')}: "
         + ", ".join(failed_before) + " failed (NCCL between logical GPUs of one GPU: "
         "'NCCL: invalid usage'; bfloat16: NcclAllReduce takes no bfloat16)."]
        if failed_before else [])])


def first_step_section(r):
  rows, ratios = [], []
  for n, figures in r["replicas"].items():
    for variant, seconds in figures["first_step_s"].items():
      rows.append([f"{variant}, {n} replica(s)", f"{seconds:.2f}"])
    for name, ratio in figures["ratios"].items():
      ratios.append([f"{n} replica(s): {name}", f"{ratio['best_of_rounds']:.2f}x",
                     f"{min(ratio['rounds']):.2f}x - {max(ratio['rounds']):.2f}x"])
  return "\n\n".join([
      "## Time to the first training step (Sonnet ResNet-50, "
      f"{r['image_size']}x{r['image_size']}, {r['per_replica_batch']} images per replica)",
      f"`{COMMANDS['first_step']}` (each figure a fresh process: building the model and "
      "optimizer, tracing, Grappler and the first step; MirroredStrategy's model and "
      "optimizer built eagerly first, as it requires; best of the rounds)",
      table(rows, ["variant", "s to the end of the first step"]),
      table(ratios, ["ratio (> 1: ours is faster)", "best of rounds", "round by round"])])
