"""Fixtures shared by the examples' tests."""

import pytest

import imagenet_archives


@pytest.fixture(scope="session")
def imagenet_manual_dir(tmp_path_factory):
  """`(manual_dir, data_dir)`: tiny ILSVRC2012 archives and a TFDS data_dir.

  The first test to use it has TFDS prepare `imagenet2012` from the archives
  (4 s); the others find it prepared.
  """
  pytest.importorskip("tensorflow_datasets")
  root = tmp_path_factory.mktemp("imagenet2012")
  return imagenet_archives.write(root), str(root / "tfds")
