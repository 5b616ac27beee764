"""What `input_fn` is given and how its batches reach the replicas (CONTRIBUTING.md lists the
modules)."""
