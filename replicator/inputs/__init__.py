"""What `input_fn` is given and how its batches reach the replicas.

- `input_context`: `InputContext`, `pad_to_global_batch`, `allow_uneven_batches`.
- `streams`: the iterators a replicator runs, their names and positions.
- `positions`: what a checkpoint keeps of the inputs.
- `fetch`: each step's batches, and whether the step may run.
"""
