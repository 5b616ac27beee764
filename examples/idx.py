"""IDX files (MNIST, Fashion-MNIST), read whole and checked.

One reader for every example. A file that is cut short (an interrupted copy or
download) or is not IDX at all is named with what was wrong and how to get a
good copy, instead of failing later in a reshape or a gzip stream.
"""

import gzip
import zlib

import numpy as np
import tensorflow as tf

# The IDX type byte -> the element dtype (big-endian, as the format stores it).
_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4",
           0x0D: ">f4", 0x0E: ">f8"}
_FIX = ("Reinstall the data (apt-get install --reinstall dataset-fashion-mnist) or "
        "copy the file again.")


def read_idx(path: str) -> np.ndarray:
  """The array in the (possibly gzipped) IDX file `path`.

  Raises:
    ValueError: naming `path`, when it is not IDX, or shorter or longer than
      its header says.
  """
  try:
    with tf.io.gfile.GFile(path, "rb") as f:  # local paths and gs:// alike
      data = f.read()
    if path.endswith(".gz"):
      data = gzip.decompress(data)
  except (EOFError, gzip.BadGzipFile, zlib.error) as error:
    raise ValueError(f"{path}: the gzip stream is damaged or cut short "
                     f"({error}). {_FIX}") from error
  if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _DTYPES:
    raise ValueError(f"{path} is not an IDX file (magic {data[:4].hex()}). {_FIX}")
  ndim, header = data[3], 4 + 4 * data[3]
  if len(data) < header:
    raise ValueError(f"{path}: cut short in its header ({len(data)} bytes, the "
                     f"header of a {ndim}-dimensional array takes {header}). {_FIX}")
  shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
  dtype = np.dtype(_DTYPES[data[2]])
  expected = header + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
  if len(data) != expected:
    raise ValueError(
        f"{path}: {len(data)} bytes where its header (shape {shape}, "
        f"{dtype.name}) needs {expected}: the file is "
        f"{'cut short' if len(data) < expected else 'longer than it says'}. {_FIX}")
  return np.frombuffer(data, dtype=dtype, offset=header).reshape(shape)
