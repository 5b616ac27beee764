# %% [markdown]
# # SN-GAN on ImageNet 128x128, batch 8 to 512, on a Colab TPU (`TpuReplicator`)
#
# The TF-Replicator paper's batch-size study: the same SN-GAN (projection
# discriminator, ch=64, 1000 classes) trained at several global batch sizes
# for the same number of generator steps. This file is a Colab notebook in
# "percent" format: open it in Colab (File > Upload notebook accepts `.py`
# via Jupytext, or paste the cells), or run it as a script on a TPU VM.
#
# **Not run on a TPU here.** The example was developed and tested on CPUs
# only (the `small` config, and `imagenet128` at reduced width on synthetic
# data through `MultiGpuReplicator` on 2 logical CPU devices). Budget, paths
# and step counts below are a starting point, not a reproduced result.
#
# What you need:
# 1. Runtime > Change runtime type > TPU (a TPU VM runtime with the
#    `tensorflow-tpu` build; `TpuReplicator()` finds it as `'local'`).
# 2. ImageNet (ILSVRC2012) you are licensed to use, in one of two forms:
#    * TFDS `imagenet2012` already prepared in a bucket or on disk
#      (`DATA_DIR`), or the two ILSVRC2012 tars in `MANUAL_DIR` for TFDS to
#      prepare once (hours; better done on a CPU VM into a bucket);
#    * or TFRecord shards as written by the Cloud TPU ImageNet scripts
#      (`image/encoded`, `image/class/label` starting at 1).
# 3. For true Inception Score / FID, Keras InceptionV3 weights with the top
#    (`inception_v3_weights_tf_dim_ordering_tf_kernels.h5`) on local disk.
#    Without them only the classifier-based metrics are available, and a
#    small classifier is a poor judge of ImageNet: pass the weights.

# %%
# Install the library and the example's dependencies (a clone or upload of
# this repository in /content/replicator).
import subprocess
import sys

REPO = "/content/replicator"
subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e",
                f"{REPO}[examples]"], check=True)

# %%
DATA_DIR = "gs://YOUR_BUCKET/tensorflow_datasets"  # TFDS data_dir, or a TFRecord glob.
DATASET = "imagenet2012"                           # or "tfrecord" (then LABEL_OFFSET = 1).
LABEL_OFFSET = 0
MANUAL_DIR = ""                                    # ILSVRC2012 tars, if TFDS must prepare.
INCEPTION_WEIGHTS = "/content/inception_v3_weights_tf_dim_ordering_tf_kernels.h5"
WORKDIR = "/content/gan_imagenet128"
BATCH_SIZES = "8,16,32,64,128,256,512"
# The paper compares models after equal generator steps; 100k steps at batch
# 512 with n_dis=5 is days on one v3-8. Start small and raise it.
GENERATOR_STEPS = 20_000

# %%
# The sweep, with the TPU replicator: every run splits its global batch over
# the TPU cores, and each core draws its own noise.
command = [
    sys.executable, "-m", "examples.gan.sweep",
    "--config=imagenet128", "--replicator=tpu",
    f"--dataset={DATASET}", f"--data_dir={DATA_DIR}",
    f"--label_offset={LABEL_OFFSET}",
    f"--batch_sizes={BATCH_SIZES}", "--seeds=0",
    f"--num_generator_steps={GENERATOR_STEPS}", "--evals_per_run=4",
    "--noclassifier_metrics", f"--inception_weights={INCEPTION_WEIGHTS}",
    "--num_eval_samples=10000", "--num_real_examples=10000",
    f"--workdir={WORKDIR}", "--grid_class=207",  # golden retriever
]
if MANUAL_DIR:
  command.append(f"--manual_dir={MANUAL_DIR}")
subprocess.run(command, cwd=REPO, check=True)

# %%
# The table and the figures.
from IPython.display import Image, Markdown, display  # pylint: disable=g-import-not-at-top

display(Markdown(open(f"{WORKDIR}/results.md").read()))
for name in ("quality_vs_batch_size", "quality_vs_steps", "samples_by_batch_size"):
  display(Image(f"{WORKDIR}/{name}.png"))

# %% [markdown]
# One run by hand (TensorBoard: `%load_ext tensorboard`,
# `%tensorboard --logdir /content/gan_one`):
#
#     python -m examples.gan.train --config=imagenet128 --replicator=tpu \
#         --global_batch_size=256 --num_generator_steps=20000 \
#         --data_dir=gs://YOUR_BUCKET/tensorflow_datasets --noclassifier_metrics \
#         --inception_weights=/content/inception_v3_weights_tf_dim_ordering_tf_kernels.h5 \
#         --workdir=/content/gan_one --eval_every=5000
#
# On a TPU Node (legacy Colab, `COLAB_TPU_ADDR`), checkpoints and summaries
# must go to a bucket: pass `--workdir=gs://...`.
