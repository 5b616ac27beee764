"""replicator: write the step for one device, run it on many (TF 2 + Sonnet 2)."""

import setuptools

setuptools.setup(
    name="replicator",
    version="0.1.0",
    description=("TF-Replicator-style data parallelism for TensorFlow 2 and "
                 "Sonnet 2: one-device research code on many GPUs, workers "
                 "or a TPU."),
    license="Apache-2.0",
    license_files=["LICENSE"],
    packages=setuptools.find_packages(include=["replicator", "replicator.*"]),
    python_requires=">=3.10",
    # TensorFlow comes through an extra so that an installed tensorflow-tpu or
    # tensorflow-cpu build is never shadowed by a second TensorFlow. The extras
    # name the versions that .ci/run tests (replicator/_tf_check.py warns
    # outside them).
    install_requires=["dm-sonnet>=2.0.2", "numpy", "absl-py"],
    extras_require={
        "tf": ["tensorflow>=2.20,<2.22"],
        "tf-cpu": ["tensorflow-cpu>=2.20,<2.22"],
        # pdoc builds the API reference (docs/api/), which a test builds too.
        "test": ["pytest", "pytest-xdist", "ruff", "pdoc"],
        # TFDS imagenet2012 needs importlib_resources to prepare from the
        # archives (--tfds_manual_dir, --manual_dir) and does not require it.
        "examples": ["matplotlib", "tensorboard", "tensorflow-datasets", "importlib_resources"],
    },
    entry_points={"console_scripts": ["replicator-launch=replicator.launch:main"]},
)
