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
