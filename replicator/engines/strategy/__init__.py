"""The strategy engine: steps that `tf.distribute` replicates (a TPU's engine).

`TpuReplicator()` runs on it: `TPUStrategy` (Sonnet's `TpuReplicator`, which
Sonnet's optimizers accept) compiles each replica's step with XLA and runs
it on every core. `replicator.testing.tpu_engine_on_cpus` runs the same engine
on a stand-in strategy over logical CPUs, so that the suite executes it.
docs/design.md, "The strategy engine", says what it shares with the in-graph
engine (`replicator.engines.in_graph`) and where it differs.
"""
