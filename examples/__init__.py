"""Research examples for `replicator`.

TensorFlow turns on its oneDNN CPU kernels by default only on CPUs with AVX512-VNNI,
AVX512-BF16 or AMX. On other x86 CPUs (this repository's AMD EPYC VM among them) the
same kernels train the examples' convolutional networks about 1.6x faster, so the
examples ask for them unless `TF_ENABLE_ONEDNN_OPTS` is already set (`=0` turns them
off). The variable is read once, when TensorFlow loads: importing `examples` first is
what makes it count.
"""

import os

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
# TensorFlow's C++ INFO lines (the CPU-feature banner among them) say nothing a
# researcher acts on; warnings and errors still print. `=0` shows them, and the
# oneDNN banner that no setting hides (see below).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")


def _import_tensorflow_quietly():
  """Imports TensorFlow with its start-up banners filtered out of stderr.

  TensorFlow 2.21 prints "oneDNN custom operations are on" once for each of two
  libraries it loads, before its C++ logging reads TF_CPP_MIN_LOG_LEVEL, so no
  setting hides it. Every other line TensorFlow writes while loading is passed on.
  """
  import sys
  import tempfile
  banners = ("oneDNN custom operations are on",
             "All log messages before absl::InitializeLog() is called",
             "This TensorFlow binary is optimized to use available CPU",
             "rebuild TensorFlow with the appropriate compiler flags")
  try:
    sys.stderr.flush()
    saved = os.dup(2)
  except (OSError, ValueError):  # no real stderr (an embedding host): import as is
    import tensorflow  # noqa: F401
    return
  with tempfile.TemporaryFile() as captured:
    os.dup2(captured.fileno(), 2)
    try:
      import tensorflow  # noqa: F401
    finally:
      os.dup2(saved, 2)
      os.close(saved)
      captured.seek(0)
      for line in captured.read().decode(errors="replace").splitlines(keepends=True):
        if not any(banner in line for banner in banners):
          sys.stderr.write(line)
      sys.stderr.flush()


if os.environ.get("TF_CPP_MIN_LOG_LEVEL") != "0":
  _import_tensorflow_quietly()
