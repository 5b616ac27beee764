"""The two engines a `Replicator` runs its steps on, behind one `Engine` (`protocol`).

`in_graph` traces every local replica into one graph (`GpuReplicator`,
`MultiGpuReplicator`); in `strategy`, `tf.distribute` traces the step
(`TpuReplicator`). `step_args` and `step_checks` are what both share;
docs/design.md sets the engines side by side.
"""
