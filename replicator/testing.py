"""Helpers for tests: several replicas on one CPU."""

from replicator.mesh import configure_logical_cpus  # noqa: F401  (public here)
