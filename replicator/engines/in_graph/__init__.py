"""The in-graph engine: every local replica's step traced into one graph.

- `effects`: what in a traced step has effects, and the gate that holds them.
- `steps`: `CompiledStep`, k steps of every replica in one call.
- `interrupts`: SIGINT and SIGTERM end a call of several steps between two steps.
- `divergence`: whether the copies still agree.
- `generators`: `ReplicaGenerator`, a random generator per replica.
- `engine`: `InGraphEngine`, an `engines.protocol.Engine`.
"""
